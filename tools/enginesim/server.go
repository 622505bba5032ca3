package enginesim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/tools/enginesim/model"
	"github.com/prometheus/client_golang/prometheus"
)

// H100Llama8B is the calibrated profile of Llama-3.1-8B on one H100-80GB
// (engine-calibration.md §5), for tests that need an engine without a fleet.
var H100Llama8B = fleet.Profile{
	GPU: "H100", Model: "llama-3.1-8b",
	PrefillTokensPerS: 25000, OverheadMs: 10, DecodeStepMs: 6.5, DecodeStepPerSeqMs: 0.055,
	MaxRunning: 256, MaxBatchedTokens: 8192, KVCapacityTokens: 450000, BlockSize: 16,
	MaxContextTokens: 8192,
}

// A100Llama8B is the calibrated profile of Llama-3.1-8B on one A100-80GB.
var A100Llama8B = fleet.Profile{
	GPU: "A100", Model: "llama-3.1-8b",
	PrefillTokensPerS: 11000, OverheadMs: 15, DecodeStepMs: 13, DecodeStepPerSeqMs: 0.09,
	MaxRunning: 256, MaxBatchedTokens: 8192, KVCapacityTokens: 450000, BlockSize: 16,
	MaxContextTokens: 8192,
}

// Options configure one simulated engine.
type Options struct {
	// Listen is the TCP address; default "127.0.0.1:0" (an ephemeral port).
	Listen string
	// ID names the engine in logs; default the listen address.
	ID string
	// Model is the served model name (required): requests for another
	// model get 404, and it is the model_name label of every metric.
	Model string
	// Replicas is the number of identical replicas behind the address
	// (fleet.Engine.Replicas); default 1. Metrics and Stats sum them.
	Replicas int
	// Region is the engine's region, for network-distance emulation.
	Region string
	// Profile is the engine's latency profile (required). Zero
	// MaxRunning, MaxBatchedTokens and BlockSize take vLLM's defaults
	// (256, 8192, 16).
	Profile fleet.Profile
	// MaxContextTokens is the context limit (prompt + output, vLLM's
	// max_model_len); default Profile.MaxContextTokens, else 8192.
	MaxContextTokens int
	// Fleet, if set, gives the round trips for x-inferlb-source-region.
	Fleet *fleet.Spec
	// TimeScale is real seconds per simulated second; default 1. 0.1 runs
	// ten times faster than real time.
	TimeScale float64
	// Seed seeds the error-rate fault's random choices.
	Seed uint64
	// DefaultMaxTokens is the output length when a request sets neither
	// max_tokens nor max_completion_tokens; default 128.
	DefaultMaxTokens int
	// MaxBodyBytes bounds a request body; larger gets 413. Default 4 MiB.
	MaxBodyBytes int64
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Server is the kind of server mimicked (ServerVLLM, the default, or
	// ServerSGLang): metric names and labels, health paths (SGLang adds
	// /health_generate), and whether metrics exist before the first request.
	Server string
	// LoadingFor makes the engine "still loading the model" for this long
	// after it starts (real time): health paths answer 503 and requests
	// 503, as a server warming up does.
	LoadingFor time.Duration
}

// Server kinds engine-sim mimics (fleet engines[].server).
const (
	ServerVLLM   = "vllm"
	ServerSGLang = "sglang"
)

// ConfigFromProfile is model.ConfigFromProfile.
func ConfigFromProfile(p fleet.Profile) model.Config { return model.ConfigFromProfile(p) }

// Server is one running simulated engine.
type Server struct {
	opts   Options
	log    *slog.Logger
	cfg    model.Config
	scale  float64
	epoch  time.Time
	maxCtx int

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // driver and restart timers
	poke   chan struct{}
	done   chan struct{} // closed when shutdown has finished

	mu      sync.Mutex // guards the fields below and the engine
	eng     *model.Replicas
	faults  Faults
	rng     *rand.Rand
	nextID  uint64
	crashed bool
	crashCh chan struct{} // closed when the current incarnation crashes
	httpSrv *http.Server
	ln      net.Listener
	active  sync.WaitGroup // handlers of the current incarnation
	// completing counts the completion handlers in flight (entered, not
	// left); cutAtCrash is its value when the last crash came, taken with
	// crashed set, so no handler enters or leaves in between.
	completing, cutAtCrash int
	closed                 bool
	restartMu              sync.Mutex

	addr    string
	reg     *prometheus.Registry
	metrics *metrics
	lags    lagRecorder
	genRate rateMeter // gen_throughput of /v1/loads and /get_server_info
	// served is set by the first completion request (SGLang's series
	// appear then).
	served atomic.Bool
	// loaded ends the LoadingFor period early (FinishLoading).
	loaded atomic.Bool
}

// Start validates opts, binds the listener and serves until ctx is
// cancelled or Close is called.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if opts.Model == "" {
		return nil, errors.New("enginesim: Options.Model is required")
	}
	if opts.Listen == "" {
		opts.Listen = "127.0.0.1:0"
	}
	if opts.TimeScale == 0 {
		opts.TimeScale = 1
	}
	if !(opts.TimeScale > 0) || math.IsInf(opts.TimeScale, 0) {
		return nil, fmt.Errorf("enginesim: time scale must be a positive number, got %v", opts.TimeScale)
	}
	if opts.DefaultMaxTokens == 0 {
		opts.DefaultMaxTokens = 128
	}
	if opts.DefaultMaxTokens < 1 {
		return nil, fmt.Errorf("enginesim: default max tokens must be at least 1, got %d", opts.DefaultMaxTokens)
	}
	if opts.Replicas == 0 {
		opts.Replicas = 1
	}
	if opts.Replicas < 1 {
		return nil, fmt.Errorf("enginesim: replicas must be at least 1, got %d", opts.Replicas)
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = 4 << 20
	}
	switch opts.Server {
	case "", "generic":
		opts.Server = ServerVLLM
	case ServerVLLM, ServerSGLang:
	default:
		return nil, fmt.Errorf("enginesim: unknown server kind %q (vllm or sglang)", opts.Server)
	}
	if opts.LoadingFor < 0 {
		return nil, fmt.Errorf("enginesim: loading time must not be negative, got %v", opts.LoadingFor)
	}
	if opts.MaxBodyBytes < 0 {
		return nil, fmt.Errorf("enginesim: max body bytes must be positive, got %d", opts.MaxBodyBytes)
	}
	maxCtx := opts.MaxContextTokens
	if maxCtx == 0 {
		maxCtx = opts.Profile.MaxContextTokens
	}
	if maxCtx == 0 {
		maxCtx = 8192
	}
	if maxCtx < 2 {
		return nil, fmt.Errorf("enginesim: max context tokens must be at least 2, got %d", maxCtx)
	}
	if opts.Fleet != nil && opts.Region != "" && !hasRegion(opts.Fleet, opts.Region) {
		return nil, fmt.Errorf("enginesim: region %q is not in the fleet's regions", opts.Region)
	}
	cfg := ConfigFromProfile(opts.Profile)
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("enginesim: profile %s/%s: %w", opts.Profile.GPU, opts.Profile.Model, err)
	}
	ln, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return nil, fmt.Errorf("enginesim: %w", err)
	}
	if opts.ID == "" {
		opts.ID = ln.Addr().String()
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	s := &Server{
		opts:   opts,
		log:    log.With("engine", opts.ID),
		cfg:    cfg,
		scale:  opts.TimeScale,
		epoch:  time.Now(),
		maxCtx: maxCtx,
		poke:   make(chan struct{}, 1),
		done:   make(chan struct{}),
		rng:    rand.New(rand.NewPCG(opts.Seed, 0x656e67696e65)),
		addr:   ln.Addr().String(),
		reg:    prometheus.NewRegistry(),
	}
	s.faults.Slowdown = 1
	s.ctx, s.cancel = context.WithCancel(ctx)
	if s.eng, err = model.NewReplicas(opts.Replicas, cfg, (*listener)(s)); err != nil {
		ln.Close()
		return nil, fmt.Errorf("enginesim: %w", err)
	}
	s.metrics = newMetrics(s)
	s.serve(ln)
	s.wg.Add(1)
	go s.drive()
	context.AfterFunc(s.ctx, func() { s.shutdown() })
	s.log.Info("engine started", "addr", s.addr, "model", opts.Model, "gpu", opts.Profile.GPU,
		"region", opts.Region, "time_scale", s.scale)
	return s, nil
}

