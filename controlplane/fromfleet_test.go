package controlplane

import (
	"errors"
	"math"
	"testing"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/optimizer"
)

func loadExample(t *testing.T) (*fleet.Spec, *DemandFile) {
	t.Helper()
	spec, err := fleet.Load("../examples/fleet-3region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	d, err := LoadDemand("../examples/demand-3region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return spec, d
}

// TestExampleDemand solves the example fleet and demand: us-east overflows
// to the nearest region (us-west, 70 ms, before eu-west, 80 ms) only as
// far as needed, EU-resident traffic stays in eu-west, nothing is shed, and
// every engine stays below its limit.
func TestExampleDemand(t *testing.T) {
	spec, d := loadExample(t)
	p, err := FromFleet(spec, d)
	if err != nil {
		t.Fatal(err)
	}
	sol, err := optimizer.Solve(p, optimizer.Options{})
	if err != nil {
		t.Fatal(err)
	}
	region := map[string]string{}
	for _, e := range spec.Engines {
		region[e.ID] = e.Region
	}
	for _, f := range sol.Flows {
		for _, s := range f.Shed {
			if s.RatePerS > 1e-9 {
				t.Errorf("%s/%s sheds %g req/s of %s", f.Frontend, f.Class, s.RatePerS, s.Priority)
			}
		}
		share := map[string]float64{}
		for _, w := range f.Weights {
			share[region[w.Engine]] += w.Weight
		}
		t.Logf("%s/%s: %.1f req/s, by region %v, TTFT %.0f ms TBOT %.1f ms", f.Frontend, f.Class, f.DemandPerS, share, f.TTFTMs, f.TBOTMs)
		if f.Class == "eu" && share["eu-west"] < 1-1e-12 && f.RoutedPerS > 0 {
			t.Errorf("EU-resident traffic leaves eu-west: %v", share)
		}
	}
	for _, e := range sol.Engines {
		if e.LoadRPS > e.LimitRPS*(1+1e-4) {
			t.Errorf("engine %s load %.3f above limit %.3f", e.ID, e.LoadRPS, e.LimitRPS)
		}
	}
}

func TestFromFleetErrors(t *testing.T) {
	spec, _ := loadExample(t)
	neg := -1.0
	for name, d := range map[string]*DemandFile{
		"unknown frontend": {Demand: []DemandEntry{{Frontend: "nope", Class: "general", RatePerS: map[string]float64{"critical": 1}}}},
		"unknown class":    {Demand: []DemandEntry{{Frontend: "frontend-us-east", Class: "nope", RatePerS: map[string]float64{"critical": 1}}}},
		"unknown priority": {Demand: []DemandEntry{{Frontend: "frontend-us-east", Class: "general", RatePerS: map[string]float64{"gold": 1}}}},
		"unknown engine":   {Engines: []EngineState{{ID: "nope"}}},
		"engine twice":     {Engines: []EngineState{{ID: "us-west-a100-3", Penalty: 0.2}, {ID: "us-west-a100-3"}}},
		"bad headroom":     {Headroom: &neg},
	} {
		if _, err := FromFleet(spec, d); !errors.Is(err, optimizer.ErrInvalidProblem) {
			t.Errorf("%s: got %v, want ErrInvalidProblem", name, err)
		}
	}
	d := &DemandFile{Demand: []DemandEntry{{Frontend: "frontend-us-east", Class: "general", RatePerS: map[string]float64{"critical": -1}}}}
	if _, err := FromFleet(spec, d); !errors.Is(err, optimizer.ErrNegativeDemand) {
		t.Errorf("negative demand: got %v", err)
	}
	if _, err := ParseDemand([]byte("demand: []\nbogus: 1\n")); !errors.Is(err, optimizer.ErrInvalidProblem) {
		t.Errorf("unknown key: got %v", err)
	}
	_ = math.Inf
}

// FuzzParseDemand: the demand parser never panics, and what it accepts
// either builds a valid problem or fails with a sentinel error.
func FuzzParseDemand(f *testing.F) {
	f.Add([]byte("headroom: 0.8\ndemand:\n  - {frontend: frontend-us-east, class: general, rate_per_s: {critical: 5}}\n"))
	f.Add([]byte("demand: []\nengines: [{id: us-east-h100-1, health: 0.5}]\n"))
	f.Add([]byte("last_weights: {frontend-us-east: {general: {us-east-h100-1: 1}}}\n"))
	f.Add([]byte("{"))
	spec, err := fleet.Load("../examples/fleet-3region.yaml")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d, err := ParseDemand(data)
		if err != nil {
			return
		}
		p, err := FromFleet(spec, d)
		if err != nil {
			if !errors.Is(err, optimizer.ErrInvalidProblem) && !errors.Is(err, optimizer.ErrNegativeDemand) && !errors.Is(err, optimizer.ErrNoEligibleEngine) {
				t.Fatalf("unexpected error kind: %v", err)
			}
			return
		}
		if err := p.Validate(); err != nil {
			t.Fatal(err)
		}
	})
}

