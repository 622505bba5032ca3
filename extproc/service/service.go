// Package service runs `inferlb extproc`: the ext_proc gRPC server, the
// RoutingPolicy subscription and the Reports client to the control plane, and
// a small HTTP endpoint for metrics, health and the policy in force, all
// under one context with a graceful shutdown.
package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
	"google.golang.org/protobuf/encoding/protojson"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc"
	"github.com/inferlb/inferlb/extproc/cpclient"
	"github.com/inferlb/inferlb/extproc/picker"
	"github.com/inferlb/inferlb/internal/procs"
	"github.com/inferlb/inferlb/internal/tokens/hf"
	"github.com/inferlb/inferlb/xds/auth"
)

// streamWorkers is the size of the gRPC server's stream worker pool: above
// the number of ext_proc streams a busy frontend keeps open (one per
// in-flight request). Idle workers cost a parked goroutine each.
const streamWorkers = 512

// ServerOptions are the ext_proc gRPC server's options for bodies up to
// bodyLimit bytes (also used by `inferlb-lab bench extproc` for its null
// processor, so both meet Envoy on the same terms).
func ServerOptions(bodyLimit int) []grpc.ServerOption {
	return []grpc.ServerOption{
		// Request bodies decoded with one copy instead of two (see extproc.Codec).
		grpc.ForceServerCodecV2(extproc.Codec{}),
		grpc.MaxRecvMsgSize(bodyLimit + (1 << 20)), // a whole buffered body plus headers
		grpc.MaxConcurrentStreams(100000),
		// Whole bodies arrive in one message: windows large enough that a
		// 220 KB body needs no flow-control round trip.
		grpc.InitialWindowSize(4 << 20),
		grpc.InitialConnWindowSize(64 << 20),
		// Every in-flight HTTP request holds one ext_proc stream, so
		// hundreds are open at once. A pool of long-lived workers serves
		// them on goroutines whose stacks have already grown: with fewer
		// workers than open streams, each new stream starts a goroutine
		// that grows its stack again, a measurable share of the CPU at
		// high concurrency.
		grpc.NumStreamWorkers(streamWorkers),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}),
	}
}

// The service's modes.
const (
	// ModeExtProc serves inferlb's own frontend Envoys (bootstrapped from
	// envoy-configs/): the decision goes to Envoy's Maglev cluster as a
	// cluster header and an affinity key.
	ModeExtProc = "ext_proc"
	// ModeEndpointPicker serves a gateway's Envoy as the Inference
	// Extension's endpoint picker: the picker names the engine itself.
	ModeEndpointPicker = "endpoint-picker"
)

