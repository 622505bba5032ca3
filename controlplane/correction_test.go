package controlplane

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/optimizer"
)

// TestProfileCorrectionKeepsNearTrafficNear: the fleet's H100 profile
// states a TTFT curve three times what the engines do (every coefficient
// of the derived curve × 3). fe-east asks 50 req/s of 200/200 requests of
// its two engines, fe-west 4 req/s; west is 60 ms away. Priced with the
// pessimistic curve, east's congestion looks worth the round trip and the
// first plan sends 37% of east's traffic west. The engines (fakes that
// follow the true curve at the load the plan gives them) report their real
// TTFT; every 5 s cycle the correction moves toward observed / predicted,
// and within 2 minutes of virtual time the plan keeps about as much of
// fe-east's traffic in east as the true profile's plan does: within 5
// points (measured: 23.7% west against the true plan's 19.3%; with a 60 ms
// round trip the tail-priced plan itself sends a fifth west; the last
// points are the optimizer's stability band, which a replan every 10% of
// correction closed but at a cost in remapped conversations: hot-region's
// p99 rose from 163 to 220 ms), with a factor ≤ 0.5 on the east engines'
// curve, shown with its reason in their views. Without the correction
// (correctionGain 0) the 37% stays; without the replan (correctionReplan
// +Inf) the stability term holds most of it: the last check fails either
// way.
func TestProfileCorrectionKeepsNearTrafficNear(t *testing.T) {
	truthSpec := testFleet(t)
	truth, err := ProfileFromFleet(truthSpec.Profiles[0], 200, 200)
	if err != nil {
		t.Fatal(err)
	}
	pessimistic := testFleet(t)
	pessimistic.Profiles[0].TTFTCurve = &fleet.Curve{BaseMs: 3 * truth.TTFT.Base, LinearMs: 3 * truth.TTFT.Linear, QueueMs: 3 * truth.TTFT.Queue}
	ref, _ := runCorrection(t, truthSpec, truth, false)
	last, first := runCorrection(t, pessimistic, truth, true)
	t.Logf("fe-east west share: pessimistic profile %.1f%% at first, %.1f%% after 2 minutes; true profile %.1f%%", 100*first, 100*last, 100*ref)
	if first < ref+0.05 {
		t.Fatalf("the pessimistic profile spills %.1f%% of fe-east at first, the true one %.1f%%: the test does not reach the correction", 100*first, 100*ref)
	}
	if last > ref+0.05 {
		t.Errorf("after 2 minutes fe-east still sends %.1f%% west (first plan: %.1f%%, the true profile's plan %.1f%%); want within 5 points", 100*last, 100*first, 100*ref)
	}
}

// runCorrection runs 2 minutes of 5 s cycles of spec's controller against
// fake engines that follow truth; it returns fe-east's share sent west at
// the end and at the first cycle.
func runCorrection(t *testing.T, spec *fleet.Spec, truth optimizer.Profile, check bool) (last, first float64) {
	c, err := NewController(spec, DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	const east, west = 50.0, 4.0
	f := map[string]fake{}
	for k := 0; k <= 24; k++ { // 2 minutes of 5 s cycles
		r, err := c.Step(ctx, Inputs{Now: now, Engines: engines(now, f), Demand: demand(east, west)})
		if err != nil {
			t.Fatal(err)
		}
		spill := share(r, "fe-east", "e-west-1", "e-west-2")
		if k == 0 {
			first = spill
		}
		last = spill
		if check && (k%4 == 0 || k == 24) {
			v := view(r, "e-east-1")
			t.Logf("t=%3ds: fe-east sends %.1f%% west; e-east-1 correction %.2f (%s)", 5*k, 100*spill, v.ProfileCorrection, v.ProfileCorrectionWhy)
		}
		// the engines serve what the plan sends them, at the true curve
		for _, id := range []string{"e-east-1", "e-east-2", "e-west-1", "e-west-2"} {
			rate := east*share(r, "fe-east", id) + west*share(r, "fe-west", id)
			u := rate / truth.CapacityRPS
			ttft, _ := truth.Latency(truth.Reference(), u)
			// No TBOT: the fakes report no running batch, against which the
			// penalty's TBOT check would find them slow.
			f[id] = fake{reqPerS: rate, promptTokS: 200 * rate, genTokS: 200 * rate, ttftMs: ttft}
		}
		now = now.Add(5 * time.Second)
		if check && k == 24 {
			for _, id := range []string{"e-east-1", "e-east-2"} {
				if v := view(r, id); !(v.ProfileCorrection <= 0.5) || v.ProfileCorrectionWhy == "" {
					t.Errorf("%s after 2 minutes: correction %.2f (%q), want ≤ 0.5 with its reason", id, v.ProfileCorrection, v.ProfileCorrectionWhy)
				}
			}
		}
	}
	return last, first
}

// TestProfileCorrectionIgnoresQueuedEngines: an engine with a lasting
// queue reports a TTFT that the queue sets (here 8× the profile's
// prediction): the correction holds at 1 with the queue as its reason,
// for as long as the queue lasts, and resumes once the queue drains.
func TestProfileCorrectionIgnoresQueuedEngines(t *testing.T) {
	spec := testFleet(t)
	c, err := NewController(spec, DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	truth, err := ProfileFromFleet(spec.Profiles[0], 200, 200)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	ttft, _ := truth.Latency(truth.Reference(), 0.5)
	step := func(waiting, ttftMs float64) EngineView {
		f := map[string]fake{}
		for _, id := range []string{"e-east-1", "e-east-2", "e-west-1", "e-west-2"} {
			f[id] = fake{reqPerS: 10, promptTokS: 2000, genTokS: 2000, ttftMs: ttft}
		}
		f["e-east-1"] = fake{reqPerS: 10, promptTokS: 2000, genTokS: 2000, ttftMs: ttftMs, waiting: waiting}
		r, err := c.Step(ctx, Inputs{Now: now, Engines: engines(now, f), Demand: demand(20, 20)})
		if err != nil {
			t.Fatal(err)
		}
		now = now.Add(5 * time.Second)
		return view(r, "e-east-1")
	}
	for k := 0; k < 10; k++ {
		v := step(4, 8*ttft)
		if v.ProfileCorrection != 1 || !strings.Contains(v.ProfileCorrectionWhy, "queue") {
			t.Fatalf("cycle %d, queue of 4, TTFT 8× the profile: correction %.2f (%q), want 1 held for the queue", k, v.ProfileCorrection, v.ProfileCorrectionWhy)
		}
	}
	v := step(0, 3*ttft)
	if !(v.ProfileCorrection > 1.1) {
		t.Errorf("queue drained, TTFT 3× the profile: correction %.2f (%q), want it to move up", v.ProfileCorrection, v.ProfileCorrectionWhy)
	}
}
