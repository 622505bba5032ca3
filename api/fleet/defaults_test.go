package fleet

import (
	"reflect"
	"strings"
	"testing"
)

// TestDefaults covers setDefaults branch by branch: an omitted field gets its
// default; a given one, even a wrong one, is kept for validate to judge.
func TestDefaults(t *testing.T) {
	cases := []struct {
		name string
		in   specDoc
		want func(d *specDoc) any // the part of the result to compare
		exp  any
	}{
		{"same-region RTT omitted",
			specDoc{}, func(d *specDoc) any { return *d.Network.SameRegionRTTMs }, 1.0},
		{"same-region RTT given (even negative) is kept",
			specDoc{Network: networkDoc{SameRegionRTTMs: ptr(-2.0)}}, func(d *specDoc) any { return *d.Network.SameRegionRTTMs }, -2.0},
		{"profile optional fields omitted",
			specDoc{Profiles: []profileDoc{{}}}, func(d *specDoc) any {
				p := d.Profiles[0]
				return [4]any{*p.OverheadMs, *p.MaxRunning, *p.MaxBatchedTokens, *p.BlockSize}
			}, [4]any{0.0, 256, 8192, 16}},
		{"profile optional fields given are kept",
			specDoc{Profiles: []profileDoc{{OverheadMs: ptr(-1.0), MaxRunning: ptr(0), MaxBatchedTokens: ptr(7), BlockSize: ptr(0)}}}, func(d *specDoc) any {
				p := d.Profiles[0]
				return [4]any{*p.OverheadMs, *p.MaxRunning, *p.MaxBatchedTokens, *p.BlockSize}
			}, [4]any{-1.0, 0, 7, 0}},
		{"profile required fields stay omitted",
			specDoc{Profiles: []profileDoc{{}}}, func(d *specDoc) any {
				p := d.Profiles[0]
				return [6]bool{p.PrefillTokensPerS == nil, p.DecodeStepMs == nil, p.DecodeStepPerSeqMs == nil, p.KVCapacityTokens == nil, p.MaxContextTokens == nil, p.CapacityRPS == nil}
			}, [6]bool{true, true, true, true, true, true}},
		{"classes omitted: one per named model, name made safe",
			specDoc{Models: []modelDoc{{Name: "m"}, {Name: ""}, {Name: "org/model:v1"}}}, func(d *specDoc) any {
				var out []string
				for _, c := range *d.Classes {
					out = append(out, c.Name+"="+c.Model)
				}
				return strings.Join(out, " ")
			}, "m=m org-model-v1=org/model:v1"},
		{"classes given empty stay empty",
			specDoc{Models: []modelDoc{{Name: "m"}}, Classes: &[]classDoc{}}, func(d *specDoc) any { return len(*d.Classes) }, 0},
		{"class affinity omitted",
			specDoc{Classes: &[]classDoc{{}}}, func(d *specDoc) any {
				a := (*d.Classes)[0].Affinity
				return [5]any{a.Mode, *a.Keys, *a.HotShare, a.SpreadMinPrefixTokens == nil, *a.GroupMinPrefixTokens}
			}, [5]any{"on", []string{"session", "prompt_cache_key", "user", "prefix"}, 0.5, true, 1024}},
		{"class affinity given is kept",
			specDoc{Classes: &[]classDoc{{Affinity: &affinityDoc{Mode: "x", Keys: &[]string{}, HotShare: ptr(-1.0), GroupMinPrefixTokens: ptr(0)}}}}, func(d *specDoc) any {
				a := (*d.Classes)[0].Affinity
				return [4]any{a.Mode, *a.Keys, *a.HotShare, *a.GroupMinPrefixTokens}
			}, [4]any{"x", []string{}, -1.0, 0}},
		{"class optional fields omitted",
			specDoc{Classes: &[]classDoc{{}}}, func(d *specDoc) any {
				c := (*d.Classes)[0]
				return [3]any{*c.MinContextTokens, *c.MeanPromptTokens, *c.MeanOutputTokens}
			}, [3]any{0, 200.0, 200.0}},
		{"long-context class: mean prompt half its minimum context",
			specDoc{Classes: &[]classDoc{{MinContextTokens: ptr(65536)}}}, func(d *specDoc) any {
				return *(*d.Classes)[0].MeanPromptTokens
			}, 32768.0},
		{"short minimum context keeps the 200-token prompt",
			specDoc{Classes: &[]classDoc{{MinContextTokens: ptr(100)}}}, func(d *specDoc) any {
				return *(*d.Classes)[0].MeanPromptTokens
			}, 200.0},
		{"engine server and health path omitted",
			specDoc{Engines: []engineDoc{{}, {Server: "sglang"}, {Server: "generic", HealthPath: "/ready"}, {Server: "llamacpp"}}}, func(d *specDoc) any {
				var out []string
				for _, e := range d.Engines {
					out = append(out, e.Server+" "+e.HealthPath)
				}
				return strings.Join(out, ", ")
			}, "vllm /health, sglang /health_generate, generic /ready, llamacpp /health"},
		{"model chat template tokens omitted; given kept",
			specDoc{Models: []modelDoc{{Name: "a"}, {Name: "b", ChatTemplateTokens: ptr(-3)}}}, func(d *specDoc) any {
				return [2]int{*d.Models[0].ChatTemplateTokens, *d.Models[1].ChatTemplateTokens}
			}, [2]int{64, -3}},
		{"class fields given are kept",
			specDoc{Classes: &[]classDoc{{MinContextTokens: ptr(-1), MeanPromptTokens: ptr(0.0), MeanOutputTokens: ptr(-3.0)}}}, func(d *specDoc) any {
				c := (*d.Classes)[0]
				return [3]any{*c.MinContextTokens, *c.MeanPromptTokens, *c.MeanOutputTokens}
			}, [3]any{-1, 0.0, -3.0}},
		{"priorities omitted: one default",
			specDoc{}, func(d *specDoc) any { return *d.Priorities }, []priorityDoc{{Name: "default", Level: ptr(0), ShedCost: ptr(1000.0)}}},
		{"priorities given empty stay empty",
			specDoc{Priorities: &[]priorityDoc{}}, func(d *specDoc) any { return len(*d.Priorities) }, 0},
		{"priority fields are not defaulted",
			specDoc{Priorities: &[]priorityDoc{{Name: "p"}}}, func(d *specDoc) any {
				p := (*d.Priorities)[0]
				return [2]bool{p.Level == nil, p.ShedCost == nil}
			}, [2]bool{true, true}},
		{"frontend node id omitted: its name",
			specDoc{Frontends: []Frontend{{Name: "f"}}}, func(d *specDoc) any { return d.Frontends[0].NodeID }, "f"},
		{"frontend node id given is kept",
			specDoc{Frontends: []Frontend{{Name: "f", NodeID: "n"}}}, func(d *specDoc) any { return d.Frontends[0].NodeID }, "n"},
		{"engine replicas omitted: 1",
			specDoc{Engines: []engineDoc{{}}}, func(d *specDoc) any { return *d.Engines[0].Replicas }, 1},
		{"engine replicas given (0) is kept",
			specDoc{Engines: []engineDoc{{Replicas: ptr(0)}}}, func(d *specDoc) any { return *d.Engines[0].Replicas }, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := tc.in
			setDefaults(&d)
			if got := tc.want(&d); !reflect.DeepEqual(got, tc.exp) {
				t.Errorf("got %#v, want %#v", got, tc.exp)
			}
		})
	}
}