// Config is the service's configuration (the command's flags).
type Config struct {
	// Listen is the ext_proc gRPC address Envoy connects to.
	Listen string
	// HTTPListen serves /metrics, /healthz and /policy ("" = off).
	HTTPListen string
	// ControlPlane is the control plane's gRPC address, or its replicas'
	// addresses separated by commas ("" = none: the policy file is all
	// there is). The policy comes from one replica at a time (another when
	// it goes away); reports go to all of them.
	ControlPlane string
	// Auth is this instance's credential for the control plane's port. It
	// must be set, or say Insecure explicitly.
	Auth auth.Client
	// ListenTokenFile holds the bearer tokens Envoy must send on this
	// service's own port (the ext_proc and access-log streams; the
	// bootstrap's initial_metadata). The access logs are evidence that
	// moves engines' weights, so with a control plane the port is as
	// closed as the control plane's: without this file it takes Auth's
	// token file (Envoy holds the same token for ADS), and with neither it
	// is open only under Insecure.
	ListenTokenFile string
	// MaxRequestAge bounds how long an admitted request holds its in-flight
	// slot without Envoy's access log reporting its end (0: the default).
	MaxRequestAge time.Duration
	// ClientPriorities is a file of the priorities each client may use
	// (extproc.ClientPriorities; "" = no restriction).
	ClientPriorities string
	// NodeID and Region: the frontend node this instance serves.
	NodeID, Region string
	// Instance names this process in reports (default host-pid).
	Instance string
	// PolicyFile is a RoutingPolicy in protobuf JSON, used from start until
	// the control plane sends one ("" = none: 503 until then).
	PolicyFile string
	// BodyLimit is the request body limit in bytes (0: extproc.DefaultBodyLimit).
	BodyLimit int
	// MaxMessages bounds a chat request's messages (0:
	// extproc.DefaultMaxMessages; negative: none but the context's).
	MaxMessages int
	// MaxBodyMemory bounds the request-body bytes in flight; beyond it
	// requests are answered 503 (0: extproc.DefaultMaxBodyMemory).
	MaxBodyMemory int64
	// LargeBodyLane is extproc.Options.LargeBodyLane (0: no lane; the
	// command's default is extproc.DefaultLargeBodyLane).
	LargeBodyLane int64
	// IdleMemory is the resident memory the process returns to after a
	// burst, beside twice the body bytes in flight (extproc.MemoryTrim;
	// 0: no trimming).
	IdleMemory int64
	// AdaptiveProcs runs the Go scheduler on one processor while the
	// service uses under 0.3 of a CPU and on the runtime's default above
	// 0.7 (internal/procs); ignored when GOMAXPROCS is set in the
	// environment.
	AdaptiveProcs bool
	// PrefillPlacement, IdlePlacement and CachePlacement: extproc.Options'.
	PrefillPlacement, IdlePlacement, CachePlacement bool
	// UploadTimeout is how long a streamed body may take to arrive
	// (extproc.Options'; 0: extproc.DefaultUploadTimeout).
	UploadTimeout time.Duration
	// Tokenizers are paths of models' tokenizer.json files (--tokenizer).
	Tokenizers []string
	// ReportInterval between Reports (default 1 s).
	ReportInterval time.Duration
	// ShutdownGrace bounds the graceful stop (default 10 s).
	ShutdownGrace time.Duration
	// Admission tunes local admission and the retry budget (nil:
	// extproc.DefaultAdmission).
	Admission *extproc.Admission
	// Mode is ModeExtProc (beside inferlb's own frontend Envoys, "" too)
	// or ModeEndpointPicker (behind a gateway's Envoy, the Inference
	// Extension's endpoint picker protocol: extproc/picker).
	Mode string
	// PickerFallbacks is how many fallback endpoints the endpoint picker
	// lists after the primary (0: none).
	PickerFallbacks int
	Logger          *slog.Logger
	// Ready, if set, receives the bound addresses once serving.
	Ready func(grpcAddr, httpAddr string)
}

// LoadTokenizers loads tokenizer.json files by their SHA-256, the key a
// RoutingPolicy names them by. Errors name the flag and the file.
func LoadTokenizers(paths []string, log *slog.Logger) (map[string]*hf.Tokenizer, error) {
	out := map[string]*hf.Tokenizer{}
	for _, p := range paths {
		t0 := time.Now()
		t, err := hf.Load(p)
		if err != nil {
			return nil, fmt.Errorf("--tokenizer %s: %w", p, err)
		}
		out[t.SHA256()] = t
		if log != nil {
			log.Info("tokenizer loaded", "path", p, "sha256", t.SHA256(), "took", time.Since(t0).Round(time.Millisecond))
		}
	}
	return out, nil
}

// LoadPolicyFile reads a RoutingPolicy in protobuf JSON.
func LoadPolicyFile(path string) (*policyv1.RoutingPolicy, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	p := &policyv1.RoutingPolicy{}
	if err := (protojson.UnmarshalOptions{}).Unmarshal(b, p); err != nil {
		return nil, fmt.Errorf("policy file %s: %w", path, err)
	}
	return p, nil
}

