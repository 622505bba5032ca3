package fleetsim

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/tools/workload"
)

// Scenario is one simulated situation: a fleet, a workload, faults over
// time, the SLO and the policies to compare. Files live in examples/sim;
// docs/sim.md documents every key. Times in a scenario (fault starts, region
// phases, rate phases) count from the start of traffic.
type Scenario struct {
	Name        string
	Description string
	// Fleet is the fleet spec (parsed; its path resolved against the
	// scenario file's directory).
	Fleet     *fleet.Spec
	FleetPath string
	// Dir is the scenario file's directory (where traces are looked for
	// when the data directory is not found from the working directory).
	Dir string
	// Duration of traffic; Warmup, at its start, is left out of the
	// figures (caches and controllers settle).
	Duration, Warmup time.Duration
	Seed             uint64
	// Seeds is how many seeds the figures are medians of: Seed, Seed+1, …
	// (default 1; one run's p99 is noisy).
	Seeds    int
	SLO      SLO
	Workload Workload
	Faults   []Fault
	// Policies to run, by name (default: all).
	Policies []string
	Control  Control
}

// SLO is what a request must meet to count as goodput.
type SLO struct{ TTFT, TPOT time.Duration }

// WorkloadKind selects the generator.
type WorkloadKind string

// Workload kinds.
const (
	// Sessions: synthetic multi-turn conversations (tools/workload's
	// MultiTurn), optionally with shared preambles or as agentic tool loops.
	Sessions WorkloadKind = "sessions"
	// Azure and Mooncake replay a trace from the data directory.
	Azure    WorkloadKind = "azure"
	Mooncake WorkloadKind = "mooncake"
)

// Workload describes the traffic.
type Workload struct {
	Kind WorkloadKind
	// Sessions (open loop): new sessions per second, scaled over time by
	// RatePhases. Users (closed loop, instead of a rate): that many users
	// each run one session after another; Sessions caps the total (0: no
	// cap).
	SessionsPerS float64
	Users        int
	MaxSessions  int
	RatePhases   []RatePhase
	MultiTurn    workload.MultiTurnOptions
	Model        string
	// Trace (azure, mooncake): the file name under the data directory;
	// TimeScale divides the trace's inter-arrival times (2: twice as fast);
	// Rows limits the rows replayed (0: all).
	Trace     string
	TimeScale float64
	Rows      int
	// BlockTokens (mooncake): tokens per trace hash id (default 512; less
	// shrinks prompts and keeps the prefix structure).
	BlockTokens int
	// Window (traces, instead of Rows): each seed replays its own window of
	// the trace, as the rivals' bench replays one per run
	// (tools/rivalbench): window (seed − 1) mod n of the n whole windows
	// the trace holds (at least one), i.e. the rows whose time since the
	// trace's first row falls in that window (seed 0 counts as seed 1).
	Window time.Duration
	// MaxOutputTokens (mooncake) caps every row's output length (0: the
	// trace's own).
	MaxOutputTokens int
	// Regions for trace rows (their shares); sessions use MultiTurn.Regions.
	Regions []workload.Share
	// Priorities of trace rows (their shares, drawn per row; empty: the
	// fleet's default priority); sessions use MultiTurn.Priorities.
	Priorities []workload.Share
}

// RatePhase scales the arrival rate from At on.
type RatePhase struct {
	At     time.Duration
	Factor float64
}

// FaultKind is what happens.
type FaultKind string

// Fault kinds.
const (
	Crash      FaultKind = "crash"       // the engine dies (in-flight requests fail), back after For
	Slowdown   FaultKind = "slowdown"    // steps take Factor× longer for For
	Hang       FaultKind = "hang"        // the engine stops stepping (health checks time out) for For
	RegionLoss FaultKind = "region_loss" // every engine of Region crashes for For
	Surge      FaultKind = "surge"       // the arrival rate is multiplied by Factor for For
)

