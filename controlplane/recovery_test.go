package controlplane

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb/controlplane/signals"
)

// An engine failing half its requests loses its share at once, down to
// its probe share from the frontends nearest to it; without evidence its penalty is held (no traffic proves
// nothing); once its probe traffic comes back clean the penalty decays and
// it gets its share back, even at a load so low that moving traffic back
// gains almost no latency (where the stability term alone would hold the
// traffic away for good).
func TestCycleFailingEngineLosesAndRegainsItsShare(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Penalty.HalfLife = time.Second
	c, err := NewController(testFleet(t), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	quiet := func() map[string]fake {
		m := map[string]fake{}
		for _, id := range []string{"e-east-1", "e-east-2", "e-west-1", "e-west-2"} {
			m[id] = fake{reqPerS: 1, promptTokS: 200, genTokS: 200, ttftMs: 30, tbotMs: 7}
		}
		return m
	}
	step := func(ev map[string]signals.Evidence) *Result {
		t.Helper()
		r, err := c.Step(ctx, Inputs{Now: now, Engines: engines(now, quiet()), Demand: demand(0.3, 0.3), Evidence: ev})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	r := step(nil)
	base := share(r, "fe-east", "e-east-1")
	if base < 0.2 {
		t.Fatalf("healthy e-east-1 starts with share %.3f", base)
	}
	// 50% errors reported by ext_proc for e-east-1 (127.0.0.1:19001).
	now = now.Add(time.Second)
	r = step(map[string]signals.Evidence{"127.0.0.1:19001": {Responses: 100, Errors: 50}})
	probe := cfg.Penalty.MaxProbeShare // 0.5 req/s of 0.3 req/s: the largest probe share
	if got := share(r, "fe-east", "e-east-1"); math.Abs(got-probe) > 1e-9 {
		t.Fatalf("failing engine has share %.3f (penalty %.2f), want its probe share %.2f", got, view(r, "e-east-1").Penalty, probe)
	}
	// The probe comes from the nearest frontend with traffic alone: the
	// west frontend does not send a tenth of its traffic across regions
	// to probe an east engine.
	if got := share(r, "fe-west", "e-east-1"); got != 0 {
		t.Fatalf("fe-west gives the penalized east engine share %.3f, want 0: probing is fe-east's", got)
	}
	// No evidence (its probe requests not answered yet): held, decaying
	// heldSlowdown times slower than on evidence, not forgotten.
	p0 := view(r, "e-east-1").Penalty
	for k := 0; k < 5; k++ {
		now = now.Add(time.Second)
		r = step(nil)
	}
	if v, want := view(r, "e-east-1"), p0*math.Exp2(-5.0/heldSlowdown); math.Abs(v.Penalty-want) > 1e-9 || !strings.Contains(v.PenaltyWhy, "held") {
		t.Fatalf("penalty without evidence: %.2f (%s), want held, decaying slowly to %.2f", v.Penalty, v.PenaltyWhy, want)
	}
	// Recovery: its probe traffic is answered without errors; the penalty
	// decays below the cutoff within log2(0.9/0.01) ≈ 6.5 half-lives, and
	// the engine gets its share back.
	var back float64
	for k := 0; k < 12; k++ {
		now = now.Add(time.Second)
		r = step(map[string]signals.Evidence{"127.0.0.1:19001": {Responses: 5}})
		back = share(r, "fe-east", "e-east-1")
		if back >= base/2 {
			t.Logf("share %.3f → 0 → %.3f after %d s of recovery", base, back, k+1)
			return
		}
	}
	t.Fatalf("after 12 half-lives the recovered engine has share %.3f (was %.3f), penalty %.3f (%s)",
		back, base, view(r, "e-east-1").Penalty, view(r, "e-east-1").PenaltyWhy)
}

// One report of 3 errors of 3 responses must not set the largest penalty
// (0.9), and a penalty without evidence must not be held for good (an
// engine at weight 1 staying there minutes later): a report's penalty is
// worth the responses behind it, and without evidence a penalty decays
// with time. Without either, the first check sees 0.90 and the second
// 0.90 still.
func TestReportPenaltyBoundedAndDecaysWithTime(t *testing.T) {
	cfg := DefaultConfig()
	c, err := NewController(testFleet(t), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	quiet := map[string]fake{}
	for _, id := range []string{"e-east-1", "e-east-2", "e-west-1", "e-west-2"} {
		quiet[id] = fake{reqPerS: 1, promptTokS: 200, genTokS: 200, ttftMs: 30, tbotMs: 7}
	}
	step := func(ev map[string]signals.Evidence) *Result {
		t.Helper()
		r, err := c.Step(context.Background(), Inputs{Now: now, Engines: engines(now, quiet), Demand: demand(0.3, 0.3), Evidence: ev})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	base := share(step(nil), "fe-east", "e-east-1")
	now = now.Add(time.Second)
	r := step(map[string]signals.Evidence{"127.0.0.1:19001": {Responses: 3, Errors: 3}})
	small := view(r, "e-east-1").Penalty
	if small <= 0 || small > 0.2 {
		t.Errorf("3 errors of 3 responses: penalty %.2f, want in (0, 0.2]", small)
	}
	now = now.Add(time.Second)
	r = step(map[string]signals.Evidence{"127.0.0.1:19001": {Responses: 60, Errors: 60}})
	if p := view(r, "e-east-1").Penalty; p < cfg.Penalty.Max {
		t.Errorf("60 errors of 60 responses: penalty %.2f, want the largest %.2f", p, cfg.Penalty.Max)
	}
	// Three minutes without evidence (a cycle a second).
	for k := 0; k < 180; k++ {
		now = now.Add(time.Second)
		r = step(nil)
	}
	// Half-life 10 s × heldSlowdown: 0.9 → 0.11 in 180 s.
	if p, sh := view(r, "e-east-1").Penalty, share(r, "fe-east", "e-east-1"); p > 0.15 || sh < base/2 {
		t.Errorf("after 3 minutes without evidence: penalty %.3f, share %.3f (was %.3f); want ≤ 0.15 and at least half its share back", p, sh, base)
	}
}