func hasRegion(spec *fleet.Spec, r string) bool {
	for _, x := range spec.Regions {
		if x.Name == r {
			return true
		}
	}
	return false
}

// URL is the engine's base URL, e.g. "http://127.0.0.1:40123".
func (s *Server) URL() string { return "http://" + s.addr }

// Addr is the engine's listen address (host:port).
func (s *Server) Addr() string { return s.addr }

// ID is the engine's id.
func (s *Server) ID() string { return s.opts.ID }

// Model is the served model name.
func (s *Server) Model() string { return s.opts.Model }

// Registry is the engine's own Prometheus registry (what /metrics serves).
func (s *Server) Registry() *prometheus.Registry { return s.reg }

// CutAtCrash returns how many completion requests were in flight (their
// handlers entered, not left) when the engine last crashed: those a crash
// can cut, counted in the same critical section that marked the engine
// down. 0 if it never crashed.
func (s *Server) CutAtCrash() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cutAtCrash
}

// Stats returns the scheduler's current state and counters (summed over
// replicas).
func (s *Server) Stats() model.Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.eng.Stats()
}

// Close stops the engine: the listener closes, streams in flight end, and
// the driver goroutine exits. Close waits for all of it.
func (s *Server) Close() error {
	s.cancel()
	<-s.done
	return nil
}