// TestOmittedVersusWrong: the same field omitted parses, given as 0 fails.
func TestOmittedVersusWrong(t *testing.T) {
	s, err := Parse([]byte(edit(t, "replicas: 2, ", "")))
	if err != nil {
		t.Fatal(err)
	}
	if e, _ := s.EngineByID("e4"); e.Replicas != 1 {
		t.Errorf("omitted replicas = %d, want 1", e.Replicas)
	}
	if _, err := Parse([]byte(edit(t, "replicas: 2", "replicas: 0"))); err == nil {
		t.Error("replicas: 0 accepted")
	}
	// A YAML null counts as omitted.
	if _, err := Parse([]byte(edit(t, "replicas: 2", "replicas: ~"))); err != nil {
		t.Errorf("replicas: ~ : %v", err)
	}
}

// TestDocTagsMatchSpec keeps the document types' YAML keys equal to Spec's.
func TestDocTagsMatchSpec(t *testing.T) {
	pairs := []struct{ doc, spec reflect.Type }{
		{reflect.TypeFor[specDoc](), reflect.TypeFor[Spec]()},
		{reflect.TypeFor[networkDoc](), reflect.TypeFor[Network]()},
		{reflect.TypeFor[linkDoc](), reflect.TypeFor[Link]()},
		{reflect.TypeFor[modelDoc](), reflect.TypeFor[Model]()},
		{reflect.TypeFor[profileDoc](), reflect.TypeFor[Profile]()},
		{reflect.TypeFor[curveDoc](), reflect.TypeFor[Curve]()},
		{reflect.TypeFor[classDoc](), reflect.TypeFor[Class]()},
		{reflect.TypeFor[priorityDoc](), reflect.TypeFor[Priority]()},
		{reflect.TypeFor[engineDoc](), reflect.TypeFor[Engine]()},
	}
	for _, p := range pairs {
		d, s := fieldIndex(p.doc), fieldIndex(p.spec)
		for k := range s {
			if _, ok := d[k]; !ok {
				t.Errorf("%v has key %q, %v does not", p.spec, k, p.doc)
			}
		}
		for k := range d {
			if _, ok := s[k]; !ok {
				t.Errorf("%v has key %q, %v does not", p.doc, k, p.spec)
			}
		}
	}
}

// The spread threshold is derived from the class's engines: a tenth of the
// smallest KV cache among them, unless given.
func TestAffinitySpreadThresholdFromEngines(t *testing.T) {
	s, err := Parse([]byte(edit(t, "kv_capacity_tokens: 450000, max_context_tokens: 32768}", "kv_capacity_tokens: 200000, max_context_tokens: 32768}",
		"{name: long, model: m, min_context_tokens: 65536}", "{name: long, model: m, min_context_tokens: 65536, affinity: {spread_min_prefix_tokens: 7}}")))
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for _, c := range s.Classes {
		got[c.Name] = c.Affinity.SpreadMinPrefixTokens
	}
	// general and eu include A100 engines (200,000 tokens); long only H100s
	// (its own value wins anyway).
	if want := map[string]int{"general": 20000, "eu": 20000, "long": 7}; !reflect.DeepEqual(got, want) {
		t.Fatalf("spread_min_prefix_tokens %v, want %v", got, want)
	}
}
