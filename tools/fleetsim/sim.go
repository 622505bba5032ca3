// Package fleetsim is inferlb's fleet simulator: a discrete-event
// simulation, in virtual time, of a multi-region fleet of inference engines
// behind frontend Envoys, under a workload and faults over time, with one
// routing policy at a time, so that routing quality is measured on the same
// work for every policy (docs/sim.md).
//
// What runs is the project's own code wherever it exists: the engines are
// tools/enginesim/model (continuous batching, chunked prefill, a finite
// block prefix cache, per-GPU profiles); inferlb's request path is
// extproc.Decider (class, affinity key, admission, retry grant, demand and
// evidence), fed real request bodies; its control loop is
// controlplane.Controller.Step fed by controlplane/signals' Tracker (scrapes with
// smoothing and staleness) and Intake (ext_proc's reports); the resources it
// returns (RoutingPolicy and EDS) are applied to the deciders and to a
// model of Envoy's host selection (internal/envoylb, checked against a real
// Envoy). Rival policies are plug-ins (Policy).
package fleetsim

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
	"unsafe"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/internal/tokens"
	"github.com/inferlb/inferlb/internal/tokens/hf"
	"github.com/inferlb/inferlb/internal/words"
	"github.com/inferlb/inferlb/tools/enginesim/model"
	"github.com/inferlb/inferlb/tools/workload"
)

// Options configure one run.
type Options struct {
	Scenario *Scenario
	// Policy is the policy's name (PolicyNames).
	Policy string
	// Seed overrides the scenario's seed when not 0.
	Seed uint64
	// DataDir holds the traces (azure, mooncake workloads).
	DataDir string
	// MaxArrivals stops new arrivals after that many requests (0: none).
	MaxArrivals int
	// Progress, if set, is called now and then with the share of virtual
	// time done.
	Progress func(done float64)
	// NoSeries skips the time series and per-request records beyond what
	// the figures need (benchmarks).
	NoSeries bool
	// BalanceFactor, when set, overrides the control plane's
	// BalanceFactor for the inferlb policies (nil: its default).
	BalanceFactor *float64
	// PrefillPlacement turns ext_proc's prefill-aware placement on for the
	// inferlb policies (off by default, as in the service).
	PrefillPlacement bool
	// IdlePlacement turns ext_proc's idle-engine placement on for the
	// inferlb policies. The service's command turns it on by default (as
	// does `inferlb-lab sim`); the zero Options route by the key alone, as
	// extproc.Options do.
	IdlePlacement bool
	// CachePlacement turns ext_proc's cache-aware placement on for the
	// inferlb policies (it supersedes the other two).
	CachePlacement bool
	// Keys, if set, is told the affinity key ext_proc's decision gave each
	// request the inferlb policies admit, in arrival order, with the
	// request's identity (its conversation and arrival time): tests compare
	// keys request by request, whatever admission let through.
	Keys func(conv int32, arrival time.Duration, key uint64)
}

// lead is how long the control plane runs before traffic starts: its
// warm-up and first cycle happen on an idle fleet, as in a deployment that
// was up before the traffic came.
const lead = 15 * time.Second

// drainLimit bounds how long the simulation waits for requests in flight
// after the last arrival; what is still running then counts as failed.
const drainLimit = 10 * time.Minute

// epoch maps virtual time to the wall-clock times the control plane's code
// takes.
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// Sim is one run's state. Not safe for concurrent use; Run owns it.
type Sim struct {
	sc   *Scenario
	spec *fleet.Spec
	opt  Options
	pol  Policy
	now  time.Duration
	q    queue
	// arr draws arrivals (session starts, trace regions); rng is the
	// policies' own (random choices): separate streams, so that every
	// policy sees the same sessions start at the same times.
	arr  *rand.Rand
	rng  *rand.Rand
	seed uint64

	engines []*engine
	fronts  []*frontend
	// classEngines[c] are the engine indexes eligible for class c.
	classEngines [][]int
	classIx      map[string]int
	frontOf      map[string]*frontend // region → its frontend

	src      workload.Source
	mt       *workload.MultiTurn
	rate     float64 // current session-rate multiplier (phases × surges)
	surge    float64
	phase    float64
	sessions int // sessions started
	arrivals int
	stopped  bool // no more arrivals
	end      time.Duration
	open     int // requests arrived and not finished
	nextRow  *workload.Request
	convLast []int32 // conversation → engine of its last served turn (−1 none)

	rec *recorder
	ctx context.Context
	// tok is what the simulated ext_procs count context needs with
	// (tokenizer.go); spec's models name it.
	tok       *hf.Tokenizer
	sysTokens map[sysKey][]uint64
	// arrays of finished sessions, for new ones (recycle)
	spareBytes [][]byte
	spareToks  [][]uint64
}

