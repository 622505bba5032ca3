package labcmd

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/inferlb/inferlb/tools/affinitybench"
	"github.com/inferlb/inferlb/tools/workload"
)

func newBenchAffinityCmd() *cobra.Command {
	o := affinitybench.DefaultOptions()
	var modes, turns, user, output, jsonOut, mooncake string
	mooncakeRows := 0
	cmd := &cobra.Command{
		Use:   "affinity",
		Short: "Measure cache affinity through a real Envoy on shared-preamble conversations",
		Long: `bench affinity replays multi-turn conversations whose prompts all open with
one long shared preamble inside the first user message (the traffic on which a
key hashed from the prompt's first 2 KB put every request on one engine)
through the whole request path: simulated engines (engine-sim, --time-scale),
the control plane, the ext_proc service and a real Envoy. Each mode runs on a
fresh rig: prefix (keys from the prompt's prefix chain and the learned split
table), random (affinity off for the class: a fresh key per request) and
session (an x-session-id per conversation). A recording proxy in front of each
engine sees what Envoy sent it.

It prints, per mode: distinct affinity keys per 1,000 requests, TTFT p50 and
p99 as the client sees them and as the engines report them (queueing and
prefill only), the prefix-cache hit rate, requests per engine (max/mean, idle
engines), remaps (later turns served by another engine than their
conversation's previous turn), key moves, the EDS weight changes during the
run and the split table's size; then the ratios against random. Latencies are
in the engines' simulated time.

--mooncake FILE replays the rows of a Mooncake trace instead (prompts that
share long prefixes inside one user message each, at the trace's own times,
--mooncake-speedup times faster, every hash id --mooncake-block-tokens words):
the hit rate to compare with the simulator's on the same rows (docs/sim.md).

  inferlb-lab bench affinity
  inferlb-lab bench affinity --modes prefix --mooncake mooncake_synthetic_trace.jsonl --mooncake-rows 600
  inferlb-lab bench affinity --requests 100 --modes prefix,random,session --json-out affinity.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Modes = strings.Split(modes, ",")
			for _, x := range []struct {
				flag, s string
				dst     *workload.Range
			}{{"--turns", turns, &o.Turns}, {"--user-tokens", user, &o.UserTokens}, {"--output-tokens", output, &o.OutputTokens}} {
				r, err := workload.ParseRange(x.s)
				if err != nil {
					return fmt.Errorf("%s: %w", x.flag, err)
				}
				*x.dst = r
			}
			if mooncake != "" {
				rows, err := workload.LoadMooncake(mooncake)
				if err != nil {
					return fmt.Errorf("--mooncake: %w", err)
				}
				if mooncakeRows < 0 {
					return fmt.Errorf("--mooncake-rows: %d is negative", mooncakeRows)
				}
				if mooncakeRows > 0 && mooncakeRows < len(rows) {
					rows = rows[:mooncakeRows]
				}
				o.Mooncake = rows
			}
			o.Progress = cmd.ErrOrStderr()
			rep, err := affinitybench.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			printAffinityReport(cmd.OutOrStdout(), rep)
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
	f.StringVar(&modes, "modes", strings.Join(o.Modes, ","), "modes to run, in order: prefix, random, session")
	f.IntVar(&o.Engines, "engines", o.Engines, "simulated engines")
	f.Float64Var(&o.TimeScale, "time-scale", o.TimeScale, "real seconds per simulated second for the engines (and the load generator)")
	f.IntVar(&o.Requests, "requests", o.Requests, "requests per mode")
	f.Float64Var(&o.Rate, "rate", o.Rate, "new conversations per simulated second (Poisson)")
	f.IntVar(&o.PreambleTokens, "preamble-tokens", o.PreambleTokens, "the shared preamble opening every conversation's first user message, in tokens")
	f.StringVar(&turns, "turns", fmt.Sprintf("%d-%d", o.Turns.Min, o.Turns.Max), "turns per conversation (N or MIN-MAX)")
	f.StringVar(&user, "user-tokens", fmt.Sprintf("%d-%d", o.UserTokens.Min, o.UserTokens.Max), "tokens per user message")
	f.StringVar(&output, "output-tokens", fmt.Sprintf("%d-%d", o.OutputTokens.Min, o.OutputTokens.Max), "tokens per answer")
	f.DurationVar(&o.ThinkTime, "think-time", o.ThinkTime, "mean (exponential) pause between an answer and the next turn, simulated")
	f.Uint64Var(&o.Seed, "seed", o.Seed, "workload seed")
	f.Uint32Var(&o.HashBalanceFactor, "hash-balance-factor", o.HashBalanceFactor, "the class cluster's bounded-load factor in percent (>= 100, 0 = off)")
	f.StringVar(&jsonOut, "json-out", "", "also write the report as JSON to this file")
	f.StringVar(&mooncake, "mooncake", "", "replay this Mooncake trace (JSON Lines) instead of conversations")
	f.IntVar(&mooncakeRows, "mooncake-rows", 0, "--mooncake: the trace's first N rows (0: all)")
	f.IntVar(&o.MooncakeBlockTokens, "mooncake-block-tokens", 64, "--mooncake: words per hash id (the trace's blocks are 512 tokens)")
	f.Float64Var(&o.MooncakeSpeedup, "mooncake-speedup", 4, "--mooncake: replay this many times faster than the trace's timestamps (simulated time)")
	return cmd
}

func printAffinityReport(w io.Writer, rep *affinitybench.Report) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "mode\trequests\tkeys/1000\tTTFT p50 ms\tp99 ms\tengine TTFT p50 ms\tp99 ms\thit rate\tmax/mean\tidle engines\tremaps\tkey moves\tweight changes\ttable rules\t")
	for _, p := range rep.Phases {
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%.0f\t%.0f\t%.0f\t%.0f\t%.3f\t%.2f\t%d\t%d/%d\t%d/%d\t%d\t%d\t\n", p.Mode, p.Requests, p.KeysPer1000,
			p.TTFTP50(), p.TTFTP99(), p.EngineTTFTP50Ms, p.EngineTTFTP99Ms, p.HitRate(), p.MaxOverMean, p.IdleEngines, p.Remaps, p.LaterTurns,
			p.KeyMoves, p.LaterTurns, p.WeightChanges, p.TableRules)
	}
	_ = tw.Flush()
	if r := rep.Phase(affinitybench.ModeRandom); r != nil && r.TTFTP50() > 0 {
		for _, p := range rep.Phases {
			if p.Mode == affinitybench.ModeRandom {
				continue
			}
			fmt.Fprintf(w, "%s vs random: TTFT p50 %.2f×, p99 %.2f×; engine TTFT p50 %.2f×, p99 %.2f×; hit rate %.2f×\n", p.Mode, p.TTFTP50()/r.TTFTP50(),
				p.TTFTP99()/r.TTFTP99(), p.EngineTTFTP50Ms/max(r.EngineTTFTP50Ms, 1e-9), p.EngineTTFTP99Ms/max(r.EngineTTFTP99Ms, 1e-9), p.HitRate()/max(r.HitRate(), 1e-9))
		}
	}
}
