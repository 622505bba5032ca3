package controlplane

import (
	"context"
	"testing"
	"time"

	"github.com/inferlb/inferlb/controlplane/signals"
)

// A class whose traffic reuses nothing (no chain point two requests passed
// through, nothing cached) gets Envoy's tightest bounded load, 100, on its
// clusters; a repeated point in the prefix view, or a cached share above
// 2%, brings the configured factor back, and so does a view too small to
// judge at the start. The simulator's azure-conv and overload are such
// traffic (TTFT p99 -31% and -36% at 100, docs/control-plane.md).
func TestBoundedLoadTightensWhereNothingIsReused(t *testing.T) {
	view := func(reqs float64, repeated bool) map[string]signals.ClassPrefixes {
		v := signals.ClassPrefixes{Requests: reqs, Tokens: reqs * 200}
		for i := range int(reqs) {
			v.Points = append(v.Points, signals.PrefixPoint{Prefix: uint64(i + 1), DepthBytes: 512, Requests: 1, Upper: 1, Tokens: 128})
		}
		if repeated {
			v.Points[0].Requests = 2.5
		}
		return map[string]signals.ClassPrefixes{"chat": v}
	}
	traffic := func(cached float64) map[string]fake {
		m := map[string]fake{}
		for _, id := range []string{"e-east-1", "e-east-2", "e-west-1", "e-west-2"} {
			m[id] = fake{reqPerS: 10, promptTokS: 2000, cachedTokS: 2000 * cached, genTokS: 2000, ttftMs: 30, tbotMs: 8}
		}
		return m
	}
	c, err := NewController(testFleet(t), DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	conf := c.cfg.Translate.HashBalanceFactor
	now := time.Unix(1_800_000_000, 0)
	for i, step := range []struct {
		name     string
		prefixes map[string]signals.ClassPrefixes
		cached   float64
		want     uint32
	}{
		{"too few requests in the view to judge", view(3, false), 0, conf},
		{"nothing repeated, nothing cached", view(40, false), 0, tightFactor},
		// The smoothed share (ShapeSmoothing 20 s, a step of 5 s) lands
		// between 1% and 2%: tightened stays tightened.
		{"a cached share within the hysteresis", view(40, false), 0.068, tightFactor},
		{"a repeated point", view(40, true), 0, conf},
		{"nothing repeated again", view(40, false), 0, tightFactor},
		{"a cached share above 2%", view(40, false), 0.5, conf},
	} {
		now = now.Add(5 * time.Second)
		r, err := c.Step(context.Background(), Inputs{Now: now, Engines: engines(now, traffic(step.cached)), Demand: demand(40, 20), Prefixes: step.prefixes})
		if err != nil {
			t.Fatal(err)
		}
		if sh := r.Shapes["chat"].CachedShare; step.name == "a cached share within the hysteresis" && !(sh > noCacheShare && sh < 2*noCacheShare) {
			t.Fatalf("step %d: cached share %.4f, not within the hysteresis the step tests", i, sh)
		}
		for node, nd := range r.Nodes {
			for _, cl := range nd.Resources.Clusters {
				if got := cl.GetCommonLbConfig().GetConsistentHashingLbConfig().GetHashBalanceFactor().GetValue(); got != step.want {
					t.Errorf("step %d (%s): %s's cluster %s has hash_balance_factor %d, want %d (cached share %.3f)",
						i, step.name, node, cl.GetName(), got, step.want, r.Shapes["chat"].CachedShare)
				}
			}
		}
		if want := map[bool]uint32{true: tightFactor, false: 0}[step.want == tightFactor]; r.Shapes["chat"].HashBalanceFactor != want {
			t.Errorf("step %d (%s): the shape view says %d, want %d", i, step.name, r.Shapes["chat"].HashBalanceFactor, want)
		}
	}
}
