package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/xds/auth"
	"github.com/inferlb/inferlb/xds/server"
)

// RunConfig configures a Runner.
type RunConfig struct {
	Fleet *fleet.Spec
	Cycle Config
	// XDSListen is the gRPC address (ADS + Reports); AdminListen the admin
	// HTTP address (localhost by default).
	XDSListen, AdminListen string
	// Interval is the control cycle period; a health change runs a cycle at
	// once. ScrapeInterval is the engine scrape period; ScrapeTimeout
	// bounds each request.
	Interval, ScrapeInterval, ScrapeTimeout time.Duration
	// StaleAfter marks an engine's metrics stale; Smoothing is the EWMA
	// time constant; DemandWindow the Reports window.
	StaleAfter, Smoothing, DemandWindow time.Duration
	// EvidenceWindow is how far back the latency evidence of penalties
	// reaches; IdleReset how long without a first token makes an engine
	// forget its latency (signals.TrackerOptions; 0: 10 s and 60 s).
	EvidenceWindow, IdleReset time.Duration
	// Warmup delays the first publication so that the first cycle sees one
	// full scrape round and the demand reports of a demand window's worth
	// of time (a restarted control plane must not publish from nothing).
	Warmup time.Duration
	// StateFile, if set, keeps the published weights across restarts.
	StateFile string
	// History is how many cycles GET /history keeps for the dashboard's
	// charts (0: none).
	History int
	// MaxClockSkew is how far a report's interval end may be from this
	// clock (0: 10 s).
	MaxClockSkew time.Duration
	// Auth secures the xDS/Reports port. DefaultRunConfig leaves it
	// Insecure (tests, embedding); the command requires credentials unless
	// --insecure is given.
	Auth      auth.Server
	Allocator Allocator
	Logger    *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// DefaultRunConfig has production periods.
func DefaultRunConfig() RunConfig {
	return RunConfig{
		Cycle: DefaultConfig(), XDSListen: "127.0.0.1:18000", AdminListen: "127.0.0.1:18080",
		Interval: 5 * time.Second, ScrapeInterval: time.Second, ScrapeTimeout: 800 * time.Millisecond,
		StaleAfter: 5 * time.Second, Smoothing: 3 * time.Second, DemandWindow: 10 * time.Second,
		Warmup: 3 * time.Second, History: 1800, Auth: auth.Server{Insecure: true},
	}
}

// Runner runs the control plane: scraping, intake, cycles, the xDS server
// and the admin HTTP server, all from one root context.
type Runner struct {
	cfg     RunConfig
	log     *slog.Logger
	reg     *prometheus.Registry
	ctrl    *Controller
	srv     *server.Server
	intake  *signals.Intake
	scraper *signals.Scraper
	targets []signals.Target
	kick    chan struct{}
	// scrapeDone signals a finished scrape round: the cycle loop checks
	// whether a penalty would rise (Controller.PenaltyRising).
	scrapeDone chan struct{}
	ran        atomic.Bool // Run was called: a Runner runs once
	hist       *history

	// mu guards tracker (the scrape loop writes it, the cycle and the admin
	// handlers read it), targets, hist, fleet, pending, last, cycles, ready
	// and the bound addresses.
	mu      sync.Mutex
	tracker *signals.Tracker
	// fleet is the spec the controller plans for: cfg.Fleet, then each
	// fleet UpdateFleet handed over, once a cycle applied it. pending is
	// the one handed over and not yet applied.
	fleet, pending     *fleet.Spec
	last               *Result
	cycles             int
	ready              bool
	xdsAddr, adminAddr string
	started            chan struct{}
	// scraped is closed after the first complete scrape round.
	scraped     chan struct{}
	scrapedOnce sync.Once

	m struct {
		cycles       *prometheus.CounterVec
		cycleSeconds prometheus.Histogram
		penalty      *prometheus.GaugeVec
		correction   *prometheus.GaugeVec
		up           *prometheus.GaugeVec
		age          *prometheus.GaugeVec
		held         prometheus.Counter
		adjusted     *prometheus.CounterVec
	}
}

// NewRunner validates the config and builds the runner.
func NewRunner(cfg RunConfig) (*Runner, error) {
	if cfg.Fleet == nil {
		return nil, errors.New("control plane: no fleet")
	}
	for name, d := range map[string]time.Duration{"interval": cfg.Interval, "scrape_interval": cfg.ScrapeInterval,
		"scrape_timeout": cfg.ScrapeTimeout, "stale_after": cfg.StaleAfter, "demand_window": cfg.DemandWindow} {
		if d <= 0 {
			return nil, fmt.Errorf("control plane: %s must be positive, got %v", name, d)
		}
	}
	for name, d := range map[string]time.Duration{"warmup": cfg.Warmup, "smoothing": cfg.Smoothing} {
		if d < 0 {
			return nil, fmt.Errorf("control plane: %s must be ≥ 0, got %v", name, d)
		}
	}
	if cfg.History < 0 {
		return nil, fmt.Errorf("control plane: history must be ≥ 0 cycles, got %d", cfg.History)
	}
	if cfg.EvidenceWindow < 0 || cfg.IdleReset < 0 || cfg.MaxClockSkew < 0 {
		return nil, fmt.Errorf("control plane: evidence_window, idle_reset and max_clock_skew must be ≥ 0, got %v, %v and %v", cfg.EvidenceWindow, cfg.IdleReset, cfg.MaxClockSkew)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	lg := cfg.Logger
	if lg == nil {
		lg = slog.Default()
	}
	// A penalized engine's probe traffic must bring MinSamples of evidence
	// within the windows it is judged over (demand window for ext_proc's
	// evidence, evidence window for the engine's own), with a margin: else
	// its penalty is held for lack of evidence however well it does.
	ew := cfg.EvidenceWindow
	if ew == 0 {
		ew = 10 * time.Second
	}
	if floor := 1.5 * cfg.Cycle.Penalty.MinSamples / min(cfg.DemandWindow, ew).Seconds(); cfg.Cycle.Penalty.ProbeRPS < floor {
		lg.Info("probe rate raised to bring enough evidence within the windows", "probe_rps", floor,
			"min_samples", cfg.Cycle.Penalty.MinSamples, "window", min(cfg.DemandWindow, ew))
		cfg.Cycle.Penalty.ProbeRPS = floor
	}
	ctrl, err := NewController(cfg.Fleet, cfg.Cycle, cfg.Allocator)
	if err != nil {
		return nil, err
	}
	r := &Runner{cfg: cfg, log: lg, reg: prometheus.NewRegistry(), ctrl: ctrl, kick: make(chan struct{}, 1), started: make(chan struct{}),
		scraped: make(chan struct{}), scrapeDone: make(chan struct{}, 1), hist: newHistory(cfg.Fleet, cfg.History), fleet: cfg.Fleet}
	var ids []string
	ids, r.targets = targetsOf(cfg.Fleet)
	r.m.adjusted = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "inferlb_reports_adjusted_total",
		Help: "Parts of accepted reports clipped or dropped, by reason: rate_clipped (demand above the frontend's bound, clipped to it), unknown_engine (evidence for an address that is no engine of the fleet, dropped)."}, []string{"reason"})
	iopt := r.intakeOptions()
	iopt.OnAdjust = func(reason string) { r.m.adjusted.WithLabelValues(reason).Inc() }
	if r.intake, err = signals.NewIntake(iopt); err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	r.tracker = signals.NewTracker(signals.TrackerOptions{Smoothing: cfg.Smoothing, StaleAfter: cfg.StaleAfter,
		EvidenceWindow: cfg.EvidenceWindow, IdleReset: cfg.IdleReset}, ids)
	r.scraper = &signals.Scraper{Timeout: cfg.ScrapeTimeout, Now: cfg.Now,
		Client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2, IdleConnTimeout: time.Minute}}}
	r.srv, err = server.New(server.Config{Logger: lg, Registry: r.reg, Reports: r.intake, Auth: cfg.Auth,
		VersionPrefix: fmt.Sprintf("p%d-", cfg.Now().UnixMilli())})
	if err != nil {
		return nil, err
	}
	r.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	r.m.cycles = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "inferlb_cycles_total", Help: "Control cycles by outcome: published, unchanged or error (one per cycle); fallback additionally counts the cycles whose allocator failed and the proportional fallback was used."}, []string{"outcome"})
	r.m.cycleSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "inferlb_cycle_seconds", Help: "Duration of a control cycle's logic (signals to resources).",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)})
	r.m.penalty = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "inferlb_engine_penalty", Help: "Outlier penalty per engine (share of capacity removed)."}, []string{"engine"})
	r.m.up = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "inferlb_engine_state", Help: "1 for the engine's current state (up, down, stale, new)."}, []string{"engine", "state"})
	r.m.age = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "inferlb_engine_signal_age_seconds", Help: "Age of the engine's last good metrics scrape."}, []string{"engine"})
	r.m.held = prometheus.NewCounter(prometheus.CounterOpts{Name: "inferlb_deadband_holds_total", Help: "(frontend, class) weight changes held back by the deadband."})
	r.m.correction = prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "inferlb_engine_profile_correction",
		Help: "Factor on the engine's TTFT curve the optimizer plans with (observed over predicted TTFT, smoothed; 1: as configured)."}, []string{"engine"})
	r.reg.MustRegister(r.m.cycles, r.m.cycleSeconds, r.m.penalty, r.m.correction, r.m.up, r.m.age, r.m.held, r.m.adjusted)
	if cfg.StateFile != "" {
		if err := r.loadState(); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// targetsOf are the engines a fleet's scrape rounds probe, and their ids.
func targetsOf(spec *fleet.Spec) (ids []string, targets []signals.Target) {
	for _, e := range spec.Engines {
		ids = append(ids, e.ID)
		targets = append(targets, signals.Target{ID: e.ID, Address: e.Address, Server: e.Server, HealthPath: e.HealthPath})
	}
	return ids, targets
}

// UpdateFleet hands the runner a new fleet: with Kubernetes discovery
// (controlplane/discovery/kube) engines come and go as pods scale and turn
// ready or not. The next cycle, run at once, plans for it: engines that left
// lose their weight, new ones are probed by the next scrape round and get
// weight once they answer (as any engine that was never scraped). What the
// engines that stay had (published weights, penalties, latency signals) is
// kept.
//
// The frontends, classes and priorities are the ones the runner started
// with: ext_proc instances and the Reports intake are keyed by them, so a
// fleet that changes them is refused (restart the control plane to change
// them). Safe for concurrent use.
func (r *Runner) UpdateFleet(spec *fleet.Spec) error {
	if spec == nil {
		return errors.New("control plane: update to no fleet")
	}
	names := func(s *fleet.Spec) string {
		var b []byte
		for _, f := range s.Frontends {
			b = fmt.Appendf(b, "frontend %s/%s ", f.Name, f.NodeID)
		}
		for _, c := range s.Classes {
			b = fmt.Appendf(b, "class %s ", c.Name)
		}
		for _, p := range s.Priorities {
			b = fmt.Appendf(b, "priority %s/%d ", p.Name, p.Level)
		}
		return string(b)
	}
	if names(spec) != names(r.cfg.Fleet) {
		return fmt.Errorf("control plane: fleet update changes the frontends, classes or priorities (%s→ %s); restart the control plane to change them",
			names(r.cfg.Fleet), names(spec))
	}
	r.mu.Lock()
	r.pending = spec
	r.mu.Unlock()
	r.Kick()
	return nil
}

// Fleet is the fleet the control plane plans for now (its last update a
// cycle applied).
func (r *Runner) Fleet() *fleet.Spec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fleet
}