// SplitAddresses splits a comma-separated list of control-plane addresses
// (host:port each).
func SplitAddresses(list string) ([]string, error) {
	var out []string
	for _, a := range strings.Split(list, ",") {
		a = strings.TrimSpace(a)
		if _, p, err := net.SplitHostPort(a); err != nil || p == "" {
			return nil, fmt.Errorf("--control-plane %q: %q is not host:port", list, a)
		}
		out = append(out, a)
	}
	return out, nil
}

// Run serves until ctx is cancelled, then stops gracefully.
func Run(ctx context.Context, cfg Config) error {
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if err := cfg.normalize(); err != nil {
		return err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reloads, err := auth.NewReloads(reg, log)
	if err != nil {
		return err
	}
	cp, err := cfg.dialControlPlane(reloads, log)
	if err != nil {
		return err
	}
	defer cp.close()
	// A megabyte of bodies in hand wakes the adaptive-procs controller
	// (extproc.BodyBurst): a burst does not wait on one P for the
	// controller's next measurement.
	burst := make(chan struct{}, 1)
	srv, err := cfg.newServer(reg, log, func() {
		select {
		case burst <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return err
	}
	listenAuth, err := cfg.listenAuth(reg, reloads, log)
	if err != nil {
		return err
	}

	lis, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen (--listen) %q: %w", cfg.Listen, err)
	}
	g := grpc.NewServer(append(ServerOptions(cfg.BodyLimit), listenAuth...)...)
	apply := srv.SetPolicy
	var pk *picker.Picker
	if cfg.Mode == ModeEndpointPicker {
		pk = picker.New(srv, picker.Options{Fallbacks: cfg.PickerFallbacks, Logger: log})
		pk.Register(g)
		// Readiness follows the policy: a gateway's health check keeps
		// requests away from a picker that would answer them all 503.
		apply = func(rp *policyv1.RoutingPolicy) error {
			err := srv.SetPolicy(rp)
			pk.UpdateReadiness()
			return err
		}
	} else {
		srv.Register(g)
	}

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 4)
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := g.Serve(lis); err != nil {
			errc <- fmt.Errorf("ext_proc gRPC: %w", err)
		}
	}()

	wg.Add(1)
	go func() { defer wg.Done(); srv.RunMemoryTrim(ctx, cfg.IdleMemory) }()
	if cfg.AdaptiveProcs && !procs.UserSet() {
		pc := &procs.Controller{Wake: burst, OnChange: func(n int, cores float64) {
			log.Debug("scheduler processors", "procs", n, "cpu_cores", cores)
		}}
		wg.Add(1)
		go func() { defer wg.Done(); _ = pc.Run(ctx) }()
	}

	var sub *cpclient.Subscriber
	if cp.policy != nil {
		sub = &cpclient.Subscriber{Conn: cp.policy, NodeID: cfg.NodeID, Region: cfg.Region, Apply: apply, Logger: log}
		rep := &cpclient.Reporter{Conns: cp.reports, NodeID: cfg.NodeID, Instance: cfg.Instance, Interval: cfg.ReportInterval,
			Flush: srv.Observer().Flush, Logger: log}
		wg.Add(2)
		go func() { defer wg.Done(); _ = sub.Run(ctx) }()
		go func() { defer wg.Done(); _ = rep.Run(ctx) }()
	}

	httpAddr := ""
	var hs *http.Server
	if cfg.HTTPListen != "" {
		hl, err := net.Listen("tcp", cfg.HTTPListen)
		if err != nil {
			cancel()
			g.Stop()
			wg.Wait()
			return fmt.Errorf("http listen (--http-listen) %q: %w", cfg.HTTPListen, err)
		}
		httpAddr = hl.Addr().String()
		hs = &http.Server{Handler: statusMux(reg, srv, sub), ReadHeaderTimeout: 5 * time.Second}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := hs.Serve(hl); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("http: %w", err)
			}
		}()
	}
	log.Info("ext_proc serving", "grpc", lis.Addr().String(), "http", httpAddr, "control_plane", cfg.ControlPlane, "node", cfg.NodeID)
	if cfg.Ready != nil {
		cfg.Ready(lis.Addr().String(), httpAddr)
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-errc:
	}
	cancel()
	if pk != nil {
		pk.Shutdown() // gateways stop sending new requests while streams drain
	}
	stopServing(g, hs, cfg.ShutdownGrace, log)
	wg.Wait()
	log.Info("ext_proc stopped")
	return runErr
}