// engine is one simulated engine (its replicas).
type engine struct {
	ix     int
	spec   fleet.Engine
	cfg    model.Config
	reps   *model.Replicas
	region string
	lis    *listener

	down    bool // crashed: refuses connections
	hung    bool
	slow    float64
	healthy bool // Envoy's active health check verdict
	hcOK    int  // consecutive passing checks
	hcFail  int

	wake    time.Duration
	gen     uint32
	pending bool

	running []*request // requests the engine holds (for crashes)

	// Counters a /metrics scrape would read (vLLM's histograms' sums and
	// counts).
	ttftSum, ttftCount, itlSum, itlCount, success float64
	// ttftIn counts first tokens per bucket of vLLM's TTFT histogram
	// (model.TTFTBuckets; the overflow last), for the scrape's buckets.
	ttftIn []float64
}

// frontend is one frontend node (one Envoy, one ext_proc).
type frontend struct {
	ix     int
	spec   fleet.Frontend
	owd    []time.Duration // one-way delay to each engine
	active []int           // requests in flight per engine (all classes)
}

// request is one request (one turn) through the fleet.
type request struct {
	w       workload.Request
	conv    int32
	front   *frontend
	arrival time.Duration
	class   int
	key     uint64 // the consistent-hash key (policy's)
	engine  int
	host    int // host index in the policy's cluster (−1 none)
	tried   []int32
	retries int
	attempt int
	prompt  []uint64
	hashes  []uint64 // chained block hashes of prompt (lazy)
	outTok  []uint64 // the answer's tokens as the next turn repeats them
	// base is the previous turn's prompt and answer, the tokens of this
	// turn's first baseMsgs messages: only the new messages are tokenized.
	base     []uint64
	baseMsgs int
	// baseHashes are the previous turn's prompt block hashes, a prefix of
	// this prompt's chain.
	baseHashes []uint64
	// bodyBase is the JSON of the previous turn's messages (bodyMsgs of
	// them), without the closing bracket; bodyPre is this turn's, for the
	// next (see chatBody).
	bodyBase, bodyPre []byte
	bodyMsgs          int
	mr                model.Request
	sim               *Sim
	headers           bool // the engine accepted it (response headers sent)
	aborted           bool
	slot              int // index in engine.running
	replica           int // which replica serves it
	state             any // the policy's per-request state
	retried           int
}

// listener receives one engine's model events.
type listener struct {
	s *Sim
	e *engine
}

func (l *listener) Token(r *model.Request, t time.Duration) {
	if r.Generated == 1 {
		l.e.ttftSum += (t - r.Arrival).Seconds()
		l.e.ttftIn = countBucket(l.e.ttftIn, (t - r.Arrival).Seconds())
		l.e.ttftCount++
	}
}

// Tokens takes decode tokens in batches (model.TokenBatcher), so the
// engine collapses runs of identical decode steps into one event: the
// simulator needs only first tokens, last tokens and finishes.
func (l *listener) Tokens(*model.Request, int, time.Duration, time.Duration) {}

func (l *listener) Finished(r *model.Request, t time.Duration) {
	p := r.Tag.(*request)
	e := l.e
	e.success++
	if r.Generated > 1 {
		e.itlSum += (r.LastToken - r.FirstToken).Seconds()
		e.itlCount += float64(r.Generated - 1)
	}
	e.remove(p)
	p.aborted = r.Reason == model.FinishAbort
	l.s.q.push(event{t: t + p.front.owd[e.ix], kind: evReturn, p: p})
}

func (e *engine) add(p *request) {
	p.slot = len(e.running)
	e.running = append(e.running, p)
}

func (e *engine) remove(p *request) {
	i := p.slot
	if i < 0 || i >= len(e.running) || e.running[i] != p {
		return
	}
	last := len(e.running) - 1
	e.running[i] = e.running[last]
	e.running[i].slot = i
	e.running[last] = nil
	e.running = e.running[:last]
	p.slot = -1
}

// schedule (re)arms the engine's wake-up at its next event.
func (s *Sim) schedule(e *engine) {
	t, ok := e.reps.NextEvent()
	if !ok {
		e.pending = false
		return
	}
	if e.pending && t == e.wake {
		return
	}
	if t < s.now {
		panic(fmt.Sprintf("engine %s next event %v < now %v (clock %v down %v hung %v)", e.spec.ID, t, s.now, e.reps.Stats(), e.down, e.hung))
	}
	e.gen++
	e.wake, e.pending = t, true
	s.q.push(event{t: t, kind: evWake, a: int32(e.ix), gen: e.gen})
}

