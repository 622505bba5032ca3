package controlplane

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/optimizer"
)

// TestBalancePools: engines of a region share a pool when classes link
// them (an H100 serving long-context and general with the A100s serving
// general only); regions never share one; an engine no class uses is alone.
func TestBalancePools(t *testing.T) {
	for _, tc := range []struct {
		name     string
		regions  []string
		eligible [][]int // per class
		want     []int
	}{
		{"one class two regions", []string{"a", "a", "b", "b"}, [][]int{{0, 1, 2, 3}}, []int{0, 0, 2, 2}},
		{"linked by a second class", []string{"a", "a", "a"}, [][]int{{0, 1}, {1, 2}}, []int{0, 0, 0}},
		{"restricted class joins nothing new", []string{"a", "a", "a"}, [][]int{{0, 1, 2}, {0}}, []int{0, 0, 0}},
		{"disjoint classes in one region", []string{"a", "a", "a", "a"}, [][]int{{0, 1}, {2, 3}}, []int{0, 0, 2, 2}},
		{"unused engine", []string{"a", "a", "a"}, [][]int{{0, 1}}, []int{0, 0, 2}},
	} {
		var cls []optimizer.Class
		for _, e := range tc.eligible {
			cls = append(cls, optimizer.Class{ID: "c", Eligible: e})
		}
		got := balancePools(tc.regions, cls)
		// Compare as partitions: same pool iff same pool in want.
	pairs:
		for i := range got {
			for j := range got {
				if (got[i] == got[j]) != (tc.want[i] == tc.want[j]) {
					t.Errorf("%s: pools %v, want the partition %v", tc.name, got, tc.want)
					break pairs
				}
			}
		}
	}
}

