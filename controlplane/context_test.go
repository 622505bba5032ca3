package controlplane

import (
	"testing"

	"github.com/inferlb/inferlb/api/fleet"
)

// The RoutingPolicy's max_context_tokens of a class is what every engine of
// the class accepts: in the example fleet the general class mixes A100s
// (32,768-token limit) and H100s (131,072), so it guarantees only 32,768,
// and longer requests must go to the long-context class.
func TestPolicyMaxContextIsTheClassGuarantee(t *testing.T) {
	spec, err := fleet.Load("../examples/fleet-3region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewController(spec, DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]int{"general": 32768, "long-context": 131072} {
		cl, ok := spec.ClassByName(name)
		if !ok {
			t.Fatalf("example fleet has no class %q", name)
		}
		if got := c.maxContext(cl); got != want {
			t.Errorf("class %s: max context %d, want %d", name, got, want)
		}
	}
}