// Fault is one event on the timeline.
type Fault struct {
	At, For time.Duration
	Kind    FaultKind
	Engine  string
	Region  string
	Factor  float64
}

// Control tunes the simulated control plane and Envoys (defaults: the
// production ones).
type Control struct {
	Interval, ScrapeInterval, ReportInterval time.Duration
	// HealthCheckInterval: Envoy's active health check period.
	HealthCheckInterval time.Duration
	// OldGain is the old proportional controller's gain per cycle.
	OldGain float64
}

// The YAML documents.
type scenarioDoc struct {
	Name        string       `yaml:"name"`
	Description string       `yaml:"description"`
	Fleet       string       `yaml:"fleet"`
	Duration    string       `yaml:"duration"`
	Warmup      string       `yaml:"warmup"`
	Seed        *int         `yaml:"seed"`
	Seeds       *int         `yaml:"seeds"`
	SLO         *sloDoc      `yaml:"slo"`
	Workload    *workloadDoc `yaml:"workload"`
	Faults      []faultDoc   `yaml:"faults"`
	Policies    []string     `yaml:"policies"`
	Control     *controlDoc  `yaml:"control"`
}

type sloDoc struct {
	TTFTMs float64 `yaml:"ttft_ms"`
	TPOTMs float64 `yaml:"tpot_ms"`
}

type rangeDoc struct {
	Min int `yaml:"min"`
	Max int `yaml:"max"`
}

type phaseDoc struct {
	At     string             `yaml:"at"`
	Shares map[string]float64 `yaml:"shares"`
}

type rateDoc struct {
	At     string  `yaml:"at"`
	Factor float64 `yaml:"factor"`
}

type workloadDoc struct {
	Kind               string             `yaml:"kind"`
	Model              string             `yaml:"model"`
	SessionsPerS       float64            `yaml:"sessions_per_s"`
	Users              int                `yaml:"users"`
	MaxSessions        int                `yaml:"max_sessions"`
	RatePhases         []rateDoc          `yaml:"rate_phases"`
	Turns              *rangeDoc          `yaml:"turns"`
	UserTokens         *rangeDoc          `yaml:"user_tokens"`
	OutputTokens       *rangeDoc          `yaml:"output_tokens"`
	SystemPrompts      int                `yaml:"system_prompts"`
	SystemPromptTokens int                `yaml:"system_prompt_tokens"`
	Preambles          int                `yaml:"preambles"`
	PreambleTokens     *rangeDoc          `yaml:"preamble_tokens"`
	ToolTokens         *rangeDoc          `yaml:"tool_tokens"`
	ThinkTime          string             `yaml:"think_time"`
	SessionIDs         bool               `yaml:"session_ids"`
	Priorities         map[string]float64 `yaml:"priorities"`
	Regions            []phaseDoc         `yaml:"regions"`
	Trace              string             `yaml:"trace"`
	TimeScale          float64            `yaml:"time_scale"`
	Rows               int                `yaml:"rows"`
	BlockTokens        int                `yaml:"block_tokens"`
	Window             string             `yaml:"window"`
	MaxOutputTokens    int                `yaml:"max_output_tokens"`
}

type faultDoc struct {
	At     string  `yaml:"at"`
	For    string  `yaml:"for"`
	Kind   string  `yaml:"kind"`
	Engine string  `yaml:"engine"`
	Region string  `yaml:"region"`
	Factor float64 `yaml:"factor"`
}

type controlDoc struct {
	Interval            string  `yaml:"interval"`
	ScrapeInterval      string  `yaml:"scrape_interval"`
	ReportInterval      string  `yaml:"report_interval"`
	HealthCheckInterval string  `yaml:"health_check_interval"`
	OldGain             float64 `yaml:"old_gain"`
}

// MaxSeeds bounds the seeds one scenario's figures are medians of.
const MaxSeeds = 50

// maxScenarioBytes bounds a scenario file.
const maxScenarioBytes = 1 << 20