// Run simulates the scenario under one policy.
func Run(ctx context.Context, opt Options) (*PolicyResult, error) {
	s, err := newSim(ctx, opt)
	if err != nil {
		return nil, err
	}
	if err := s.loop(); err != nil {
		return nil, err
	}
	return s.result()
}

func newSim(ctx context.Context, opt Options) (*Sim, error) {
	sc := opt.Scenario
	if sc == nil || sc.Fleet == nil {
		return nil, fmt.Errorf("fleetsim: no scenario")
	}
	seed := sc.Seed
	if opt.Seed != 0 {
		seed = opt.Seed
	}
	s := &Sim{sc: sc, spec: sc.Fleet, opt: opt, seed: seed, ctx: ctx,
		arr: rand.New(rand.NewPCG(seed, 0x617272)), rng: rand.New(rand.NewPCG(seed, 0x73696d)), classIx: map[string]int{}, frontOf: map[string]*frontend{},
		rate: 1, surge: 1, phase: 1, sysTokens: map[sysKey][]uint64{}}
	var err error
	if s.spec, s.tok, err = withSimTokenizer(sc.Fleet); err != nil {
		return nil, fmt.Errorf("fleetsim: the simulator's tokenizer: %w", err)
	}
	spec := s.spec
	for i, fe := range spec.Frontends {
		f := &frontend{ix: i, spec: fe, active: make([]int, len(spec.Engines))}
		for _, e := range spec.Engines {
			rtt, ok := spec.RTT(fe.Region, e.Region)
			if !ok {
				return nil, fmt.Errorf("fleetsim: no round trip between %s and %s", fe.Region, e.Region)
			}
			f.owd = append(f.owd, rtt/2)
		}
		s.fronts = append(s.fronts, f)
		if _, ok := s.frontOf[fe.Region]; !ok {
			s.frontOf[fe.Region] = f
		}
	}
	for i, e := range spec.Engines {
		prof, ok := spec.ProfileOf(e)
		if !ok {
			return nil, fmt.Errorf("fleetsim: engine %s: no profile for gpu %q model %q", e.ID, e.GPU, e.Model)
		}
		en := &engine{ix: i, spec: e, cfg: model.ConfigFromProfile(prof), region: e.Region, slow: 1, healthy: true}
		en.lis = &listener{s: s, e: en}
		if err := en.cfg.Validate(); err != nil {
			return nil, fmt.Errorf("fleetsim: engine %s: %w", e.ID, err)
		}
		if err := s.restart(en); err != nil {
			return nil, err
		}
		s.engines = append(s.engines, en)
	}
	ix := map[string]int{}
	for i, e := range spec.Engines {
		ix[e.ID] = i
	}
	for c, cl := range spec.Classes {
		s.classIx[cl.Name] = c
		var js []int
		for _, e := range spec.EligibleEngines(cl.Name) {
			js = append(js, ix[e.ID])
		}
		s.classEngines = append(s.classEngines, js)
	}
	if err := s.workload(); err != nil {
		return nil, err
	}
	s.end = lead + sc.Duration
	s.rec = newRecorder(s)
	pol, err := newPolicy(opt.Policy, s)
	if err != nil {
		return nil, err
	}
	s.pol = pol
	return s, nil
}

// restart gives an engine fresh replicas (a restarted process: empty cache).
func (s *Sim) restart(e *engine) error {
	reps, err := model.NewReplicas(max(e.spec.Replicas, 1), e.cfg, e.lis)
	if err != nil {
		return fmt.Errorf("fleetsim: engine %s: %w", e.spec.ID, err)
	}
	e.reps = reps
	e.pending = false
	// A new process: its counters start over.
	e.ttftSum, e.ttftCount, e.itlSum, e.itlCount, e.success, e.ttftIn = 0, 0, 0, 0, 0, nil
	e.gen++
	if e.slow != 1 || e.hung {
		s.setFaults(e, e.slow, e.hung, s.now)
	}
	return nil
}

