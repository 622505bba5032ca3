package opcmd

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"runtime/pprof"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/inferlb/inferlb/cmd/internal/cli"
	"github.com/inferlb/inferlb/cmd/internal/cliconfig"
	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/extproc"
	"github.com/inferlb/inferlb/extproc/picker"
	"github.com/inferlb/inferlb/extproc/service"
	"github.com/inferlb/inferlb/xds/auth"
)

// extprocOptions are ext_proc's settings: the service's config and the
// command's own.
type extprocOptions struct {
	cfg                                service.Config
	adm                                extproc.Admission
	logLevel, printBootstrap, fallback string
	authFilters, cpuProfile            string
	envoySDSDir, envoyBodyMode         string
	gcPercent, envoyPort               int
	envoyStreamAbove                   int
	keepSysmonAwake                    bool
}

func newExtprocCmd() *cobra.Command {
	o := extprocOptions{adm: extproc.DefaultAdmission()}
	o.cfg.Admission = &o.adm
	cfg := &o.cfg
	cmd := &cobra.Command{
		Use:   "extproc",
		Short: "Serve the ext_proc service in each frontend Envoy's request path",
		Long: `extproc is inferlb's Envoy external processor (envoy.service.ext_proc.v3).
For every request Envoy sends it the headers and the buffered body; it answers
from local state only: the eligibility class (Envoy cluster, route
cluster_header), the cache-affinity key (route hash_policy), admission
(priority-aware shedding, 429 + Retry-After) and the retry allowance
(x-envoy-max-retries). On responses it records which engine served, the status
and the time to response headers, and reports demand and evidence to the
control plane about once a second. See docs/extproc.md.

The routing policy (classes, priorities, shed fractions, retry budgets) comes
from the control plane over ADS (--control-plane, --node-id); --policy-file
gives one (protobuf JSON RoutingPolicy) to use until the first arrives, or
alone without a control plane.

The control plane's port is authenticated: give this instance its
credentials (mutual TLS: --control-plane-ca, --control-plane-cert,
--control-plane-key; or its shared token: --control-plane-token-file; or
both), or --insecure for a local demo. --control-plane may list several
replicas, separated by commas: the policy comes from one at a time, reports
go to all.

This service's own port carries Envoy's access logs, the evidence it reports
(errors and latencies that move engines' weights), so it takes a bearer token
as well: --listen-token-file, by default the --control-plane-token-file
(Envoy sends it on the ext_proc and access-log streams). Only --insecure
leaves it open.

--print-bootstrap prints a frontend Envoy bootstrap that uses this service
and the control plane, for --node-id in --region, with the same
control-plane credentials for Envoy's ADS connection and this port's token,
and exits.`,
		Example: `  inferlb extproc --control-plane 127.0.0.1:18000 --node-id frontend-eu-west --region eu-west --insecure
  inferlb extproc --config examples/config/extproc.yaml
  inferlb extproc --policy-file examples/policy-eu-west.json --node-id frontend-eu-west --region eu-west
  inferlb extproc --print-bootstrap fail-closed --node-id frontend-eu-west --region eu-west \
      --control-plane 127.0.0.1:18000 --envoy-port 10000 --insecure`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			fs := cmd.Flags()
			name := func(flag string) string { return cliconfig.Name(fs, flag) }
			log, err := cli.NewLogger(o.logLevel)
			if err != nil {
				return fmt.Errorf("%s: %w", name("log-level"), err)
			}
			cfg.Logger = log
			if cfg.BodyLimit <= 0 {
				return fmt.Errorf("%s must be positive, got %d", name("body-limit"), cfg.BodyLimit)
			}
			if cfg.MaxBodyMemory < int64(cfg.BodyLimit) {
				return fmt.Errorf("%s must be at least %s (%d), got %d", name("max-body-memory"), name("body-limit"), cfg.BodyLimit, cfg.MaxBodyMemory)
			}
			if cfg.MaxMessages == 0 || cfg.MaxMessages < -1 {
				return fmt.Errorf("%s must be positive, or -1 for no bound, got %d", name("max-messages"), cfg.MaxMessages)
			}
			if cfg.LargeBodyLane < 0 {
				return fmt.Errorf("%s must not be negative (0: no lane), got %d", name("large-body-lane"), cfg.LargeBodyLane)
			}
			if cfg.IdleMemory < 0 {
				return fmt.Errorf("%s must not be negative (0: never trim), got %d", name("idle-memory"), cfg.IdleMemory)
			}
			// The service reads 0 as its default (1 s, 10 s): from the
			// command line, 0 or less would silently mean that.
			if cfg.ReportInterval <= 0 {
				return fmt.Errorf("%s must be positive, got %v", name("report-interval"), cfg.ReportInterval)
			}
			if cfg.ShutdownGrace <= 0 {
				return fmt.Errorf("%s must be positive, got %v", name("shutdown-grace"), cfg.ShutdownGrace)
			}
			if err := o.adm.Validate(); err != nil {
				return namingFlags(fs, err)
			}
			if cfg.ControlPlane != "" {
				if err := cfg.Auth.Validate(); err != nil {
					return err
				}
			}
			if o.printBootstrap != "" {
				return printFrontendBootstrap(cmd, *cfg, o.printBootstrap, o.fallback, o.authFilters, o.envoySDSDir, o.envoyBodyMode, o.envoyPort, o.envoyStreamAbove)
			}
			// Before anything of the service starts: the runtime reads
			// GODEBUG once, at the process's start.
			cli.KeepSysmonAwake(o.keepSysmonAwake, log)
			// The request path allocates per decision (protobuf messages, the
			// body copy); its live heap is small (the bodies in flight), so
			// collecting less often buys CPU: the default of 400 was
			// chosen with `inferlb-lab bench extproc` (the figures are in
			// docs/extproc.md). GOGC in the environment wins, as usual.
			if _, set := os.LookupEnv("GOGC"); !set {
				if o.gcPercent <= 0 {
					return fmt.Errorf("%s must be positive, got %d (use GOGC=off to disable the collector)", name("gc-percent"), o.gcPercent)
				}
				debug.SetGCPercent(o.gcPercent)
			}
			if o.cpuProfile != "" {
				f, err := os.Create(o.cpuProfile)
				if err != nil {
					return err
				}
				defer f.Close()
				if err := pprof.StartCPUProfile(f); err != nil {
					return err
				}
				defer pprof.StopCPUProfile()
			}
			return service.Run(cmd.Context(), *cfg)
		},
	}
	extprocFlags(cmd, &o)
	return cmd
}