// LoadScenario reads, defaults and validates a scenario file. Errors name
// the file, line and key path, all of them.
func LoadScenario(path string) (*Scenario, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("scenario: %w", err)
	}
	if len(b) > maxScenarioBytes {
		return nil, fmt.Errorf("scenario %s: %d bytes, more than %d", path, len(b), maxScenarioBytes)
	}
	return ParseScenario(b, path)
}

// ParseScenario parses a scenario; path names it in errors and anchors the
// fleet path ("" for none: the fleet path is then taken as is).
func ParseScenario(data []byte, path string) (*Scenario, error) {
	var d scenarioDoc
	lines, ferrs := fleet.DecodeStrict(data, &d, "scenario")
	v := &validator{lines: lines, file: path}
	v.errs = append(v.errs, ferrs...)
	if len(ferrs) > 0 && d.Name == "" && d.Workload == nil {
		return nil, v.err()
	}
	sc := v.scenario(&d, filepath.Dir(path))
	if err := v.err(); err != nil {
		return nil, err
	}
	if path != "" {
		sc.Dir = filepath.Dir(path)
		if real, err := filepath.EvalSymlinks(path); err == nil {
			sc.Dir = filepath.Dir(real)
		}
	}
	return sc, nil
}

// WithDuration returns a copy of the scenario whose traffic lasts d (a
// quick look at a long scenario): the warm-up shrinks to at most a quarter
// of it; faults and phases past the end never happen.
func (sc *Scenario) WithDuration(d time.Duration) (*Scenario, error) {
	if d <= 0 {
		return nil, fmt.Errorf("duration must be positive, got %v", d)
	}
	c := *sc
	c.Duration = d
	c.Warmup = min(sc.Warmup, d/4)
	return &c, nil
}

type validator struct {
	lines map[string]int
	file  string
	errs  []*fleet.FieldError
}

func (v *validator) bad(path, format string, args ...any) {
	line := v.lines[path]
	for p := path; line == 0 && p != ""; {
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
		line = v.lines[p]
	}
	v.errs = append(v.errs, &fleet.FieldError{Path: path, Line: line, Msg: fmt.Sprintf(format, args...)})
}

// ScenarioError lists every problem of a scenario file.
type ScenarioError struct {
	File string
	Errs []*fleet.FieldError
}

func (e *ScenarioError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "scenario %s: %d problem(s):", e.File, len(e.Errs))
	for _, fe := range e.Errs {
		b.WriteString("\n  " + fe.WithLine())
	}
	return b.String()
}

func (v *validator) err() error {
	if len(v.errs) == 0 {
		return nil
	}
	sort.SliceStable(v.errs, func(i, j int) bool { return v.errs[i].Line < v.errs[j].Line })
	return &ScenarioError{File: v.file, Errs: v.errs}
}

func (v *validator) duration(path, s string, def time.Duration, allowZero bool) time.Duration {
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	switch {
	case err != nil:
		v.bad(path, "%q is not a duration (e.g. 90s, 5m)", s)
	case d < 0 || (d == 0 && !allowZero):
		v.bad(path, "must be positive, got %s", s)
	}
	return d
}

// rng checks an optional range of counts: 1 ≤ min ≤ max; absent is the
// zero Range.
func (v *validator) rng(path string, r *rangeDoc) workload.Range {
	if r == nil {
		return workload.Range{}
	}
	if r.Min < 1 || r.Max < r.Min {
		v.bad(path, "want 1 ≤ min ≤ max, got min %d max %d", r.Min, r.Max)
	}
	return workload.Range{Min: r.Min, Max: r.Max}
}

func (v *validator) shares(path string, m map[string]float64, known func(string) bool, what string) []workload.Share {
	var out []workload.Share
	sum := 0.0
	for _, k := range slices.Sorted(maps.Keys(m)) {
		w := m[k]
		if !known(k) {
			v.bad(path+"."+k, "unknown %s %q", what, k)
		}
		if !(w >= 0) {
			v.bad(path+"."+k, "share must be ≥ 0, got %v", w)
		}
		sum += w
		out = append(out, workload.Share{Name: k, Weight: w})
	}
	if len(m) > 0 && !(sum > 0) {
		v.bad(path, "shares must not all be 0")
	}
	return out
}

