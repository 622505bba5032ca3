package labcmd

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"

	"github.com/inferlb/inferlb/controlplane"
	"github.com/inferlb/inferlb/tools/fleetsim"
)

func newSimCmd() *cobra.Command {
	var o simFlags
	cmd := &cobra.Command{
		Use:   "sim SCENARIO.yaml...",
		Short: "Simulate a fleet under a scenario and compare routing policies",
		Long: `sim runs a discrete-event simulation, in virtual time, of the scenario's fleet
and workload (with its faults) once per routing policy, and prints one table
per scenario: TTFT p50/p90/p99, TPOT p50/p99, SLO goodput, prefix-cache hit
rate (and the best achievable with the fleet's caches pooled), shed and failed
shares, retries, weight churn per control cycle, conversations remapped and
the busiest engine's load over the mean, in in-flight requests and in
utilization (work over capacity: the balance figure with mixed GPUs).
--seeds N runs each policy N times (seeds --seed, --seed+1, ...) and reports
the median of every figure.

The engines are the engine simulator's model; inferlb runs its own ext_proc
decisions and control loop (controlplane.Controller.Step) in the loop; Envoy's
Maglev is modelled exactly (internal/envoylb). Policies: ` + strings.Join(fleetsim.PolicyNames(), ", ") + `.
Scenario files: examples/sim/*.yaml; docs/sim.md documents their keys.

--out DIR writes, per scenario, DIR/NAME/results.json and the charts (PNG and
SVG: TTFT CDF, p99 over time, weights over time, engine utilization), and
DIR/README.md and DIR/results.json with every scenario. --bench runs the scale
benchmark instead (--engines, --requests) and reports CPU seconds.`,
		Example: `  inferlb-lab sim --duration 60s examples/sim/steady-3region.yaml
  inferlb-lab sim --duration 60s --policy inferlb,session_hash examples/sim/shared-preamble.yaml
  inferlb-lab sim --duration 60s --json --policy inferlb examples/sim/hot-region.yaml
  inferlb-lab sim --duration 60s --out sim-out examples/sim/engine-failure.yaml
  inferlb-lab sim --duration 60s --seeds 3 --policy inferlb,random_key examples/sim/steady-3region.yaml
  inferlb-lab sim --bench --engines 100 --requests 20000`,
		RunE: o.run,
	}
	f := cmd.Flags()
	f.StringSliceVar(&o.policies, "policy", nil, "policies to run, comma-separated (default: the scenario's, else all)")
	f.Uint64Var(&o.seed, "seed", 0, "random seed (default: the scenario's)")
	f.IntVar(&o.seeds, "seeds", 0, "run every policy with this many seeds (--seed, --seed+1, ...) and report medians (default: the scenario's seeds, else 1)")
	f.StringVar(&o.out, "out", "", "directory for results.json and charts per scenario, and a summary")
	f.StringVar(&o.dataDir, "data-dir", fleetsim.DefaultDataDir, "directory of the traces the azure and mooncake workloads replay")
	f.IntVar(&o.parallel, "parallel", min(2, runtime.NumCPU()), "policies simulated at once")
	f.BoolVar(&o.asJSON, "json", false, "print every figure as JSON instead of tables")
	f.BoolVar(&o.bench, "bench", false, "run the scale benchmark instead of scenarios")
	f.IntVar(&o.engines, "engines", 1000, "--bench: engines in the fleet")
	f.IntVar(&o.requests, "requests", 1_000_000, "--bench: requests to simulate")
	f.StringVar(&o.header, "header", "", "file whose text opens the --out summary (README.md)")
	f.BoolVar(&o.prefillPlacement, "prefill-placement", false, "ext_proc's --prefill-placement for the inferlb policies")
	f.BoolVar(&o.idlePlacement, "idle-placement", true, "ext_proc's --idle-placement for the inferlb policies (on, as ext_proc's default)")
	f.BoolVar(&o.cachePlacement, "cache-placement", true, "ext_proc's --cache-placement for the inferlb policies (on, as ext_proc's default)")
	f.Float64Var(&o.balanceFactor, "balance-factor", controlplane.DefaultConfig().BalanceFactor, "the control plane's --balance-factor for the inferlb policies (0 = off: the latency-minimizing plan)")
	f.DurationVar(&o.duration, "duration", 0, "traffic time instead of the scenario's (a quick look; the warm-up shrinks to at most a quarter)")
	return cmd
}

