package controlplane

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/extproc"
	"github.com/inferlb/inferlb/extproc/body"
	"github.com/inferlb/inferlb/xds/translate"
)

// shapedDemand is demand of one shape at both frontends, split over the
// priorities given.
func shapedDemand(east, west, prompt, output float64, prios ...string) map[signals.DemandKey]signals.DemandRate {
	d := map[signals.DemandKey]signals.DemandRate{}
	for _, pr := range prios {
		n := float64(len(prios))
		d[signals.DemandKey{Node: "fe-east", Class: "chat", Priority: pr}] = signals.DemandRate{RequestsPerS: east / n, PromptTokens: prompt, OutputTokens: output}
		d[signals.DemandKey{Node: "fe-west", Class: "chat", Priority: pr}] = signals.DemandRate{RequestsPerS: west / n, PromptTokens: prompt, OutputTokens: output}
	}
	return d
}

// busyEngines: each region's two engines share its frontend's requests/s
// of the given shape (each region's traffic stays in it: the plan keeps it
// there while its engines have room), hit of the prompt tokens from their
// prefix caches.
func busyEngines(now time.Time, east, west, prompt, output, hit float64) []signals.Engine {
	f := map[string]fake{}
	for _, id := range []string{"e-east-1", "e-east-2", "e-west-1", "e-west-2"} {
		r := east / 2
		if strings.HasPrefix(id, "e-west") {
			r = west / 2
		}
		f[id] = fake{reqPerS: r, promptTokS: r * prompt, cachedTokS: r * prompt * hit, genTokS: r * output}
	}
	return engines(now, f)
}

