package simreal

import (
	"context"
	"math"
	"path/filepath"
	"testing"

	"github.com/lni/goutils/leaktest"

	"github.com/inferlb/inferlb/tools/fleetsim"
)

// short is examples/simreal/scenario.yaml in 40 s: the same fleet and
// sessions, the surge (×3 for 15 s) from 15 s on.
const short = `
name: simreal-short
description: sim vs real, short
fleet: ../../examples/simreal/fleet.yaml
duration: 40s
warmup: 0s
seed: 5
slo: {ttft_ms: 1000, tpot_ms: 60}
workload:
  kind: sessions
  sessions_per_s: 1.5
  turns: {min: 2, max: 6}
  user_tokens: {min: 400, max: 1500}
  output_tokens: {min: 32, max: 128}
  system_prompts: 4
  system_prompt_tokens: 600
  think_time: 3s
  regions:
    - at: 0s
      shares: {a: 1}
faults:
  - {at: 15s, kind: surge, factor: 3, for: 15s}
policies: [inferlb]
`

// Tolerances of the short comparison on a loaded 2-core machine
// (docs/results/simreal.md reports the full-size gap). The real side runs at time scale 2, which
// halves what the machine adds in the engines' time (at time scale 1 on a
// busy machine the load generator's own send lag reaches the real p99).
// The median is the model's: real within 20% of the simulator's TTFT p50.
// The tail of 370 requests is a handful of them, on a shared machine (p99:
// below).
//
// The routing and the hit rate are the model's too, up to one close call:
// at this load, whether and where the plan spills to the far regions
// (b, c) is decided by a few milliseconds of predicted latency, and the
// two sides do not decide it alike. Nor does the simulator with the same
// seed and other engine addresses: prepare gives the engines fresh ports,
// which build other Maglev tables, so conversations land differently
// (one set of ports always gives the same figures; another set gives
// others, the p99 most of all). That close call moves an engine's share
// by up to about ten points and the hit rate by up to about six, so 12
// and 8 points hold the comparison to the model without measuring that
// one decision. The p99 (a handful of the 370 requests) moves with it, by
// up to about 2.5× real over sim, so its bound is a factor of 3 either
// way. A plan that routes differently fails it (a far engine at a fifth of
// the traffic it should not get).
const (
	tolP50      = 0.20
	tolHitPts   = 0.08
	tolP99      = 3.0
	tolSharePts = 0.12
	// tolPathMs bounds what the real request path adds on average beyond
	// the round trips the simulator models (Envoy, ext_proc, the load
	// generator, in the engines' time at time scale 2), and how far below
	// them it may be (timer granularity).
	tolPathMs = 25
)

