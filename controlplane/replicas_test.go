package controlplane

import (
	"context"
	"testing"
	"time"

	"github.com/inferlb/inferlb/controlplane/signals"
)

// Two control-plane replicas fed the same signals publish the same
// resources, byte for byte (weights, health, shed fractions, versions):
// Envoy and ext_proc may take their configuration from either. Checked over
// cycles with shifting demand, a failing engine (penalty and probe share),
// a down engine and its recovery.
func TestReplicasAreDeterministic(t *testing.T) {
	ctx := context.Background()
	a, err := NewController(testFleet(t), DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewController(testFleet(t), DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	load := map[string]fake{}
	for _, id := range []string{"e-east-1", "e-east-2", "e-west-1", "e-west-2"} {
		load[id] = fake{reqPerS: 5, promptTokS: 1000, genTokS: 1000, ttftMs: 30, tbotMs: 7}
	}
	steps := []struct {
		mut  func(map[string]fake)
		ev   map[string]signals.Evidence
		east float64
	}{
		{nil, nil, 40},
		{nil, nil, 80},
		{nil, map[string]signals.Evidence{"127.0.0.1:19002": {Responses: 100, Errors: 40}}, 80},
		{func(m map[string]fake) { x := m["e-west-1"]; x.down = true; m["e-west-1"] = x }, nil, 200},
		{func(m map[string]fake) { x := m["e-west-1"]; x.down = false; m["e-west-1"] = x }, map[string]signals.Evidence{"127.0.0.1:19002": {Responses: 20}}, 120},
		{nil, nil, 30},
	}
	for i, st := range steps {
		now = now.Add(5 * time.Second)
		if st.mut != nil {
			st.mut(load)
		}
		in := Inputs{Now: now, Engines: engines(now, load), Demand: demand(st.east, 20), Evidence: st.ev}
		ra, err := a.Step(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		rb, err := b.Step(ctx, in)
		if err != nil {
			t.Fatal(err)
		}
		for node, na := range ra.Nodes {
			nb := rb.Nodes[node]
			x, y := na.Resources, nb.Resources
			if x.ClusterVersion != y.ClusterVersion || x.EndpointVersion != y.EndpointVersion || x.PolicyHash != y.PolicyHash ||
				x.Policy.GetVersion() != y.Policy.GetVersion() {
				t.Fatalf("step %d node %s: replicas differ: versions %s/%s/%s/%s vs %s/%s/%s/%s\nweights %v vs %v", i, node,
					x.ClusterVersion, x.EndpointVersion, x.PolicyHash, x.Policy.GetVersion(),
					y.ClusterVersion, y.EndpointVersion, y.PolicyHash, y.Policy.GetVersion(),
					na.Classes["chat"].Weights, nb.Classes["chat"].Weights)
			}
		}
	}
}