func (v *validator) scenario(d *scenarioDoc, dir string) *Scenario {
	sc := &Scenario{Name: d.Name, Description: d.Description, Seed: 1}
	if d.Name == "" {
		v.bad("name", "is required")
	}
	if d.Seed != nil {
		if *d.Seed < 0 {
			v.bad("seed", "must be ≥ 0, got %d", *d.Seed)
		}
		sc.Seed = uint64(*d.Seed)
	}
	sc.Seeds = 1
	if d.Seeds != nil {
		if *d.Seeds < 1 || *d.Seeds > MaxSeeds {
			v.bad("seeds", "must be in [1, %d], got %d", MaxSeeds, *d.Seeds)
		}
		sc.Seeds = *d.Seeds
	}
	sc.Duration = v.duration("duration", d.Duration, 0, false)
	if d.Duration == "" {
		v.bad("duration", "is required")
	}
	sc.Warmup = v.duration("warmup", d.Warmup, min(60*time.Second, sc.Duration/5), true)
	if sc.Duration > 0 && sc.Warmup >= sc.Duration {
		v.bad("warmup", "%v is not shorter than the duration %v", sc.Warmup, sc.Duration)
	}
	switch {
	case d.Fleet == "":
		v.bad("fleet", "is required (a fleet spec file, relative to the scenario)")
	default:
		p := d.Fleet
		if !filepath.IsAbs(p) && v.file != "" {
			p = filepath.Join(dir, p)
		}
		spec, err := fleet.Load(p)
		if err != nil {
			v.bad("fleet", "%s: %v", p, err)
		}
		sc.Fleet, sc.FleetPath = spec, p
	}
	sc.SLO = SLO{TTFT: 2 * time.Second, TPOT: 100 * time.Millisecond}
	if d.SLO != nil {
		if d.SLO.TTFTMs > 0 {
			sc.SLO.TTFT = time.Duration(d.SLO.TTFTMs * float64(time.Millisecond))
		} else if d.SLO.TTFTMs < 0 {
			v.bad("slo.ttft_ms", "must be positive, got %v", d.SLO.TTFTMs)
		}
		if d.SLO.TPOTMs > 0 {
			sc.SLO.TPOT = time.Duration(d.SLO.TPOTMs * float64(time.Millisecond))
		} else if d.SLO.TPOTMs < 0 {
			v.bad("slo.tpot_ms", "must be positive, got %v", d.SLO.TPOTMs)
		}
	}
	if d.Workload == nil {
		v.bad("workload", "is required")
	} else {
		v.workload(sc, d.Workload)
	}
	for i, f := range d.Faults {
		v.fault(sc, i, f)
	}
	known := map[string]bool{}
	for _, p := range PolicyNames() {
		known[p] = true
	}
	for i, p := range d.Policies {
		if !known[p] {
			v.bad(fmt.Sprintf("policies[%d]", i), "unknown policy %q (known: %s)", p, strings.Join(PolicyNames(), ", "))
		}
		if slices.Contains(d.Policies[:i], p) {
			v.bad(fmt.Sprintf("policies[%d]", i), "policy %q twice", p)
		}
	}
	sc.Policies = d.Policies
	if len(sc.Policies) == 0 {
		sc.Policies = PolicyNames()
	}
	sc.Control = Control{Interval: 5 * time.Second, ScrapeInterval: time.Second, ReportInterval: time.Second,
		HealthCheckInterval: 2 * time.Second, OldGain: 1}
	if c := d.Control; c != nil {
		sc.Control.Interval = v.duration("control.interval", c.Interval, sc.Control.Interval, false)
		sc.Control.ScrapeInterval = v.duration("control.scrape_interval", c.ScrapeInterval, sc.Control.ScrapeInterval, false)
		sc.Control.ReportInterval = v.duration("control.report_interval", c.ReportInterval, sc.Control.ReportInterval, false)
		sc.Control.HealthCheckInterval = v.duration("control.health_check_interval", c.HealthCheckInterval, sc.Control.HealthCheckInterval, false)
		if c.OldGain != 0 {
			if !(c.OldGain > 0 && c.OldGain <= 2) {
				v.bad("control.old_gain", "must be in (0, 2], got %v", c.OldGain)
			}
			sc.Control.OldGain = c.OldGain
		}
	}
	return sc
}

