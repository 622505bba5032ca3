package kube

import (
	"strings"
	"testing"

	"github.com/inferlb/inferlb/api/fleet"
)

func TestParsePool(t *testing.T) {
	for in, want := range map[string]string{"llm/llama": "", "llama": "want namespace/name", "/llama": "want namespace/name",
		"llm/": "want namespace/name", "a/b/c": "want namespace/name"} {
		_, _, err := ParsePool(in)
		if (want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("ParsePool(%q) = %v, want %q", in, err, want)
		}
	}
}

const base = `regions: [{name: local}]
frontends: [{name: fe, region: local}]
models: [{name: m, max_context_tokens: 8192}]
profiles: [{gpu: H100, model: m, prefill_tokens_per_s: 25000, decode_step_ms: 6.5, decode_step_per_seq_ms: 0.05, kv_capacity_tokens: 100000}]
`

// The ConfigMap's spec: no engines of its own, and each discovered engine
// must name what it knows; the reason names the label to fix.
func TestBaseSpec(t *testing.T) {
	if _, err := parseBase([]byte(base + "engines: []\n")); err == nil || !strings.Contains(err.Error(), "lists no engines") {
		t.Errorf("a spec with engines: err = %v", err)
	}
	if _, err := parseBase([]byte("")); err == nil {
		t.Error("an empty spec was accepted")
	}
	if _, err := parseBase([]byte("regions: [")); err == nil {
		t.Error("broken YAML was accepted")
	}
	b, err := parseBase([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	ok := fleet.Engine{ID: "p", Address: "10.0.0.1:8000", Model: "m", GPU: "H100", Region: "local"}
	for _, c := range []struct {
		edit func(*fleet.Engine)
		want string
	}{
		{func(*fleet.Engine) {}, ""},
		{func(e *fleet.Engine) { e.Model = "" }, "no model label (inferlb.io/model)"},
		{func(e *fleet.Engine) { e.GPU = "" }, "no GPU label (inferlb.io/gpu, nvidia.com/gpu.product) on the pod or its node"},
		{func(e *fleet.Engine) { e.Region = "" }, "no region label (inferlb.io/region, topology.kubernetes.io/region) on the pod or its node"},
		{func(e *fleet.Engine) { e.Model = "x" }, `model "x" is not a model of the fleet spec`},
		{func(e *fleet.Engine) { e.Region = "mars" }, `region "mars" is not a region of the fleet spec`},
		{func(e *fleet.Engine) { e.GPU = "A100" }, `no profile for gpu "A100" model "m" in the fleet spec`},
	} {
		e := ok
		c.edit(&e)
		if got := b.refuses(e, DefaultLabels()); got != c.want {
			t.Errorf("refuses(%+v) = %q, want %q", e, got, c.want)
		}
	}
	spec, err := b.with([]fleet.Engine{ok})
	if err != nil {
		t.Fatal(err)
	}
	if len(spec.Engines) != 1 || spec.Engines[0].Server != fleet.ServerVLLM || spec.Engines[0].Address != "10.0.0.1:8000" {
		t.Errorf("spec engines %+v", spec.Engines)
	}
}
