package opcmd

import (
	"fmt"
	"math"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/cmd/internal/cli"
	"github.com/inferlb/inferlb/cmd/internal/cliconfig"
	"github.com/inferlb/inferlb/controlplane"
	"github.com/inferlb/inferlb/controlplane/discovery/kube"
	"github.com/inferlb/inferlb/optimizer"
	"github.com/inferlb/inferlb/xds/translate"
)

// controlPlaneLong is control-plane --help's text.
const controlPlaneLong = `control-plane scrapes every engine of the fleet (/metrics in the names of its
engines[].server, vLLM's or SGLang's, and its health path), takes demand reports from the ext_proc services (gRPC Reports), runs
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
over time, and the optimizer's reasons for any weight (docs/demo.md).`

// controlPlaneOptions are the control-plane flags that are not RunConfig
// fields: they choose or build one (the fleet, the allocator, the logger).
type controlPlaneOptions struct {
	fleet, lbPolicy, allocator, logLevel string
	solverTolerance, timeScale           float64
	// Kubernetes discovery (instead of --fleet): the pool, the ConfigMap
	// with the rest of the fleet, the API server's credentials.
	kubeconfig, inferencePool, fleetConfigMap, fleetConfigMapKey string
	discoveryTimeout                                             time.Duration
	keepSysmonAwake                                              bool
}

func newControlPlaneCmd() *cobra.Command {
	d := controlplane.DefaultRunConfig()
	var o controlPlaneOptions
	cmd := &cobra.Command{
		Use:   "control-plane --fleet FILE",
		Short: "Run the xDS control plane: engine signals and demand in, per-frontend weights out",
		Long:  controlPlaneLong,
		Example: `  inferlb control-plane --fleet examples/fleet-3region.yaml --insecure
  inferlb control-plane --config examples/config/control-plane.yaml --insecure`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := o.apply(cmd.Flags(), &d); err != nil {
				return err
			}
			if o.inferencePool != "" {
				cli.KeepSysmonAwake(o.keepSysmonAwake, d.Logger)
				return o.serveKubernetes(cmd, d)
			}
			r, err := controlplane.NewRunner(d)
			if err != nil {
				return namingFlags(cmd.Flags(), err)
			}
			cli.KeepSysmonAwake(o.keepSysmonAwake, d.Logger)
			return r.Run(cmd.Context())
		},
	}
	controlPlaneFlags(cmd, &d, &o)
	cliconfig.Add(cmd)
	return cmd
}