// Measured curves in the fleet spec (what `inferlb profile` writes) replace
// the derived ones; capacity_rps still scales the per-token costs; curves
// without any growth with load are refused.
func TestProfileFromFleetUsesMeasuredCurves(t *testing.T) {
	spec, err := fleet.Parse([]byte(`name: t
regions: [{name: r}]
frontends: [{name: f, region: r}]
models: [{name: m, max_context_tokens: 8192}]
profiles:
  - {gpu: H100, model: m, prefill_tokens_per_s: 25000, overhead_ms: 10, decode_step_ms: 6.5, decode_step_per_seq_ms: 0.055,
     kv_capacity_tokens: 450000, capacity_rps: 12.5,
     ttft_curve: {base_ms: 40, linear_ms: 5, queue_ms: 2}, tbot_curve: {base_ms: 7, linear_ms: 3, queue_ms: 0.5}}
classes: [{name: c, model: m, mean_prompt_tokens: 1000, mean_output_tokens: 200}]
priorities: [{name: p, level: 0, shed_cost: 1000}]
engines: [{id: e, address: "127.0.0.1:9000", region: r, gpu: H100, model: m}]
`))
	if err != nil {
		t.Fatal(err)
	}
	fp := spec.Profiles[0]
	p, err := ProfileFromFleet(fp, 1000, 200)
	if err != nil {
		t.Fatal(err)
	}
	if p.TTFT != (optimizer.Curve{Base: 40, Linear: 5, Queue: 2}) || p.TBOT != (optimizer.Curve{Base: 7, Linear: 3, Queue: 0.5}) || p.CapacityRPS != 12.5 {
		t.Fatalf("profile %+v: want the spec's curves and capacity", p)
	}
	derived, err := ProfileFromFleet(fleet.Profile{GPU: fp.GPU, Model: fp.Model, PrefillTokensPerS: fp.PrefillTokensPerS,
		OverheadMs: fp.OverheadMs, DecodeStepMs: fp.DecodeStepMs, DecodeStepPerSeqMs: fp.DecodeStepPerSeqMs,
		MaxRunning: fp.MaxRunning, KVCapacityTokens: fp.KVCapacityTokens}, 1000, 200)
	if err != nil || derived.TTFT == p.TTFT {
		t.Fatalf("without curves: %+v, %v (want the derived curves)", derived.TTFT, err)
	}
	flat := fp
	flat.TTFTCurve = &fleet.Curve{BaseMs: 40}
	flat.TBOTCurve = &fleet.Curve{BaseMs: 7}
	if _, err := ProfileFromFleet(flat, 1000, 200); !errors.Is(err, optimizer.ErrNonConvexProfile) {
		t.Fatalf("curves flat in load: %v, want ErrNonConvexProfile", err)
	}
}
