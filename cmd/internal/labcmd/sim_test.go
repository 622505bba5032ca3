package labcmd

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// runSim runs `inferlb-lab sim args...` in-process.
func runSim(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := newSimCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	cmd.SetContext(context.Background())
	err := cmd.Execute()
	return out.String() + errOut.String(), err
}

// Bad invocations name the flag or the file.
func TestSimErrors(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "give at least one scenario file"},
		{[]string{"--policy", "magic", "../../../examples/sim/steady-3region.yaml"}, `--policy: unknown policy "magic"`},
		{[]string{"--parallel", "0", "../../../examples/sim/steady-3region.yaml"}, "--parallel must be at least 1"},
		{[]string{"--seeds", "0", "../../../examples/sim/steady-3region.yaml"}, "--seeds must be in [1, 50], got 0"},
		{[]string{"--bench", "../../../examples/sim/steady-3region.yaml"}, "--bench takes no scenario files"},
		{[]string{"--bench", "--engines", "0"}, "--engines and --requests must be positive"},
		{[]string{"--duration", "-1s", "../../../examples/sim/steady-3region.yaml"}, "--duration: duration must be positive"},
		{[]string{"nowhere.yaml"}, "scenario: open nowhere.yaml"},
	} {
		_, err := runSim(t, c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("sim %v: error %v, want %q", c.args, err, c.want)
		}
	}
}

// A short run prints the table with every policy asked for, and the
// reference hit rate; with --seeds, medians and says so.
func TestSimTable(t *testing.T) {
	out, err := runSim(t, "--duration", "20s", "--seeds", "2", "--policy", "inferlb,random_key", "../../../examples/sim/steady-3region.yaml")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, w := range []string{"steady-3region — ", "| inferlb |", "| random_key |", "max/mean util |", "Medians over 2 seeds (1–2)", "Best achievable hit rate"} {
		if !strings.Contains(out, w) {
			t.Errorf("output lacks %q:\n%s", w, out)
		}
	}
}