// apply validates the options and the flags the runner does not check
// itself, and completes d.
func (o *controlPlaneOptions) apply(fs *pflag.FlagSet, d *controlplane.RunConfig) error {
	name := func(flag string) string { return cliconfig.Name(fs, flag) }
	log, err := cli.NewLogger(o.logLevel)
	if err != nil {
		return fmt.Errorf("%s: %w", name("log-level"), err)
	}
	switch {
	case o.fleet != "" && o.inferencePool != "":
		return fmt.Errorf("%s and %s: give one (the fleet file lists the engines; Kubernetes discovery finds them)", name("fleet"), name("inference-pool"))
	case o.fleet == "" && o.inferencePool == "":
		return fmt.Errorf("%s or %s is required", name("fleet"), name("inference-pool"))
	case o.inferencePool != "":
		if _, _, err := kube.ParsePool(o.inferencePool); err != nil {
			return fmt.Errorf("%s: %w", name("inference-pool"), err)
		}
		if o.fleetConfigMap == "" || o.fleetConfigMapKey == "" {
			return fmt.Errorf("%s and %s: must not be empty", name("fleet-configmap"), name("fleet-configmap-key"))
		}
		if o.discoveryTimeout <= 0 {
			return fmt.Errorf("%s: must be positive, got %v", name("discovery-timeout"), o.discoveryTimeout)
		}
		if !(o.timeScale > 0) || math.IsInf(o.timeScale, 0) {
			return fmt.Errorf("%s: must be a positive number, got %v", name("time-scale"), o.timeScale)
		}
	default:
		spec, err := fleet.Load(o.fleet)
		if err != nil {
			return err
		}
		if spec, err = spec.InRealTime(o.timeScale); err != nil {
			return fmt.Errorf("%s: %w", name("time-scale"), err)
		}
		d.Fleet = spec
	}
	d.Logger = log
	switch o.lbPolicy {
	case "maglev":
		d.Cycle.Translate.LBPolicy = translate.Maglev
	case "ring_hash":
		d.Cycle.Translate.LBPolicy = translate.RingHash
	default:
		return fmt.Errorf("%s: want maglev or ring_hash, got %q", name("lb-policy"), o.lbPolicy)
	}
	switch o.allocator {
	case "optimizer":
		if !(o.solverTolerance > 0 && o.solverTolerance < 1) {
			return fmt.Errorf("%s: want a gap in (0, 1), got %g", name("solver-tolerance"), o.solverTolerance)
		}
		d.Allocator = controlplane.OptimizerAllocator{Options: optimizer.Options{Tolerance: o.solverTolerance}}
	case "proportional":
		d.Allocator = controlplane.ProportionalAllocator{}
	default:
		return fmt.Errorf("%s: want optimizer or proportional, got %q", name("allocator"), o.allocator)
	}
	if err := d.Auth.Validate(); err != nil {
		return err
	}
	for _, c := range []struct {
		flag string
		v    time.Duration
	}{{"evidence-window", d.EvidenceWindow}, {"idle-reset", d.IdleReset}, {"max-clock-skew", d.MaxClockSkew}} {
		if c.v <= 0 {
			return fmt.Errorf("%s: must be positive, got %v", name(c.flag), c.v)
		}
	}
	if d.Auth.TokenFile != "" && d.Auth.CertFile == "" {
		log.Warn("the xDS token travels without TLS: use it only on the same host or a trusted network (add --tls-cert/--tls-key)")
	}
	return nil
}