// normalize fills defaults and refuses what cannot run.
func (cfg *Config) normalize() error {
	if cfg.Instance == "" {
		h, _ := os.Hostname()
		cfg.Instance = fmt.Sprintf("%s-%d", h, os.Getpid())
	}
	if cfg.ShutdownGrace == 0 {
		cfg.ShutdownGrace = 10 * time.Second
	}
	// The same limit must reach both the server (413 beyond it) and gRPC's
	// receive limit: with gRPC at its 1 MiB default and the server at 4 MiB,
	// bodies in between would fail the stream instead of getting a 413.
	switch {
	case cfg.Listen == "":
		// net.Listen would take "" as every interface on a random port:
		// an ext_proc service Envoy cannot find, open to the network.
		return errors.New("no ext_proc listen address (--listen)")
	case cfg.ReportInterval < 0 || cfg.ShutdownGrace < 0:
		// 0 means the default; a negative one is a mistake, not a default.
		return fmt.Errorf("negative report interval %v or shutdown grace %v", cfg.ReportInterval, cfg.ShutdownGrace)
	case cfg.BodyLimit < 0:
		return fmt.Errorf("body limit %d bytes is negative", cfg.BodyLimit)
	case cfg.LargeBodyLane < 0:
		return fmt.Errorf("negative large-body lane %d bytes (--large-body-lane; 0: none)", cfg.LargeBodyLane)
	case cfg.MaxBodyMemory < 0 || cfg.IdleMemory < 0:
		return fmt.Errorf("negative body memory bound %d or idle memory %d bytes", cfg.MaxBodyMemory, cfg.IdleMemory)
	case cfg.UploadTimeout != 0 && cfg.UploadTimeout <= extproc.UploadGrace:
		// Envoy's timer would be "extended" to less than the grace
		// already spent.
		return fmt.Errorf("upload timeout %v (--upload-timeout) must be longer than the upload grace %v", cfg.UploadTimeout, extproc.UploadGrace)
	case cfg.BodyLimit == 0:
		cfg.BodyLimit = extproc.DefaultBodyLimit
	}
	if cfg.MaxBodyMemory == 0 {
		cfg.MaxBodyMemory = extproc.DefaultMaxBodyMemory
	}
	// A bound below one body of the limit would answer every such body 503.
	if cfg.MaxBodyMemory < int64(cfg.BodyLimit) {
		return fmt.Errorf("max body memory %d bytes (--max-body-memory) is below the body limit %d bytes (--body-limit)", cfg.MaxBodyMemory, cfg.BodyLimit)
	}
	switch cfg.Mode {
	case "", ModeExtProc, ModeEndpointPicker:
	default:
		return fmt.Errorf("mode (--mode) %q: want %s or %s", cfg.Mode, ModeExtProc, ModeEndpointPicker)
	}
	if cfg.PickerFallbacks < 0 {
		return fmt.Errorf("picker fallbacks (--picker-fallbacks) %d is negative", cfg.PickerFallbacks)
	}
	if cfg.ControlPlane != "" && cfg.NodeID == "" {
		return errors.New("--node-id is required with --control-plane")
	}
	if cfg.Admission != nil {
		if err := cfg.Admission.Validate(); err != nil {
			return fmt.Errorf("admission: %w", err)
		}
	}
	return nil
}

