package opcmd

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"
)

func runExplainKey(stdin string, args ...string) (string, error) {
	cmd := newExplainKeyCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetIn(strings.NewReader(stdin))
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err := cmd.ExecuteContext(context.Background())
	return out.String(), err
}

// The documented example: the example request under the example policy,
// whose table marks the shared preamble hot.
func TestExplainKeyExample(t *testing.T) {
	out, err := runExplainKey("", "--policy-file", "../../../examples/policy-affinity.json", "../../../examples/request-shared-preamble.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"class llama-3.1-8b: key order session, prompt_cache_key, user, prefix; split table example with 1 rules",
		"deeper (hot; spread 8 if nothing deeper) ← deepest hot",
		"anchor (end of the first user message)  8604179f67369f28   ← key",
		"x-inferlb-affinity-key: bb34053ccb15de80\n",
		"point 3 (4096 bytes, ~710 tokens) is hot, so the key goes deeper",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// From stdin, with a session header: the session keys it.
	body, err := os.ReadFile("../../../examples/request-shared-preamble.json")
	if err != nil {
		t.Fatal(err)
	}
	out, err = runExplainKey(string(body), "--policy-file", "../../../examples/policy-affinity.json", "--session", "s-42", "--json", "-")
	if err != nil || !strings.Contains(out, `"source": "session"`) || !strings.Contains(out, `"why": "keyed on the session"`) {
		t.Fatalf("session: %v\n%s", err, out)
	}
}

func TestExplainKeyRejects(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "give exactly one of --policy-file and --control-plane"},
		{[]string{"--policy-file", "x", "--control-plane", "y"}, "give exactly one of --policy-file and --control-plane"},
		{[]string{"--control-plane", "127.0.0.1:1"}, "--control-plane needs --node-id"},
		{[]string{"--policy-file", "../../../examples/policy-affinity.json", "--path", "/v1/embeddings", "../../../examples/request-shared-preamble.json"},
			`../../../examples/request-shared-preamble.json: path "/v1/embeddings"`},
		{[]string{"--policy-file", "../../../examples/policy-affinity.json", "-"}, "stdin: body: invalid JSON at byte 0"},
		{[]string{"--policy-file", "../../../examples/fleet-minimal.yaml", "-"}, "policy file ../../../examples/fleet-minimal.yaml"},
	} {
		if _, err := runExplainKey("", c.args...); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}