// extprocFlags defines ext_proc's flags, which are also its config file's
// keys (docs/configuration.md is generated from them).
func extprocFlags(cmd *cobra.Command, o *extprocOptions) {
	cfg := &o.cfg
	f := cmd.Flags()
	f.StringVar(&cfg.Listen, "listen", "127.0.0.1:9002", "ext_proc gRPC address (Envoy connects here)")
	f.StringVar(&cfg.HTTPListen, "http-listen", "127.0.0.1:9102", "address for /metrics, /healthz and /policy (empty: off)")
	f.StringVar(&cfg.ControlPlane, "control-plane", "", "control plane gRPC address host:port (ADS and Reports), or its replicas' separated by commas; empty: none")
	controlPlaneAuthFlags(f, &cfg.Auth)
	f.StringVar(&cfg.ListenTokenFile, "listen-token-file", "", "bearer tokens (one a line) Envoy must send on --listen (ext_proc and access-log streams); default with a control plane: --control-plane-token-file; needed with mutual TLS alone")
	f.StringVar(&cfg.ClientPriorities, "client-priorities", "", "YAML file of the priorities each client may use, by a header your authentication layer sets (docs/operations.md)")
	f.StringVar(&o.authFilters, "auth-filters", "", "with --print-bootstrap: YAML list of HTTP filters (your authentication) put before ext_proc; they set the --client-priorities header")
	f.DurationVar(&cfg.MaxRequestAge, "max-request-age", extproc.DefaultMaxRequestAge, "an admitted request whose end Envoy's access log never reports gives back its in-flight slot after this long")
	f.StringVar(&cfg.NodeID, "node-id", "", "frontend node id (the RoutingPolicy resource name)")
	f.StringVar(&cfg.Region, "region", "", "frontend region (sent as node locality)")
	f.StringVar(&cfg.Instance, "instance", "", "instance name in reports (default host-pid)")
	f.StringVar(&cfg.PolicyFile, "policy-file", "", "RoutingPolicy in protobuf JSON, in force until the control plane sends one")
	f.IntVar(&cfg.BodyLimit, "body-limit", extproc.DefaultBodyLimit, "largest request body in bytes (413 beyond); give Envoy the same buffer limit")
	f.IntVar(&cfg.MaxMessages, "max-messages", extproc.DefaultMaxMessages, "most messages in a chat request: the parser stops at the next one and answers 400 too_many_messages (a request with more messages than the policy's largest context has tokens gets 400 context_length_exceeded the same way); -1: no bound but the context's")
	f.Int64Var(&cfg.LargeBodyLane, "large-body-lane", extproc.DefaultLargeBodyLane, "bytes of large request bodies (declared 64 KiB or more) Envoy may send to the service at once when it buffers bodies, while small requests come beside them (one in the last second): a large body's headers are then answered when it fits (one always does; at most 250 ms of waiting), so that a wave of them does not take the CPUs from the small requests; with no small request they go at once (docs/extproc.md); 0: no lane")
	f.Int64Var(&cfg.MaxBodyMemory, "max-body-memory", extproc.DefaultMaxBodyMemory, "most request-body bytes in flight (counted from content-length on): a request that would take them past it is answered 503 with Retry-After; at least --body-limit")
	f.BoolVar(&cfg.PrefillPlacement, "prefill-placement", false, "route a request, by its affinity key, to a faster-prefill engine of its home engine's region when its first token is predicted sooner there by more than 50 ms, and trade places back (docs/extproc.md); off by default: it puts more work on the fast engines than the plan's balance")
	f.BoolVar(&cfg.IdlePlacement, "idle-placement", true, "route a request, by its affinity key, to an engine of its home engine's region with none of this service's requests in flight (or a faster one with fewer and none of its prefills) when its first token is predicted sooner there by more than 50 ms, the prompt's hot prefix counted as cached at home (docs/extproc.md); --idle-placement=false routes by the key alone; --prefill-placement supersedes it")
	f.BoolVar(&cfg.CachePlacement, "cache-placement", true, "place each request on the engine of the plan where its first token is predicted soonest, counting the prefix of its prompt this service sent there before, within each engine's budget of the plan's shares (half again its share when the engines are planned full, more when they have room); a conversation stays where its history is (docs/placement.md); supersedes --prefill-placement and --idle-placement")
	f.DurationVar(&cfg.UploadTimeout, "upload-timeout", extproc.DefaultUploadTimeout, "how long a request body Envoy streams to ext_proc may take to arrive: one not whole after 100 ms has Envoy's message_timeout extended to this (the bootstrap's max_message_timeout, which --print-bootstrap sets to it; keep it above Envoy's request_timeout, 15 s, so that a client that never finishes gets Envoy's 408)")
	f.BoolVar(&cfg.AdaptiveProcs, "adaptive-procs", true, "run the Go scheduler on one processor while the service uses under 0.3 of a CPU, on all (GOMAXPROCS's default) above 0.7: one request at a time costs about a fifth less CPU on one; GOMAXPROCS in the environment overrides it")
	f.Int64Var(&cfg.IdleMemory, "idle-memory", extproc.DefaultIdleMemory, "resident bytes the service returns to after a burst, beside twice the request bodies in flight: above it, free memory goes back to the OS (at most every 5 s); 0: never")
	f.StringArrayVar(&cfg.Tokenizers, "tokenizer", nil, "a model's tokenizer.json (or .json.gz), repeatable; the policy names each class's by SHA-256 (fleet spec models[].tokenizer) and context limits near a class's are then judged by exact counts, else by the bytes bound")
	f.DurationVar(&cfg.ReportInterval, "report-interval", time.Second, "interval between reports to the control plane")
	f.DurationVar(&cfg.ShutdownGrace, "shutdown-grace", 10*time.Second, "how long open streams may finish on shutdown")
	f.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&o.printBootstrap, "print-bootstrap", "", "print a frontend Envoy bootstrap (fail-closed or fail-open) and exit")
	f.IntVar(&o.envoyPort, "envoy-port", 10000, "with --print-bootstrap: Envoy's client-facing port")
	f.StringVar(&o.envoyBodyMode, "envoy-body-mode", envoyconfigs.BodyBuffered, "with --print-bootstrap: how Envoy sends request bodies: buffered (a round trip after the headers) or streamed (right after them, the headers' answer waiting for the body: a round trip less and less of the service's CPU one request at a time, one more message for Envoy at load; docs/extproc.md)")
	f.IntVar(&o.envoyStreamAbove, "envoy-stream-above", envoyconfigs.DefaultStreamAbove, "with --print-bootstrap and buffered bodies: stream the bodies declared at least this many bytes long to ext_proc as they arrive, so that one whose first bytes prove it over a limit (a hundred thousand tiny messages) is refused before Envoy reads the rest; 0: none")
	f.StringVar(&o.envoySDSDir, "envoy-sds-dir", "", "with --print-bootstrap and TLS credentials: write SDS resource files for Envoy's certificate, key and CA into this directory and have the bootstrap read them from there, so Envoy takes rotated files live (empty: static file names, read once at start)")
	f.StringVar(&o.fallback, "fallback-cluster", "", "with --print-bootstrap fail-open: the cluster used when ext_proc is down")
	cli.SysmonFlag(f, &o.keepSysmonAwake)
	f.IntVar(&o.gcPercent, "gc-percent", 400, "Go GC target percentage (GOGC) for the service; GOGC in the environment overrides it")
	f.Float64Var(&o.adm.LocalReserve, "local-reserve", o.adm.LocalReserve, "share of a class's in-flight limit kept for more important traffic: the least important priority is refused at (1 - this) of the limit, the most important only at the limit, in [0, 1)")
	f.Float64Var(&o.adm.RetryBurst, "retry-burst", o.adm.RetryBurst, "most retries a class's retry budget holds (and starts with), >= 1")
	f.StringVar(&cfg.Mode, "mode", service.ModeExtProc, "ext_proc (beside inferlb's frontend Envoys) or endpoint-picker (behind a gateway's Envoy: the Gateway API Inference Extension's endpoint picker protocol, docs/endpoint-picker.md)")
	f.IntVar(&cfg.PickerFallbacks, "picker-fallbacks", picker.DefaultFallbacks, "with --mode endpoint-picker: fallback endpoints listed after the primary (the next distinct hosts on the table), >= 0; only for gateways on the override_host policy (an ORIGINAL_DST cluster takes one address)")
	f.StringVar(&o.cpuProfile, "cpu-profile", "", "write a CPU profile to this file until exit")
	_ = f.MarkHidden("cpu-profile")
	for _, name := range []string{"client-priorities", "auth-filters", "policy-file", "tokenizer"} {
		_ = cmd.MarkFlagFilename(name)
	}
	cliconfig.Add(cmd)
}

