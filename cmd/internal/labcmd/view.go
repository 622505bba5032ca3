package labcmd

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/tools/liveview"
)

// isTerminal tells whether f is a terminal (a character device): the live
// views redraw the screen only there, and append screens to a file or pipe.
func isTerminal(f *os.File) bool {
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func newViewCmd() *cobra.Command {
	var (
		fleetPath string
		envoys    []string
		interval  time.Duration
		once      bool
		plain     bool
	)
	cmd := &cobra.Command{
		Use:   "view --fleet F --envoy-admin NAME=URL ...",
		Short: "Live terminal view of engines' load and each frontend Envoy's weights and traffic",
		Long: `view polls every engine's /metrics (in the names of its engines[].server,
vLLM's or SGLang's, as the control plane reads them) and every frontend Envoy's
admin /clusters, and redraws one screen per interval: for each engine its
running and waiting requests, KV-cache use, mean TTFT, prefix-cache hit rate
and generated tokens/s over the interval; for each frontend the share of
weight its Envoy holds for the engine in each class's cluster (priority 0)
and the share of that cluster's requests the engine received, and per
frontend its request rate and Envoy's retries.`,
		Example: `  inferlb-lab view --fleet examples/fleet-demo.yaml --envoy-admin frontend-us-east=http://127.0.0.1:17020   # a running demo's us-east Envoy`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if fleetPath == "" {
				return fmt.Errorf("--fleet is required")
			}
			spec, err := fleet.Load(fleetPath)
			if err != nil {
				return err
			}
			admin := map[string]string{}
			for _, kv := range envoys {
				name, url, ok := strings.Cut(kv, "=")
				if !ok || name == "" || url == "" {
					return fmt.Errorf("--envoy-admin %q: want NAME=URL", kv)
				}
				found := false
				for _, f := range spec.Frontends {
					found = found || f.Name == name
				}
				if !found {
					return fmt.Errorf("--envoy-admin %q: no frontend %q in %s", kv, name, fleetPath)
				}
				admin[name] = strings.TrimRight(url, "/")
			}
			if interval <= 0 {
				return fmt.Errorf("--interval must be positive, got %v", interval)
			}
			plain = plain || !isTerminal(os.Stdout)
			c := &liveview.Collector{Fleet: spec, EnvoyAdmin: admin}
			ctx := cmd.Context()
			var prev liveview.Sample
			t := time.NewTicker(interval)
			defer t.Stop()
			for {
				cur, err := c.Collect(ctx)
				if err != nil {
					return nil // context ended: a clean exit
				}
				if !once || !prev.At.IsZero() {
					var buf bytes.Buffer
					if !plain && !once {
						buf.WriteString("\033[H\033[2J")
					}
					liveview.Render(&buf, c.Build(prev, cur))
					os.Stdout.Write(buf.Bytes())
					if once {
						return nil
					}
				}
				prev = cur
				select {
				case <-ctx.Done():
					return nil
				case <-t.C:
				}
			}
		},
	}
	cmd.Flags().StringVar(&fleetPath, "fleet", "", "fleet spec (YAML)")
	cmd.Flags().StringArrayVar(&envoys, "envoy-admin", nil, "frontend name=Envoy admin URL (repeatable)")
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "redraw interval; rates are over one interval")
	cmd.Flags().BoolVar(&once, "once", false, "print one screen (two polls, one interval apart) and exit")
	cmd.Flags().BoolVar(&plain, "plain", false, "append screens instead of redrawing (the default when stdout is not a terminal)")
	return cmd
}