func (s *Server) shutdown() {
	s.mu.Lock()
	s.closed = true
	srv, crashCh, crashed := s.httpSrv, s.crashCh, s.crashed
	s.crashed = true
	s.mu.Unlock()
	if !crashed {
		close(crashCh)
		_ = srv.Close()
	}
	s.active.Wait()
	s.wg.Wait()
	s.log.Info("engine stopped")
	close(s.done)
}

// serve starts an incarnation of the HTTP server on ln. Holds no lock.
func (s *Server) serve(ln net.Listener) {
	srv := &http.Server{
		Handler:           s.routes(),
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		BaseContext:       func(net.Listener) context.Context { return s.ctx },
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		ln.Close()
		return
	}
	s.httpSrv, s.ln = srv, ln
	s.crashed = false
	s.crashCh = make(chan struct{})
	s.wg.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("serve", "err", err)
		}
	}()
}

// vnow is the current simulated time.
func (s *Server) vnow() time.Duration {
	return time.Duration(float64(time.Since(s.epoch)) / s.scale)
}

// realAt is the wall-clock time of simulated time t.
func (s *Server) realAt(t time.Duration) time.Time {
	return s.epoch.Add(time.Duration(float64(t) * s.scale))
}

// real converts a simulated duration to a real one.
func (s *Server) real(d time.Duration) time.Duration { return time.Duration(float64(d) * s.scale) }

func (s *Server) wake() {
	select {
	case s.poke <- struct{}{}:
	default:
	}
}

// drive is the engine's one driver goroutine: it advances the model to the
// present and sleeps until the model's next event or a poke.
func (s *Server) drive() {
	defer s.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		s.mu.Lock()
		s.eng.Advance(s.vnow())
		next, ok := s.eng.NextEvent()
		s.mu.Unlock()
		if ok {
			timer.Reset(time.Until(s.realAt(next)))
		} else {
			timer.Reset(time.Hour)
		}
		select {
		case <-s.ctx.Done():
			return
		case <-s.poke:
		case <-timer.C:
		}
	}
}

// lagRecorder keeps the first samples of the simulator's timing error.
type lagRecorder struct {
	mu            sync.Mutex
	engine, flush []time.Duration
}

const maxLagSamples = 1 << 20

func (l *lagRecorder) add(engine bool, d time.Duration) {
	l.mu.Lock()
	p := &l.flush
	if engine {
		p = &l.engine
	}
	if len(*p) < maxLagSamples {
		*p = append(*p, d)
	}
	l.mu.Unlock()
}

// TimingLags are the simulator's timing errors for first tokens, in real
// time: how much later than intended (epoch + simulated time × scale) the
// engine's driver produced the token (Engine), and the handler wrote and
// flushed it to the client's connection (Flush; streams only).
type TimingLags struct {
	Engine, Flush []time.Duration
}

// TimingLags returns and clears the recorded timing errors.
func (s *Server) TimingLags() TimingLags {
	s.lags.mu.Lock()
	defer s.lags.mu.Unlock()
	out := TimingLags{Engine: s.lags.engine, Flush: s.lags.flush}
	s.lags.engine, s.lags.flush = nil, nil
	return out
}

// listener receives model events under s.mu.
type listener Server

func (l *listener) Token(r *model.Request, t time.Duration) {
	st := r.Tag.(*stream)
	s := (*Server)(l)
	if r.Generated == 1 {
		s.lags.add(true, time.Since(s.realAt(t)))
		s.metrics.ttft.Observe(s.real(t - r.Arrival).Seconds())
	} else {
		s.metrics.itl.Observe(s.real(t - st.last).Seconds())
	}
	st.last = t
	st.mu.Lock()
	st.n = r.Generated
	if r.Generated == 1 {
		st.first = t
		st.cached = r.CachedTokens
	}
	if r.Generated >= r.MaxTokens {
		// The last token: publish the end with it, so the handler never
		// sends the last token without its finish_reason.
		st.done = true
		st.reason = r.EndReason
	}
	st.mu.Unlock()
	st.signal()
}

func (l *listener) Finished(r *model.Request, t time.Duration) {
	st := r.Tag.(*stream)
	s := (*Server)(l)
	s.metrics.success[r.Reason].Inc()
	if r.Reason != model.FinishAbort {
		s.metrics.e2e.Observe(s.real(t - r.Arrival).Seconds())
		s.metrics.queue.Observe(s.real(r.Scheduled - r.Queued).Seconds())
	}
	st.mu.Lock()
	st.done = true
	st.reason = r.Reason
	st.mu.Unlock()
	st.signal()
}

// stream is a request's state shared between the model (via the listener,
// under s.mu) and its HTTP handler.
type stream struct {
	notify  chan struct{}
	replica int           // index of the replica serving it; set under Server.mu
	last    time.Duration // previous token time; listener only

	mu     sync.Mutex
	n      int
	first  time.Duration
	cached int
	done   bool
	reason model.FinishReason
}

func (st *stream) signal() {
	select {
	case st.notify <- struct{}{}:
	default:
	}
}

func (st *stream) snapshot() (n int, first time.Duration, cached int, done bool, reason model.FinishReason) {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.n, st.first, st.cached, st.done, st.reason
}