// simFlags are inferlb-lab sim's flags.
type simFlags struct {
	policies          []string
	seed              uint64
	seeds             int
	out, dataDir      string
	parallel          int
	asJSON, bench     bool
	engines, requests int
	header            string
	duration          time.Duration
	balanceFactor     float64
	prefillPlacement  bool
	idlePlacement     bool
	cachePlacement    bool
}

// run validates the flags, loads every scenario, then runs them in order.
func (o *simFlags) run(cmd *cobra.Command, args []string) error {
	defer fleetsim.WithSimGC()()
	if o.bench {
		if len(args) > 0 {
			return fmt.Errorf("sim: --bench takes no scenario files")
		}
		return runSimBench(cmd, o.engines, o.requests, o.policies)
	}
	if len(args) == 0 {
		return fmt.Errorf("sim: give at least one scenario file (examples/sim/*.yaml)")
	}
	if o.parallel < 1 {
		return fmt.Errorf("sim: --parallel must be at least 1, got %d", o.parallel)
	}
	if cmd.Flags().Changed("seeds") && (o.seeds < 1 || o.seeds > fleetsim.MaxSeeds) {
		return fmt.Errorf("sim: --seeds must be in [1, %d], got %d", fleetsim.MaxSeeds, o.seeds)
	}
	known := map[string]bool{}
	for _, p := range fleetsim.PolicyNames() {
		known[p] = true
	}
	for _, p := range o.policies {
		if !known[p] {
			return fmt.Errorf("sim: --policy: unknown policy %q (known: %s)", p, strings.Join(fleetsim.PolicyNames(), ", "))
		}
	}
	var scs []*fleetsim.Scenario
	for _, a := range args {
		sc, err := fleetsim.LoadScenario(a)
		if err != nil {
			return err
		}
		if cmd.Flags().Changed("duration") {
			if sc, err = sc.WithDuration(o.duration); err != nil {
				return fmt.Errorf("sim: --duration: %w", err)
			}
		}
		scs = append(scs, sc)
	}
	return o.runScenarios(cmd, scs)
}

// runScenarios runs each scenario with the flags' policies and seeds and
// writes tables, JSON and --out as asked.
func (o *simFlags) runScenarios(cmd *cobra.Command, scs []*fleetsim.Scenario) error {
	var results []*fleetsim.ScenarioResult
	w := cmd.OutOrStdout()
	for _, sc := range scs {
		pols := o.policies
		if len(pols) == 0 {
			pols = sc.Policies
		}
		bar := newProgress(cmd.ErrOrStderr(), sc.Name, pols)
		res, err := fleetsim.RunScenario(cmd.Context(), sc, fleetsim.RunOptions{Policies: pols, Seed: o.seed, Seeds: o.seeds,
			DataDir: o.dataDir, Parallel: o.parallel, Progress: bar.update, BalanceFactor: &o.balanceFactor,
			PrefillPlacement: o.prefillPlacement, IdlePlacement: o.idlePlacement, CachePlacement: o.cachePlacement})
		bar.done()
		if err != nil {
			return err
		}
		results = append(results, res)
		if o.out != "" {
			if err := fleetsim.WriteOut(o.out, res); err != nil {
				return fmt.Errorf("sim: --out: %w", err)
			}
		}
		if !o.asJSON {
			fmt.Fprintf(w, "\n%s — %s\n\n", res.Scenario, res.Description)
			fleetsim.WriteTable(w, res)
		}
	}
	if o.asJSON {
		if err := fleetsim.WriteJSON(w, results); err != nil {
			return err
		}
	}
	if o.out != "" {
		h := "# Simulation results\n\nGenerated by `make sim-report` (`inferlb-lab sim --out docs/results examples/sim/*.yaml`); docs/sim.md explains the model, the policies and how to read these tables.\n"
		if o.header != "" {
			b, err := os.ReadFile(o.header)
			if err != nil {
				return fmt.Errorf("sim: --header: %w", err)
			}
			h = string(b)
		}
		if err := fleetsim.WriteSummary(o.out, results, h); err != nil {
			return fmt.Errorf("sim: --out: %w", err)
		}
	}
	return nil
}

