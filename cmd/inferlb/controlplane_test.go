package main

import (
	"context"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// A bad control-plane flag is refused before anything listens, with an
// error that names the flag as typed (--demand-window), not the config key
// behind it (demand_window).
func TestControlPlaneErrorsNameTheFlag(t *testing.T) {
	cmd, _, err := rootCmd.Find([]string{"control-plane"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--demand-window", "0s"}, "--demand-window must be positive, got 0s"},
		{[]string{"--interval", "-1s"}, "--interval must be positive"},
		{[]string{"--scrape-timeout", "0s"}, "--scrape-timeout must be positive"},
		{[]string{"--warmup", "-1s"}, "--warmup must be ≥ 0, got -1s"},
		{[]string{"--smoothing", "-1s"}, "--smoothing must be ≥ 0"},
		{[]string{"--history", "-1"}, "--history must be ≥ 0 cycles, got -1"},
		{[]string{"--headroom", "1.5"}, "--headroom: must be in (0, 1), got 1.5"},
		{[]string{"--deadband", "1"}, "--deadband: must be in [0, 1)"},
		{[]string{"--stability-ms", "-1"}, "--stability-ms: must be ≥ 0"},
		{[]string{"--penalty-half-life", "0s"}, "--penalty-half-life: must be positive"},
		{[]string{"--maglev-table-size", "100"}, "--maglev-table-size: must be a prime"},
		{[]string{"--weight-scale", "1"}, "--weight-scale: must be in [10, 1000000]"},
		{[]string{"--health-check-interval", "0s"}, "--health-check-interval / --health-check-timeout: must be positive"},
		{[]string{"--time-scale", "0"}, "--time-scale: fleet: time scale must be a positive number, got 0"},
		// Two bad flags: both named, one a line.
		{[]string{"--headroom", "0", "--hash-balance-factor", "50"}, "--hash-balance-factor: must be 0 (off) or ≥ 100, got 50\n--headroom: must be in (0, 1), got 0"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			// The command's flags keep their values between runs: back to
			// the defaults first.
			cmd.Flags().VisitAll(func(f *pflag.Flag) {
				if err := f.Value.Set(f.DefValue); err != nil {
					t.Fatalf("resetting --%s: %v", f.Name, err)
				}
				f.Changed = false
			})
			rootCmd.SetArgs(append([]string{"control-plane", "--fleet", "../../examples/fleet-3region.yaml", "--log-level", "error", "--insecure",
				"--xds-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, c.args...))
			ctx, cancel := context.WithCancel(context.Background())
			cancel() // a config that passes must not serve
			err := rootCmd.ExecuteContext(ctx)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("err = %v\nwant it to contain %q", err, c.want)
			}
			for _, key := range []string{"demand_window", "scrape_", "stale_after", "deadband_tv", "half_life", "_ms", "maglev_table", "health_check"} {
				if strings.Contains(err.Error(), key) {
					t.Errorf("the error names the config key %q: %v", key, err)
				}
			}
		})
	}
}
