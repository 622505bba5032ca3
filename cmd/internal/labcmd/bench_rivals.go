package labcmd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/inferlb/inferlb/internal/envoybin"
	"github.com/inferlb/inferlb/tools/rivalbench"
	"github.com/inferlb/inferlb/tools/workload"
)

func newBenchRivalsCmd() *cobra.Command {
	o := rivalbench.DefaultOptions()
	var routers, workloads, shares, resultsDir string
	cmd := &cobra.Command{
		Use:   "rivals",
		Short: "Run inferlb beside the real SGLang and vLLM routers on identical engines and traffic",
		Long: `bench rivals runs inferlb side by side with the real routers it is measured
against, each at its documented defaults: SGLang's model gateway smg
(cache_aware, prefix_hash), sglang-router (cache_aware) and vllm-router
(cache_aware, consistent_hash, and round_robin, the baseline of every ratio).
One engine-sim process serves an identical fleet to each router (4 H100
engines of an 8B model per region, differing only in their ports); the same
workload, same seed, starts at the same instant against every router. inferlb
runs as its users run it: the control plane at its defaults, ext_proc, and
Envoy from 'inferlb extproc --print-bootstrap'. Every run starts everything
afresh (empty caches). The rivals come from PyPI, pinned, one virtual
environment each (scripts/setup-rivals.sh; make bench-rivals installs them).

Per router it prints the medians over --runs of: the engines' prefix-cache
hit rate (their own counters), the clients' TTFT p50/p90/p99 and the ratios to
round robin's, TPOT, throughput, requests served, shed (429) and failed, the
share of follow-up turns that reached an engine without their conversation's
history, the busiest engine's load over the mean, and the router's CPU
seconds (inferlb: its Envoys, ext_proc services and control plane). Latencies
are real time (the engines run at time scale 1).

Workloads (--workloads): mooncake (windows of Mooncake's synthetic trace),
multiturn (shared 4k-token system prompts, no session ids),
multiturn-sessions (the same with x-session-id), agentic (tool loops on a
growing context), rag (per-user prompt, one of 50 documents, a question),
azure-conv (Azure's conversation trace: no shared prefixes).

--regions 3 splits each fleet over us-east, us-west and eu-west with the
round trips emulated by the engine simulator: a rival runs one router per
region in front of that region's engines, each region's clients sending to
their own region's router; inferlb runs one control plane and an ext_proc and
Envoy per region. --shares sets the regions' shares of the traffic (a hot
region). --results writes results.json, table.txt and a TTFT CDF chart per
workload (docs/results/rivals: make bench-rivals).`,
		Example: `  make bench-rivals
  inferlb-lab bench rivals --workloads multiturn --runs 1 --duration 30s
  inferlb-lab bench rivals --routers inferlb,sglang-router-cache_aware,round-robin --workloads mooncake
  inferlb-lab bench rivals --regions 3 --shares us-east=3,us-west=1,eu-west=1 --workloads multiturn`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Routers, err = rivalbench.ParseRouters(routers); err != nil {
				return fmt.Errorf("--routers: %w", err)
			}
			if o.Workloads, err = rivalbench.ParseWorkloads(workloads); err != nil {
				return fmt.Errorf("--workloads: %w", err)
			}
			if shares != "" {
				if o.Shares, err = workload.ParseShares(shares); err != nil {
					return fmt.Errorf("--shares: %w", err)
				}
			}
			if o.Self, err = os.Executable(); err != nil {
				return err
			}
			if o.Envoy, err = envoybin.Binary(); err != nil {
				return err
			}
			o.RivalDir = rivalbench.RivalDir(envoybin.Venv())
			if o.OutDir == "" {
				if o.OutDir, err = os.MkdirTemp("", "inferlb-rivals-"); err != nil {
					return err
				}
			}
			if _, err := os.Stat(filepath.Join(o.DataDir, "mooncake_synthetic_trace.jsonl")); err != nil && needsTraces(o.Workloads) {
				return fmt.Errorf("--data-dir: %w (the traces of the mooncake and azure-conv workloads)", err)
			}
			o.Progress = cmd.ErrOrStderr()
			fmt.Fprintf(cmd.ErrOrStderr(), "logs in %s\n", o.OutDir)
			res, err := rivalbench.Run(cmd.Context(), o)
			if err != nil {
				return err
			}
			if err := res.WriteTable(cmd.OutOrStdout()); err != nil {
				return err
			}
			if resultsDir != "" {
				return res.WriteFiles(resultsDir)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&routers, "routers", "all", "routers to run, comma-separated: all, or of "+strings.Join(rivalbench.RouterIDs(), ", "))
	f.StringVar(&workloads, "workloads", "all", "workloads to run, comma-separated: all, or of mooncake, multiturn, multiturn-sessions, agentic, rag, azure-conv")
	f.IntVar(&o.Regions, "regions", o.Regions, "1 (one region) or 3 (us-east, us-west, eu-west, round trips emulated)")
	f.StringVar(&shares, "shares", "", "with --regions 3: the regions' shares of the traffic, e.g. us-east=3,us-west=1,eu-west=1 (default equal)")
	f.IntVar(&o.EnginesPerRegion, "engines", o.EnginesPerRegion, "each router's engines per region")
	f.IntVar(&o.Runs, "runs", o.Runs, "runs per workload (the table shows medians)")
	f.DurationVar(&o.Duration, "duration", o.Duration, "traffic per run (requests in flight then finish)")
	f.Float64Var(&o.Load, "load", o.Load, "scale of the synthetic workloads' arrival rates (1: where round robin's engines queue)")
	f.Uint64Var(&o.Seed, "seed", o.Seed, "traffic seed (the same for every router)")
	f.StringVar(&o.DataDir, "data-dir", defaultDataDir(), "directory holding mooncake_synthetic_trace.jsonl and AzureLLMInferenceTrace_conv.csv")
	f.StringVar(&o.OutDir, "out", "", "directory for every process's log and each router's TTFTs (default: a new temporary directory)")
	f.StringVar(&resultsDir, "results", "", "also write results.json, table.txt and charts into this directory")
	return cmd
}

// defaultDataDir is where the project's traces are found: the
// repository's data/traces.
func defaultDataDir() string {
	if root, err := envoybin.RepoRoot(); err == nil {
		return filepath.Join(root, "data", "traces")
	}
	return filepath.Join("data", "traces")
}

func needsTraces(ws []rivalbench.Workload) bool {
	for _, w := range ws {
		if w.Name == "mooncake" || w.Name == "azure-conv" {
			return true
		}
	}
	return false
}
