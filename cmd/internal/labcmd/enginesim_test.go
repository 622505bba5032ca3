package labcmd

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func runEngineSim(ctx context.Context, args ...string) error {
	cmd := newEngineSimCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	return cmd.ExecuteContext(ctx)
}

// A value typed on the command line is never replaced by a default, and a
// flag that cannot apply is refused rather than ignored. Every case fails
// before anything listens.
func TestEngineSimRejectsBadFlags(t *testing.T) {
	fleetArgs := []string{"--fleet", "../../../examples/fleet-minimal.yaml"}
	solo := []string{"--listen", "127.0.0.1:0", "--model", "m"}
	cases := []struct {
		args []string
		want string
	}{
		{append(fleetArgs, "--time-scale", "0"), "--time-scale: must be > 0, got 0"},
		{append(fleetArgs, "--time-scale", "-1"), "--time-scale: must be > 0, got -1"},
		{append(fleetArgs, "--default-max-tokens", "0"), "--default-max-tokens: must be at least 1, got 0"},
		{append(fleetArgs, "--max-body-bytes", "0"), "--max-body-bytes: must be at least 1, got 0"},
		{append(fleetArgs, "--decode-step-ms", "9"), "--decode-step-ms is a standalone profile flag"},
		{append(append(fleetArgs, solo...), "--gpu", "H100", "--max-running", "8"), "--max-running is a standalone profile flag"},
		{append(solo, "--max-running", "0"), "--max-running: must be at least 1, got 0"},
		{append(solo, "--block-size", "0"), "--block-size: must be at least 1, got 0"},
		{[]string{}, "either --fleet (fleet mode) or --listen (standalone mode) is required"},
		{append(fleetArgs, "--model", "m"), "--gpu, --model and --region apply to standalone mode"},
	}
	for _, c := range cases {
		err := runEngineSim(context.Background(), c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("engine-sim %s: error %v, want %q", strings.Join(c.args, " "), err, c.want)
		}
	}
}
