package controlplane

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"

	"gopkg.in/yaml.v3"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/optimizer"
)

// DemandFile is the demand input of `inferlb solve` (YAML; see
// examples/demand-3region.yaml): one cycle's demand per (frontend, class)
// and priority, plus the engine state and knobs a control plane would
// supply. Frontends, classes, priorities and engines are named as in the
// fleet spec.
type DemandFile struct {
	// Headroom caps utilization; default 0.85.
	Headroom *float64 `yaml:"headroom"`
	// StabilityMs is the cost of moving one request off its engine (a cold
	// KV cache); default 0 (no stability term).
	StabilityMs float64 `yaml:"stability_ms"`
	// PenaltyCostMs is charged per request per unit of outlier penalty
	// (Problem.PenaltyCostMs); default 0.
	PenaltyCostMs float64 `yaml:"penalty_cost_ms"`
	// RemapFactor: moved keys per unit of weight change (default 1.35).
	RemapFactor float64 `yaml:"remap_factor"`
	// Demand entries; a (frontend, class) not listed has no demand.
	Demand []DemandEntry `yaml:"demand"`
	// Engines optionally overrides engine state (default healthy, all
	// replicas ready, no penalty).
	Engines []EngineState `yaml:"engines"`
	// LastWeights[frontend][class][engine] is the previous allocation.
	LastWeights map[string]map[string]map[string]float64 `yaml:"last_weights"`
}

// DemandEntry is one (frontend, class) demand.
type DemandEntry struct {
	Frontend string `yaml:"frontend"`
	Class    string `yaml:"class"`
	// RatePerS maps a priority name to requests per second.
	RatePerS map[string]float64 `yaml:"rate_per_s"`
	// Mean request shape; 0 means the class's.
	PromptTokens float64 `yaml:"prompt_tokens"`
	OutputTokens float64 `yaml:"output_tokens"`
	// CachedPromptShare is the share of the prompt tokens the engines'
	// prefix caches hold (no prefill work); with a shape only.
	CachedPromptShare float64 `yaml:"cached_prompt_share"`
}

// EngineState is the observed state of one engine.
type EngineState struct {
	ID            string   `yaml:"id"`
	Health        *float64 `yaml:"health"`
	ReadyReplicas *float64 `yaml:"ready_replicas"`
	Penalty       float64  `yaml:"penalty"`
}

// ParseDemand decodes a demand file, rejecting unknown keys and trailing
// documents.
func ParseDemand(data []byte) (*DemandFile, error) {
	var d DemandFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&d); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: demand file is empty", optimizer.ErrInvalidProblem)
		}
		return nil, fmt.Errorf("%w: demand file: %v", optimizer.ErrInvalidProblem, err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("%w: demand file has more than one YAML document", optimizer.ErrInvalidProblem)
	}
	return &d, nil
}

// LoadDemand reads and parses a demand file.
func LoadDemand(path string) (*DemandFile, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("optimizer: %w", err)
	}
	d, err := ParseDemand(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return d, nil
}

// ReferenceShape is the reference request of a model's engines: the mean
// prompt and output tokens of the model's first class in the spec. A fleet
// profile's capacity_rps and measured curves are for this shape. ok is false
// when no class of the model gives a shape.
func ReferenceShape(spec *fleet.Spec, model string) (prompt, output float64, ok bool) {
	for _, cl := range spec.Classes {
		if cl.Model == model {
			return cl.MeanPromptTokens, cl.MeanOutputTokens, cl.MeanPromptTokens+cl.MeanOutputTokens > 0
		}
	}
	return 0, 0, false
}

// ProfileFromFleet derives an engine profile from a fleet profile's step
// model for a reference request of prompt and output tokens, honouring its
// capacity_rps override and its measured curves (ttft_curve, tbot_curve),
// which replace the derived ones.
func ProfileFromFleet(fp fleet.Profile, prompt, output float64) (optimizer.Profile, error) {
	p, err := optimizer.NewProfile(optimizer.StepModel{PrefillTokensPerS: fp.PrefillTokensPerS, OverheadMs: fp.OverheadMs,
		DecodeStepMs: fp.DecodeStepMs, DecodeStepPerSeqMs: fp.DecodeStepPerSeqMs, MaxRunning: fp.MaxRunning,
		KVCapacityTokens: fp.KVCapacityTokens}, prompt, output)
	if err != nil {
		return optimizer.Profile{}, fmt.Errorf("profile %s/%s: %w", fp.GPU, fp.Model, err)
	}
	if fp.CapacityRPS > 0 {
		p = p.WithCapacity(fp.CapacityRPS)
	}
	if c := fp.TTFTCurve; c != nil {
		p.TTFT = optimizer.Curve{Base: c.BaseMs, Linear: c.LinearMs, Queue: c.QueueMs}
	}
	if c := fp.TBOTCurve; c != nil {
		p.TBOT = optimizer.Curve{Base: c.BaseMs, Linear: c.LinearMs, Queue: c.QueueMs}
	}
	if err := p.Validate(); err != nil {
		return optimizer.Profile{}, fmt.Errorf("profile %s/%s: %w", fp.GPU, fp.Model, err)
	}
	return p, nil
}