// The simulator agrees with the real stack (Envoy, the control plane,
// ext_proc, engine-sim with the fleet's round trips, the load generator) on
// one short scenario with the same fleet, seed, sessions and session
// start times: TTFT p50, p99 and the hit rate within the tolerances above,
// and every request served on both sides. It runs in make test without the
// race detector (whose slowdown of the request path would be measured
// instead of the model), after the other packages.
func TestSimAgainstReal(t *testing.T) {
	defer leaktest.AfterTest(t)()
	if testing.Short() {
		t.Skip("runs the whole request path for about two minutes")
	}
	if raceEnabled {
		t.Skip("the race detector slows the real request path several-fold; make test runs this without it")
	}
	sc, err := fleetsim.ParseScenario([]byte(short), filepath.Join(".", "short.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), Options{Scenario: sc, TimeScale: 2, Dir: t.TempDir(), Progress: testWriter{t}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("sim:  %+v", rep.Sim)
	t.Logf("real: %+v", rep.Real)
	if rep.Sim.Errors != 0 || rep.Real.Errors != 0 {
		t.Errorf("requests lost: sim %d, real %d", rep.Sim.Errors, rep.Real.Errors)
	}
	if d := math.Abs(float64(rep.Real.Requests-rep.Sim.Requests)) / float64(rep.Sim.Requests); d > 0.05 {
		t.Errorf("served: sim %d, real %d (%.1f%% apart): the two sides did not send the same sessions", rep.Sim.Requests, rep.Real.Requests, 100*d)
	}
	if len(rep.Sim.Engines) != len(rep.Real.Engines) {
		t.Fatalf("engines: sim %d, real %d", len(rep.Sim.Engines), len(rep.Real.Engines))
	}
	for i, se := range rep.Sim.Engines {
		re := rep.Real.Engines[i]
		ss, rs := float64(se.Served)/float64(rep.Sim.Requests), float64(re.Served)/float64(rep.Real.Requests)
		if math.Abs(ss-rs) > tolSharePts {
			t.Errorf("engine %s served %.1f%% of the requests in the simulator, %.1f%% in the real stack, want within %.0f points", se.ID, 100*ss, 100*rs, 100*tolSharePts)
		}
	}
	// The network: the real path's mean (client TTFT − the engines' own)
	// is the emulated round trips plus Envoy's and ext_proc's time; the
	// simulator's is the round trips. Without the emulation, or with the
	// round trips modelled wrong on either side, this is what moves.
	if d := rep.Real.PathMs - rep.Sim.PathMs; d < -5 || d > tolPathMs {
		t.Errorf("request path, mean: sim %.1f ms (round trips), real %.1f ms: %+.1f ms, want within −5…+%d ms", rep.Sim.PathMs, rep.Real.PathMs, d, tolPathMs)
	}
	if math.Abs(rep.GapP50) > tolP50 {
		t.Errorf("TTFT p50: sim %.1f ms, real %.1f ms (%+.1f%%), want within %.0f%%", rep.Sim.TTFTP50, rep.Real.TTFTP50, 100*rep.GapP50, 100*tolP50)
	}
	if d := math.Abs(rep.Real.HitRate - rep.Sim.HitRate); d > tolHitPts {
		t.Errorf("hit rate: sim %.3f, real %.3f, want within %.0f points", rep.Sim.HitRate, rep.Real.HitRate, 100*tolHitPts)
	}
	if r := rep.Real.TTFTP99 / rep.Sim.TTFTP99; r > tolP99 || r < 1/tolP99 {
		t.Errorf("TTFT p99: sim %.1f ms, real %.1f ms (%.2f×), want within %g× either way", rep.Sim.TTFTP99, rep.Real.TTFTP99, r, tolP99)
	}
}

// prepare refuses what the real side cannot replay (faults other than
// surges, closed-loop users), cuts the warm-up to 0 (the load generator
// reports every request) and gives the engines fresh ports.
func TestPrepareRefuses(t *testing.T) {
	for _, tc := range []struct{ name, edit string }{
		{"crash", "faults:\n  - {at: 5s, kind: crash, engine: a-1, for: 5s}\n"},
		{"users", "workload:\n  kind: sessions\n  users: 4\n  turns: {min: 2, max: 3}\n  user_tokens: {min: 10, max: 20}\n  output_tokens: {min: 5, max: 10}\n  regions: [{at: 0s, shares: {a: 1}}]\n"},
	} {
		doc := "name: x\ndescription: x\nfleet: ../../examples/simreal/fleet.yaml\nduration: 20s\nseed: 1\n"
		if tc.name == "users" {
			doc += tc.edit
		} else {
			doc += "workload:\n  kind: sessions\n  sessions_per_s: 1\n  turns: {min: 2, max: 3}\n  user_tokens: {min: 10, max: 20}\n  output_tokens: {min: 5, max: 10}\n  regions: [{at: 0s, shares: {a: 1}}]\n" + tc.edit
		}
		sc, err := fleetsim.ParseScenario([]byte(doc), "x.yaml")
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if _, err := prepare(Options{Scenario: sc}); err == nil {
			t.Errorf("%s: prepare accepted a scenario the real side cannot run", tc.name)
		}
	}
	sc, err := fleetsim.ParseScenario([]byte(short), "short.yaml")
	if err != nil {
		t.Fatal(err)
	}
	got, err := prepare(Options{Scenario: sc})
	if err != nil {
		t.Fatal(err)
	}
	if got.Warmup != 0 || got.Fleet.Engines[0].Address == sc.Fleet.Engines[0].Address {
		t.Errorf("prepare: warm-up %v, engine address %s (was %s): want 0 and a fresh port", got.Warmup, got.Fleet.Engines[0].Address, sc.Fleet.Engines[0].Address)
	}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Log(string(b))
	return len(b), nil
}