func (s *Sim) workload() error {
	w := &s.sc.Workload
	switch w.Kind {
	case Sessions:
		opt := w.MultiTurn
		opt.Seed = s.seed
		// Sessions need ids for the session-affinity rival and the remap
		// count; ext_proc only sees them when the scenario sends them.
		mt, err := workload.NewMultiTurn(opt)
		if err != nil {
			return fmt.Errorf("fleetsim: workload: %w", err)
		}
		s.mt, s.src = mt, mt
	case Azure:
		rows, err := workload.LoadAzure(s.tracePath())
		if err != nil {
			return fmt.Errorf("fleetsim: workload: %w", err)
		}
		if w.Rows > 0 && w.Rows < len(rows) {
			rows = rows[:w.Rows]
		}
		if w.Window > 0 && len(rows) > 0 {
			t0 := rows[0].Time
			rows, err = traceWindow(rows, w.Window, s.seed, func(r workload.AzureRow) time.Duration { return r.Time.Sub(t0) })
			if err != nil {
				return err
			}
		}
		src, err := workload.NewAzure(rows, workload.AzureOptions{Format: workload.Chat, Seed: s.seed, Priorities: w.Priorities})
		if err != nil {
			return err
		}
		s.src = src
	case Mooncake:
		rows, err := workload.LoadMooncake(s.tracePath())
		if err != nil {
			return fmt.Errorf("fleetsim: workload: %w", err)
		}
		if w.Rows > 0 && w.Rows < len(rows) {
			rows = rows[:w.Rows]
		}
		if w.Window > 0 && len(rows) > 0 {
			t0 := rows[0].Timestamp
			rows, err = traceWindow(rows, w.Window, s.seed, func(r workload.MooncakeRow) time.Duration {
				return time.Duration(r.Timestamp-t0) * time.Millisecond
			})
			if err != nil {
				return err
			}
		}
		src, err := workload.NewMooncake(rows, workload.MooncakeOptions{Format: workload.Chat, Seed: s.seed, BlockTokens: w.BlockTokens,
			MaxOutputTokens: w.MaxOutputTokens, Priorities: w.Priorities})
		if err != nil {
			return err
		}
		s.src = src
	default:
		return fmt.Errorf("fleetsim: unknown workload kind %q", w.Kind)
	}
	return nil
}

// traceWindow returns the rows of seed's window of a trace (Workload.Window):
// window k = (seed − 1) mod n of the n whole windows the trace holds (at
// least one), the rows whose time since the trace's first row, at, falls in
// [k·window, (k+1)·window); seed 0 counts as seed 1.
func traceWindow[R any](rows []R, window time.Duration, seed uint64, at func(R) time.Duration) ([]R, error) {
	n := max(1, uint64((at(rows[len(rows)-1])+time.Millisecond)/window))
	k := time.Duration((max(seed, 1) - 1) % n)
	lo, hi := k*window, (k+1)*window
	var out []R
	for _, r := range rows {
		if t := at(r); t >= lo && t < hi {
			out = append(out, r)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("fleetsim: workload: seed %d's window [%v, %v) of the trace holds no row", seed, lo, hi)
	}
	return out, nil
}

func (s *Sim) tracePath() string {
	dir := s.opt.DataDir
	if dir == "" || dir == DefaultDataDir {
		dir = FindDataDir(s.sc.Dir)
	}
	if strings.HasPrefix(s.sc.Workload.Trace, "/") {
		return s.sc.Workload.Trace
	}
	return dir + "/" + s.sc.Workload.Trace
}

// DefaultDataDir is where traces are looked for: the repository's
// data/traces, from its root (FindDataDir looks further up when it is not
// there, as from a package directory or an example's).
const DefaultDataDir = "data/traces"

// FindDataDir returns DefaultDataDir if it exists, else the first
// data/traces directory found going up from the working directory or from
// the given directories (a scenario's own, symbolic links resolved), else
// DefaultDataDir (whose absence the trace loader then reports).
func FindDataDir(from ...string) string {
	if st, err := os.Stat(DefaultDataDir); err == nil && st.IsDir() {
		return DefaultDataDir
	}
	if wd, err := os.Getwd(); err == nil {
		from = append([]string{wd}, from...)
	}
	for _, dir := range from {
		if dir == "" {
			continue
		}
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			dir = real
		}
		dir, _ = filepath.Abs(dir)
		for range 8 {
			cand := filepath.Join(dir, "data", "traces")
			if st, err := os.Stat(cand); err == nil && st.IsDir() {
				return cand
			}
			parent := filepath.Dir(dir)
			if parent == dir {
				break
			}
			dir = parent
		}
	}
	return DefaultDataDir
}