func printFrontendBootstrap(cmd *cobra.Command, cfg service.Config, variant, fallback, authFilters, sdsDir, bodyMode string, envoyPort, streamAbove int) error {
	if variant != envoyconfigs.FailClosed && variant != envoyconfigs.FailOpen {
		// The template's direct variant (no ext_proc) is for measurements
		// and tests, not for a frontend of this service.
		return fmt.Errorf("--print-bootstrap %q: want %s or %s", variant, envoyconfigs.FailClosed, envoyconfigs.FailOpen)
	}
	if bodyMode != "" && bodyMode != envoyconfigs.BodyBuffered && bodyMode != envoyconfigs.BodyStreamed {
		return fmt.Errorf("--envoy-body-mode %q: want %s or %s", bodyMode, envoyconfigs.BodyBuffered, envoyconfigs.BodyStreamed)
	}
	switch {
	case streamAbove < 0:
		return fmt.Errorf("--envoy-stream-above %d: want a size in bytes, or 0 for none", streamAbove)
	case streamAbove == 0:
		streamAbove = -1 // envoyconfigs: none
	}
	eh, ep, err := splitHostPort(cfg.Listen, "--listen")
	if err != nil {
		return err
	}
	if cfg.ControlPlane == "" {
		return fmt.Errorf("--print-bootstrap needs --control-plane (Envoy takes CDS/EDS from it)")
	}
	// Envoy sends its node id and locality to the control plane: without
	// them it would get no (or the wrong) configuration, silently.
	if cfg.NodeID == "" || cfg.Region == "" {
		return fmt.Errorf("--print-bootstrap needs --node-id and --region (the Envoy node's id and locality), got %q and %q", cfg.NodeID, cfg.Region)
	}
	cps, err := service.SplitAddresses(cfg.ControlPlane)
	if err != nil {
		return err
	}
	xh, xp, err := splitHostPort(cps[0], "--control-plane")
	if err != nil {
		return err
	}
	token, err := cfg.Auth.Token()
	if err != nil {
		return err
	}
	// Envoy's credential for this service's port (its access logs are
	// evidence that moves weights).
	extToken := ""
	if tf, err := cfg.ListenToken(); err != nil {
		return err
	} else if tf != "" {
		if extToken, err = (auth.Client{TokenFile: tf}).Token(); err != nil {
			return err
		}
	}
	var clientHeader, filters string
	if cfg.ClientPriorities != "" {
		cp, err := extproc.LoadClientPriorities(cfg.ClientPriorities)
		if err != nil {
			return err
		}
		clientHeader = cp.Header
	}
	if authFilters != "" {
		if clientHeader == "" {
			return fmt.Errorf("--auth-filters: give --client-priorities too (the filters set its header)")
		}
		b, err := os.ReadFile(authFilters)
		if err != nil {
			return fmt.Errorf("--auth-filters: %w", err)
		}
		filters = string(b)
	}
	xa := envoyconfigs.XDSAuth{Token: token, CAFile: cfg.Auth.CAFile, CertFile: cfg.Auth.CertFile, KeyFile: cfg.Auth.KeyFile,
		ServerName: cfg.Auth.ServerName}
	if sdsDir != "" {
		if xa.CAFile == "" {
			return fmt.Errorf("--envoy-sds-dir serves Envoy's TLS credentials: give them (--control-plane-ca, and --control-plane-cert/--control-plane-key for mutual TLS)")
		}
		// Envoy resolves the SDS files' names from its own working
		// directory: make every name absolute.
		for _, f := range []*string{&xa.CAFile, &xa.CertFile, &xa.KeyFile, &sdsDir} {
			if *f == "" {
				continue
			}
			a, err := filepath.Abs(*f)
			if err != nil {
				return err
			}
			*f = a
		}
		xa.SDSDir = sdsDir
	}
	y, err := envoyconfigs.Render(envoyconfigs.Params{
		Variant: variant, NodeID: cfg.NodeID, Region: cfg.Region, ListenPort: envoyPort,
		ExtProcHost: eh, ExtProcPort: ep, XDSHost: xh, XDSPort: xp, XDSAddresses: cps, BodyLimit: cfg.BodyLimit, FallbackCluster: fallback,
		XDSAuth: xa, ExtProcToken: extToken, ClientHeader: clientHeader, AuthFilters: filters,
		UploadTimeout: cfg.UploadTimeout, BodyMode: bodyMode, StreamAbove: streamAbove,
	})
	if err != nil {
		return err
	}
	if sdsDir != "" {
		if err := envoyconfigs.WriteSDS(xa); err != nil {
			return fmt.Errorf("--envoy-sds-dir: %w", err)
		}
	}
	_, err = fmt.Fprint(cmd.OutOrStdout(), y)
	return err
}

func splitHostPort(addr, flag string) (string, int, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, fmt.Errorf("%s %q: %w", flag, addr, err)
	}
	n, err := strconv.Atoi(p)
	if err != nil || n <= 0 || n > 65535 {
		return "", 0, fmt.Errorf("%s %q: bad port", flag, addr)
	}
	return h, n, nil
}