func (v *validator) workload(sc *Scenario, d *workloadDoc) {
	w := &sc.Workload
	w.Kind = WorkloadKind(d.Kind)
	w.Model = d.Model
	spec := sc.Fleet
	if spec != nil {
		if w.Model == "" && len(spec.Models) > 0 {
			w.Model = spec.Models[0].Name
		} else if _, ok := spec.ModelByName(w.Model); !ok {
			v.bad("workload.model", "the fleet serves no model %q", w.Model)
		}
	}
	regionKnown := func(r string) bool {
		if spec == nil {
			return true
		}
		for _, f := range spec.Frontends {
			if f.Region == r {
				return true
			}
		}
		return false
	}
	for i, rp := range d.RatePhases {
		p := fmt.Sprintf("workload.rate_phases[%d]", i)
		ph := RatePhase{At: v.duration(p+".at", rp.At, 0, true), Factor: rp.Factor}
		if !(rp.Factor >= 0) {
			v.bad(p+".factor", "must be ≥ 0, got %v", rp.Factor)
		}
		if i > 0 && ph.At <= w.RatePhases[i-1].At {
			v.bad(p+".at", "phases must be in increasing order of at")
		}
		w.RatePhases = append(w.RatePhases, ph)
	}
	switch w.Kind {
	case Sessions:
		mt := &w.MultiTurn
		mt.Format = workload.Chat
		mt.Seed = sc.Seed
		mt.SystemPrompts, mt.SystemPromptTokens = d.SystemPrompts, d.SystemPromptTokens
		mt.Turns = v.rng("workload.turns", d.Turns)
		mt.UserTokens = v.rng("workload.user_tokens", d.UserTokens)
		mt.OutputTokens = v.rng("workload.output_tokens", d.OutputTokens)
		mt.Preambles = d.Preambles
		mt.PreambleTokens = v.rng("workload.preamble_tokens", d.PreambleTokens)
		if d.Preambles > 0 && d.PreambleTokens == nil {
			v.bad("workload.preamble_tokens", "is required with preambles")
		}
		mt.ToolTokens = v.rng("workload.tool_tokens", d.ToolTokens)
		mt.ThinkTime = v.duration("workload.think_time", d.ThinkTime, 0, true)
		mt.SessionIDs = d.SessionIDs
		if spec != nil {
			mt.Priorities = v.shares("workload.priorities", d.Priorities, func(p string) bool { _, ok := spec.PriorityByName(p); return ok }, "priority")
		}
		for i, ph := range d.Regions {
			p := fmt.Sprintf("workload.regions[%d]", i)
			mt.Regions = append(mt.Regions, workload.RegionPhase{At: v.duration(p+".at", ph.At, 0, true),
				Shares: v.shares(p+".shares", ph.Shares, regionKnown, "frontend region")})
		}
		if len(d.Regions) == 0 && spec != nil {
			v.bad("workload.regions", "is required: the frontend regions' shares of sessions")
		}
		if d.Users > 0 && d.SessionsPerS > 0 {
			v.bad("workload.users", "give users (closed loop) or sessions_per_s (open loop), not both")
		}
		if d.Users <= 0 && !(d.SessionsPerS > 0) {
			v.bad("workload.sessions_per_s", "must be positive (or give users), got %v", d.SessionsPerS)
		}
		w.SessionsPerS, w.Users, w.MaxSessions = d.SessionsPerS, d.Users, d.MaxSessions
		if d.MaxSessions < 0 {
			v.bad("workload.max_sessions", "must be ≥ 0, got %d", d.MaxSessions)
		}
		if _, err := workload.NewMultiTurn(*mt); err != nil && len(v.errs) == 0 {
			v.bad("workload", "%v", err)
		}
	case Azure, Mooncake:
		if d.Trace == "" {
			v.bad("workload.trace", "is required for %s (a file name under the data directory)", d.Kind)
		}
		w.Trace, w.Rows, w.BlockTokens = d.Trace, d.Rows, d.BlockTokens
		if spec != nil {
			w.Priorities = v.shares("workload.priorities", d.Priorities, func(p string) bool { _, ok := spec.PriorityByName(p); return ok }, "priority")
		}
		if d.Rows < 0 {
			v.bad("workload.rows", "must be ≥ 0, got %d", d.Rows)
		}
		if d.BlockTokens < 0 || d.BlockTokens > workload.MooncakeBlockTokens {
			v.bad("workload.block_tokens", "must be in [0, %d], got %d", workload.MooncakeBlockTokens, d.BlockTokens)
		}
		w.Window = v.duration("workload.window", d.Window, 0, false)
		if d.Window != "" && d.Rows > 0 {
			v.bad("workload.window", "give rows or window, not both")
		}
		w.MaxOutputTokens = d.MaxOutputTokens
		switch {
		case d.MaxOutputTokens < 0:
			v.bad("workload.max_output_tokens", "must be ≥ 0, got %d", d.MaxOutputTokens)
		case d.MaxOutputTokens > 0 && w.Kind != Mooncake:
			v.bad("workload.max_output_tokens", "applies to mooncake traces only")
		}
		w.TimeScale = 1
		if d.TimeScale != 0 {
			if !(d.TimeScale > 0) {
				v.bad("workload.time_scale", "must be positive, got %v", d.TimeScale)
			}
			w.TimeScale = d.TimeScale
		}
		if len(d.Regions) != 1 {
			v.bad("workload.regions", "a trace takes exactly one phase of region shares")
		} else {
			w.Regions = v.shares("workload.regions[0].shares", d.Regions[0].Shares, regionKnown, "frontend region")
		}
	case "":
		v.bad("workload.kind", "is required: sessions, azure or mooncake")
	default:
		v.bad("workload.kind", "unknown kind %q (sessions, azure or mooncake)", d.Kind)
	}
}

