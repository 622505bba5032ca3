package labcmd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/inferlb/inferlb/tools/demo"
)

// printSummary writes what the demo leaves behind: the load generator's
// report (per priority and per region), where the logs are, and the control
// plane's admin URLs (which stop answering with the demo).
func printSummary(w io.Writer, res *demo.Result) {
	fmt.Fprintln(w, "\ninferlb demo: stopped.")
	if res.Report != nil {
		fmt.Fprintln(w, "\nSummary (the load generator's report; times in the engines' time):")
		if err := res.Report.WriteTable(w); err != nil {
			fmt.Fprintln(w, "summary:", err)
		}
	} else {
		fmt.Fprintln(w, "The load generator wrote no report.")
	}
	fmt.Fprintf(w, "\nLogs, Envoy bootstraps and reports: %s (load generator report: %s)\n", res.OutDir, res.LoadgenReport)
	fmt.Fprintf(w, "While a demo runs, the control plane answers on %s: /weights, /explain, /signals, and its dashboard at %s/dashboard/\n", res.ControlPlaneAdmin, res.ControlPlaneAdmin)
}

func newDemoCmd() *cobra.Command {
	o := demo.Options{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the whole balancer locally: engines in 3 regions, control plane, ext_proc, Envoy, traffic, live view",
		Long: `demo runs inferlb end to end on this machine, each part as its own process:

  engine-sim      every engine of the fleet (vLLM-compatible, simulated GPUs)
  control-plane   signals → optimizer → CDS/EDS and RoutingPolicy over ADS
  extproc         one per frontend, in its Envoy's request path
  envoy           one per frontend (fail-closed bootstrap from envoy-configs/)
  loadgen         multi-turn conversations from every region, Poisson arrivals,
                  and after --surge-after a surge of new conversations in
                  --surge-region

and draws the live view: per engine its load, KV-cache use, TTFT and cache hit
rate; per class and frontend the weight its Envoy holds for each engine and
the share of traffic each got; per frontend what its clients saw (429s by
priority, errors, TTFT) and Envoy's retries. docs/demo.md explains the screen.

The fleet (examples/fleet-demo.yaml) serves a 70B model on one GPU per
engine, so this machine's traffic can fill it. The run goes through phases,
in the engines' time: steady traffic; at --surge-after a surge in
--surge-region (its overflow goes to the nearest region with room); at
--overload-after, --overload-factor × the rate for --overload-for (more than
the fleet serves: shedding by priority, queues, retries); at --fail-after
--fail-engine crashes for --fail-for (Envoy retries elsewhere, the weights
move). Ctrl-C (or the end of --duration) stops everything and prints the
summary per priority and region; logs, Envoy bootstraps and the load
generator's reports stay in --out. The control plane's admin server
(--base-port+1) serves /weights and /explain while the demo runs, and a web
dashboard at /dashboard/ (http://127.0.0.1:17001/dashboard/ by default).

Ports: --base-port (xDS), +1 control-plane admin, +10.. Envoy listeners,
+20.. Envoy admins, +30.. ext_proc gRPC, +40.. ext_proc HTTP; the engines
listen on their fleet-spec addresses.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			self, err := os.Executable()
			if err != nil {
				return err
			}
			o.Self = self
			if o.Engines == demo.EnginesLlamaCpp {
				// The real engines' own fleet and pace, unless given.
				for flag, set := range map[string]func(){
					"fleet":       func() { o.FleetPath = "examples/fleet-llamacpp.yaml" },
					"fail-engine": func() { o.FailEngine = "us-east-cpu-1" },
					"rate":        func() { o.Rate = 0.3 },
				} {
					if !cmd.Flags().Changed(flag) {
						set()
					}
				}
			}
			for name, v := range map[string]float64{"--rate": o.Rate, "--time-scale": o.TimeScale,
				"--control-interval": o.ControlInterval.Seconds(), "--view-interval": o.ViewInterval.Seconds()} {
				if !(v > 0) {
					return fmt.Errorf("%s must be positive, got %s", name, cmd.Flags().Lookup(name[2:]).Value)
				}
			}
			if o.Duration < 0 {
				return fmt.Errorf("--duration must not be negative, got %v", o.Duration)
			}
			if o.BasePort <= 0 || o.BasePort > 65000 {
				return fmt.Errorf("--base-port %d: want 1..65000", o.BasePort)
			}
			abs, err := filepath.Abs(o.OutDir)
			if err != nil {
				return err
			}
			o.OutDir = abs
			o.View = os.Stdout
			o.Plain = o.Plain || !isTerminal(os.Stdout)
			o.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
			fmt.Fprintf(os.Stderr, "inferlb demo: starting engines, control plane, ext_proc and Envoy for %s (logs in %s)\n", o.FleetPath, o.OutDir)
			res, err := demo.Run(cmd.Context(), o)
			if err != nil {
				if cmd.Context().Err() != nil && errors.Is(err, context.Canceled) {
					fmt.Fprintln(os.Stderr, "\ninferlb demo: interrupted before the traffic started")
					return nil
				}
				return err
			}
			printSummary(os.Stdout, res)
			return nil
		},
	}
	cmd.Example = `  make demo                                   # until Ctrl-C
  inferlb-lab demo --duration 20s --time-scale 0.5  # 20 simulated seconds (10 real), then the summary
  inferlb-lab demo --time-scale 2 --rate 2 --plain > demo.log
  inferlb-lab demo --engines llamacpp --duration 40s  # real llama.cpp servers instead of simulated ones`
	f := cmd.Flags()
	f.StringVar(&o.FleetPath, "fleet", "examples/fleet-demo.yaml", "fleet spec (YAML)")
	f.StringVar(&o.OutDir, "out", "demo-out", "directory for logs, Envoy bootstraps and reports")
	f.DurationVar(&o.Duration, "duration", 0, "stop sending traffic after this long, in the engines' time (0: until Ctrl-C)")
	f.Float64Var(&o.TimeScale, "time-scale", 1, "engine simulator time scale (real seconds per simulated second)")
	f.Float64Var(&o.Rate, "rate", 2.5, "new conversations per second (each has 2-6 turns)")
	f.DurationVar(&o.SurgeAfter, "surge-after", 60*time.Second, "when the surge starts (0: no surge)")
	f.StringVar(&o.SurgeRegion, "surge-region", "us-east", "region whose share of new conversations quadruples in the surge")
	f.DurationVar(&o.OverloadAfter, "overload-after", 120*time.Second, "when the overload phase starts (0: none)")
	f.DurationVar(&o.OverloadFor, "overload-for", 60*time.Second, "how long the overload phase lasts")
	f.Float64Var(&o.OverloadFactor, "overload-factor", 4, "rate multiplier in the overload phase")
	f.StringVar(&o.FailEngine, "fail-engine", "us-east-h100-1", "engine that crashes at --fail-after (empty: none)")
	f.DurationVar(&o.FailAfter, "fail-after", 150*time.Second, "when --fail-engine crashes (0: never)")
	f.DurationVar(&o.FailFor, "fail-for", 30*time.Second, "how long it stays down")
	f.DurationVar(&o.ControlInterval, "control-interval", 2*time.Second, "control plane cycle period")
	f.DurationVar(&o.ViewInterval, "view-interval", 2*time.Second, "live view redraw period")
	f.BoolVar(&o.Plain, "plain", false, "append screens instead of redrawing (the default when stdout is not a terminal)")
	f.IntVar(&o.BasePort, "base-port", 17000, "first port of the demo's listeners")
	f.StringVar(&o.Engines, "engines", demo.EnginesSim, "what serves the engines: sim (the engine simulator) or llamacpp (one llama.cpp llama-server per engine on a tiny model, built by scripts/setup.sh --engines; real time; default fleet examples/fleet-llamacpp.yaml, --rate 0.3, --fail-engine us-east-cpu-1)")
	return cmd
}
