package opcmd

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// A bad control-plane flag is refused before anything listens, with an
// error that names the flag as typed (--demand-window), not the config key
// behind it (demand_window).
func TestControlPlaneErrorsNameTheFlag(t *testing.T) {
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
		// Keys that were constants only changeable in code.
		{[]string{"--penalty-latency-scale", "0"}, "--penalty-latency-scale: must be > 0 and finite, got 0"},
		{[]string{"--penalty-error-tolerance", "-1"}, "--penalty-error-tolerance: must be ≥ 0 and finite"},
		{[]string{"--penalty-max", "1"}, "--penalty-max: must be in [0, 1)"},
		{[]string{"--min-probe-share", "0.2"}, "--probe-rps / --min-probe-share / --max-probe-share: want rps ≥ 0 and 0 ≤ min ≤ max < 0.5"},
		{[]string{"--max-retries", "11"}, "--max-retries: must be at most 10, got 11"},
		{[]string{"--unknown-health", "2"}, "--unknown-health: must be in [0, 1]"},
		{[]string{"--idle-demand-per-s", "0"}, "--idle-demand-per-s: must be > 0"},
		{[]string{"--shed-deadband", "1"}, "--shed-deadband: must be in [0, 1)"},
		{[]string{"--background-floor", "1"}, "--background-floor: must be in [0, 1)"},
		{[]string{"--retry-budget", "2"}, "--retry-budget: must be in [0, 1]"},
		{[]string{"--connect-timeout", "0s"}, "--connect-timeout: must be positive"},
		{[]string{"--healthy-panic-threshold", "101"}, "--healthy-panic-threshold: must be a percentage in [0, 100]"},
		{[]string{"--health-check-healthy-threshold", "0"}, "--health-check-unhealthy-threshold / --health-check-healthy-threshold: must be ≥ 1"},
		{[]string{"--outlier-interval", "0s"}, "--outlier-interval / --outlier-base-ejection-time / --outlier-max-ejection-percent: need positive interval"},
		{[]string{"--circuit-retry-budget-percent", "101"}, "--circuit-retry-budget-percent: must be in [0, 100]"},
		{[]string{"--lb-policy", "ring_hash", "--ring-min-size", "0"}, "--ring-min-size / --ring-max-size: need 0 < min ≤ max"},
		// Two bad flags: both named, one a line.
		{[]string{"--headroom", "0", "--hash-balance-factor", "50"}, "--hash-balance-factor: must be 0 (off) or ≥ 100, got 50\n--headroom: must be in (0, 1), got 0"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			err := refused(t, c.want, append([]string{"control-plane", "--fleet", "../../../examples/fleet-3region.yaml", "--log-level", "error", "--insecure",
				"--xds-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, c.args...)...)
			for _, key := range []string{"demand_window", "scrape_", "stale_after", "deadband_tv", "half_life", "_ms", "maglev_table", "health_check"} {
				if strings.Contains(err.Error(), key) {
					t.Errorf("the error names the config key %q: %v", key, err)
				}
			}
		})
	}
}

// A setting made in the config file is named by the file, its line and key
// when the control plane refuses it; the command line overrides the file.
func TestControlPlaneConfigFile(t *testing.T) {
	fleetPath, err := filepath.Abs("../../../examples/fleet-3region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	for _, c := range []struct {
		name, file string
		args       []string
		want       string
	}{
		{"runner check", "fleet: " + fleetPath + "\ndemand-window: 0s\n", nil,
			"control plane: config " + dir + "/cp.yaml: line 2: demand-window must be positive, got 0s"},
		{"cycle check", "fleet: " + fleetPath + "\n\nheadroom: 1.5\n", nil,
			"control plane config: config " + dir + "/cp.yaml: line 3: headroom: must be in (0, 1), got 1.5"},
		{"command check", "fleet: " + fleetPath + "\nlb-policy: round_robin\n", nil,
			"config " + dir + "/cp.yaml: line 2: lb-policy: want maglev or ring_hash"},
		{"the flag wins and is named", "fleet: " + fleetPath + "\nheadroom: 0.5\n", []string{"--headroom", "2"},
			"--headroom: must be in (0, 1), got 2"},
		{"unknown key", "fleet: " + fleetPath + "\nhead-room: 0.5\n", nil, "config " + dir + "/cp.yaml: line 2: head-room: unknown key"},
		{"relative fleet path", "fleet: no-such-fleet.yaml\n", nil, "fleet: open " + dir + "/no-such-fleet.yaml"},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := filepath.Join(dir, "cp.yaml")
			if err := os.WriteFile(path, []byte(c.file), 0o600); err != nil {
				t.Fatal(err)
			}
			refused(t, c.want, append([]string{"control-plane", "--config", path, "--log-level", "error", "--insecure",
				"--xds-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, c.args...)...)
		})
	}
}

// Kubernetes discovery's flags: one fleet source, a well-formed pool, a
// positive wait, and a kubeconfig that exists; each refusal names the flag.
func TestControlPlaneKubernetesFlags(t *testing.T) {
	base := []string{"control-plane", "--log-level", "error", "--insecure", "--xds-listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "--fleet or --inference-pool is required"},
		{[]string{"--fleet", "../../../examples/fleet-3region.yaml", "--inference-pool", "llm/pool"}, "--fleet and --inference-pool: give one"},
		{[]string{"--inference-pool", "pool"}, `--inference-pool: inference pool "pool": want namespace/name`},
		{[]string{"--inference-pool", "llm/pool", "--discovery-timeout", "0s"}, "--discovery-timeout: must be positive, got 0s"},
		{[]string{"--inference-pool", "llm/pool", "--fleet-configmap", ""}, "--fleet-configmap and --fleet-configmap-key: must not be empty"},
		{[]string{"--inference-pool", "llm/pool", "--kubeconfig", "/nonexistent/kubeconfig"}, "--kubeconfig: stat /nonexistent/kubeconfig"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			refused(t, c.want, append(slices.Clone(base), c.args...)...)
		})
	}
}
