package opcmd

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane"
	"github.com/inferlb/inferlb/optimizer"
)

func newSolveCmd() *cobra.Command {
	var (
		fleetPath, demandPath string
		asJSON, reference     bool
		explain               []string
		tolerance             float64
	)
	cmd := &cobra.Command{
		Use:   "solve --fleet FILE --demand FILE",
		Short: "Run the optimizer on a fleet spec and a demand file",
		Long: `solve builds one control cycle's problem from a fleet spec and a demand file
(demand per frontend, class and priority, engine state, last weights; see
examples/demand-3region.yaml and docs/optimizer.md), solves it, and prints per
frontend and class the engine weights, shed fractions and predicted latencies.

--explain FRONTEND ENGINE prints, for every class of that frontend with
traffic on that engine, the terms that make its weight: network round trip,
latency at the solved load (TTFT + output tokens x TBOT), queueing, marginal
congestion, capacity price, outlier penalty and stability, which add up to
the flow's marginal price.`,
		Example: `  inferlb solve --fleet examples/fleet-3region.yaml --demand examples/demand-3region.yaml
  inferlb solve --fleet examples/fleet-3region.yaml --demand examples/demand-3region.yaml --json
  inferlb solve --fleet examples/fleet-3region.yaml --demand examples/demand-3region.yaml \
      --explain frontend-us-east us-west-h100-1`,
		// One positional argument: the ENGINE of "--explain FRONTEND ENGINE".
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if fleetPath == "" || demandPath == "" {
				return fmt.Errorf("solve: --fleet and --demand are required")
			}
			if len(args) == 1 {
				if len(explain) != 1 {
					return fmt.Errorf("solve: unexpected argument %q (only --explain FRONTEND ENGINE takes one)", args[0])
				}
				explain = append(explain, args[0])
			}
			if cmd.Flags().Changed("explain") && len(explain) != 2 {
				return fmt.Errorf("solve: --explain takes FRONTEND ENGINE (or FRONTEND,ENGINE), got %q", strings.Join(explain, ","))
			}
			if !(tolerance >= 0 && tolerance < 1) {
				return fmt.Errorf("solve: --tolerance: want a relative gap in [0, 1) (0: the default 1e-4), got %g", tolerance)
			}
			spec, err := fleet.Load(fleetPath)
			if err != nil {
				return err
			}
			d, err := controlplane.LoadDemand(demandPath)
			if err != nil {
				return err
			}
			p, err := controlplane.FromFleet(spec, d)
			if err != nil {
				return fmt.Errorf("solve: %w", err)
			}
			opts := optimizer.Options{Tolerance: tolerance}
			if reference {
				opts.Method = optimizer.Reference
			}
			sol, err := optimizer.Solve(p, opts)
			if err != nil {
				return fmt.Errorf("solve: %w", err)
			}
			out := cmd.OutOrStdout()
			switch {
			case len(explain) == 2:
				return printExplain(out, sol, explain[0], explain[1], asJSON)
			case asJSON:
				enc := json.NewEncoder(out)
				enc.SetIndent("", "  ")
				return enc.Encode(sol)
			}
			printSolution(out, sol)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&fleetPath, "fleet", "", "fleet spec (YAML)")
	f.StringVar(&demandPath, "demand", "", "demand file (YAML)")
	f.BoolVar(&asJSON, "json", false, "print the whole solution as JSON")
	f.StringSliceVar(&explain, "explain", nil, "FRONTEND ENGINE (or FRONTEND,ENGINE): decompose that weight")
	f.BoolVar(&reference, "reference", false, "use the exact reference LP solver (small fleets only)")
	f.Float64Var(&tolerance, "tolerance", 0, "relative optimality gap of the fast solver (0: default 1e-4)")
	return cmd
}