// runSimBench runs the scale benchmark once per policy and prints requests,
// CPU seconds and wall seconds.
func runSimBench(cmd *cobra.Command, engines, requests int, policies []string) error {
	if engines < 1 || requests < 1 {
		return fmt.Errorf("sim --bench: --engines and --requests must be positive, got %d and %d", engines, requests)
	}
	if len(policies) == 0 {
		policies = []string{fleetsim.PolicyInferlb}
	}
	sc, err := fleetsim.ScaleScenario(engines, requests)
	if err != nil {
		return err
	}
	w := cmd.OutOrStdout()
	fmt.Fprintf(w, "scale benchmark: %d engines, %d requests (GOMAXPROCS %d)\n", engines, requests, runtime.GOMAXPROCS(0))
	for _, p := range policies {
		bar := newProgress(cmd.ErrOrStderr(), "bench", []string{p})
		t0, c0 := time.Now(), ownCPU()
		r, err := fleetsim.Run(cmd.Context(), fleetsim.Options{Scenario: sc, Policy: p, MaxArrivals: requests, NoSeries: true,
			Progress: func(d float64) { bar.update(p, d) }})
		bar.done()
		if err != nil {
			return err
		}
		wall, cpu := time.Since(t0).Seconds(), ownCPU()-c0
		fmt.Fprintf(w, "%-20s %9d requests  %7.1f CPU-s  %7.1f wall-s  %8.0f req/CPU-s  TTFT p50 %.0f ms p99 %.0f ms\n",
			p, r.Arrived, cpu, wall, float64(r.Arrived)/cpu, r.TTFT.P50, r.TTFT.P99)
	}
	return nil
}

// ownCPU is this process's CPU seconds (0 if /proc cannot tell).
func ownCPU() float64 {
	v, _ := cpuSeconds(os.Getpid())
	return v
}

// progress shows how far a scenario's runs are: a bar redrawn in place on
// a terminal, a plain line every 10% otherwise.
type progress struct {
	w     io.Writer
	name  string
	tty   bool
	mu    sync.Mutex
	done_ map[string]float64
	pols  []string
	last  int
	start time.Time
}

func newProgress(w io.Writer, name string, pols []string) *progress {
	tty := false
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 && os.Getenv("TERM") != "dumb" {
			tty = true
		}
	}
	return &progress{w: w, name: name, tty: tty, done_: map[string]float64{}, pols: pols, last: -1, start: time.Now()}
}

func (p *progress) update(policy string, d float64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done_[policy] = d
	sum := 0.0
	for _, x := range p.done_ {
		sum += x
	}
	frac := sum / float64(len(p.pols))
	pct := int(frac * 100)
	if p.tty {
		if pct == p.last {
			return
		}
		p.last = pct
		n := int(frac * 30)
		fmt.Fprintf(p.w, "\r%-24s [%s%s] %3d%%  %4.0fs", p.name, strings.Repeat("#", n), strings.Repeat("-", 30-n), pct, time.Since(p.start).Seconds())
		return
	}
	if pct/10 > p.last/10 || p.last < 0 {
		p.last = pct
		fmt.Fprintf(p.w, "sim %s: %d%% (%.0fs)\n", p.name, pct/10*10, time.Since(p.start).Seconds())
	}
}

func (p *progress) done() {
	if p.tty {
		fmt.Fprintf(p.w, "\r%-24s done in %.1fs%s\n", p.name, time.Since(p.start).Seconds(), strings.Repeat(" ", 30))
	}
}