// FromFleet builds a Problem from a fleet spec (built by fleet.Load, Parse
// or New) and a demand file. Frontend ids are the fleet's frontend names;
// RTTs come from the fleet's network (round trips by region pair); each
// engine's profile is its (GPU, model) profile with the first class of its
// model as the reference request.
func FromFleet(spec *fleet.Spec, d *DemandFile) (*optimizer.Problem, error) {
	p := &optimizer.Problem{Headroom: 0.85, StabilityMs: d.StabilityMs, PenaltyCostMs: d.PenaltyCostMs, RemapFactor: d.RemapFactor}
	if d.Headroom != nil {
		p.Headroom = *d.Headroom
	}
	for _, pr := range spec.Priorities {
		p.Priorities = append(p.Priorities, optimizer.Priority{Name: pr.Name, ShedCost: pr.ShedCost})
	}
	engIdx := map[string]int{}
	for j, e := range spec.Engines {
		engIdx[e.ID] = j
		fp, ok := spec.ProfileOf(e)
		if !ok {
			return nil, fmt.Errorf("%w: engine %q: no profile for gpu %q model %q", optimizer.ErrInvalidProblem, e.ID, e.GPU, e.Model)
		}
		refP, refO, ok := ReferenceShape(spec, e.Model)
		if !ok {
			return nil, fmt.Errorf("%w: engine %q: no class of model %q gives a reference request shape", optimizer.ErrInvalidProblem, e.ID, e.Model)
		}
		prof, err := ProfileFromFleet(fp, refP, refO)
		if err != nil {
			return nil, fmt.Errorf("engine %q: %w", e.ID, err)
		}
		reps := float64(e.Replicas)
		if reps <= 0 {
			reps = 1
		}
		p.Engines = append(p.Engines, optimizer.Engine{ID: e.ID, Profile: prof, Replicas: reps, ReadyReplicas: reps, Health: 1})
	}
	stated := map[string]int{}
	for k, st := range d.Engines {
		j, ok := engIdx[st.ID]
		if !ok {
			return nil, fmt.Errorf("%w: engines[%d]: unknown engine %q", optimizer.ErrInvalidProblem, k, st.ID)
		}
		// An engine stated twice is refused, like demand entries listed
		// twice: which of the two should win (the second's penalty even when
		// it states none?) is the user's call, not a silent rule.
		if prev, dup := stated[st.ID]; dup {
			return nil, fmt.Errorf("%w: engines[%d]: engine %q already stated in engines[%d]", optimizer.ErrInvalidProblem, k, st.ID, prev)
		}
		stated[st.ID] = k
		e := &p.Engines[j]
		if st.Health != nil {
			e.Health = *st.Health
		}
		if st.ReadyReplicas != nil {
			e.ReadyReplicas = *st.ReadyReplicas
		}
		e.Penalty = st.Penalty
	}
	clsIdx := map[string]int{}
	for c, cl := range spec.Classes {
		clsIdx[cl.Name] = c
		oc := optimizer.Class{ID: cl.Name, PromptTokens: cl.MeanPromptTokens, OutputTokens: cl.MeanOutputTokens}
		for _, e := range spec.EligibleEngines(cl.Name) {
			oc.Eligible = append(oc.Eligible, engIdx[e.ID])
		}
		sort.Ints(oc.Eligible)
		p.Classes = append(p.Classes, oc)
	}
	feIdx := map[string]int{}
	p.RTTMs = make([][]float64, len(spec.Frontends))
	p.Demand = make([][]optimizer.Demand, len(spec.Frontends))
	for i, fe := range spec.Frontends {
		feIdx[fe.Name] = i
		p.Frontends = append(p.Frontends, optimizer.Frontend{ID: fe.Name})
		p.RTTMs[i] = make([]float64, len(spec.Engines))
		for j, e := range spec.Engines {
			ms, ok := spec.RTTMs(fe.Region, e.Region)
			if !ok {
				return nil, fmt.Errorf("%w: no round trip between regions %q and %q", optimizer.ErrInvalidProblem, fe.Region, e.Region)
			}
			p.RTTMs[i][j] = ms
		}
		p.Demand[i] = make([]optimizer.Demand, len(spec.Classes))
		for c := range p.Demand[i] {
			p.Demand[i][c].RatePerS = make([]float64, len(p.Priorities))
		}
	}
	priIdx := map[string]int{}
	for k, pr := range p.Priorities {
		priIdx[pr.Name] = k
	}
	seen := map[[2]int]bool{}
	for k, de := range d.Demand {
		i, ok := feIdx[de.Frontend]
		if !ok {
			return nil, fmt.Errorf("%w: demand[%d]: unknown frontend %q", optimizer.ErrInvalidProblem, k, de.Frontend)
		}
		c, ok := clsIdx[de.Class]
		if !ok {
			return nil, fmt.Errorf("%w: demand[%d]: unknown class %q", optimizer.ErrInvalidProblem, k, de.Class)
		}
		if seen[[2]int{i, c}] {
			return nil, fmt.Errorf("%w: demand[%d]: frontend %q class %q listed twice", optimizer.ErrInvalidProblem, k, de.Frontend, de.Class)
		}
		seen[[2]int{i, c}] = true
		dm := &p.Demand[i][c]
		dm.PromptTokens, dm.OutputTokens, dm.CachedPromptShare = de.PromptTokens, de.OutputTokens, de.CachedPromptShare
		if de.CachedPromptShare != 0 && de.PromptTokens <= 0 && de.OutputTokens <= 0 {
			return nil, fmt.Errorf("%w: demand[%d]: cached_prompt_share needs prompt_tokens or output_tokens (the shape it belongs to)", optimizer.ErrInvalidProblem, k)
		}
		for name, r := range de.RatePerS {
			pk, ok := priIdx[name]
			if !ok {
				return nil, fmt.Errorf("%w: demand[%d]: unknown priority %q", optimizer.ErrInvalidProblem, k, name)
			}
			dm.RatePerS[pk] = r
		}
	}
	if d.LastWeights != nil {
		p.Last = &optimizer.Allocation{Weights: d.LastWeights}
	}
	if err := p.Validate(); err != nil {
		return nil, err
	}
	return p, nil
}
