package controlplane

import (
	"context"
	"testing"
	"time"

	"github.com/inferlb/inferlb/controlplane/signals"
)

// cachedEngines is an idle fleet with a prefix-cache hit rate: each engine
// looked up 10,000 prompt tokens in the last second and found hit of them.
func cachedEngines(now time.Time, hit float64) []signals.Engine {
	ids := []string{"e-east-1", "e-east-2", "e-west-1", "e-west-2"}
	tr := signals.NewTracker(signals.TrackerOptions{StaleAfter: 5 * time.Second}, ids)
	for _, id := range ids {
		m0 := signals.Metrics{Success: 1000, PromptTokens: 1e5, GenTokens: 1e5, PrefixQueries: 1e5, PrefixHits: 1e5 * hit}
		tr.Observe(signals.Sample{ID: id, At: now.Add(-time.Second), Healthy: true, Metrics: m0})
		m1 := m0
		m1.PrefixQueries += 1e4
		m1.PrefixHits += 1e4 * hit
		tr.Observe(signals.Sample{ID: id, At: now, Healthy: true, Metrics: m1})
	}
	return tr.Engines(now)
}

func promptDemand(east, west, prompt float64) map[signals.DemandKey]signals.DemandRate {
	d := demand(east, west)
	for k, v := range d {
		v.PromptTokens = prompt
		d[k] = v
	}
	return d
}

// The deadband publishes new weights when what they gain outweighs the
// cache misses they cause. fe-east's two identical engines get 600-token
// prompts; the optimum splits them 50/50. The latency gain of a move grows
// with the square of its size and with load, its misses linearly: from a
// published 54/46 (a 4% move) at 2 req/s with 90% of prompts cached the
// move is held; with nothing cached it is published; a lopsided split of a
// load near capacity is published with caches too. Smoothing and the optimizer's stability term
// are off: the deadband alone decides.
func TestDeadbandWeighsGainAgainstMisses(t *testing.T) {
	ctx := context.Background()
	run := func(published, hit, rate float64) *ClassDecision {
		t.Helper()
		cfg := DefaultConfig()
		cfg.DemandSmoothing, cfg.StabilityMs = 0, 0
		c, err := NewController(testFleet(t), cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Seed(map[string]map[string]map[string]float64{
			"fe-east": {"chat": {"e-east-1": published, "e-east-2": 1 - published}},
			"fe-west": {"chat": {"e-west-1": 0.5, "e-west-2": 0.5}},
		}, 1); err != nil {
			t.Fatal(err)
		}
		now := time.Unix(1_800_000_000, 0)
		r, err := c.Step(ctx, Inputs{Now: now, Engines: cachedEngines(now, hit), Demand: promptDemand(rate, 2, 600)})
		if err != nil {
			t.Fatal(err)
		}
		cd := r.Nodes["fe-east"].Classes["chat"]
		t.Logf("%.0f req/s, published %.2f, hit %.1f: proposed %.3f/%.3f, tv %.3f, gain %.2f, miss cost %.2f ms·req/s, held %v",
			rate, published, hit, cd.Proposed["e-east-1"], cd.Proposed["e-east-2"], cd.TVDistance, cd.Gain, cd.MissCost, cd.Held)
		if cd.TVDistance < cfg.DeadbandTV {
			t.Fatalf("the proposal moved by %.3f, not past the %.2f floor: the test does not reach the gain rule", cd.TVDistance, cfg.DeadbandTV)
		}
		return cd
	}
	if cd := run(0.54, 0.9, 2); !cd.Held || !(cd.Gain < cd.MissCost) {
		t.Errorf("4%% move, 90%% cached: held %v (gain %.2f, miss cost %.2f); want held", cd.Held, cd.Gain, cd.MissCost)
	} else if cd.Weights["e-east-1"] != 0.54 {
		t.Errorf("held weights %v, want the published 0.54/0.46", cd.Weights)
	}
	if cd := run(0.54, 0, 2); cd.Held || cd.MissCost != 0 {
		t.Errorf("4%% move, nothing cached: held %v, miss cost %.2f; want published", cd.Held, cd.MissCost)
	}
	// The objective prices TTFT, which hardly moves with load until an
	// engine nears its capacity: at 2 req/s even a 75/25 split gains less
	// than its misses cost (it is held), at 45 req/s a 90/10 split puts
	// 40 req/s on e-east-1, past its headroom, and the move pays.
	if cd := run(0.75, 0.9, 2); !cd.Held {
		t.Errorf("25%% move at 2 req/s, 90%% cached: published (gain %.2f, miss cost %.2f); want held", cd.Gain, cd.MissCost)
	}
	if cd := run(0.9, 0.9, 45); cd.Held || !(cd.Gain > cd.MissCost) {
		t.Errorf("40%% move at 45 req/s, 90%% cached: held %v (gain %.2f, miss cost %.2f); want published", cd.Held, cd.Gain, cd.MissCost)
	}
}
