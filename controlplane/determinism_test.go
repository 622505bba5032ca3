package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/internal/ordered"
)

// detFleetYAML is three regions, a frontend and two engines in each, two
// classes and two priorities: enough engines and flows that sums over maps
// have several terms.
const detFleetYAML = `name: det
regions: [{name: a}, {name: b}, {name: c}]
network: {same_region_rtt_ms: 1.3, links: [{a: a, b: b, rtt_ms: 37.7}, {a: b, b: c, rtt_ms: 21.1}, {a: a, b: c, rtt_ms: 55.3}]}
frontends:
  - {name: fa, region: a, node_id: fa}
  - {name: fb, region: b, node_id: fb}
  - {name: fc, region: c, node_id: fc}
models: [{name: m, max_context_tokens: 8192}]
profiles:
  - {gpu: H100, model: m, prefill_tokens_per_s: 25000, overhead_ms: 10, decode_step_ms: 6.5, decode_step_per_seq_ms: 0.055, kv_capacity_tokens: 450000}
classes:
  - {name: chat, model: m, mean_prompt_tokens: 300, mean_output_tokens: 150}
  - {name: rag, model: m, mean_prompt_tokens: 3000, mean_output_tokens: 90}
priorities: [{name: high, level: 0, shed_cost: 10000}, {name: low, level: 1, shed_cost: 100}]
engines:
  - {id: a1, address: "127.0.0.1:19101", region: a, gpu: H100, model: m}
  - {id: a2, address: "127.0.0.1:19102", region: a, gpu: H100, model: m}
  - {id: b1, address: "127.0.0.1:19103", region: b, gpu: H100, model: m}
  - {id: b2, address: "127.0.0.1:19104", region: b, gpu: H100, model: m}
  - {id: c1, address: "127.0.0.1:19105", region: c, gpu: H100, model: m}
  - {id: c2, address: "127.0.0.1:19106", region: c, gpu: H100, model: m}
`

// detInputs is cycle i's inputs; reverse builds every map in the opposite
// insertion order (Go's map iteration order varies anyway, run to run).
func detInputs(spec *fleet.Spec, now time.Time, i int, reverse bool) Inputs {
	order := func(n int) []int {
		o := make([]int, n)
		for k := range o {
			o[k] = k
		}
		if reverse {
			slices.Reverse(o)
		}
		return o
	}
	var ids []string
	for _, e := range spec.Engines {
		ids = append(ids, e.ID)
	}
	tr := signals.NewTracker(signals.TrackerOptions{StaleAfter: 5 * time.Second}, ids)
	for _, k := range order(len(ids)) {
		x := 1 + float64((k*7+i*3)%11)/13
		m0 := signals.Metrics{Success: 1000, PromptTokens: 1e5, GenTokens: 1e5, TTFTSum: 10, TTFTCount: 1000, ITLSum: 10, ITLCount: 1e5}
		m1 := m0
		m1.Success += 9.1 * x
		m1.PromptTokens += 9100 * x
		m1.GenTokens += 1333 * x
		m1.TTFTCount += 9.1 * x
		m1.TTFTSum += 9.1 * x * (0.031 + 0.013*float64(k%3)) * x
		m1.ITLCount += 1333 * x
		m1.ITLSum += 1333 * x * 0.0077 * x
		tr.Observe(signals.Sample{ID: ids[k], At: now.Add(-time.Second), Healthy: true})
		tr.Observe(signals.Sample{ID: ids[k], At: now.Add(-time.Second), Healthy: true, Metrics: m0})
		tr.Observe(signals.Sample{ID: ids[k], At: now, Healthy: true, Metrics: m1})
	}
	in := Inputs{Now: now, Engines: tr.Engines(now), Demand: map[signals.DemandKey]signals.DemandRate{},
		Evidence: map[string]signals.Evidence{}}
	// Demand that ends up overloaded in the later cycles (shedding).
	for _, f := range order(len(spec.Frontends)) {
		for _, c := range order(len(spec.Classes)) {
			for _, p := range order(len(spec.Priorities)) {
				r := (11.3 + 3.7*float64(f) + 1.9*float64(c) + 2.3*float64(p)) * (1 + 0.37*float64(i))
				in.Demand[signals.DemandKey{Node: spec.Frontends[f].NodeID, Class: spec.Classes[c].Name, Priority: spec.Priorities[p].Name}] = signals.DemandRate{
					RequestsPerS: r, ShedPerS: r * 0.01 * float64(i%3), PromptTokens: 300 + 2700*float64(c) + 0.1*float64(f), OutputTokens: 150 - 60*float64(c)}
			}
		}
	}
	for _, k := range order(len(spec.Engines)) {
		e := spec.Engines[k]
		ev := signals.Evidence{Responses: 90.7 + float64(k), Errors: 0.3 * float64((k+i)%4), HeaderLatencyCnt: 80, HeaderLatencyMs: 41.3,
			Completed: 88.1, CompletionSeconds: 88.1 * (1.7 + 0.9*float64(k%2)), CompletionPromptTokens: 88.1 * 900, CompletionOutputTokens: 88.1 * 130,
			CompletedByNode: map[string]float64{}}
		for _, f := range order(len(spec.Frontends)) {
			ev.CompletedByNode[spec.Frontends[f].NodeID] = 88.1 / 3 * (1 + 0.1*float64(f))
		}
		in.Evidence[e.Address] = ev
	}
	return in
}

// runDet runs eight cycles on a fresh controller and returns each cycle's
// outcome: the decisions and engine views as JSON (floats written exactly)
// and the published resources' content hashes.
func runDet(t *testing.T, spec *fleet.Spec, reverse bool) []string {
	t.Helper()
	c, err := NewController(spec, DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	now := time.Unix(1_800_000_000, 0)
	for i := 0; i < 8; i++ {
		now = now.Add(5 * time.Second)
		r, err := c.Step(context.Background(), detInputs(spec, now, i, reverse))
		if err != nil {
			t.Fatal(err)
		}
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		for _, n := range ordered.Keys(r.Nodes) {
			res := r.Nodes[n].Resources
			s += fmt.Sprintf("\n%s cds %s eds %s policy %s", n, res.ClusterVersion, res.EndpointVersion, res.PolicyHash)
		}
		out = append(out, s)
	}
	return out
}

// Replicas of the control plane must agree: the same inputs give the same
// output bit for bit, whatever order the input maps were built in and
// whatever order Go iterates them (it varies from run to run, so several
// runs are compared).
func TestStepIsDeterministic(t *testing.T) {
	spec, err := fleet.Parse([]byte(detFleetYAML))
	if err != nil {
		t.Fatal(err)
	}
	want := runDet(t, spec, false)
	if !strings.Contains(want[len(want)-1], `"shed_by_priority"`) {
		t.Fatal("the last cycles do not shed: the comparison would not cover shedding")
	}
	for run := 0; run < 6; run++ {
		got := runDet(t, spec, run%2 == 1)
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("run %d (reverse %v) cycle %d differs:\n%s\nvs\n%s", run, run%2 == 1, i, firstDiff(got[i], want[i]), firstDiff(want[i], got[i]))
			}
		}
	}
}

// firstDiff is a's text around where it first differs from b.
func firstDiff(a, b string) string {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	return a[max(0, i-120):min(len(a), i+120)]
}