// applyFleet switches the controller to a pending fleet, if any: a new
// Controller seeded with the old one's published weights and version (so
// the change publishes as the next version, and weights of engines that
// stay are held as before) and its penalties; the tracker keeps the
// signals of the engines that stay. A fleet the controller refuses is
// logged and dropped; the old one stays. Cycle loop only.
func (r *Runner) applyFleet() {
	r.mu.Lock()
	spec := r.pending
	r.pending = nil
	r.mu.Unlock()
	if spec == nil {
		return
	}
	ctrl, err := NewController(spec, r.cfg.Cycle, r.cfg.Allocator)
	if err != nil {
		r.log.Error("fleet update refused; the previous fleet stays", "err", err)
		return
	}
	if _, err := ctrl.Seed(r.ctrl.Published(), r.ctrl.Version()); err != nil {
		r.log.Error("fleet update refused; the previous fleet stays", "err", err)
		return
	}
	ctrl.inherit(r.ctrl)
	r.ctrl = ctrl
	r.intake.SetBounds(ctrl.IntakeOptions())
	ids, targets := targetsOf(spec)
	r.mu.Lock()
	old := len(r.targets)
	r.fleet, r.targets = spec, targets
	r.tracker.SetEngines(ids)
	r.hist = newHistory(spec, r.cfg.History)
	r.mu.Unlock()
	r.log.Info("fleet updated", "engines", len(ids), "before", old)
}