// controlPlaneFlags defines the control plane's flags, which are also its
// config file's keys (docs/configuration.md is generated from them). Each
// default is RunConfig's.
func controlPlaneFlags(cmd *cobra.Command, d *controlplane.RunConfig, o *controlPlaneOptions) {
	f := cmd.Flags()
	c, t, p := &d.Cycle, &d.Cycle.Translate, &d.Cycle.Penalty
	f.StringVar(&o.fleet, "fleet", "", "fleet spec (YAML), e.g. examples/fleet-3region.yaml (or --inference-pool)")
	cli.SysmonFlag(f, &o.keepSysmonAwake)
	f.StringVar(&o.inferencePool, "inference-pool", "", "Kubernetes discovery instead of --fleet: the engines are the ready pods of this InferencePool (namespace/name), the rest of the fleet is in --fleet-configmap (docs/kubernetes.md)")
	f.StringVar(&o.kubeconfig, "kubeconfig", "", "with --inference-pool: kubeconfig file of the API server (empty: the pod's in-cluster service account)")
	f.StringVar(&o.fleetConfigMap, "fleet-configmap", "inferlb-fleet", "with --inference-pool: the ConfigMap, in the pool's namespace, holding the fleet spec without engines")
	f.StringVar(&o.fleetConfigMapKey, "fleet-configmap-key", kube.DefaultConfigMapKey, "with --inference-pool: the key of --fleet-configmap holding the fleet spec")
	f.DurationVar(&o.discoveryTimeout, "discovery-timeout", 2*time.Minute, "with --inference-pool: how long to wait at start for the first fleet (the pool, a ready pod, the ConfigMap)")
	f.StringVar(&d.XDSListen, "xds-listen", d.XDSListen, "gRPC address for ADS and Reports")
	f.BoolVar(&d.Auth.Insecure, "insecure", false, "serve ADS and Reports without authentication (local demos only)")
	f.StringVar(&d.Auth.CertFile, "tls-cert", "", "server certificate (PEM): TLS on the xDS/Reports port (re-read with --tls-key when either changes: rotates without a restart)")
	f.StringVar(&d.Auth.KeyFile, "tls-key", "", "the key (PEM) of --tls-cert")
	f.StringVar(&d.Auth.ClientCAFile, "tls-client-ca", "", "CA (PEM) that client certificates must chain to: mutual TLS (re-read when it changes)")
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
	f.Float64Var(&o.timeScale, TimeScaleFlag, 1, "the engines are simulators at this time scale (engine-sim --time-scale): the fleet's profiles and round trips are read in their real time (durations × it, rates ÷ it)")
	// Real engines run in real time: the setting is the lab's (its
	// control-plane shows it, labcmd), not one an operator sets.
	_ = f.MarkHidden(TimeScaleFlag)
	f.StringVar(&o.allocator, "allocator", "optimizer", "optimizer, or proportional (capacity-proportional baseline)")
	f.Float64Var(&o.solverTolerance, "solver-tolerance", controlplane.DefaultSolverTolerance, "optimizer's relative optimality gap per cycle")
	f.StringVar(&o.lbPolicy, "lb-policy", "maglev", "maglev or ring_hash")
	f.Uint32Var(&t.HashBalanceFactor, "hash-balance-factor", t.HashBalanceFactor, "bounded-load factor in percent (>= 100, 0 = off)")
	f.Uint64Var(&t.MaglevTableSize, "maglev-table-size", t.MaglevTableSize, "Maglev table size (a prime)")
	f.Uint64Var(&t.RingMinSize, "ring-min-size", t.RingMinSize, "with --lb-policy ring_hash: smallest ring")
	f.Uint64Var(&t.RingMaxSize, "ring-max-size", t.RingMaxSize, "with --lb-policy ring_hash: largest ring")
	f.Uint32Var(&t.WeightScale, "weight-scale", t.WeightScale, "Envoy weight of a share of 1.0")
	f.Float64Var(&t.HealthyPanicThreshold, "healthy-panic-threshold", t.HealthyPanicThreshold, "Envoy's panic threshold in percent of healthy hosts (0 = off: a mostly-dead priority fails over instead of spraying dead engines)")
	f.DurationVar(&t.ConnectTimeout, "connect-timeout", t.ConnectTimeout, "Envoy's connect timeout to an engine")
	f.DurationVar(&t.HealthCheck.Interval, "health-check-interval", t.HealthCheck.Interval, "Envoy active health check interval")
	f.DurationVar(&t.HealthCheck.Timeout, "health-check-timeout", t.HealthCheck.Timeout, "Envoy active health check timeout")
	f.Uint32Var(&t.HealthCheck.UnhealthyThreshold, "health-check-unhealthy-threshold", t.HealthCheck.UnhealthyThreshold, "failed checks before Envoy marks a host unhealthy")
	f.Uint32Var(&t.HealthCheck.HealthyThreshold, "health-check-healthy-threshold", t.HealthCheck.HealthyThreshold, "passed checks before Envoy marks an unhealthy host healthy again")
	f.Uint32Var(&t.Outlier.Consecutive5xx, "outlier-consecutive-5xx", t.Outlier.Consecutive5xx, "Envoy ejects an engine after this many 5xx in a row")
	f.Uint32Var(&t.Outlier.ConsecutiveGatewayFailure, "outlier-consecutive-gateway-failure", t.Outlier.ConsecutiveGatewayFailure, "Envoy ejects an engine after this many gateway failures (502-504, resets) in a row")
	f.DurationVar(&t.Outlier.Interval, "outlier-interval", t.Outlier.Interval, "Envoy's outlier detection sweep interval")
	f.DurationVar(&t.Outlier.BaseEjectionTime, "outlier-base-ejection-time", t.Outlier.BaseEjectionTime, "an engine's first ejection lasts this long (longer for each repeat)")
	f.Uint32Var(&t.Outlier.MaxEjectionPercent, "outlier-max-ejection-percent", t.Outlier.MaxEjectionPercent, "most engines of a cluster Envoy ejects at once, in percent")
	f.Uint32Var(&t.Circuit.MaxConnections, "circuit-max-connections", t.Circuit.MaxConnections, "Envoy circuit breaker: connections per cluster")
	f.Uint32Var(&t.Circuit.MaxPendingRequests, "circuit-max-pending-requests", t.Circuit.MaxPendingRequests, "Envoy circuit breaker: requests waiting for a connection per cluster")
	f.Uint32Var(&t.Circuit.MaxRequests, "circuit-max-requests", t.Circuit.MaxRequests, "Envoy circuit breaker: requests in flight per cluster")
	f.Float64Var(&t.Circuit.RetryBudgetPercent, "circuit-retry-budget-percent", t.Circuit.RetryBudgetPercent, "Envoy's retry budget: concurrent retries as a percentage of active requests")
	f.Uint32Var(&t.Circuit.MinRetryConcurrency, "circuit-min-retry-concurrency", t.Circuit.MinRetryConcurrency, "concurrent retries Envoy's retry budget always allows")
	f.Float64Var(&c.Headroom, "headroom", c.Headroom, "planned utilization cap of available capacity, in (0, 1)")
	f.Float64Var(&c.OverloadHeadroom, "overload-headroom", c.OverloadHeadroom, "utilization cap when demand does not fit under --headroom (the rest is shed), in [headroom, 1)")
	f.Float64Var(&c.MarginalStretch, "marginal-stretch", c.MarginalStretch, "an engine is full where one more request would cost this many times its zero-load latency (its own and the congestion it adds), if before --headroom; 0 = the headroom alone")
	f.Float64Var(&c.BalanceFactor, "balance-factor", c.BalanceFactor, "plan no engine above this many times the mean planned utilization of the engines of its region that serve the same classes (≥ 1; 0 = off: the latency-minimizing plan as it is, faster on mixed GPUs but unbalanced)")
	f.DurationVar(&c.ShapeSmoothing, "shape-smoothing", c.ShapeSmoothing, "time constant with which each class's tokens per request and cached prompt share follow what is observed")
	f.Float64Var(&c.MaxCachedShare, "max-cached-share", c.MaxCachedShare, "largest share of prompt tokens counted as prefix-cache hits (no prefill work), in [0, 1)")
	f.Float64Var(&c.StabilityMs, "stability-ms", c.StabilityMs, "optimizer cost per moved request (cold KV cache), ms")
	f.Float64Var(&c.PenaltyCostMs, "penalty-cost-ms", c.PenaltyCostMs, "optimizer cost per request per unit of an engine's outlier penalty (failures, slowness), ms")
	f.Float64Var(&c.DeadbandTV, "deadband", c.DeadbandTV, "smallest total-variation change of a frontend's class weights worth publishing")
	f.DurationVar(&c.DemandSmoothing, "demand-smoothing", c.DemandSmoothing, "time constant of the demand the optimizer plans with (0 = the demand window's rates as they are)")
	f.Float64Var(&c.ShedDeadband, "shed-deadband", c.ShedDeadband, "smallest change of a shed fraction worth publishing")
	f.Float64Var(&c.IdleDemandPerS, "idle-demand-per-s", c.IdleDemandPerS, "demand (requests/s) assumed for a frontend's class with none reported, so that it has weights for its first requests")
	f.Float64Var(&c.UnknownHealth, "unknown-health", c.UnknownHealth, "share of its capacity a stale engine (unknown health) is planned with, in [0, 1]")
	f.Float64Var(&c.BackgroundFloor, "background-floor", c.BackgroundFloor, "part of an engine's observed utilization minus our own traffic's taken for noise, not background load, in [0, 1)")
	f.Float64Var(&c.RetryBudget, "retry-budget", c.RetryBudget, "retries per request a class may spend at low utilization, published unscaled (ext_proc lowers it from 70% utilization to 0 at 95%, and stops it while shedding), in [0, 1]")
	f.Uint32Var(&c.MaxRetries, "max-retries", c.MaxRetries, "most retries one request is allowed while the budget lasts (at most 10)")
	f.DurationVar(&p.HalfLife, "penalty-half-life", p.HalfLife, "decay half-life of an outlier penalty while the engine's traffic looks normal again")
	f.Float64Var(&p.LatencyTolerance, "penalty-latency-tolerance", p.LatencyTolerance, "observed/predicted latency ratios up to 1 + this are normal (no penalty)")
	f.Float64Var(&p.LatencyScale, "penalty-latency-scale", p.LatencyScale, "beyond the tolerance, the penalty grows by 1 per this much latency ratio")
	f.Float64Var(&p.ErrorTolerance, "penalty-error-tolerance", p.ErrorTolerance, "error rates up to this are normal (no penalty)")
	f.Float64Var(&p.ErrorScale, "penalty-error-scale", p.ErrorScale, "beyond the tolerance, the penalty grows by 1 per this much error rate")
	f.Float64Var(&p.MinSamples, "penalty-min-samples", p.MinSamples, "fewer first tokens (or responses) than this in an interval are no evidence")
	f.Float64Var(&p.E2ESlackMs, "penalty-e2e-slack-ms", p.E2ESlackMs, "time per request allowed for the proxy path when ext_proc's request timing is compared with the engine's profile, ms")
	f.Float64Var(&p.Max, "penalty-max", p.Max, "largest outlier penalty, in [0, 1)")
	f.Float64Var(&p.ProbeRPS, "probe-rps", p.ProbeRPS, "requests/s a penalized engine keeps of each class, to judge its recovery")
	f.Float64Var(&p.MinProbeShare, "min-probe-share", p.MinProbeShare, "smallest share of a class a penalized engine keeps for probing")
	f.Float64Var(&p.MaxProbeShare, "max-probe-share", p.MaxProbeShare, "largest share of a class a penalized engine keeps for probing")
	f.DurationVar(&d.EvidenceWindow, "evidence-window", 10*time.Second, "how far back the latency evidence of outlier penalties reaches")
	f.DurationVar(&d.IdleReset, "idle-reset", time.Minute, "an engine without a first token this long forgets its measured latency")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	for _, name := range []string{"fleet", "kubeconfig", "tls-cert", "tls-key", "tls-client-ca", "token-file", "state-file"} {
		_ = cmd.MarkFlagFilename(name)
	}
}

// serveKubernetes runs the control plane on the fleet Kubernetes discovery
// finds (--inference-pool), until the command's context ends.
func (o *controlPlaneOptions) serveKubernetes(cmd *cobra.Command, d controlplane.RunConfig) error {
	ns, pool, _ := kube.ParsePool(o.inferencePool)
	var rc *rest.Config
	var err error
	if o.kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return fmt.Errorf("%s: %w", cliconfig.Name(cmd.Flags(), "kubeconfig"), err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return err
	}
	disc, err := kube.New(cs, dyn, kube.Config{Namespace: ns, Pool: pool, ConfigMap: o.fleetConfigMap,
		ConfigMapKey: o.fleetConfigMapKey, Logger: d.Logger})
	if err != nil {
		return err
	}
	return kube.ServeControlPlane(cmd.Context(), disc, d, kube.ServeOptions{FirstFleet: o.discoveryTimeout,
		Adjust: func(s *fleet.Spec) (*fleet.Spec, error) { return s.InRealTime(o.timeScale) }})
}
