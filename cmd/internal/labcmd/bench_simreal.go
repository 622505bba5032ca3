package labcmd

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/inferlb/inferlb/tools/fleetsim"
	"github.com/inferlb/inferlb/tools/simreal"
)

func newBenchSimRealCmd() *cobra.Command {
	var (
		duration time.Duration
		seed     uint64
		scale    float64
		jsonOut  string
	)
	cmd := &cobra.Command{
		Use:   "simreal [SCENARIO]",
		Short: "Run one scenario in the fleet simulator and through the real stack, side by side",
		Long: `bench simreal runs one scenario twice with the same fleet, seed and sessions:
in the fleet simulator (inferlb's policy) and through the real request path —
a real Envoy, the control plane, the ext_proc service and engine-sim engines on
the fleet's addresses, which hold each request for the fleet's round trip
from the frontend's region — driven by the load generator. It prints TTFT p50
and p99 and the prefix-cache hit rate of both and their gaps ((real − sim) /
sim). The scenario needs one frontend, one class, a sessions workload with
sessions_per_s and no faults but surges. Default scenario:
examples/simreal/scenario.yaml (three regions, four engines, multi-turn chat
tripled for 30 s).

The real side runs at --time-scale 2 by default: twice as slow as the
simulated engines' time, which halves what a busy machine adds (Envoy's
and ext_proc's own time, timers firing late) in the figures; --time-scale 1
measures the machine as much as the model on two shared cores.

  inferlb-lab bench simreal
  inferlb-lab bench simreal --duration 60s --seed 7 --json-out simreal.json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := "examples/simreal/scenario.yaml"
			if len(args) == 1 {
				path = args[0]
			}
			sc, err := fleetsim.LoadScenario(path)
			if err != nil {
				return err
			}
			rep, err := simreal.Run(cmd.Context(), simreal.Options{Scenario: sc, Duration: duration, Seed: seed, TimeScale: scale, Progress: cmd.ErrOrStderr()})
			if err != nil {
				return err
			}
			printSimReal(cmd.OutOrStdout(), rep)
			if jsonOut != "" {
				b, err := json.MarshalIndent(rep, "", "  ")
				if err != nil {
					return err
				}
				return os.WriteFile(jsonOut, append(b, '\n'), 0o644)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&duration, "duration", 0, "traffic time instead of the scenario's")
	f.Uint64Var(&seed, "seed", 0, "seed instead of the scenario's")
	f.Float64Var(&scale, "time-scale", 2, "real seconds per simulated second on the real side (engine-sim --time-scale): above 1 divides the machine's own delays by it")
	f.StringVar(&jsonOut, "json-out", "", "also write the report as JSON to this file")
	return cmd
}

func printSimReal(w io.Writer, r *simreal.Report) {
	fmt.Fprintf(w, "scenario %s, seed %d, %.0f s of traffic, real side at time scale %g\n\n", r.Scenario, r.Seed, r.Duration, r.TimeScale)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "\tsim\treal\tgap\t")
	fmt.Fprintf(tw, "requests served\t%d\t%d\t\t\n", r.Sim.Requests, r.Real.Requests)
	fmt.Fprintf(tw, "shed or failed\t%d\t%d\t\t\n", r.Sim.Errors, r.Real.Errors)
	fmt.Fprintf(tw, "TTFT p50 (ms)\t%.1f\t%.1f\t%+.1f%%\t\n", r.Sim.TTFTP50, r.Real.TTFTP50, 100*r.GapP50)
	fmt.Fprintf(tw, "TTFT p90 (ms)\t%.1f\t%.1f\t%+.1f%%\t\n", r.Sim.TTFTP90, r.Real.TTFTP90, 100*simreal.Gap(r.Sim.TTFTP90, r.Real.TTFTP90))
	fmt.Fprintf(tw, "TTFT p99 (ms)\t%.1f\t%.1f\t%+.1f%%\t\n", r.Sim.TTFTP99, r.Real.TTFTP99, 100*r.GapP99)
	fmt.Fprintf(tw, "TPOT p50 (ms)\t%.2f\t%.2f\t%+.1f%%\t\n", r.Sim.TPOTP50, r.Real.TPOTP50, 100*simreal.Gap(r.Sim.TPOTP50, r.Real.TPOTP50))
	fmt.Fprintf(tw, "request path, mean (ms)\t%.1f\t%.1f\t%+.1f\t\n", r.Sim.PathMs, r.Real.PathMs, r.Real.PathMs-r.Sim.PathMs)
	fmt.Fprintf(tw, "hit rate\t%.1f%%\t%.1f%%\t%+.1f%%\t\n", 100*r.Sim.HitRate, 100*r.Real.HitRate, 100*r.GapHit)
	_ = tw.Flush()
	if len(r.Sim.Engines) == len(r.Real.Engines) && len(r.Sim.Engines) > 0 {
		fmt.Fprintln(w, "\nper engine (sim: at the client; real: the engine's own TTFT histogram + the round trip):")
		tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintln(tw, "engine\tsim served\treal served\tsim p50\treal p50\tsim p99\treal p99\t")
		for i, s := range r.Sim.Engines {
			x := r.Real.Engines[i]
			fmt.Fprintf(tw, "%s\t%d\t%d\t%.1f\t%.1f\t%.1f\t%.1f\t\n", s.ID, s.Served, x.Served, s.TTFTP50, x.TTFTP50, s.TTFTP99, x.TTFTP99)
		}
		_ = tw.Flush()
	}
}