// intakeOptions are the Reports intake's names and bounds (the
// controller's) with the runner's window, clock and clock skew.
func (r *Runner) intakeOptions() signals.IntakeOptions {
	o := r.ctrl.IntakeOptions()
	o.Window, o.Now, o.MaxClockSkew = r.cfg.DemandWindow, r.cfg.Now, r.cfg.MaxClockSkew
	return o
}

// Registry is the runner's own metrics registry.
func (r *Runner) Registry() *prometheus.Registry { return r.reg }

// Server is the xDS server.
func (r *Runner) Server() *server.Server { return r.srv }

// Addrs returns the bound xDS and admin addresses once Run has bound them.
func (r *Runner) Addrs(ctx context.Context) (xds, admin string, err error) {
	select {
	case <-r.started:
	case <-ctx.Done():
		return "", "", ctx.Err()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.xdsAddr, r.adminAddr, nil
}

// Last returns the last cycle's result (nil before the first).
func (r *Runner) Last() *Result {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// Run serves until ctx is cancelled, then shuts everything down and
// returns. Envoy keeps its last configuration meanwhile.
func (r *Runner) Run(ctx context.Context) error {
	if r.ran.Swap(true) {
		return errors.New("control plane: Run called twice; a Runner runs once (its server, intake and state are spent)")
	}
	xl, err := net.Listen("tcp", r.cfg.XDSListen)
	if err != nil {
		return fmt.Errorf("control plane: xds listen: %w", err)
	}
	al, err := net.Listen("tcp", r.cfg.AdminListen)
	if err != nil {
		xl.Close()
		return fmt.Errorf("control plane: admin listen: %w", err)
	}
	r.mu.Lock()
	r.xdsAddr, r.adminAddr = xl.Addr().String(), al.Addr().String()
	r.mu.Unlock()
	close(r.started)
	r.log.Info("control plane serving", "xds", r.xdsAddr, "admin", r.adminAddr, "fleet", r.cfg.Fleet.Name,
		"engines", len(r.cfg.Fleet.Engines), "interval", r.cfg.Interval)

	// Every part ends when the first fails or ctx ends.
	g, ctx := errgroup.WithContext(ctx)
	admin := &http.Server{Handler: r.adminHandler(), ReadHeaderTimeout: 5 * time.Second}
	g.Go(func() error { return r.srv.Serve(xl) })
	g.Go(func() error {
		if err := admin.Serve(al); err != nil && !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		r.srv.Stop()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		return admin.Shutdown(sctx)
	})
	g.Go(func() error { r.scrapeLoop(ctx); return nil })
	g.Go(func() error { r.cycleLoop(ctx); return nil })
	err = g.Wait()
	r.scraper.Client.CloseIdleConnections()
	r.log.Info("control plane stopped")
	return err
}

func (r *Runner) scrapeLoop(ctx context.Context) {
	t := time.NewTicker(r.cfg.ScrapeInterval)
	defer t.Stop()
	for {
		r.mu.Lock()
		targets := r.targets
		r.mu.Unlock()
		samples := r.scraper.ScrapeAll(ctx, targets)
		if ctx.Err() != nil {
			return
		}
		changed := false
		r.mu.Lock()
		for _, s := range samples {
			if r.tracker.Observe(s) {
				changed = true
				r.log.Info("engine state changed", "engine", s.ID, "healthy", s.Healthy, "health_err", s.HealthErr, "metrics_err", s.MetricsErr)
			}
		}
		r.mu.Unlock()
		r.scrapedOnce.Do(func() { close(r.scraped) })
		if changed {
			select {
			case r.kick <- struct{}{}:
			default:
			}
		}
		select {
		case r.scrapeDone <- struct{}{}:
		default:
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (r *Runner) cycleLoop(ctx context.Context) {
	start := r.cfg.Now()
	warm := time.NewTimer(r.cfg.Warmup)
	defer warm.Stop()
	select {
	case <-ctx.Done():
		return
	case <-warm.C:
	}
	// Every engine must have been scraped once: an engine not yet seen is
	// "unknown", and publishing that would move weights for nothing.
	select {
	case <-ctx.Done():
		return
	case <-r.scraped:
	}
	// Then wait for every frontend's demand reports (ext_proc reconnects
	// with a backoff after a restart), at most one demand window more:
	// publishing from partial demand would move weights for nothing.
	deadline := time.NewTimer(r.cfg.DemandWindow)
	defer deadline.Stop()
	poll := time.NewTicker(r.cfg.ScrapeInterval)
	defer poll.Stop()
	for !r.allReported() {
		select {
		case <-ctx.Done():
			return
		case <-deadline.C:
			r.log.Warn("warm-up: not every frontend has reported demand; starting anyway", "reported", len(r.intake.Status().LastReport))
			goto warm
		case <-poll.C:
		}
	}
warm:
	r.log.Info("warm-up done", "after", r.cfg.Now().Sub(start))
	t := time.NewTicker(r.cfg.Interval)
	defer t.Stop()
	for {
		r.cycle(ctx)
		if !r.awaitCycle(ctx, t.C) {
			return
		}
	}
}

// awaitCycle waits for the next cycle: the period, a kick (an engine's
// state changed), or a scrape round after which a penalty would rise. It
// returns false when ctx ends.
func (r *Runner) awaitCycle(ctx context.Context, period <-chan time.Time) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case <-period:
			return true
		case <-r.kick:
			return true
		case <-r.scrapeDone:
			if ids := r.ctrl.PenaltyRising(r.inputs()); len(ids) > 0 {
				r.log.Info("penalty rising: cycle now", "engines", ids)
				return true
			}
		}
	}
}

// inputs are a cycle's observations now.
func (r *Runner) inputs() Inputs {
	now := r.cfg.Now()
	r.mu.Lock()
	engines := r.tracker.Engines(now)
	r.mu.Unlock()
	// The capacity the engines show (requests completed per second over
	// the evidence window, saturated ones at their real rate): a bound on
	// reported demand derived from the profiles' capacity follows it.
	served := 0.0
	for _, e := range engines {
		if e.Status() == signals.Up && e.Window.CompletionsPerS > 0 {
			served += e.Window.CompletionsPerS
		}
	}
	r.intake.SetMeasuredRPS(served)
	dem, ev := r.intake.Snapshot(now)
	return Inputs{Now: now, Engines: engines, Demand: dem, Evidence: ev, DemandWindow: r.cfg.DemandWindow, Instances: r.intake.Instances(now)}
}

func (r *Runner) allReported() bool {
	seen := r.intake.Status().LastReport
	for _, f := range r.cfg.Fleet.Frontends {
		if _, ok := seen[f.NodeID]; !ok {
			return false
		}
	}
	return true
}

func (r *Runner) cycle(ctx context.Context) {
	r.applyFleet()
	in := r.inputs()
	engines := in.Engines
	t0 := time.Now()
	in.Prefixes = r.intake.Prefixes(in.Now)
	res, err := r.ctrl.Step(ctx, in)
	r.m.cycleSeconds.Observe(time.Since(t0).Seconds())
	r.mu.Lock()
	hist := r.hist
	r.mu.Unlock()
	hist.record(in.Now, engines, in.Demand, res) // a failed cycle's signals count too
	if err != nil {
		r.m.cycles.WithLabelValues("error").Inc()
		r.log.Error("control cycle failed", "err", err)
		return
	}
	if res.Fallback != "" {
		r.m.cycles.WithLabelValues("fallback").Inc()
		r.log.Warn("optimizer failed; capacity-proportional fallback used", "err", res.Fallback)
	}
	if res.BalanceSkipped != "" {
		r.log.Info("balance bound not applied this cycle; the unbounded plan stands", "reason", res.BalanceSkipped)
	}
	r.mu.Lock()
	// The engines the previous successful cycle left with a penalty: a
	// penalty is logged when it is set and when it clears.
	penalized := map[string]bool{}
	if r.last != nil {
		for _, v := range r.last.Engines {
			penalized[v.ID] = v.Penalty > 0
		}
	}
	r.last, r.ready = res, true
	r.cycles++
	r.mu.Unlock()
	// Every node's current resources go to the server, not only the
	// changed ones: the server sends only what differs from what it holds,
	// so a publication that failed (or was replaced behind the controller's
	// back) is retried next cycle instead of waiting for the weights to move.
	failed := 0
	for _, nd := range res.Nodes {
		if err := r.srv.Publish(ctx, nd.Resources); err != nil {
			failed++
			r.log.Error("publish failed; retried next cycle", "node", nd.NodeID, "err", err)
		}
	}
	outcome := "unchanged"
	if len(res.Publish) > 0 {
		outcome = "published"
		if r.cfg.StateFile != "" {
			if err := r.saveState(); err != nil {
				r.log.Error("state file", "err", err)
			}
		}
	}
	if failed > 0 {
		outcome = "error"
	}
	r.m.cycles.WithLabelValues(outcome).Inc()
	for _, nd := range res.Nodes {
		for _, cd := range nd.Classes {
			if cd.Held && cd.TVDistance > 0 {
				r.m.held.Inc()
			}
		}
	}
	for _, e := range engines {
		r.m.age.WithLabelValues(e.ID).Set(e.AgeSeconds)
		for _, st := range []signals.State{signals.Up, signals.Down, signals.Stale, signals.New} {
			v := 0.0
			if e.Status() == st {
				v = 1
			}
			r.m.up.WithLabelValues(e.ID, st.String()).Set(v)
		}
	}
	for _, v := range res.Engines {
		r.m.penalty.WithLabelValues(v.ID).Set(v.Penalty)
		r.m.correction.WithLabelValues(v.ID).Set(v.ProfileCorrection)
		switch w := v.Window; {
		case v.Penalty > 0 && !penalized[v.ID]:
			// With the evidence that set it: a penalty takes traffic
			// away, and its cause must be readable after the fact.
			r.log.Warn("engine penalized", "engine", v.ID, "penalty", v.Penalty, "why", v.PenaltyWhy,
				"ttft_residual", v.TTFTResidual, "tbot_residual", v.TBOTResidual, "e2e_residual", v.E2EResidual, "error_rate", v.ErrorRate,
				"ttft_ms", w.TTFTMeanMs, "ttft_predicted_ms", v.TTFTPredMs, "first_tokens", w.TTFTCount, "tbot_ms", w.TBOTMeanMs, "tbot_predicted_ms", v.TBOTPredMs, "queue_mean_ms", w.QueueMeanMs, "queue_count", w.QueueCount,
				"running", w.Running, "waiting", w.Waiting, "completions_per_s", w.CompletionsPerS, "window_s", w.Seconds)
		case v.Penalty == 0 && penalized[v.ID]:
			r.log.Info("engine penalty cleared", "engine", v.ID, "why", v.PenaltyWhy)
		}
		if strings.Contains(v.ProfileCorrectionWhy, "replanned") {
			r.log.Info("profile corrected", "engine", v.ID, "factor", v.ProfileCorrection, "why", v.ProfileCorrectionWhy)
		}
	}
}

type stateFile struct {
	Version int64                                    `json:"version"`
	Weights map[string]map[string]map[string]float64 `json:"weights"`
}

func (r *Runner) loadState() error {
	b, err := os.ReadFile(r.cfg.StateFile)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("control plane state: %w", err)
	}
	var st stateFile
	if err := json.Unmarshal(b, &st); err != nil {
		return fmt.Errorf("control plane state %s: %w", r.cfg.StateFile, err)
	}
	ignored, err := r.ctrl.Seed(st.Weights, st.Version)
	if err != nil {
		return fmt.Errorf("control plane state %s: %w", r.cfg.StateFile, err)
	}
	if len(ignored) > 0 {
		r.log.Warn("state file names what the fleet no longer has; ignored", "file", r.cfg.StateFile, "ignored", ignored)
	}
	r.log.Info("published weights restored", "file", r.cfg.StateFile, "version", st.Version)
	return nil
}

func (r *Runner) saveState() error {
	b, err := json.MarshalIndent(stateFile{Version: r.ctrl.Version(), Weights: r.ctrl.Published()}, "", " ")
	if err != nil {
		return err
	}
	tmp := r.cfg.StateFile + ".tmp"
	if err := os.MkdirAll(filepath.Dir(r.cfg.StateFile), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, r.cfg.StateFile)
}

// Kick runs a cycle as soon as possible (tests, admin).
func (r *Runner) Kick() {
	select {
	case r.kick <- struct{}{}:
	default:
	}
}