func (s *Sim) loop() error {
	sc := s.sc
	// Control plane and Envoy timers start at 0; traffic at lead.
	s.q.push(event{t: 0, kind: evHealth})
	s.q.push(event{t: 0, kind: evSample})
	s.pol.Start()
	for i, f := range sc.Faults {
		s.q.push(event{t: lead + f.At, kind: evFault, a: int32(i)})
	}
	s.startTraffic()
	total := float64(s.end)
	lastProg := time.Duration(0)
	step := s.end / 200
	for s.q.len() > 0 {
		ev := s.q.pop()
		if ev.t < s.now {
			return fmt.Errorf("fleetsim: event %d at %v before now %v (a bug)", ev.kind, ev.t, s.now)
		}
		s.now = ev.t
		if s.now >= s.end && !s.stopped {
			s.stopped = true
		}
		if s.stopped && s.open == 0 {
			break
		}
		if s.now > s.end+drainLimit {
			break
		}
		if s.opt.Progress != nil && s.now-lastProg > step {
			lastProg = s.now
			s.opt.Progress(math.Min(1, float64(s.now)/total))
		}
		if err := s.dispatch(ev); err != nil {
			return err
		}
	}
	if err := s.ctx.Err(); err != nil {
		return err
	}
	// Whatever is still in flight failed (timed out).
	for _, e := range s.engines {
		for len(e.running) > 0 {
			p := e.running[len(e.running)-1]
			e.remove(p)
			s.finish(p, outcomeFailed)
		}
	}
	if s.opt.Progress != nil {
		s.opt.Progress(1)
	}
	return nil
}