// TestBalanceCaps: the cap is β × the pool's planned load over its
// capacity, plus the engine's own restricted load; a plan within its caps
// needs no second solve (nil); a cap at or above the headroom is none.
func TestBalanceCaps(t *testing.T) {
	eng := func(load, capa float64) optimizer.EngineResult {
		return optimizer.EngineResult{LoadRPS: load, CapacityRPS: capa}
	}
	for _, tc := range []struct {
		name       string
		engines    []optimizer.EngineResult
		pools      []int
		restricted []float64
		beta       float64
		want       []float64 // nil: no second solve
	}{
		{"balanced: nothing to do", []optimizer.EngineResult{eng(2, 10), eng(1, 5)}, []int{0, 0}, []float64{0, 0}, 1.3, nil},
		{"H100 busy, A100 idle", []optimizer.EngineResult{eng(3, 10), eng(0, 5)}, []int{0, 0}, []float64{0, 0}, 1.3,
			[]float64{1.3 * 3 / 15, 1.3 * 3 / 15}},
		{"pools apart", []optimizer.EngineResult{eng(3, 10), eng(0, 5), eng(1, 10)}, []int{0, 0, 2}, []float64{0, 0, 0}, 1.3,
			[]float64{1.3 * 3 / 15, 1.3 * 3 / 15, 1.3 * 1 / 10}},
		{"restricted load lifts its engine's cap", []optimizer.EngineResult{eng(3, 10), eng(0, 5)}, []int{0, 0}, []float64{1.5, 0}, 1.3,
			[]float64{1.3*1.5/15 + 1.5/10, 1.3 * 1.5 / 15}},
		// 1.3 × 8/11 ≥ the headroom 0.8: no engine capped, nothing to do.
		{"cap above the headroom is none", []optimizer.EngineResult{eng(8, 10), eng(0, 1)}, []int{0, 0}, []float64{0, 0}, 1.3, nil},
	} {
		got := balanceCaps(&optimizer.Solution{Engines: tc.engines}, tc.beta, 0.8, tc.pools, tc.restricted, nil)
		if tc.want == nil {
			if got != nil {
				t.Errorf("%s: caps %v, want none", tc.name, got)
			}
			continue
		}
		if !slices.EqualFunc(got, tc.want, func(a, b float64) bool { return math.Abs(a-b) < 1e-12 }) {
			t.Errorf("%s: caps %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestConfigBalanceFactor: 0 (off) and ≥ 1 are valid; anything else is
// refused naming the key.
func TestConfigBalanceFactor(t *testing.T) {
	for _, tc := range []struct {
		v  float64
		ok bool
	}{{0, true}, {1, true}, {1.3, true}, {0.5, false}, {-1, false}, {math.NaN(), false}, {math.Inf(1), false}} {
		c := DefaultConfig()
		c.BalanceFactor = tc.v
		err := c.Validate()
		if (err == nil) != tc.ok || (err != nil && !strings.Contains(err.Error(), "balance_factor")) {
			t.Errorf("balance_factor %v: %v (want ok=%v, naming balance_factor)", tc.v, err, tc.ok)
		}
	}
}

// capRefusing solves like the optimizer but fails every problem that
// carries a balance cap, standing in for a bounded plan that cannot be met.
type capRefusing struct {
	OptimizerAllocator
	capped *int
}

func (a capRefusing) Allocate(ctx context.Context, p *optimizer.Problem) (*optimizer.Solution, error) {
	for _, e := range p.Engines {
		if e.MaxUtilization > 0 {
			*a.capped++
			return nil, errors.New("infeasible under the caps")
		}
	}
	return a.OptimizerAllocator.Allocate(ctx, p)
}

// A bounded plan that fails leaves the unbounded one in force, and the
// cycle's result says so (a bound that never applies is not silent).
func TestBalanceSkippedIsReported(t *testing.T) {
	cfg := DefaultConfig()
	cfg.BalanceFactor = 1.0
	var capped int
	// One region of an H100 and a slower A100: the latency-minimizing plan
	// loads them unequally, so β = 1 caps the H100.
	y := testFleetYAML([4]string{"127.0.0.1:19001", "127.0.0.1:19002", "127.0.0.1:19003", "127.0.0.1:19004"})
	y = strings.Replace(y, "profiles:\n", "profiles:\n  - {gpu: A100, model: m, prefill_tokens_per_s: 9000, overhead_ms: 14, decode_step_ms: 11, decode_step_per_seq_ms: 0.1, kv_capacity_tokens: 150000}\n", 1)
	y = strings.Replace(y, "region: east, gpu: H100, model: m}\n  - {id: e-east-2, address: \"127.0.0.1:19002\", region: east, gpu: H100", "region: east, gpu: H100, model: m}\n  - {id: e-east-2, address: \"127.0.0.1:19002\", region: east, gpu: A100", 1)
	spec, err := fleet.Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(y, "gpu: A100, model: m}") {
		t.Fatal("the test fleet has no A100 engine")
	}
	c, err := NewController(spec, cfg, capRefusing{capped: &capped})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	r, err := c.Step(context.Background(), Inputs{Now: now, Engines: engines(now, nil), Demand: demand(40, 20)})
	if err != nil {
		t.Fatal(err)
	}
	if capped == 0 {
		t.Fatal("β = 1 proposed no cap on the test fleet: the test checks nothing")
	}
	if !strings.Contains(r.BalanceSkipped, "bounded plan failed: infeasible under the caps") {
		t.Errorf("balance_skipped %q, want the bounded plan's error", r.BalanceSkipped)
	}
	if r.Fallback != "" || len(r.Publish) != 2 {
		t.Errorf("the unbounded plan should stand: fallback %q, %d nodes published", r.Fallback, len(r.Publish))
	}
}

// TestBalanceEvenUtilization: the pool's even utilization is the one at
// which its traffic, each request counted at its work on each engine,
// loads every engine alike: the engines' request capacities at that
// utilization add up to the pool's requests. A long-prompt flow planned
// all on an H100 costs an A100 relatively more of its capacity, so that
// utilization is above the planned load over the pool's capacity, the
// cap the bound used to set, which left the bounded plan no room (it
// shed on shared-preamble and the unbounded plan stood).
func TestBalanceEvenUtilization(t *testing.T) {
	profs := exampleProfiles(t)
	if len(profs) != 2 {
		t.Fatalf("%d profiles, want the H100 and the A100", len(profs))
	}
	const rate = 3.0
	p := &optimizer.Problem{
		Frontends: []optimizer.Frontend{{ID: "fe"}},
		Classes:   []optimizer.Class{{ID: "long", PromptTokens: 4000, OutputTokens: 100, Eligible: []int{0, 1}}},
		Engines:   []optimizer.Engine{{ID: "h100", Profile: profs[0]}, {ID: "a100", Profile: profs[1]}},
		Demand:    [][]optimizer.Demand{{{RatePerS: []float64{rate}}}},
	}
	shape := p.FlowShape(0, 0)
	h, a := &profs[0], &profs[1]
	sol := &optimizer.Solution{
		Flows: []optimizer.Flow{{Frontend: "fe", Class: "long", Weights: []optimizer.Weight{{Engine: "h100", RatePerS: rate}}}},
		Engines: []optimizer.EngineResult{
			{ID: "h100", LoadRPS: rate * h.CapacityRPS / h.Capacity(shape), CapacityRPS: h.CapacityRPS},
			{ID: "a100", CapacityRPS: a.CapacityRPS},
		},
	}
	restricted, even := poolLoads(p, sol, []int{0, 0})
	if restricted[0] != 0 || restricted[1] != 0 {
		t.Errorf("restricted load %v, want none (the class may use the whole pool)", restricted)
	}
	u, ok := even[0]
	if !ok {
		t.Fatalf("no even utilization for the pool: %v", even)
	}
	if served := u * (h.Capacity(shape) + a.Capacity(shape)); math.Abs(served-rate) > 1e-9*rate {
		t.Errorf("at the even utilization %.4f the engines serve %.4f req/s of the flow, want %.1f", u, served, rate)
	}
	planned := sol.Engines[0].LoadRPS / (h.CapacityRPS + a.CapacityRPS)
	t.Logf("even utilization %.4f, planned load over capacity %.4f", u, planned)
	if !(u > planned) {
		t.Errorf("even utilization %.4f not above the planned load over capacity %.4f: the test does not reach the difference", u, planned)
	}
}

// exampleProfiles are the optimizer profiles of examples/fleet-3region.yaml
// (its H100 and its A100) at the 200/200-token reference request.
func exampleProfiles(t *testing.T) []optimizer.Profile {
	t.Helper()
	spec, err := fleet.Load("../examples/fleet-3region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var profs []optimizer.Profile
	for _, fp := range spec.Profiles {
		pr, err := ProfileFromFleet(fp, 200, 200)
		if err != nil {
			t.Fatal(err)
		}
		profs = append(profs, pr)
	}
	return profs
}

// TestLiftForShed: a flow the bounded plan shed gets its work back as room
// under the caps of the engines its class may use, and only those (the
// A100 the long-context class may not use keeps its cap); a cap lifted to
// the headroom is no cap; a plan that shed nothing lifts nothing.
func TestLiftForShed(t *testing.T) {
	profs := exampleProfiles(t)
	problem := func(hcap float64) *optimizer.Problem {
		return &optimizer.Problem{
			Frontends: []optimizer.Frontend{{ID: "fe"}},
			Classes: []optimizer.Class{
				{ID: "general", PromptTokens: 200, OutputTokens: 200, Eligible: []int{0, 1}},
				{ID: "long", PromptTokens: 40000, OutputTokens: 500, Eligible: []int{0}},
			},
			Engines: []optimizer.Engine{{ID: "h100", Profile: profs[0], MaxUtilization: hcap}, {ID: "a100", Profile: profs[1], MaxUtilization: 0.3}},
			Demand:  [][]optimizer.Demand{{{RatePerS: []float64{5}}, {RatePerS: []float64{0.05}}}},
		}
	}
	const shed = 0.02
	sol := func(rate float64) *optimizer.Solution {
		return &optimizer.Solution{
			Flows: []optimizer.Flow{{Frontend: "fe", Class: "long", Shed: []optimizer.Shed{{Priority: "standard", RatePerS: rate}}}},
			Engines: []optimizer.EngineResult{
				{ID: "h100", CapacityRPS: profs[0].CapacityRPS}, {ID: "a100", CapacityRPS: profs[1].CapacityRPS},
			},
		}
	}
	q := problem(0.3)
	h := &profs[0]
	want := 0.3 + shed*h.CapacityRPS/h.Capacity(q.FlowShape(0, 1))/h.CapacityRPS
	if !liftForShed(q, sol(shed), 0.9) {
		t.Fatal("a shed flow lifted no cap")
	}
	if got := q.Engines[0].MaxUtilization; math.Abs(got-want) > 1e-12 || !(got > 0.3) {
		t.Errorf("h100 cap %.6f, want %.6f (its cap plus the shed flow's utilization on it)", got, want)
	}
	if got := q.Engines[1].MaxUtilization; got != 0.3 {
		t.Errorf("a100 cap %.3f moved: the long class may not use it", got)
	}
	q = problem(0.9 - 1e-9)
	if !liftForShed(q, sol(shed), 0.9) || q.Engines[0].MaxUtilization != 0 {
		t.Errorf("a cap lifted to the headroom is %.6f, want 0 (no cap)", q.Engines[0].MaxUtilization)
	}
	q = problem(0.3)
	if liftForShed(q, sol(0), 0.9) || q.Engines[0].MaxUtilization != 0.3 {
		t.Errorf("nothing shed, yet a cap moved: %.6f", q.Engines[0].MaxUtilization)
	}
}
