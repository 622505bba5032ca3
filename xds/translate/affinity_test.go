package translate

import (
	"strings"
	"testing"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
)

// A class's affinity reaches its RoutingPolicy: key order, off switch, and
// the split table sorted by prefix with a content version, so every node
// (and every ext_proc replica) gets the same table under the same version.
func TestTranslateAffinity(t *testing.T) {
	rules := []PrefixRule{{Prefix: 9, Action: Group}, {Prefix: 3, Action: Spread, Spread: 4}, {Prefix: 5, Action: Deeper, Spread: 2}}
	n := sampleNode()
	n.Classes[0].Affinity = Affinity{Keys: []string{"prefix", "session"}, Rules: rules}
	r, err := Translate(n, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	var got *policyv1.Affinity
	for _, c := range r.Policy.Classes {
		if c.Name == "llama8b" {
			got = c.Affinity
		} else if c.Affinity != nil {
			t.Fatalf("class %s without affinity got %v", c.Name, c.Affinity)
		}
	}
	if got == nil || len(got.Keys) != 2 || got.Keys[0] != policyv1.KeySource_KEY_SOURCE_PREFIX || got.Keys[1] != policyv1.KeySource_KEY_SOURCE_SESSION || got.Off {
		t.Fatalf("affinity %v", got)
	}
	rs := got.Table.GetRules()
	if len(rs) != 3 || rs[0].Prefix != 3 || rs[0].Action != policyv1.PrefixRule_ACTION_SPREAD || rs[0].Spread != 4 ||
		rs[1].Prefix != 5 || rs[1].Action != policyv1.PrefixRule_ACTION_DEEPER || rs[2].Action != policyv1.PrefixRule_ACTION_GROUP {
		t.Fatalf("rules %v", rs)
	}
	// Another node, rules in another order: the same version.
	m := sampleNode()
	m.NodeID = "fe-eu"
	m.Classes[0].Affinity = Affinity{Keys: []string{"prefix", "session"}, Rules: []PrefixRule{rules[2], rules[0], rules[1]}}
	r2, err := Translate(m, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range r2.Policy.Classes {
		if c.Name == "llama8b" && c.Affinity.Table.Version != got.Table.Version {
			t.Fatalf("versions %s and %s for equal tables", c.Affinity.Table.Version, got.Table.Version)
		}
	}
	// A different table: a different version, and a different policy hash.
	m.Classes[0].Affinity.Rules[0].Spread = 3
	r3, err := Translate(m, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	if r3.PolicyHash == r2.PolicyHash {
		t.Fatal("a changed table kept the policy hash")
	}
	// A shared-prefix depth: published (alone too), in the version.
	tableOf := func(a Affinity) *policyv1.PrefixTable {
		t.Helper()
		n := sampleNode()
		n.Classes[0].Affinity = a
		r, err := Translate(n, DefaultOptions())
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range r.Policy.Classes {
			if c.Name == "llama8b" {
				return c.Affinity.GetTable()
			}
		}
		return nil
	}
	withDepth := tableOf(Affinity{Keys: []string{"prefix", "session"}, Rules: rules, SharedDepthBytes: 8192})
	if withDepth.GetSharedDepthBytes() != 8192 || withDepth.GetVersion() == got.Table.Version {
		t.Fatalf("table with a depth: %v (version without: %s)", withDepth, got.Table.Version)
	}
	if alone := tableOf(Affinity{SharedDepthBytes: 4096}); alone.GetSharedDepthBytes() != 4096 || alone.GetVersion() == "" || len(alone.GetRules()) != 0 {
		t.Fatalf("a depth alone: %v", alone)
	}
	for _, c := range []struct {
		a    Affinity
		want string
	}{
		{Affinity{Keys: []string{"header"}}, `keys[0]: unknown key source "header"`},
		{Affinity{Rules: []PrefixRule{{Prefix: 1, Action: Spread}}}, "spread rule needs spread ≥ 1"},
		{Affinity{Rules: []PrefixRule{{Prefix: 1, Action: Group}, {Prefix: 1, Action: Deeper}}}, "prefix 0000000000000001 twice"},
		{Affinity{Rules: []PrefixRule{{Prefix: 1}}}, "action(0)"},
	} {
		n := sampleNode()
		n.Classes[1].Affinity = c.a
		if _, err := Translate(n, DefaultOptions()); err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), "class llama70b-eu: affinity") {
			t.Errorf("%+v: error %v, want %q", c.a, err, c.want)
		}
	}
}
