package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane"
	"github.com/inferlb/inferlb/optimizer"
	"github.com/inferlb/inferlb/xds/translate"
)

func init() {
	d := controlplane.DefaultRunConfig()
	var (
		fleetPath       string
		lbPolicy        string
		allocator       string
		logLevel        string
		solverTolerance float64
	)
	cmd := &cobra.Command{
		Use:   "control-plane --fleet FILE",
		Short: "Run the xDS control plane: engine signals and demand in, per-frontend weights out",
		Long: `control-plane scrapes every engine of the fleet (/metrics in vLLM's names and
/health), takes demand reports from the ext_proc services (gRPC Reports), runs
the optimizer every --interval (and at once when an engine's health changes),
and publishes per frontend node, over ADS (state of the world and delta) on
--xds-listen:

  CDS  one cluster per eligibility class (inferlb_<class>), Maglev or ring hash
       with bounded loads, active health checks, outlier detection
  EDS  endpoint weights = that frontend's optimal share (integers >= 1;
       engines with no share at priority 1)
  RoutingPolicy (custom type, resource name = node id) for ext_proc: class
       table, shed fractions by priority, retry allowance

Envoy keeps its last config while the control plane is away. --state-file
keeps the published weights across restarts so a restarted control plane
republishes the same weights instead of starting cold.

The xDS/Reports port is authenticated: mutual TLS (--tls-cert, --tls-key,
--tls-client-ca), a shared bearer token (--token-file), or both. Without
either it refuses to start unless --insecure is given (local demos only):
whoever reaches an unauthenticated port reads every node's configuration and
can steer the optimizer with forged reports. Reports are also checked for
plausibility (rates within the frontend's max_requests_per_s, evidence within
the requests reported, timestamps within --max-clock-skew of this clock).

The admin HTTP server (--admin-listen, localhost by default) serves /weights,
/explain, /signals, /xds (ACK/NACK per node), /history (the last --history
cycles), /metrics, /healthz and /readyz, and the web dashboard at /dashboard/:
weights as a heatmap per class, the engine table, TTFT, load and shedding
over time, and the optimizer's reasons for any weight (docs/demo.md).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log, err := newLogger(logLevel)
			if err != nil {
				return err
			}
			if fleetPath == "" {
				return fmt.Errorf("--fleet is required")
			}
			spec, err := fleet.Load(fleetPath)
			if err != nil {
				return err
			}
			d.Fleet, d.Logger = spec, log
			switch lbPolicy {
			case "maglev":
				d.Cycle.Translate.LBPolicy = translate.Maglev
			case "ring_hash":
				d.Cycle.Translate.LBPolicy = translate.RingHash
			default:
				return fmt.Errorf("--lb-policy: want maglev or ring_hash, got %q", lbPolicy)
			}
			switch allocator {
			case "optimizer":
				if !(solverTolerance > 0 && solverTolerance < 1) {
					return fmt.Errorf("--solver-tolerance: want a gap in (0, 1), got %g", solverTolerance)
				}
				d.Allocator = controlplane.OptimizerAllocator{Options: optimizer.Options{Tolerance: solverTolerance}}
			case "proportional":
				d.Allocator = controlplane.ProportionalAllocator{}
			default:
				return fmt.Errorf("--allocator: want optimizer or proportional, got %q", allocator)
			}
			if err := d.Auth.Validate(); err != nil {
				return err
			}
			for name, v := range map[string]time.Duration{"--evidence-window": d.EvidenceWindow, "--idle-reset": d.IdleReset, "--max-clock-skew": d.MaxClockSkew} {
				if v <= 0 {
					return fmt.Errorf("%s: must be positive, got %v", name, v)
				}
			}
			if d.Auth.TokenFile != "" && d.Auth.CertFile == "" {
				log.Warn("the xDS token travels without TLS: use it only on the same host or a trusted network (add --tls-cert/--tls-key)")
			}
			r, err := controlplane.NewRunner(d)
			if err != nil {
				return namingFlags(err)
			}
			return r.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&fleetPath, "fleet", "", "fleet spec (YAML), e.g. examples/fleet-3region.yaml")
	f.StringVar(&d.XDSListen, "xds-listen", d.XDSListen, "gRPC address for ADS and Reports")
	f.BoolVar(&d.Auth.Insecure, "insecure", false, "serve ADS and Reports without authentication (local demos only)")
	f.StringVar(&d.Auth.CertFile, "tls-cert", "", "server certificate (PEM): TLS on the xDS/Reports port")
	f.StringVar(&d.Auth.KeyFile, "tls-key", "", "the key (PEM) of --tls-cert")
	f.StringVar(&d.Auth.ClientCAFile, "tls-client-ca", "", "CA (PEM) that client certificates must chain to: mutual TLS")
	f.StringVar(&d.Auth.TokenFile, "token-file", "", "file of accepted bearer tokens, one per line (re-read when it changes)")
	f.StringVar(&d.AdminListen, "admin-listen", d.AdminListen, "admin HTTP address (keep it on localhost)")
	f.DurationVar(&d.Interval, "interval", d.Interval, "control cycle period")
	f.DurationVar(&d.ScrapeInterval, "scrape-interval", d.ScrapeInterval, "engine /metrics and /health scrape period")
	f.DurationVar(&d.ScrapeTimeout, "scrape-timeout", d.ScrapeTimeout, "timeout of each scrape request")
	f.DurationVar(&d.StaleAfter, "stale-after", d.StaleAfter, "an engine without good metrics this long is stale (unknown)")
	f.DurationVar(&d.Smoothing, "smoothing", d.Smoothing, "EWMA time constant of engine signals")
	f.DurationVar(&d.DemandWindow, "demand-window", d.DemandWindow, "window over which reported demand is averaged")
	f.DurationVar(&d.Warmup, "warmup", d.Warmup, "wait this long (scrapes and reports) before the first publication")
	f.StringVar(&d.StateFile, "state-file", "", "file keeping the published weights across restarts")
	f.IntVar(&d.History, "history", d.History, "cycles kept in memory for /history and the dashboard's charts")
	f.DurationVar(&d.MaxClockSkew, "max-clock-skew", 10*time.Second, "reports whose interval ends further than this from this clock are refused")
	f.StringVar(&allocator, "allocator", "optimizer", "optimizer, or proportional (capacity-proportional baseline)")
	f.Float64Var(&solverTolerance, "solver-tolerance", controlplane.DefaultSolverTolerance, "optimizer's relative optimality gap per cycle")
	f.StringVar(&lbPolicy, "lb-policy", "maglev", "maglev or ring_hash")
	f.Uint32Var(&d.Cycle.Translate.HashBalanceFactor, "hash-balance-factor", d.Cycle.Translate.HashBalanceFactor, "bounded-load factor in percent (>= 100, 0 = off)")
	f.Uint64Var(&d.Cycle.Translate.MaglevTableSize, "maglev-table-size", d.Cycle.Translate.MaglevTableSize, "Maglev table size (a prime)")
	f.Uint32Var(&d.Cycle.Translate.WeightScale, "weight-scale", d.Cycle.Translate.WeightScale, "Envoy weight of a share of 1.0")
	f.DurationVar(&d.Cycle.Translate.HealthCheck.Interval, "health-check-interval", d.Cycle.Translate.HealthCheck.Interval, "Envoy active health check interval")
	f.DurationVar(&d.Cycle.Translate.HealthCheck.Timeout, "health-check-timeout", d.Cycle.Translate.HealthCheck.Timeout, "Envoy active health check timeout")
	f.Uint32Var(&d.Cycle.Translate.HealthCheck.UnhealthyThreshold, "health-check-unhealthy-threshold", d.Cycle.Translate.HealthCheck.UnhealthyThreshold, "failed checks before Envoy marks a host unhealthy")
	f.Float64Var(&d.Cycle.Headroom, "headroom", d.Cycle.Headroom, "planned utilization cap of available capacity, in (0, 1)")
	f.Float64Var(&d.Cycle.OverloadHeadroom, "overload-headroom", d.Cycle.OverloadHeadroom, "utilization cap when demand does not fit under --headroom (the rest is shed), in [headroom, 1)")
	f.Float64Var(&d.Cycle.MarginalStretch, "marginal-stretch", d.Cycle.MarginalStretch, "an engine is full where one more request would cost this many times its zero-load latency (its own and the congestion it adds), if before --headroom; 0 = the headroom alone")
	f.DurationVar(&d.Cycle.ShapeSmoothing, "shape-smoothing", d.Cycle.ShapeSmoothing, "time constant with which each class's tokens per request and cached prompt share follow what is observed")
	f.Float64Var(&d.Cycle.MaxCachedShare, "max-cached-share", d.Cycle.MaxCachedShare, "largest share of prompt tokens counted as prefix-cache hits (no prefill work), in [0, 1)")
	f.Float64Var(&d.Cycle.StabilityMs, "stability-ms", d.Cycle.StabilityMs, "optimizer cost per moved request (cold KV cache), ms")
	f.Float64Var(&d.Cycle.PenaltyCostMs, "penalty-cost-ms", d.Cycle.PenaltyCostMs, "optimizer cost per request per unit of an engine's outlier penalty (failures, slowness), ms")
	f.Float64Var(&d.Cycle.DeadbandTV, "deadband", d.Cycle.DeadbandTV, "smallest total-variation change of a frontend's class weights worth publishing")
	f.DurationVar(&d.Cycle.DemandSmoothing, "demand-smoothing", d.Cycle.DemandSmoothing, "time constant of the demand the optimizer plans with (0 = the demand window's rates as they are)")
	f.DurationVar(&d.Cycle.Penalty.HalfLife, "penalty-half-life", d.Cycle.Penalty.HalfLife, "decay half-life of an outlier penalty while the engine's traffic looks normal again")
	f.Float64Var(&d.Cycle.Penalty.ProbeRPS, "probe-rps", d.Cycle.Penalty.ProbeRPS, "requests/s a penalized engine keeps of each class, to judge its recovery")
	f.Float64Var(&d.Cycle.Penalty.MaxProbeShare, "max-probe-share", d.Cycle.Penalty.MaxProbeShare, "largest share of a class a penalized engine keeps for probing")
	f.DurationVar(&d.EvidenceWindow, "evidence-window", 10*time.Second, "how far back the latency evidence of outlier penalties reaches")
	f.DurationVar(&d.IdleReset, "idle-reset", time.Minute, "an engine without a first token this long forgets its measured latency")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	rootCmd.AddCommand(cmd)
}

// configFlags maps the config keys the control plane's validation names
// (controlplane.NewRunner, its cycle and translation options) to the flags
// that set them, so that an error names what the user typed.
var configFlags = map[string]string{
	"interval": "--interval", "scrape_interval": "--scrape-interval", "scrape_timeout": "--scrape-timeout",
	"stale_after": "--stale-after", "demand_window": "--demand-window", "warmup": "--warmup",
	"smoothing": "--smoothing", "history": "--history",
	"headroom": "--headroom", "stability_ms": "--stability-ms", "penalty_cost_ms": "--penalty-cost-ms",
	"marginal_stretch": "--marginal-stretch", "shape_smoothing": "--shape-smoothing", "max_cached_share": "--max-cached-share",
	"deadband_tv": "--deadband", "demand_smoothing": "--demand-smoothing", "penalty.half_life": "--penalty-half-life",
	"maglev_table_size": "--maglev-table-size", "hash_balance_factor": "--hash-balance-factor",
	"weight_scale":                                       "--weight-scale",
	"health_check.interval/timeout":                      "--health-check-interval / --health-check-timeout",
	"health_check.unhealthy_threshold/healthy_threshold": "--health-check-unhealthy-threshold",
}

// namingFlags rewrites the control plane's config errors ("control plane:
// demand_window must be positive", one per line when there are several)
// to name the flags instead of the config keys.
func namingFlags(err error) error {
	lines := strings.Split(err.Error(), "\n")
	changed := false
	for i, l := range lines {
		prefix := ""
		for _, p := range []string{"control plane config: ", "control plane: "} {
			if strings.HasPrefix(l, p) {
				prefix = p
				break
			}
		}
		rest := l[len(prefix):]
		end := strings.IndexAny(rest, ": ")
		if end < 0 {
			continue
		}
		if flag, ok := configFlags[rest[:end]]; ok {
			lines[i] = prefix + flag + rest[end:]
			changed = true
		}
	}
	if !changed {
		return err
	}
	return errors.New(strings.Join(lines, "\n"))
}
