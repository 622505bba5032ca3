package controlplane

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/internal/golden"
)

var update = flag.Bool("update", false, "rewrite the cycle goldens in controlplane/testdata")

// goldenStep is one cycle of a golden scenario.
type goldenStep struct {
	after    time.Duration // since the previous step
	engines  map[string]fake
	east     float64 // demand at fe-east (high priority), requests/s
	west     float64
	low      float64 // demand at fe-east, low priority
	evidence map[string]signals.Evidence
	prefixes bool // the shared-preamble prefix view for class chat
}

func busy(reqPerS float64) fake {
	return fake{reqPerS: reqPerS, promptTokS: 200 * reqPerS, genTokS: 200 * reqPerS, ttftMs: 30, tbotMs: 8}
}

func fleetAt(reqPerS float64, over map[string]fake) map[string]fake {
	m := map[string]fake{}
	for _, id := range []string{"e-east-1", "e-east-2", "e-west-1", "e-west-2"} {
		m[id] = busy(reqPerS)
	}
	for id, f := range over {
		m[id] = f
	}
	return m
}

// goldenScenarios cover what Step decides: regional weights, the deadband
// holding them, a down engine, a slow one's penalty and probe share, errors
// from ext_proc, overload and shedding, a split table.
var goldenScenarios = map[string][]goldenStep{
	"steady": {
		{east: 40, west: 20},
		{after: 5 * time.Second, engines: fleetAt(10, nil), east: 40.4, west: 20.2},
		{after: 5 * time.Second, engines: fleetAt(10, nil), east: 40, west: 20, prefixes: true},
	},
	"faults": {
		{engines: fleetAt(10, nil), east: 40, west: 20},
		{after: time.Second, engines: fleetAt(10, map[string]fake{"e-east-1": {down: true}}), east: 40, west: 20},
		{after: 5 * time.Second, engines: fleetAt(10, map[string]fake{"e-west-2": {reqPerS: 10, promptTokS: 2000, genTokS: 2000, ttftMs: 400, tbotMs: 8}}), east: 40, west: 20},
		{after: 5 * time.Second, engines: fleetAt(10, nil), east: 40, west: 20,
			evidence: map[string]signals.Evidence{"127.0.0.1:19002": {Responses: 100, Errors: 40}}},
	},
	"overload": {
		{engines: fleetAt(60, nil), east: 300, west: 200, low: 150},
		{after: 5 * time.Second, engines: fleetAt(60, nil), east: 100, west: 50, low: 20},
	},
}

// TestStepGolden pins Step's whole output (the admin view and the
// resources' versions) for fixed inputs, so a refactoring of the cycle can
// show it changed nothing. `go test ./controlplane -run TestStepGolden
// -update` rewrites the goldens when a change is intended.
func TestStepGolden(t *testing.T) {
	for name, steps := range goldenScenarios {
		t.Run(name, func(t *testing.T) {
			c, err := NewController(testFleet(t), DefaultConfig(), nil)
			if err != nil {
				t.Fatal(err)
			}
			now := time.Unix(1_800_000_000, 0)
			var out bytes.Buffer
			for i, s := range steps {
				now = now.Add(s.after)
				dem := demand(s.east, s.west)
				if s.low > 0 {
					dem[signals.DemandKey{Node: "fe-east", Class: "chat", Priority: "low"}] = signals.DemandRate{RequestsPerS: s.low, PromptTokens: 200, OutputTokens: 200}
				}
				in := Inputs{Now: now, Engines: engines(now, s.engines), Demand: dem, Evidence: s.evidence}
				if s.prefixes {
					in.Prefixes = map[string]signals.ClassPrefixes{"chat": preambleView(4000)}
				}
				r, err := c.Step(context.Background(), in)
				if err != nil {
					t.Fatalf("step %d: %v", i, err)
				}
				fmt.Fprintf(&out, "## step %d\n", i)
				out.Write(renderResult(t, r))
			}
			cycleGolden(t, filepath.Join("testdata", "cycle_"+name+".golden"), out.Bytes())
		})
	}
}

// renderResult is the cycle's output as stable text: the Result's JSON
// with numbers to 6 significant digits (the cycle sums floats over maps,
// whose order moves only the last digits) and each published node's
// versions and policy.
func renderResult(t *testing.T, r *Result) []byte {
	t.Helper()
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		t.Fatal(err)
	}
	pub := []any{}
	for _, p := range r.Publish {
		pol, err := protojson.Marshal(p.Policy)
		if err != nil {
			t.Fatal(err)
		}
		var pv any
		d := json.NewDecoder(bytes.NewReader(pol))
		d.UseNumber()
		if err := d.Decode(&pv); err != nil {
			t.Fatal(err)
		}
		pub = append(pub, map[string]any{"node": p.NodeID, "cluster_version": p.ClusterVersion,
			"endpoint_version": p.EndpointVersion, "policy_hash": p.PolicyHash, "policy": pv})
	}
	doc := map[string]any{"result": roundNumbers(v), "publish": roundNumbers(pub)}
	out, err := json.MarshalIndent(doc, "", " ")
	if err != nil {
		t.Fatal(err)
	}
	return append(out, '\n')
}

func roundNumbers(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = roundNumbers(e)
		}
	case []any:
		for i, e := range x {
			x[i] = roundNumbers(e)
		}
	case json.Number:
		f, err := x.Float64()
		if err != nil {
			return x
		}
		if math.Abs(f) < 1e-9 {
			f = 0
		}
		return json.Number(strconv.FormatFloat(f, 'g', 6, 64))
	}
	return v
}

func cycleGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	golden.Check(t, path, got, *update, "`go test ./controlplane -run TestStepGolden -update`")
}