func (s *Sim) dispatch(ev event) error {
	switch ev.kind {
	case evArrive:
		s.arrive(ev.p)
	case evNewSession:
		s.newSession(ev.a >= 0)
	case evTrace:
		s.nextTrace()
	case evDeliver:
		s.deliver(ev.p)
	case evWake:
		e := s.engines[ev.a]
		if ev.gen != e.gen {
			return nil // superseded
		}
		e.pending = false
		e.reps.Advance(s.now)
		s.schedule(e)
	case evReturn:
		s.returned(ev.p)
	case evRetry:
		s.route(ev.p)
	case evHealth:
		s.healthChecks()
		s.q.push(event{t: s.now + s.sc.Control.HealthCheckInterval, kind: evHealth})
	case evSample:
		s.rec.sample()
		if !s.stopped {
			s.q.push(event{t: s.now + sampleEvery, kind: evSample})
		}
	case evFault:
		s.fault(int(ev.a))
	default:
		s.pol.Event(ev)
	}
	if s.arrivals%1024 == 0 {
		if err := s.ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// sampleEvery is the time-series resolution.
const sampleEvery = time.Second

func (s *Sim) startTraffic() {
	w := &s.sc.Workload
	switch {
	case s.src.Timed():
		s.q.push(event{t: lead, kind: evTrace})
		// The first evTrace reads the first row and schedules it.
	case w.Users > 0:
		for u := 0; u < w.Users; u++ {
			// Users start spread over the first second.
			s.q.push(event{t: lead + time.Duration(s.arr.Float64()*float64(time.Second)), kind: evNewSession, a: -1})
		}
	default:
		s.q.push(event{t: lead, kind: evNewSession})
	}
	s.updateRate()
}

// updateRate recomputes the session-rate multiplier (rate phases × surges).
func (s *Sim) updateRate() {
	f := 1.0
	for _, ph := range s.sc.Workload.RatePhases {
		if s.now-lead >= ph.At {
			f = ph.Factor
		}
	}
	s.phase = f
	s.rate = s.phase * s.surge
}

// newSession starts a session; open loop schedules the next one.
func (s *Sim) newSession(open bool) {
	w := &s.sc.Workload
	if s.stopped || (s.opt.MaxArrivals > 0 && s.arrivals >= s.opt.MaxArrivals) {
		return
	}
	if w.MaxSessions > 0 && s.sessions >= w.MaxSessions {
		return
	}
	if w.Users == 0 && open {
		s.updateRate()
		if r := w.SessionsPerS * s.rate; r > 0 {
			s.q.push(event{t: s.now + time.Duration(s.arr.ExpFloat64()/r*float64(time.Second)), kind: evNewSession})
		} else {
			// Rate 0 for now: look again at the next phase boundary.
			s.q.push(event{t: s.now + time.Second, kind: evNewSession})
			return
		}
	}
	r, ok := s.src.Next(s.now - lead)
	if !ok {
		return
	}
	s.sessions++
	p := s.newRequest(r, int32(s.sessions-1))
	s.arrive(p)
}

// nextTrace sends the trace row due now and schedules the next one, at
// its offset divided by the time scale.
func (s *Sim) nextTrace() {
	if r := s.nextRow; r != nil {
		s.nextRow = nil
		if s.stopped || (s.opt.MaxArrivals > 0 && s.arrivals >= s.opt.MaxArrivals) {
			return
		}
		r.Region = pickShare(s.sc.Workload.Regions, s.arr)
		p := s.newRequest(*r, int32(s.sessions))
		s.sessions++
		s.arrive(p)
	}
	r, ok := s.src.Next(0)
	if !ok {
		return
	}
	s.nextRow = &r
	at := lead + time.Duration(float64(r.Offset)/s.sc.Workload.TimeScale)
	s.q.push(event{t: max(at, s.now), kind: evTrace})
}

func pickShare(sh []workload.Share, rng *rand.Rand) string {
	sum := 0.0
	for _, x := range sh {
		sum += x.Weight
	}
	v := rng.Float64() * sum
	for _, x := range sh {
		if v < x.Weight {
			return x.Name
		}
		v -= x.Weight
	}
	if len(sh) > 0 {
		return sh[len(sh)-1].Name
	}
	return ""
}

func (s *Sim) newRequest(r workload.Request, conv int32) *request {
	f := s.frontOf[r.Region]
	if f == nil {
		f = s.fronts[0]
	}
	for int(conv) >= len(s.convLast) {
		s.convLast = append(s.convLast, -1)
	}
	return &request{w: r, conv: conv, front: f, engine: -1, host: -1, slot: -1, sim: s}
}

func (p *request) s() *Sim { return p.sim }

// wall is the virtual now as the wall-clock time the control plane's code
// reads.
func (s *Sim) wall() time.Time { return epoch.Add(s.now) }

// arrive handles a request reaching its frontend at now.
func (s *Sim) arrive(p *request) {
	if s.stopped {
		return // the run is over: turns due later are not sent
	}
	s.arrivals++
	s.open++
	p.arrival = s.now
	p.prompt = s.promptTokens(p)
	if s.mt != nil {
		p.outTok = answerTokens(p)
	}
	s.rec.arrived(p)
	cl, err := s.spec.Classify(s.sc.Workload.Model, "", p.w.PromptTokens+p.w.MaxTokens)
	if err != nil {
		s.finish(p, outcomeRejected)
		return
	}
	p.class = s.classIx[cl.Name]
	if out := s.pol.Admit(p); out != outcomeAdmitted {
		s.finish(p, out)
		return
	}
	s.route(p)
}

// route picks the engine for the request's next attempt and sends it.
func (s *Sim) route(p *request) {
	j := s.pol.Pick(p)
	if j < 0 {
		s.finish(p, outcomeFailed) // no healthy upstream (503)
		return
	}
	p.engine = j
	p.attempt++
	p.front.active[j]++
	s.q.push(event{t: s.now + p.front.owd[j], kind: evDeliver, p: p})
}

// deliver: the request reaches engine p.engine.
func (s *Sim) deliver(p *request) {
	e := s.engines[p.engine]
	if e.down {
		// Connection refused: the failure travels back.
		p.headers = false
		p.aborted = true
		s.q.push(event{t: s.now + p.front.owd[e.ix], kind: evReturn, p: p})
		return
	}
	p.mr = model.Request{Prompt: p.prompt, MaxTokens: max(p.w.MaxTokens, 1), EndReason: model.FinishLength, Tag: p, Output: p.outTok,
		Hashes: s.blockHashes(p)}
	rep, err := e.reps.Submit(&p.mr, s.now)
	p.replica = rep
	if err != nil {
		// Too long for this engine: vLLM answers 400.
		p.headers, p.aborted = true, true
		s.q.push(event{t: s.now + p.front.owd[e.ix], kind: evReturn, p: p})
		s.schedule(e)
		return
	}
	p.headers = true
	e.add(p)
	s.schedule(e)
}

// promptTokens tokenizes p's prompt: the previous turn's tokens plus the
// new messages; a first turn's system prompt comes from a cache (sessions
// share a few).
func (s *Sim) promptTokens(p *request) []uint64 {
	if p.w.Prompt != "" {
		return tokens.Append(make([]uint64, 0, p.w.PromptTokens), p.w.Prompt)
	}
	msgs := p.w.Messages
	// Room for the answer and the next message, so the next turn's
	// prompt grows in place.
	room := p.w.PromptTokens + p.w.MaxTokens + 512
	if p.base != nil && p.baseMsgs <= len(msgs) {
		return tokens.AppendChat(growTo(p.base, room), msgs[p.baseMsgs:])
	}
	out := s.spareTokens(room)
	if len(msgs) > 0 && msgs[0].Role == "system" {
		k := sysKey{unsafe.StringData(msgs[0].Content), len(msgs[0].Content)}
		ts, ok := s.sysTokens[k]
		if !ok {
			ts = tokens.AppendChat(nil, msgs[:1])
			s.sysTokens[k] = ts
		}
		out = append(out, ts...)
		msgs = msgs[1:]
	}
	return tokens.AppendChat(out, msgs)
}

// sysKey identifies a shared system prompt string by its bytes' address.
type sysKey struct {
	p *byte
	n int
}

// answerText is the deterministic text of a chat answer of MaxTokens words.
func answerText(p *request) string {
	return words.Words(answerSeed(p), max(p.w.MaxTokens, 1))
}

// answerTokens are the token ids a follow-up prompt repeats the answer as:
// the assistant's role marker, then its words.
// (words.AppendIDs: the ids of answerText's words, without
// tokenizing it).
func answerTokens(p *request) []uint64 {
	out := make([]uint64, 1, max(p.w.MaxTokens, 1)+1)
	out[0] = tokens.RoleMarkerID("assistant")
	return words.AppendIDs(out, answerSeed(p), max(p.w.MaxTokens, 1))
}

func answerSeed(p *request) uint64 { return uint64(p.conv)<<20 ^ uint64(p.w.Turn) ^ 0x616e73 }

// returned: the response (or the failure) of p's current attempt reaches
// the frontend.
func (s *Sim) returned(p *request) {
	j := p.engine
	p.front.active[j]--
	failed := p.aborted
	s.pol.Attempted(p, failed)
	if failed {
		if !p.headers && p.retries > 0 {
			// Envoy retries on another host (previous_hosts) after its
			// back-off (25 ms base).
			p.retries--
			p.retried++
			p.tried = append(p.tried, int32(j))
			p.aborted = false
			s.q.push(event{t: s.now + 25*time.Millisecond, kind: evRetry, p: p})
			return
		}
		s.finish(p, outcomeFailed)
		return
	}
	s.finish(p, outcomeServed)
}

// finish records the request's end and starts the conversation's next
// turn.
func (s *Sim) finish(p *request, out outcome) {
	s.open--
	s.pol.Done(p, out)
	s.rec.done(p, out)
	if out != outcomeServed {
		s.sessionOver(p)
		return
	}
	if int(p.conv) < len(s.convLast) {
		s.convLast[p.conv] = int32(p.engine)
	}
	fu, ok := s.src.(workload.FollowUper)
	if !ok {
		s.sessionOver(p)
		return
	}
	if p.w.Turn >= p.w.Turns || s.stopped {
		s.sessionOver(p)
		return
	}
	// The answer's text, only for turns that have a next one (its tokens
	// went into the engine's cache already, as outTok).
	next, ok := fu.FollowUp(p.w, answerText(p))
	if !ok || s.stopped {
		s.sessionOver(p)
		return
	}
	np := &request{w: next, conv: p.conv, front: p.front, engine: -1, host: -1, slot: -1, sim: s,
		baseHashes: s.blockHashes(p),
		// p is over (the engine keeps hashes, not tokens): its prompt's
		// array can grow into the next turn's.
		base: append(p.prompt, p.outTok...), baseMsgs: len(p.w.Messages) + 1,
		bodyBase: p.bodyPre, bodyMsgs: len(p.w.Messages)}
	s.q.push(event{t: s.now + p.w.ThinkTime, kind: evArrive, p: np})
}

// sessionOver: a closed-loop user starts the next session.
func (s *Sim) sessionOver(p *request) {
	s.recycle(p)
	if s.sc.Workload.Users > 0 && !s.stopped {
		s.q.push(event{t: s.now + p.w.ThinkTime, kind: evNewSession, a: -1})
	}
}

// maxSpare bounds the arrays kept for reuse.
const maxSpare = 4096

// recycle keeps the arrays of a session's last request (its body, prompt
// tokens and block hashes: nothing refers to them once it ended) for the
// next sessions, so new conversations do not allocate and clear them.
func (s *Sim) recycle(p *request) {
	if b := p.bodyPre; cap(b) > 0 && len(s.spareBytes) < maxSpare {
		s.spareBytes = append(s.spareBytes, b[:0])
	}
	for _, t := range [][]uint64{p.prompt, p.hashes} {
		if cap(t) > 0 && len(s.spareToks) < maxSpare {
			s.spareToks = append(s.spareToks, t[:0])
		}
	}
	p.bodyPre, p.prompt, p.hashes = nil, nil, nil
}

// spareTokens is an empty token array of capacity at least n.
func (s *Sim) spareTokens(n int) []uint64 {
	if k := len(s.spareToks); k > 0 {
		t := s.spareToks[k-1]
		s.spareToks = s.spareToks[:k-1]
		return growTo(t, n)
	}
	return make([]uint64, 0, n)
}

// spareBody is an empty byte array of capacity at least n.
func (s *Sim) spareBody(n int) []byte {
	if k := len(s.spareBytes); k > 0 {
		b := s.spareBytes[k-1]
		s.spareBytes = s.spareBytes[:k-1]
		return growTo(b, n)
	}
	return make([]byte, 0, n)
}

// healthChecks is Envoy's active health checking (interval 2 s, two
// failures to mark a host unhealthy, two passes to bring it back; a hung
// engine times out). One verdict per engine stands for every frontend:
// their checks see the same engine at about the same time.
func (s *Sim) healthChecks() {
	for _, e := range s.engines {
		ok := !e.down && !e.hung
		changed := false
		if ok {
			e.hcFail = 0
			e.hcOK++
			if !e.healthy && e.hcOK >= 2 {
				e.healthy, changed = true, true
			}
		} else {
			e.hcOK = 0
			e.hcFail++
			if e.healthy && e.hcFail >= 2 {
				e.healthy, changed = false, true
			}
		}
		if changed {
			s.pol.HealthChanged(e.ix)
		}
	}
}

func (s *Sim) fault(i int) {
	if i < 0 {
		s.faultEnd(-i - 1)
		return
	}
	f := s.sc.Faults[i]
	switch f.Kind {
	case Crash:
		s.crash(s.engineByID(f.Engine))
	case Hang:
		e := s.engineByID(f.Engine)
		e.hung = true
		s.setFaults(e, e.slow, true, s.now)
		s.schedule(e)
	case Slowdown:
		e := s.engineByID(f.Engine)
		e.slow = f.Factor
		s.setFaults(e, e.slow, e.hung, s.now)
		s.schedule(e)
	case RegionLoss:
		for _, e := range s.engines {
			if e.region == f.Region {
				s.crash(e)
			}
		}
	case Surge:
		s.surge *= f.Factor
		s.updateRate()
	}
	if f.For > 0 {
		s.q.push(event{t: s.now + f.For, kind: evFault, a: int32(-i - 1)})
	}
	s.rec.mark(fmt.Sprintf("%s %s%s", f.Kind, f.Engine, f.Region))
}

func (s *Sim) faultEnd(i int) {
	f := s.sc.Faults[i]
	switch f.Kind {
	case Crash:
		s.recover(s.engineByID(f.Engine))
	case Hang:
		e := s.engineByID(f.Engine)
		e.hung = false
		s.setFaults(e, e.slow, false, s.now)
		s.schedule(e)
	case Slowdown:
		e := s.engineByID(f.Engine)
		e.slow = 1
		s.setFaults(e, 1, e.hung, s.now)
		s.schedule(e)
	case RegionLoss:
		for _, e := range s.engines {
			if e.region == f.Region {
				s.recover(e)
			}
		}
	case Surge:
		s.surge /= f.Factor
		s.updateRate()
	}
}

// setFaults applies a slowdown and a hang at now. The engine is advanced
// first: its slowdown applies to steps that start after its own clock, and
// between wake-ups a batched engine's clock may lag the simulation's.
func (s *Sim) setFaults(e *engine, slow float64, hang bool, now time.Duration) {
	e.reps.Advance(now)
	e.reps.SetFaults(slow, hang, now)
}

func (s *Sim) engineByID(id string) *engine {
	for _, e := range s.engines {
		if e.spec.ID == id {
			return e
		}
	}
	panic("fleetsim: unknown engine " + id) // validated by the scenario
}

// crash kills an engine: every request it holds fails (their streams
// reset after the headers went out, so Envoy does not retry them).
func (s *Sim) crash(e *engine) {
	if e.down {
		return
	}
	e.down = true
	for len(e.running) > 0 {
		p := e.running[len(e.running)-1]
		// Abort reports Finished (removing p from running) with
		// FinishAbort: the failure travels back to the frontend.
		e.reps.Abort(&p.mr, p.replica, s.now)
		e.remove(p)
	}
	e.pending = false
	e.gen++
}

// recover restarts a crashed engine with an empty cache.
func (s *Sim) recover(e *engine) {
	if !e.down {
		return
	}
	e.down = false
	if err := s.restart(e); err != nil {
		panic(err) // the config was valid at start
	}
}

// countBucket counts a first token at v seconds in vLLM's TTFT buckets
// (in: per bucket, the overflow last; allocated on first use).
func countBucket(in []float64, v float64) []float64 {
	if in == nil {
		in = make([]float64, len(model.TTFTBuckets)+1)
	}
	i, _ := slices.BinarySearch(model.TTFTBuckets, v) // le: v ≤ bound
	in[i]++
	return in
}

// ttftBuckets is what a scrape of the engine's TTFT histogram reads.
func (e *engine) ttftBuckets() *signals.Buckets {
	b := &signals.Buckets{Bounds: model.TTFTBuckets, Cumulative: make([]float64, len(model.TTFTBuckets))}
	c := 0.0
	for i := range b.Cumulative {
		if e.ttftIn != nil {
			c += e.ttftIn[i]
		}
		b.Cumulative[i] = c
	}
	return b
}