// ListenToken is the token file Envoy's streams to this service must carry
// ("" = none): ListenTokenFile, else, with a control plane, Auth's token
// file. With a control plane that takes credentials and no token for this
// port it is an error: whoever reached the port could forge the access-log
// evidence this instance reports under its own credentials.
func (cfg *Config) ListenToken() (string, error) {
	switch {
	case cfg.ListenTokenFile != "":
		return cfg.ListenTokenFile, nil
	case cfg.ControlPlane == "" || cfg.Auth.Insecure:
		return "", nil
	case cfg.Auth.TokenFile != "":
		return cfg.Auth.TokenFile, nil
	}
	return "", errors.New("ext_proc's port (--listen) carries Envoy's access logs, evidence that moves engines' weights: " +
		"give --listen-token-file (the token Envoy sends), or a --control-plane-token-file it can share with Envoy")
}

// listenAuth is the token check of the service's gRPC port (no option
// without a token); refused calls are counted and logged.
func (cfg *Config) listenAuth(reg *prometheus.Registry, reloads *auth.Reloads, log *slog.Logger) ([]grpc.ServerOption, error) {
	tf, err := cfg.ListenToken()
	if err != nil || tf == "" {
		if err == nil && cfg.ControlPlane != "" {
			log.Warn("ext_proc's port is open (--insecure): anyone who reaches it can send access-log evidence")
		}
		return nil, err
	}
	refused := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "inferlb_extproc_auth_failures_total",
		Help: "Calls to ext_proc's gRPC port (ext_proc and access-log streams) refused for a missing or wrong token, by method."}, []string{"method"})
	if err := reg.Register(refused); err != nil {
		return nil, err
	}
	flag := "--listen-token-file"
	if cfg.ListenTokenFile == "" {
		flag = "--control-plane-token-file"
	}
	// Health checks (the endpoint picker's liveness and readiness) come
	// from kubelet and gateways without a token.
	return auth.Server{TokenFile: tf, TokenFlag: flag, Open: []string{"/grpc.health.v1.Health/"}, Reloads: reloads, Reject: func(peer, method, reason string) {
		refused.WithLabelValues(method).Inc()
		log.Warn("ext_proc: unauthenticated call refused", "peer", peer, "method", method, "reason", reason)
	}}.Options()
}

// newServer builds the ext_proc server with its client priorities,
// tokenizers and, if given, the policy file's policy.
func (cfg *Config) newServer(reg *prometheus.Registry, log *slog.Logger, onBodyBurst func()) (*extproc.Server, error) {
	var clients *extproc.ClientPriorities
	if cfg.ClientPriorities != "" {
		var err error
		if clients, err = extproc.LoadClientPriorities(cfg.ClientPriorities); err != nil {
			return nil, err
		}
	}
	toks, err := LoadTokenizers(cfg.Tokenizers, log)
	if err != nil {
		return nil, err
	}
	srv := extproc.New(extproc.Options{BodyLimit: cfg.BodyLimit, MaxBodyMemory: cfg.MaxBodyMemory, LargeBodyLane: cfg.LargeBodyLane, MaxMessages: cfg.MaxMessages, PrefillPlacement: cfg.PrefillPlacement, IdlePlacement: cfg.IdlePlacement, CachePlacement: cfg.CachePlacement, UploadTimeout: cfg.UploadTimeout, Logger: log, Registry: reg, MaxRequestAge: cfg.MaxRequestAge,
		ClientPriorities: clients, Tokenizers: toks, Admission: cfg.Admission, OnBodyBurst: onBodyBurst})
	if cfg.PolicyFile != "" {
		p, err := LoadPolicyFile(cfg.PolicyFile)
		if err != nil {
			return nil, err
		}
		if err := srv.SetPolicy(p); err != nil {
			return nil, fmt.Errorf("policy file %s: %w", cfg.PolicyFile, err)
		}
	}
	return srv, nil
}

// cpConns are the connections to the control plane (none without one).
type cpConns struct {
	policy  *grpc.ClientConn // one over every replica
	reports []grpc.ClientConnInterface
	closers []func() error
}