func (v *validator) fault(sc *Scenario, i int, d faultDoc) {
	p := fmt.Sprintf("faults[%d]", i)
	f := Fault{Kind: FaultKind(d.Kind), Engine: d.Engine, Region: d.Region, Factor: d.Factor,
		At: v.duration(p+".at", d.At, 0, true), For: v.duration(p+".for", d.For, 0, true)}
	if d.At == "" {
		v.bad(p+".at", "is required")
	}
	spec := sc.Fleet
	needEngine := func() {
		if d.Engine == "" {
			v.bad(p+".engine", "is required for %s", d.Kind)
		} else if spec != nil {
			if _, ok := spec.EngineByID(d.Engine); !ok {
				v.bad(p+".engine", "unknown engine %q", d.Engine)
			}
		}
	}
	switch f.Kind {
	case Crash, Hang:
		needEngine()
	case Slowdown:
		needEngine()
		if !(d.Factor > 0) {
			v.bad(p+".factor", "must be positive, got %v", d.Factor)
		}
	case RegionLoss:
		if spec != nil {
			if _, ok := spec.RegionByName(d.Region); !ok {
				v.bad(p+".region", "unknown region %q", d.Region)
			}
		}
	case Surge:
		if !(d.Factor > 0) {
			v.bad(p+".factor", "must be positive, got %v", d.Factor)
		}
	default:
		v.bad(p+".kind", "unknown fault %q (crash, slowdown, hang, region_loss, surge)", d.Kind)
	}
	sc.Faults = append(sc.Faults, f)
}
