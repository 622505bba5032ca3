package fleet

import (
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// FuzzParse: Parse never panics; every rejection is a list of one-line
// FieldErrors; every accepted spec keeps its guarantees and re-validates,
// both written back as YAML and through New.
func FuzzParse(f *testing.F) {
	f.Add([]byte(base))
	for _, name := range []string{"fleet-3region.yaml", "fleet-minimal.yaml"} {
		data, err := readExample(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	for _, seed := range []string{
		"",
		"---\n",
		"a: &a [*a]\n",
		"regions: [&e {<<: *e}]\n",
		"engines: [&a {id: x}, {<<: [*a, *a]}]\n",
		"regions: [{name: r}]\nengines: [{<<: {id: e}}]\n",
		"classes: []\npriorities: []\n",
		"network: {links: [{a: x, b: x, rtt_ms: .inf}]}\n",
		edit(f, "replicas: 2", "replicas: 0", "rtt_ms: 80", "rtt_ms: -1"),
		edit(f, "residency: eu}\n", "residency: eu}\n  - {name: r3}\n"),
		edit(f, "{name: eu, model: m, residency: eu}", "{name: eu, model: m, residency: us}"),
	} {
		f.Add([]byte(seed))
	}
	for _, rc := range ruleCases {
		f.Add([]byte(edit(f, rc.edits...)))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Parse(data)
		if err != nil {
			fes := Errors(err)
			if len(fes) == 0 {
				t.Fatalf("error without FieldErrors: %v", err)
			}
			for _, fe := range fes {
				if msg := fe.Error(); msg == "" || strings.ContainsAny(msg, "\n\r") {
					t.Fatalf("error not one line: %q", msg)
				}
			}
			return
		}
		checkInvariants(t, s)
		out, err := yaml.Marshal(s)
		if err != nil {
			t.Fatalf("marshal: %v", err)
		}
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("accepted spec does not re-validate: %v\n%s", err, out)
		}
		if !equalSpecs(s, again) {
			t.Fatalf("re-parsed spec differs:\n%s", out)
		}
		viaNew, err := New(*s)
		if err != nil {
			t.Fatalf("New(accepted spec): %v", err)
		}
		if !equalSpecs(s, viaNew) {
			t.Fatal("New(accepted spec) differs")
		}
	})
}

// checkInvariants asserts what users of a parsed Spec rely on.
func checkInvariants(t *testing.T, s *Spec) {
	t.Helper()
	for _, e := range s.Engines {
		if _, ok := s.ProfileOf(e); !ok {
			t.Fatalf("engine %s has no profile", e.ID)
		}
		if _, ok := s.RegionByName(e.Region); !ok {
			t.Fatalf("engine %s region %q unknown", e.ID, e.Region)
		}
		if e.Replicas < 1 {
			t.Fatalf("engine %s replicas %d", e.ID, e.Replicas)
		}
		for _, f := range s.Frontends {
			if _, ok := s.RTT(f.Region, e.Region); !ok {
				t.Fatalf("no RTT from frontend %s to engine %s", f.Name, e.ID)
			}
		}
	}
	for _, c := range s.Classes {
		es := s.EligibleEngines(c.Name)
		if len(es) == 0 || c.ContextLimit < c.MinContextTokens {
			t.Fatalf("class %s: %d eligible engines, context limit %d", c.Name, len(es), c.ContextLimit)
		}
		got, err := s.Classify(c.Model, c.Residency, c.ContextLimit)
		if err != nil || got.ContextLimit < c.ContextLimit {
			t.Fatalf("Classify for class %s's own shape: %+v %v", c.Name, got, err)
		}
	}
	for _, f := range s.Frontends {
		if _, ok := s.FrontendByNodeID(f.NodeID); !ok || f.NodeID == "" {
			t.Fatalf("frontend %s node id %q", f.Name, f.NodeID)
		}
	}
}