func (c *cpConns) close() {
	for _, f := range c.closers {
		_ = f()
	}
}

// dialControlPlane connects to the control-plane replicas: the policy over
// one connection to every replica (pick-first: when the replica in use goes
// away, the resubscription goes to the next), reports over one connection
// per replica. gRPC connects lazily: nothing here waits for a replica.
// Each new connection takes the credential files as they are then (they
// rotate without a restart); refused new content is counted in reg.
func (cfg *Config) dialControlPlane(reloads *auth.Reloads, log *slog.Logger) (*cpConns, error) {
	c := &cpConns{}
	if cfg.ControlPlane == "" {
		return c, nil
	}
	cps, err := SplitAddresses(cfg.ControlPlane)
	if err != nil {
		return nil, err
	}
	creds := cfg.Auth
	creds.Reloads = reloads
	dial, err := creds.DialOptions()
	if err != nil {
		return nil, err
	}
	// A hung replica (stopped, wedged) keeps the TCP connection open:
	// pings find it (gRPC's shortest client interval, 10 s), and the
	// policy subscription moves to the next replica.
	dial = append(dial, grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 3 * time.Second, PermitWithoutStream: true}))
	if cfg.Auth.TokenFile != "" && !cfg.Auth.TLS() {
		log.Warn("the control-plane token is sent without TLS: use it only on the same host or a trusted network (add --control-plane-ca)")
	}
	res := manual.NewBuilderWithScheme("inferlb-cp")
	var rs resolver.State
	for _, a := range cps {
		host, _, _ := net.SplitHostPort(a)
		rs.Addresses = append(rs.Addresses, resolver.Address{Addr: a, ServerName: host})
	}
	res.InitialState(rs)
	if c.policy, err = grpc.NewClient(res.Scheme()+":///control-plane", append(dial, grpc.WithResolvers(res))...); err != nil {
		return nil, err
	}
	c.closers = append(c.closers, c.policy.Close)
	for _, a := range cps {
		rc, err := grpc.NewClient(a, dial...)
		if err != nil {
			c.close()
			return nil, err
		}
		c.closers = append(c.closers, rc.Close)
		c.reports = append(c.reports, rc)
	}
	return c, nil
}

// statusMux serves the read-only HTTP endpoints: /metrics, /healthz (200
// once a policy is held) and /policy. GET (and HEAD) only; anything else
// is 405.
func statusMux(reg *prometheus.Registry, srv *extproc.Server, sub *cpclient.Subscriber) *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if srv.Policy() == nil {
			http.Error(w, "no routing policy yet", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.HandleFunc("GET /policy", func(w http.ResponseWriter, _ *http.Request) {
		p := srv.Policy()
		if p == nil {
			http.Error(w, "no routing policy yet", http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("content-type", "application/json")
		// encoding/json, not %q: Go quoting writes \x escapes (a
		// control character or invalid UTF-8 in the control plane's
		// version string), which are not JSON.
		_ = json.NewEncoder(w).Encode(struct {
			Version   string `json:"version"`
			Node      string `json:"node"`
			Region    string `json:"region"`
			Connected bool   `json:"control_plane_connected"`
			Classes   int    `json:"classes"`
		}{p.Version, p.NodeID, p.Region, sub != nil && sub.Connected(), len(p.Classes())})
	})
	return mux
}

// stopServing stops gracefully: open streams (requests in flight) finish,
// bounded by the grace; then the HTTP server.
func stopServing(g *grpc.Server, hs *http.Server, grace time.Duration, log *slog.Logger) {
	done := make(chan struct{})
	go func() { g.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-time.After(grace):
		log.Warn("graceful stop timed out; closing streams")
		g.Stop()
		<-done
	}
	if hs != nil {
		sctx, scancel := context.WithTimeout(context.Background(), time.Second)
		_ = hs.Shutdown(sctx)
		scancel()
	}
}
