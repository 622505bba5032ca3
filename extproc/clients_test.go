package extproc

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb/extproc/body"
)

// Per-client priorities: a client may ask for what it is allowed, is
// refused (403, naming the allowed ones) what it is not, and without
// x-priority gets the policy's default if allowed, else its least
// important allowed priority; unlisted clients and requests without the
// header get the default list.
func TestClientPriorities(t *testing.T) {
	d := NewDecider(time.Now())
	if _, _, err := d.SetPolicy(testPolicy()); err != nil {
		t.Fatal(err)
	}
	d.SetClientPriorities(&ClientPriorities{Header: "x-client-id",
		Clients: map[string][]string{"gold": {"hi", "mid", "lo"}, "bulk": {"lo"}}, Default: []string{"mid", "lo"}})
	req := []byte(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"x"}]}`)
	for _, tc := range []struct {
		client, asked string
		want          string // priority, or "403"
	}{
		{"gold", "hi", "hi"},
		{"gold", "", "mid"}, // the policy's default, allowed
		{"bulk", "hi", "403"},
		{"bulk", "", "lo"}, // default not allowed: its least important
		{"bulk", "lo", "lo"},
		{"stranger", "hi", "403"},
		{"stranger", "mid", "mid"},
		{"", "hi", "403"},
		{"", "", "mid"},
	} {
		var dc Decision
		rej := d.Decide(Input{Kind: body.Chat, Priority: tc.asked, Client: tc.client, Body: req}, &dc)
		got := dc.Priority
		if rej != nil {
			got = "403"
			if rej.Status() != 403 || rej.Reason() != "priority_not_allowed" || !strings.Contains(rej.Error(), "allowed: ") {
				t.Errorf("%s asking %q: %v", tc.client, tc.asked, rej)
			}
		}
		d.Release(&dc.Held)
		if got != tc.want {
			t.Errorf("client %q asking %q: got %s, want %s", tc.client, tc.asked, got, tc.want)
		}
	}
}

func TestLoadClientPriorities(t *testing.T) {
	write := func(s string) string {
		p := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c, err := LoadClientPriorities(write("header: x-client-id\nclients: {a: [hi], b: [lo, mid]}\ndefault: [lo]\n"))
	if err != nil || c.Header != "x-client-id" || len(c.Clients["b"]) != 2 || strings.Join(c.Names(), ",") != "hi,lo,mid" {
		t.Fatalf("%+v %v", c, err)
	}
	for content, want := range map[string]string{
		"clients: {a: [hi]}\n":                      "header: required",
		"header: X-Client\nclients: {a: [hi]}\n":    "lower-case",
		"header: x-priority\nclients: {a: [hi]}\n":  "a header clients set",
		"header: x-c\nclients: {a: []}\n":           "clients.a: no priority",
		"header: x-c\ndefault: [hi]\ncolour: red\n": "field colour not found",
		"header: x-c\n":                             "default: no priority",
	} {
		if _, err := LoadClientPriorities(write(content)); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", content, err, want)
		}
	}
}