func step(t *testing.T, c *Controller, in Inputs) *Result {
	t.Helper()
	r, err := c.Step(context.Background(), in)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// The work per request the cycle plans with is learned: the fleet spec's
// shape until something is observed, then the reports' tokens per request
// and the engines' cached share, smoothed.
func TestShapeLearnedFromReportsAndEngines(t *testing.T) {
	c, err := NewController(testFleet(t), DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	r := step(t, c, Inputs{Now: now, Engines: engines(now, nil)})
	if s := r.Shapes["chat"]; s.PromptTokens != 200 || s.OutputTokens != 200 || s.CachedShare != 0 || s.Observed {
		t.Fatalf("before any report: %+v, want the spec's 200/200, nothing cached", s)
	}
	for k := 0; k < 4; k++ {
		now = now.Add(5 * time.Second)
		r = step(t, c, Inputs{Now: now, Engines: busyEngines(now, 30, 10, 1500, 180, 0.85), Demand: shapedDemand(30, 10, 1500, 180, "high", "low")})
	}
	s := r.Shapes["chat"]
	t.Logf("learned %+v", s)
	if math.Abs(s.PromptTokens-1500) > 15 || math.Abs(s.OutputTokens-180) > 2 || math.Abs(s.CachedShare-0.85) > 0.01 || !s.Observed || !s.CacheObserved {
		t.Errorf("learned %+v, want ≈ 1500/180 with 85%% cached", s)
	}
	// The plan counts each request at its learned work: what the engines
	// carry is our own traffic, not background load.
	for _, v := range r.Engines {
		if v.BackgroundLoad > 0 || math.Abs(v.PlannedUtilization-v.ObservedUtilization) > 0.02 {
			t.Errorf("%s: planned %.3f, observed %.3f, background %.3f", v.ID, v.PlannedUtilization, v.ObservedUtilization, v.BackgroundLoad)
		}
	}
	// A shift of the traffic is followed with the smoothing's time
	// constant, not at once.
	now = now.Add(5 * time.Second)
	r = step(t, c, Inputs{Now: now, Engines: busyEngines(now, 30, 10, 3000, 180, 0.85), Demand: shapedDemand(30, 10, 3000, 180, "high", "low")})
	if p := r.Shapes["chat"].PromptTokens; p < 1600 || p > 2000 {
		t.Errorf("one 5-s cycle after prompts doubled: %.0f tokens, want ≈ 1500 + 22%% of the step (ShapeSmoothing 20 s)", p)
	}
	// Without demand the shape is kept.
	for k := 0; k < 3; k++ {
		now = now.Add(5 * time.Second)
		r = step(t, c, Inputs{Now: now, Engines: engines(now, nil)})
	}
	if p := r.Shapes["chat"].PromptTokens; p < 1600 || p > 2000 {
		t.Errorf("an idle class lost its shape: %.0f prompt tokens", p)
	}
}

// Reports are outside input: a report's tokens per request count within 2×
// of what the class's engines processed per admitted request (widened to
// the spec's shape), a cache counter at most MaxCachedShare. A forged report
// can neither make capacity look unbounded nor shed everything.
func TestShapeBoundedByWhatEnginesProcessed(t *testing.T) {
	cases := []struct {
		name              string
		prompt, output    float64
		hit               float64
		wantPromptAtMost  float64
		wantPromptAtLeast float64
		wantOutputAtLeast float64
		wantCachedAtMost  float64
		bounded           string
	}{
		{"huge prompts claimed", 30000, 180, 0.5, 3000, 2900, 170, 0.5, "prompt above what the engines processed"},
		{"one-token requests claimed", 1, 1, 0.5, 200, 200, 90, 0.5, "prompt below what the engines processed; output below what the engines processed"},
		{"every token a cache hit", 1500, 180, 1, 1500, 1400, 170, DefaultConfig().MaxCachedShare, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewController(testFleet(t), DefaultConfig(), nil)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Unix(1_800_000_000, 0)
			// The engines processed 40 req/s of 1500/180-token requests.
			r := step(t, c, Inputs{Now: now, Engines: busyEngines(now, 30, 10, 1500, 180, tc.hit), Demand: shapedDemand(30, 10, tc.prompt, tc.output, "high")})
			s := r.Shapes["chat"]
			t.Logf("%+v", s)
			if s.PromptTokens > tc.wantPromptAtMost+1e-9 || s.PromptTokens < tc.wantPromptAtLeast-1e-9 || s.OutputTokens < tc.wantOutputAtLeast-1e-9 ||
				s.CachedShare > tc.wantCachedAtMost+1e-9 {
				t.Errorf("shape %+v: want prompt in [%g, %g], output ≥ %g, cached ≤ %g", s, tc.wantPromptAtLeast, tc.wantPromptAtMost,
					tc.wantOutputAtLeast, tc.wantCachedAtMost)
			}
			if s.Bounded != tc.bounded {
				t.Errorf("bounded %q, want %q", s.Bounded, tc.bounded)
			}
		})
	}
	// Before the engines saw any traffic a report cannot raise the work
	// above the fleet spec's shape.
	c, _ := NewController(testFleet(t), DefaultConfig(), nil)
	now := time.Unix(1_800_000_000, 0)
	r := step(t, c, Inputs{Now: now, Engines: engines(now, nil), Demand: shapedDemand(30, 10, 30000, 5000, "high")})
	if s := r.Shapes["chat"]; s.PromptTokens > 200+1e-9 || s.OutputTokens > 200+1e-9 || !strings.Contains(s.Bounded, "before the engines saw traffic") {
		t.Errorf("no engine evidence: %+v, want at most the spec's 200/200", s)
	}
}

// Multi-turn chat whose prompts the engines mostly serve from their
// caches fits the fleet; with the same tokens uncached it does not, and
// the low priority is shed. Counting every prompt token as prefill made the
// control plane shed where the engines had room (hot-region, skywalker).
func TestCycleCacheDiscountStopsShedding(t *testing.T) {
	for _, tc := range []struct {
		hit      float64
		wantShed bool
	}{{0.85, false}, {0, true}} {
		c, err := NewController(testFleet(t), DefaultConfig(), nil)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Unix(1_800_000_000, 0)
		// 60 req/s: with 85% hits ~35% of what four H100s serve; uncached
		// the engines are full (FullUtilization 0.64) at ~34 req/s.
		in := Inputs{Now: now, Engines: busyEngines(now, 36, 24, 1500, 180, tc.hit), Demand: shapedDemand(36, 24, 1500, 180, "high", "low")}
		r := step(t, c, in)
		shed := map[string]float64{}
		for _, n := range []string{"fe-east", "fe-west"} {
			for p, f := range r.Nodes[n].Classes["chat"].Shed {
				shed[n+"/"+p] = f
			}
		}
		t.Logf("hit rate %.2f: shapes %+v, shed %v, headroom %.2f", tc.hit, r.Shapes["chat"], shed, r.Headroom)
		if got := len(shed) > 0; got != tc.wantShed {
			t.Errorf("hit rate %.2f: shed %v, want shedding %v", tc.hit, shed, tc.wantShed)
		}
		if shed["fe-east/high"] > 0 || shed["fe-west/high"] > 0 {
			t.Errorf("hit rate %.2f: the top priority shed: %v", tc.hit, shed)
		}
	}
}

// An overload of a single priority sheds through ext_proc: the optimizer
// sheds the one level that has demand and reports the empty, less important
// levels as unshed, which ext_proc (shedding a level only while every less
// important one is shed entirely) took as "shed nothing". The policy
// publishes every less important level as shed.
func TestCycleSinglePriorityOverloadShedsThroughExtproc(t *testing.T) {
	c, err := NewController(testFleet(t), DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	// 1100/265-token uncached prompts at twice what four H100s serve.
	r := step(t, c, Inputs{Now: now, Engines: busyEngines(now, 70, 30, 1100, 265, 0), Demand: shapedDemand(70, 30, 1100, 265, "high")})
	cd := r.Nodes["fe-east"].Classes["chat"]
	if cd.Shed["high"] < 0.2 || cd.Shed["low"] != 1 {
		t.Fatalf("published shed %v, want high shed and the empty low level at 1", cd.Shed)
	}
	dec := extproc.NewDecider(now)
	if _, _, err := dec.SetPolicy(r.Nodes["fe-east"].Resources.Policy); err != nil {
		t.Fatal(err)
	}
	shed := 0
	const n = 400
	for i := 0; i < n; i++ {
		var dc extproc.Decision
		b := fmt.Sprintf(`{"model":"m","max_tokens":50,"messages":[{"role":"user","content":"question %d"}]}`, i)
		if rej := dec.Decide(extproc.Input{Kind: body.Chat, Priority: "high", Body: []byte(b)}, &dc); rej != nil {
			if !rej.Shed() {
				t.Fatalf("request %d refused, not shed: %v", i, rej)
			}
			shed++
			continue
		}
		dec.Release(&dc.Held)
	}
	t.Logf("policy sheds %.3f of the top priority; ext_proc shed %d of %d", cd.Shed["high"], shed, n)
	if want := cd.Shed["high"] * n; math.Abs(float64(shed)-want) > 0.1*n {
		t.Errorf("ext_proc shed %d of %d requests, the policy %.0f", shed, n, want)
	}
}

func TestConsistentShed(t *testing.T) {
	prios := []translate.Priority{{Name: "critical", Level: 0}, {Name: "standard", Level: 1}, {Name: "batch", Level: 2}}
	for _, tc := range []struct {
		in, want map[uint32]float64
	}{
		{map[uint32]float64{}, map[uint32]float64{}},
		{map[uint32]float64{2: 0.4}, map[uint32]float64{2: 0.4}},
		{map[uint32]float64{1: 0.3}, map[uint32]float64{1: 0.3, 2: 1}},                    // batch had no demand
		{map[uint32]float64{1: 0.3, 2: 0.9999999}, map[uint32]float64{1: 0.3, 2: 1}},      // solver's "fully"
		{map[uint32]float64{1: 1e-5, 2: 0.5}, map[uint32]float64{2: 0.5}},                 // noise dropped
		{map[uint32]float64{0: 0.1}, map[uint32]float64{0: 0.1, 1: 1, 2: 1}},              // the top too
		{map[uint32]float64{0: 1.0000000002, 2: 1}, map[uint32]float64{0: 1, 1: 1, 2: 1}}, // capped at 1
	} {
		if got := consistentShed(tc.in, prios); fmt.Sprint(got) != fmt.Sprint(tc.want) {
			t.Errorf("consistentShed(%v) = %v, want %v", tc.in, got, tc.want)
		}
	}
}
