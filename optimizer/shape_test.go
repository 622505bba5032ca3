package optimizer

import (
	"errors"
	"math"
	"testing"
)

var (
	h100Step = StepModel{PrefillTokensPerS: 25000, OverheadMs: 10, DecodeStepMs: 6.5, DecodeStepPerSeqMs: 0.055,
		MaxRunning: 256, KVCapacityTokens: 450000}
	a100Step = StepModel{PrefillTokensPerS: 11000, OverheadMs: 15, DecodeStepMs: 13, DecodeStepPerSeqMs: 0.09,
		MaxRunning: 256, KVCapacityTokens: 450000}
	// the drill's engine: 4 running slots, a slow decode step
	slotStep = StepModel{PrefillTokensPerS: 20000, OverheadMs: 5, DecodeStepMs: 20, DecodeStepPerSeqMs: 1,
		MaxRunning: 4, KVCapacityTokens: 200000}
)

func mustProfile(t *testing.T, m StepModel, prompt, output float64) Profile {
	t.Helper()
	p, err := NewProfile(m, prompt, output)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// The work of a request: a cached prompt token costs no prefill, an output
// token costs more when the context bounds the batch by KV space, and the
// reference request is exactly one reference request.
func TestShapeWork(t *testing.T) {
	p := mustProfile(t, h100Step, 200, 200)
	near := func(what string, got, want float64) {
		t.Helper()
		if math.Abs(got-want) > 1e-9*math.Abs(want) {
			t.Errorf("%s = %.9g, want %.9g", what, got, want)
		}
	}
	near("reference ratio", p.Ratio(p.Reference()), 1)
	near("output cost at the reference context", p.OutputTokenSecAt(400), p.OutputTokenSec)
	ref := 200/25000.0 + 200*(0.0065/256+0.000055)
	near("reference work", 1/p.CapacityRPS, ref)

	// 1500-token prompts of which 85% are cache hits, 180 output tokens:
	// 225 tokens to prefill; the context (1680) leaves the batch at 256.
	hot := Shape{PromptTokens: 1500, OutputTokens: 180, CachedShare: 0.85}
	near("uncached prompt", hot.UncachedPromptTokens(), 225)
	near("cached work", 1/p.Capacity(hot), 225/25000.0+180*(0.0065/256+0.000055))
	cold := hot
	cold.CachedShare = 0
	if r1, r0 := p.Ratio(hot), p.Ratio(cold); !(r1 < 0.4*r0) {
		t.Errorf("85%% cache hits: ratio %.3f against %.3f uncached; the hits should remove most of the work", r1, r0)
	}
	// A 40,000-token context bounds the batch at 450000/40500 ≈ 11 running.
	long := Shape{PromptTokens: 40000, OutputTokens: 500, CachedShare: 0.9}
	beff := 450000 / 40500.0
	near("KV-bound output cost", p.OutputTokenSecAt(long.ContextTokens()), p.OutputTokenSec*(6.5/beff+0.055)/(6.5/256+0.055))
	near("KV-bound work", 1/p.Capacity(long), 4000/25000.0+500*(0.0065/beff+0.000055))
	// A cached prompt's KV still counts: caching shortens the prefill, not
	// the context.
	if p.OutputTokenSecAt(long.ContextTokens()) <= 2*p.OutputTokenSec {
		t.Error("a long cached context priced like a short one")
	}
	// capacity_rps scales every cost alike.
	q := p.WithCapacity(2 * p.CapacityRPS)
	near("ratio after WithCapacity", q.Ratio(long), p.Ratio(long))

	// Zero-load TTFT counts only the uncached prompt.
	t0, _ := p.Latency(hot, 0)
	near("zero-load TTFT of the cached shape", t0, p.TTFT.Base+(225-200)/25000.0*1000)
	t1, _ := p.Latency(cold, 0)
	if t1-t0 < 40 {
		t.Errorf("1275 more uncached tokens add %.1f ms of zero-load TTFT, want ≈ 51", t1-t0)
	}
}

func TestShapeValidation(t *testing.T) {
	p := twoEngineProblem(t, 10, Shape{PromptTokens: 200, OutputTokens: 200, CachedShare: 1.5})
	if err := p.Validate(); !errors.Is(err, ErrInvalidProblem) {
		t.Errorf("cached share 1.5: %v, want ErrInvalidProblem", err)
	}
	p = twoEngineProblem(t, 10, Shape{PromptTokens: 200, OutputTokens: 200})
	p.Classes[0].CachedPromptShare = -0.1
	if err := p.Validate(); !errors.Is(err, ErrInvalidProblem) {
		t.Errorf("class cached share -0.1: %v, want ErrInvalidProblem", err)
	}
	p = twoEngineProblem(t, 10, Shape{PromptTokens: 200, OutputTokens: 200})
	p.MarginalStretch = 1
	if err := p.Validate(); !errors.Is(err, ErrInvalidProblem) {
		t.Errorf("marginal stretch 1: %v, want ErrInvalidProblem", err)
	}
}

// twoEngineProblem: two H100s in one region, one class, three priorities
// (a third of the demand each), the flow's shape given in its demand.
func twoEngineProblem(t *testing.T, rate float64, s Shape) *Problem {
	t.Helper()
	prof := mustProfile(t, h100Step, 200, 200)
	return &Problem{
		Headroom:  0.85,
		Frontends: []Frontend{{ID: "fe"}},
		Engines: []Engine{{ID: "a", Profile: prof, Replicas: 1, ReadyReplicas: 1, Health: 1},
			{ID: "b", Profile: prof, Replicas: 1, ReadyReplicas: 1, Health: 1}},
		Classes:    []Class{{ID: "chat", PromptTokens: 200, OutputTokens: 200, Eligible: []int{0, 1}}},
		Priorities: []Priority{{Name: "top", ShedCost: 10000}, {Name: "mid", ShedCost: 2000}, {Name: "low", ShedCost: 200}},
		Demand: [][]Demand{{{RatePerS: []float64{rate / 3, rate / 3, rate / 3}, PromptTokens: s.PromptTokens,
			OutputTokens: s.OutputTokens, CachedPromptShare: s.CachedShare}}},
		RTTMs: [][]float64{{1, 1}},
	}
}

func shedRate(f *Flow) (total float64, byPriority map[string]float64) {
	byPriority = map[string]float64{}
	for _, s := range f.Shed {
		total += s.RatePerS
		byPriority[s.Priority] = s.RatePerS
	}
	return total, byPriority
}

// Multi-turn chat whose prompts are 85% prefix-cache hits fits two H100s at
// 60 requests/s; counted as if every prompt token were prefilled (the spec's
// shape, or the reports' token counts alone) it looks like 2.7× the load and
// a third of it is shed. This is what over-shed hot-region and skywalker.
func TestCachedShareAvoidsShedding(t *testing.T) {
	for _, method := range []Method{Fast, Reference} {
		hot := Shape{PromptTokens: 1500, OutputTokens: 180, CachedShare: 0.85}
		sol, err := Solve(twoEngineProblem(t, 60, hot), Options{Method: method})
		if err != nil {
			t.Fatal(err)
		}
		if shed, _ := shedRate(sol.Flow("fe", "chat")); shed > 1e-6 {
			t.Errorf("%v: cached shape: %.2f req/s shed, want none (utilization %.2f/%.2f)", method, shed,
				sol.Engines[0].Utilization, sol.Engines[1].Utilization)
		}
		cold := hot
		cold.CachedShare = 0
		sol, err = Solve(twoEngineProblem(t, 60, cold), Options{Method: method})
		if err != nil {
			t.Fatal(err)
		}
		shed, by := shedRate(sol.Flow("fe", "chat"))
		if shed < 15 || by["top"] > 1e-6 || by["low"] < 20-1e-6 {
			t.Errorf("%v: uncached shape: shed %.1f req/s %v; want ≥ 15, the low priority first and the top never", method, shed, by)
		}
	}
}

// FullUtilization puts the hockey stick where the shape has it: long
// uncached prompts (prefill interleaved with every decode step) turn near
// u = 0.75, cached chat later, and an engine bound by 4 running slots (whose
// latency barely grows with load in the model) never before the headroom.
// At the returned utilization one more request costs exactly stretch times
// its zero-load latency.
func TestFullUtilization(t *testing.T) {
	azure := Shape{PromptTokens: 1100, OutputTokens: 265}
	hot := Shape{PromptTokens: 1500, OutputTokens: 175, CachedShare: 0.84}
	for _, c := range []struct {
		name   string
		m      StepModel
		s      Shape
		lo, hi float64
	}{
		{"H100, ~1k uncached prompts", h100Step, azure, 0.70, 0.80},
		{"A100, ~1k uncached prompts", a100Step, azure, 0.68, 0.80},
		{"H100, cached chat", h100Step, hot, 0.83, 0.95},
		{"4 running slots, short requests", slotStep, Shape{PromptTokens: 40, OutputTokens: 16}, 0.95, 0.95},
	} {
		ref := Shape{PromptTokens: 200, OutputTokens: 200}
		if c.m == slotStep {
			ref = c.s
		}
		p := mustProfile(t, c.m, ref.PromptTokens, ref.OutputTokens)
		u := p.FullUtilization(c.s, 12, 0.95)
		t.Logf("%s: full at u = %.3f", c.name, u)
		if u < c.lo-1e-9 || u > c.hi+1e-9 {
			t.Errorf("%s: full at %.3f, want in [%.2f, %.2f]", c.name, u, c.lo, c.hi)
		}
		if u < 0.95 {
			lat := func(u float64) float64 { tt, tb := p.Latency(c.s, u); return tt + c.s.OutputTokens*tb }
			h := 1e-5
			marginal := lat(u) + u*(lat(u+h)-lat(u-h))/(2*h)
			if math.Abs(marginal-12*lat(0)) > 1e-3*lat(0) {
				t.Errorf("%s: marginal cost at %.3f is %.1f ms, want 12 × %.1f", c.name, u, marginal, lat(0))
			}
		}
		if u2 := p.FullUtilization(c.s, 24, 0.95); u2 < u {
			t.Errorf("%s: a larger stretch fills less (%.3f < %.3f)", c.name, u2, u)
		}
	}
}

// With MarginalStretch an overload of long uncached prompts is shed where
// the engines' latency turns, though the headroom still has room: lowest
// priority first, the top never; the same demand with cached prompts, or
// without the limit, sheds nothing.
func TestMarginalStretchShedsBeforeTheHockeyStick(t *testing.T) {
	azure := Shape{PromptTokens: 1100, OutputTokens: 265}
	prof := mustProfile(t, h100Step, 200, 200)
	rate := 0.82 * 2 * prof.Capacity(azure) // under the 0.85 headroom
	for _, method := range []Method{Fast, Reference} {
		p := twoEngineProblem(t, rate, azure)
		sol, err := Solve(p, Options{Method: method})
		if err != nil {
			t.Fatal(err)
		}
		if shed, _ := shedRate(sol.Flow("fe", "chat")); shed > 1e-6 {
			t.Fatalf("%v: without the limit %.2f req/s shed under the headroom", method, shed)
		}
		p.MarginalStretch = 12
		sol, err = Solve(p, Options{Method: method})
		if err != nil {
			t.Fatal(err)
		}
		full := prof.FullUtilization(azure, 12, 0.85)
		shed, by := shedRate(sol.Flow("fe", "chat"))
		want := rate * (1 - full/0.82)
		t.Logf("%v: full at u = %.3f: %.2f of %.2f req/s shed %v (limit %.2f of %.2f ref req/s)", method, full, shed, rate,
			by, sol.Engines[0].LimitRPS, sol.Engines[0].CapacityRPS)
		if math.Abs(shed-want) > 0.02*rate {
			t.Errorf("%v: shed %.2f req/s, want ≈ %.2f (demand above u = %.3f)", method, shed, want, full)
		}
		if by["top"] > 1e-6 || by["mid"] > 1e-6 {
			t.Errorf("%v: shed %v: the low priority alone should go", method, by)
		}
		if lim := sol.Engines[0].LimitRPS / sol.Engines[0].CapacityRPS; math.Abs(lim-full) > 1e-9 {
			t.Errorf("%v: engine limit at u = %.3f, want %.3f", method, lim, full)
		}
		cached := twoEngineProblem(t, rate, Shape{PromptTokens: 1100, OutputTokens: 265, CachedShare: 0.85})
		cached.MarginalStretch = 12
		sol, err = Solve(cached, Options{Method: method})
		if err != nil {
			t.Fatal(err)
		}
		if shed, _ := shedRate(sol.Flow("fe", "chat")); shed > 1e-6 {
			t.Errorf("%v: cached prompts: %.2f req/s shed", method, shed)
		}
	}
}