func printSolution(out io.Writer, sol *optimizer.Solution) {
	gap := 0.0
	if sol.Objective > 0 {
		gap = max(0, (sol.Objective-sol.Bound)/sol.Objective)
	}
	fmt.Fprintf(out, "method %s, %d sweeps, objective %.6g ms·req/s (gap ≤ %.2g)\n\n", sol.Method, sol.Sweeps, sol.Objective, gap)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	for _, fl := range sol.Flows {
		if fl.DemandPerS == 0 {
			continue
		}
		fmt.Fprintf(tw, "%s / %s\tdemand %.3g req/s\trouted %.3g\tTTFT %.0f ms\tTBOT %.1f ms\tnetwork %.0f ms\tlatency %.0f ms\n",
			fl.Frontend, fl.Class, fl.DemandPerS, fl.RoutedPerS, fl.TTFTMs, fl.TBOTMs, fl.NetworkMs, fl.LatencyMs)
		for _, w := range fl.Weights {
			fmt.Fprintf(tw, "  %s\tweight %.4f\t%.3g req/s\tutil %.2f\tTTFT %.0f ms\tTBOT %.1f ms\t\n",
				w.Engine, w.Weight, w.RatePerS, w.Utilization, w.TTFTMs, w.TBOTMs)
		}
		for _, s := range fl.Shed {
			if s.RatePerS > 0 {
				fmt.Fprintf(tw, "  shed %s\t%.1f%%\t%.3g req/s\t\t\t\t\n", s.Priority, 100*s.Fraction, s.RatePerS)
			}
		}
	}
	tw.Flush()
	fmt.Fprintln(out)
	tw = tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "engine\tload\tlimit\tutil\tTTFT\tTBOT\tcapacity price")
	for _, e := range sol.Engines {
		fmt.Fprintf(tw, "%s\t%.3g\t%.3g\t%.2f\t%.0f ms\t%.1f ms\t%.3g ms\n", e.ID, e.LoadRPS, e.LimitRPS, e.Utilization, e.TTFTMs, e.TBOTMs, e.CapacityPriceMs)
	}
	tw.Flush()
}

func printExplain(out io.Writer, sol *optimizer.Solution, frontend, engine string, asJSON bool) error {
	type row struct {
		Class string `json:"class"`
		optimizer.Weight
		PriceMs float64 `json:"price_ms"`
	}
	var rows []row
	known := false
	for _, fl := range sol.Flows {
		if fl.Frontend != frontend {
			continue
		}
		known = true
		for _, w := range fl.Weights {
			if w.Engine == engine {
				rows = append(rows, row{Class: fl.Class, Weight: w, PriceMs: fl.PriceMs})
			}
		}
	}
	if !known {
		return fmt.Errorf("solve: unknown frontend %q", frontend)
	}
	// A mistyped engine would otherwise read as "sends no traffic to it".
	knownEngine := false
	for _, e := range sol.Engines {
		knownEngine = knownEngine || e.ID == engine
	}
	if !knownEngine {
		return fmt.Errorf("solve: unknown engine %q", engine)
	}
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	if len(rows) == 0 {
		fmt.Fprintf(out, "%s sends no traffic to %s\n", frontend, engine)
		return nil
	}
	for _, r := range rows {
		e := r.Explanation
		fmt.Fprintf(out, "%s / %s → %s: weight %.4f (%.3g req/s; last %.4f), engine utilization %.2f\n",
			frontend, r.Class, engine, r.Weight.Weight, r.RatePerS, r.LastWeight, e.Utilization)
		tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
		fmt.Fprintf(tw, "  network round trip\t%.1f ms\t\n", e.NetworkMs)
		fmt.Fprintf(tw, "  latency at this load (TTFT %.0f + output × TBOT %.1f)\t%.1f ms\t\n", e.TTFTMs, e.TBOTMs, e.LatencyMs)
		fmt.Fprintf(tw, "    of which queueing (load-dependent)\t%.1f ms\t\n", e.QueueingMs)
		fmt.Fprintf(tw, "    of which outlier penalty\t%.1f ms\t\n", e.PenaltyMs)
		fmt.Fprintf(tw, "  outlier cost (penalty × penalty cost)\t%.1f ms\t\n", e.OutlierCostMs)
		fmt.Fprintf(tw, "  marginal congestion (cost to others)\t%.1f ms\t\n", e.CongestionMs)
		fmt.Fprintf(tw, "  capacity price\t%.1f ms\t\n", e.CapacityPriceMs)
		fmt.Fprintf(tw, "  stability\t%.1f ms\t\n", e.StabilityMs)
		fmt.Fprintf(tw, "  = marginal price of the flow\t%.1f ms\t\n", r.PriceMs)
		tw.Flush()
	}
	return nil
}
