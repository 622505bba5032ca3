package translate

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"math"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/internal/golden"
)

var update = flag.Bool("update", false, "rewrite the golden files in xds/translate/testdata")

func sampleNode() Node {
	return Node{
		NodeID: "fe-us-east", Region: "us-east",
		Engines: map[string]Engine{
			"e1": {ID: "e1", Address: "10.0.0.1:8000", Region: "us-east", Health: Healthy},
			"e2": {ID: "e2", Address: "10.0.0.2:8000", Region: "us-east", Health: Healthy},
			// SGLang engines: llama70b-eu's cluster checks their path;
			// llama8b's checks /health (a 2–2 tie) and leaves them to the
			// control plane's probe.
			"e3": {ID: "e3", Address: "10.1.0.3:8000", Region: "eu-west", Health: Unknown, HealthPath: "/health_generate"},
			"e4": {ID: "e4", Address: "10.1.0.4:8000", Region: "eu-west", Health: Unhealthy, HealthPath: "/health_generate"},
		},
		Classes: []Class{
			{Name: "llama8b", Model: "llama-3.1-8b", MaxContextTokens: 8192,
				Weights:             map[string]float64{"e1": 0.5, "e2": 0.3, "e3": 0.2, "e4": 0},
				ShedByLevel:         map[uint32]float64{2: 0.1, 1: 0},
				RetryBudgetFraction: 0, MaxRetries: 0, LocalInflightLimit: 512, Utilization: 0.97, MeanOutputTokens: 200,
				TokenizerSHA256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", ChatTemplateTokens: 64},
			{Name: "llama70b-eu", Model: "llama-3.3-70b", Residency: "eu", MinContextTokens: 32768, MaxContextTokens: 131072,
				Weights:             map[string]float64{"e3": 0.0004, "e4": 0.9996},
				RetryBudgetFraction: 0.1, MaxRetries: 2, Utilization: 0.4},
		},
		Priorities:      []Priority{{Name: "batch", Level: 2}, {Name: "interactive", Level: 0}, {Name: "standard", Level: 1}},
		DefaultPriority: "standard",
		PolicyVersion:   "1764430000000",
		GeneratedAt:     time.Date(2026, 11, 29, 16, 0, 0, 0, time.UTC),
	}
}

// render is a stable text form: protojson's output varies its whitespace on
// purpose, so it is compacted and re-indented.
func render(t *testing.T, r *Resources) []byte {
	t.Helper()
	var parts []string
	add := func(kind string, m proto.Message) {
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		parts = append(parts, `{"kind":"`+kind+`","resource":`+string(b)+`}`)
	}
	for _, c := range r.Clusters {
		add("cluster", c)
	}
	for _, e := range r.Endpoints {
		add("endpoints", e)
	}
	add("policy", r.Policy)
	w, err := json.Marshal(r.Weights)
	if err != nil {
		t.Fatal(err)
	}
	parts = append(parts, `{"kind":"endpoint_weights","weights":`+string(w)+`}`)
	doc := `{"node":"` + r.NodeID + `","cluster_version":"` + r.ClusterVersion +
		`","endpoint_version":"` + r.EndpointVersion + `","policy_hash":"` + r.PolicyHash +
		`","resources":[` + strings.Join(parts, ",") + `]}`
	var compact, out bytes.Buffer
	if err := json.Compact(&compact, []byte(doc)); err != nil {
		t.Fatal(err)
	}
	if err := json.Indent(&out, compact.Bytes(), "", "  "); err != nil {
		t.Fatal(err)
	}
	out.WriteByte('\n')
	return out.Bytes()
}

func checkGolden(t *testing.T, name string, got []byte) {
	t.Helper()
	golden.Check(t, filepath.Join("testdata", name), got, *update, "`go test ./xds/translate -update`")
}

func TestGoldenMaglev(t *testing.T) {
	r, err := Translate(sampleNode(), DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "translate_maglev.golden.json", render(t, r))
}

func TestGoldenRingHash(t *testing.T) {
	o := DefaultOptions()
	o.LBPolicy = RingHash
	o.HashBalanceFactor = 0
	n := sampleNode()
	n.Classes = n.Classes[:1]
	r, err := Translate(n, o)
	if err != nil {
		t.Fatal(err)
	}
	checkGolden(t, "translate_ringhash.golden.json", render(t, r))
}

func TestEDSSetEqualsCDS(t *testing.T) {
	r, err := Translate(sampleNode(), DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	eds := map[string]bool{}
	for _, e := range r.Endpoints {
		eds[e.ClusterName] = true
	}
	cds := map[string]bool{}
	for _, c := range r.Clusters {
		if c.GetType() == clusterv3.Cluster_EDS {
			cds[c.Name] = true
		}
	}
	if len(eds) != len(cds) {
		t.Fatalf("EDS %v vs CDS %v", eds, cds)
	}
	for n := range cds {
		if !eds[n] {
			t.Errorf("CDS cluster %s has no EDS resource", n)
		}
	}
}

func TestWeightsAreIntegersAtLeastOne(t *testing.T) {
	r, err := Translate(sampleNode(), DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string][2]uint32{} // cluster → host → (priority, weight)
	for _, cla := range r.Endpoints {
		got[cla.ClusterName] = map[string][2]uint32{}
		for _, l := range cla.Endpoints {
			for _, e := range l.LbEndpoints {
				w := e.GetLoadBalancingWeight().GetValue()
				if w < 1 {
					t.Errorf("%s %s: weight %d", cla.ClusterName, e.GetEndpoint().Hostname, w)
				}
				got[cla.ClusterName][e.GetEndpoint().Hostname] = [2]uint32{l.Priority, w}
			}
		}
	}
	want := map[string]map[string][2]uint32{
		"inferlb_llama8b":     {"e1": {0, 500}, "e2": {0, 300}, "e3": {0, 200}, "e4": {1, 1}},
		"inferlb_llama70b-eu": {"e3": {0, 1}, "e4": {0, 1000}},
	}
	for c, hosts := range want {
		for h, pw := range hosts {
			if got[c][h] != pw {
				t.Errorf("%s %s: (priority, weight) = %v, want %v", c, h, got[c][h], pw)
			}
		}
	}
	// What Translate returns per endpoint is what the EDS carries.
	for class, ew := range r.Weights {
		cluster := DefaultOptions().ClusterName(class)
		if len(ew) != len(got[cluster]) {
			t.Errorf("class %s: returned %d endpoints, EDS has %d", class, len(ew), len(got[cluster]))
		}
		for id, w := range ew {
			if eds := got[cluster][id]; eds != [2]uint32{w.Priority, w.Weight} {
				t.Errorf("class %s engine %s: returned %+v, EDS has (priority, weight) %v", class, id, w, eds)
			}
		}
	}
}

func TestNoShareAnywhereSpreadsEvenly(t *testing.T) {
	n := sampleNode()
	n.Classes = []Class{{Name: "c", Weights: map[string]float64{"e1": 0, "e2": 0}}}
	r, err := Translate(n, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range r.Endpoints[0].Endpoints {
		if l.Priority != 0 {
			t.Errorf("priority %d, want 0 when no engine has a share", l.Priority)
		}
	}
}

func TestVersionsFollowContent(t *testing.T) {
	a, _ := Translate(sampleNode(), DefaultOptions())
	b, _ := Translate(sampleNode(), DefaultOptions())
	if a.ClusterVersion != b.ClusterVersion || a.EndpointVersion != b.EndpointVersion || a.PolicyHash != b.PolicyHash {
		t.Fatal("equal input, different versions")
	}
	n := sampleNode()
	n.Classes[0].Weights["e1"] = 0.6
	n.PolicyVersion = "other"
	c, _ := Translate(n, DefaultOptions())
	if c.ClusterVersion != a.ClusterVersion {
		t.Error("a weight change changed the CDS version")
	}
	if c.EndpointVersion == a.EndpointVersion {
		t.Error("a weight change kept the EDS version")
	}
	// The policy carries each class's endpoint weights (for an endpoint
	// picker), so a weight change is a policy change too.
	if c.PolicyHash == a.PolicyHash {
		t.Error("a weight change kept the policy hash")
	}
	v := sampleNode()
	v.PolicyVersion = "other"
	d, _ := Translate(v, DefaultOptions())
	if d.PolicyHash != a.PolicyHash {
		t.Error("policy hash depends on the version stamp")
	}
}

// TestPolicyCarriesTheEDSAssignment: an endpoint picker builds its table
// from the policy, so the policy's endpoints must be the EDS assignment's,
// endpoint for endpoint and in its order, with the cluster's load balancer;
// each carries its engine's prefill rate (prefill-aware placement).
func TestPolicyCarriesTheEDSAssignment(t *testing.T) {
	n := sampleNode()
	rates := map[string]float64{}
	i := 0
	for id, e := range n.Engines {
		i++
		e.PrefillTokensPerS = float64(1000 * i)
		rates[e.Address] = e.PrefillTokensPerS
		n.Engines[id] = e
	}
	r, err := Translate(n, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	o := DefaultOptions()
	lb := r.Policy.GetLoadBalancer()
	if lb.GetMaglevTableSize() != o.MaglevTableSize || lb.GetHashBalanceFactor() != o.HashBalanceFactor || lb.GetPolicy() != policyv1.LoadBalancer_MAGLEV {
		t.Errorf("load balancer %v, want the clusters' (table %d, factor %d, maglev)", lb, o.MaglevTableSize, o.HashBalanceFactor)
	}
	for i, cla := range r.Endpoints {
		cp := r.Policy.Classes[i]
		var want []string
		for _, loc := range cla.Endpoints {
			for _, e := range loc.LbEndpoints {
				sa := e.GetEndpoint().GetAddress().GetSocketAddress()
				hs := e.GetHealthStatus()
				want = append(want, fmt.Sprintf("%s:%d w%d p%d %v", sa.GetAddress(), sa.GetPortValue(), e.GetLoadBalancingWeight().GetValue(), loc.Priority,
					hs == corev3.HealthStatus_HEALTHY || hs == corev3.HealthStatus_UNKNOWN))
			}
		}
		var got []string
		for _, e := range cp.Endpoints {
			got = append(got, fmt.Sprintf("%s w%d p%d %v", e.Address, e.Weight, e.Priority, e.Healthy))
			if e.PrefillTokensPerS != rates[e.Address] {
				t.Errorf("class %s: endpoint %s carries prefill rate %v, want its engine's %v", cp.Name, e.Address, e.PrefillTokensPerS, rates[e.Address])
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("class %s: policy endpoints\n%v\nEDS\n%v", cp.Name, got, want)
		}
	}
}

// A class's own bounded-load factor (the control plane tightens it where
// nothing is cached) goes to its cluster alone; the other class's cluster
// and the policy's load balancer (an endpoint picker's) keep the options'.
func TestClassHashBalanceFactor(t *testing.T) {
	n, o := sampleNode(), DefaultOptions()
	n.Classes[0].HashBalanceFactor = 100
	r, err := Translate(n, o)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint32{}
	for _, c := range r.Clusters {
		got[c.GetName()] = c.GetCommonLbConfig().GetConsistentHashingLbConfig().GetHashBalanceFactor().GetValue()
	}
	if got[o.ClusterName("llama8b")] != 100 || got[o.ClusterName("llama70b-eu")] != o.HashBalanceFactor {
		t.Errorf("cluster factors %v, want llama8b's 100 and llama70b-eu's %d", got, o.HashBalanceFactor)
	}
	if f := r.Policy.GetLoadBalancer().GetHashBalanceFactor(); f != o.HashBalanceFactor {
		t.Errorf("policy load balancer factor %d, want the options' %d", f, o.HashBalanceFactor)
	}
}

func TestBadInput(t *testing.T) {
	cases := map[string]struct {
		mut  func(*Node, *Options)
		want string
	}{
		"non-prime table": {func(n *Node, o *Options) { o.MaglevTableSize = 65536 }, "maglev_table_size"},
		"negative share":  {func(n *Node, o *Options) { n.Classes[0].Weights["e1"] = -1 }, "engine e1: share"},
		"unknown engine":  {func(n *Node, o *Options) { n.Classes[0].Weights["zz"] = 1 }, "engine zz: has a weight"},
		"bad address": {func(n *Node, o *Options) {
			n.Engines["e1"] = Engine{ID: "e1", Address: "10.0.0.1"}
		}, `address "10.0.0.1"`},
		"duplicate class":      {func(n *Node, o *Options) { n.Classes = append(n.Classes, n.Classes[0]) }, `class "llama8b" twice`},
		"balance factor":       {func(n *Node, o *Options) { o.HashBalanceFactor = 50 }, "hash_balance_factor"},
		"class balance factor": {func(n *Node, o *Options) { n.Classes[1].HashBalanceFactor = 99 }, "class llama70b-eu: hash_balance_factor 99"},
		"empty node":           {func(n *Node, o *Options) { n.NodeID = "" }, "node id is empty"},
		// Policy numbers ext_proc acts on: never passed on out of range.
		"shed above one":     {func(n *Node, o *Options) { n.Classes[0].ShedByLevel = map[uint32]float64{2: 1.5} }, "shed fraction of priority level 2 must be in [0, 1], got 1.5"},
		"negative shed":      {func(n *Node, o *Options) { n.Classes[0].ShedByLevel = map[uint32]float64{0: -0.1} }, "shed fraction of priority level 0"},
		"shed far above one": {func(n *Node, o *Options) { n.Classes[0].ShedByLevel = map[uint32]float64{1: 1 + 1e-6} }, "got 1.000001"},
		"NaN shed":           {func(n *Node, o *Options) { n.Classes[0].ShedByLevel = map[uint32]float64{1: math.NaN()} }, "got NaN"},
		"retry budget":       {func(n *Node, o *Options) { n.Classes[0].RetryBudgetFraction = 2 }, "retry budget fraction"},
		"utilization":        {func(n *Node, o *Options) { n.Classes[0].Utilization = math.Inf(1) }, "utilization must be"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			n, o := sampleNode(), DefaultOptions()
			tc.mut(&n, &o)
			_, err := Translate(n, o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want it to mention %q", err, tc.want)
			}
		})
	}
}

// A solver's rounding (a shed fraction a hair above 1) is not an error; the
// policy carries at most 1.
func TestShedFractionRoundingIsClamped(t *testing.T) {
	n := sampleNode()
	n.Classes[0].ShedByLevel = map[uint32]float64{1: 1 + 1e-12}
	r, err := Translate(n, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range r.Policy.Classes {
		if f := c.ShedFractionByLevel[1]; c.Name == n.Classes[0].Name && f != 1 {
			t.Errorf("class %s: shed fraction %v, want 1", c.Name, f)
		}
	}
}

// The one rule for an engine's place in EDS.
func TestEndpointWeights(t *testing.T) {
	cases := map[string]struct {
		shares map[string]float64
		want   map[string]EndpointWeight
	}{
		"shares to integers of the scale": {map[string]float64{"a": 1, "b": 2},
			map[string]EndpointWeight{"a": {333, 0}, "b": {667, 0}}},
		"a tiny share keeps weight 1": {map[string]float64{"a": 1, "d": 1e-9},
			map[string]EndpointWeight{"a": {1000, 0}, "d": {1, 0}}},
		"no share: failover at priority 1": {map[string]float64{"a": 0.7, "c": 0},
			map[string]EndpointWeight{"a": {1000, 0}, "c": {1, 1}}},
		"no share anywhere: all at priority 0": {map[string]float64{"a": 0, "b": 0},
			map[string]EndpointWeight{"a": {1, 0}, "b": {1, 0}}},
		"shares need not sum to 1": {map[string]float64{"a": 3, "b": 1, "c": 0},
			map[string]EndpointWeight{"a": {750, 0}, "b": {250, 0}, "c": {1, 1}}},
		"empty": {map[string]float64{}, map[string]EndpointWeight{}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := EndpointWeights(tc.shares, 1000)
			if !maps.Equal(got, tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
		})
	}
}
