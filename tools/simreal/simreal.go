// Package simreal checks the fleet simulator against the real stack: one
// scenario (a fleet with one frontend, engines in several regions,
// multi-turn sessions with a surge) run once in `inferlb-lab sim` (inferlb's
// policy, tools/fleetsim) and once through the real request path — a real
// Envoy, the control plane, the ext_proc service and engine-sim engines on
// the fleet's addresses, with the fleet's round trips emulated by the
// engines (x-inferlb-source-region, which ext_proc sets) — driven by the load
// generator with the same fleet, seed, sessions and surge. It compares
// client-side TTFT p50/p99 and the prefix-cache hit rate.
//
// The two sides share the engine model (tools/enginesim/model), the
// workload generator (tools/workload's MultiTurn with the scenario's seed:
// session k has the same system prompt, turns and lengths on both sides, and
// starts at the same time, fleetsim.SessionStarts),
// the control plane's code and periods (controlplane.DefaultRunConfig) and
// ext_proc's Decider. They differ in what the simulator abstracts: the
// answers' text (engine-sim's words, the simulator's token ids), Envoy's and
// ext_proc's own latency and the machine's scheduling, which the simulator
// does not model.
//
// `inferlb-lab bench simreal` runs it at full size; a test in this package runs
// it short.
package simreal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane"
	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/extproc"
	"github.com/inferlb/inferlb/extproc/cpclient"
	"github.com/inferlb/inferlb/extproc/service"
	"github.com/inferlb/inferlb/internal/dist"
	"github.com/inferlb/inferlb/internal/envoyrun"
	"github.com/inferlb/inferlb/internal/tokens/hf"
	"github.com/inferlb/inferlb/tools/enginesim"
	"github.com/inferlb/inferlb/tools/fleetsim"
	"github.com/inferlb/inferlb/tools/loadgen"
	"github.com/inferlb/inferlb/tools/workload"
)

// Options configure a comparison.
type Options struct {
	// Scenario is the fleetsim scenario both sides run: a sessions
	// workload, one frontend, faults limited to surges.
	Scenario *fleetsim.Scenario
	// Duration, if not 0, replaces the scenario's traffic time (the
	// surges keep their times and are cut at the end).
	Duration time.Duration
	// Seed, if not 0, replaces the scenario's seed.
	Seed uint64
	// TimeScale is real seconds per simulated second on the real side
	// (engine-sim --time-scale; 0 means 1): the engines, the round trips,
	// the load generator and the control plane's periods run that much
	// slower, and every figure is read back in simulated time. Above 1 it
	// divides what the machine adds (Envoy's and ext_proc's own time,
	// timers firing late on a busy machine) by it; the simulator's figures
	// do not depend on it.
	TimeScale float64
	// Dir holds Envoy's files (a temporary directory if "").
	Dir    string
	Logger *slog.Logger
	// Progress, if set, receives a line per step.
	Progress io.Writer
}

// Side is one side's figures (client-side, milliseconds).
type Side struct {
	Requests int     `json:"requests"`
	TTFTP50  float64 `json:"ttft_p50_ms"`
	TTFTP90  float64 `json:"ttft_p90_ms"`
	TTFTP99  float64 `json:"ttft_p99_ms"`
	HitRate  float64 `json:"hit_rate"`
	// TPOTP50 is the median time per output token: the engines' decode
	// steps alone, so a gap here is the machine slowing engine-sim down.
	TPOTP50 float64 `json:"tpot_p50_ms"`
	// Errors are requests that failed or were shed.
	Errors int `json:"errors"`
	// PathMs is what the request path adds to the engines' own TTFT, on
	// average: in the simulator the round trip (the requests' mean RTT
	// to the engines that served them: all it models); in the real stack
	// the client's mean TTFT minus the engines' (their histograms' sums
	// over counts, exact): the emulated round trip plus Envoy, ext_proc
	// and the machine.
	PathMs float64 `json:"path_ms"`
	// Engines are per-engine figures, in the fleet's order.
	Engines []Engine `json:"engines"`
}

// Engine is one engine's requests and TTFT. The simulator's is measured at
// the client; the real side's is the engine's own histogram
// (vllm:time_to_first_token_seconds, interpolated within its buckets) plus
// the round trip from the frontend: the client's view without Envoy's and
// ext_proc's own time, so a gap here is the engines' or the routing's, and a
// gap only in the client figures is the request path's.
type Engine struct {
	ID      string  `json:"id"`
	Served  int     `json:"served"`
	TTFTP50 float64 `json:"ttft_p50_ms"`
	TTFTP99 float64 `json:"ttft_p99_ms"`
}

// Report is both sides and their relative gaps ((real − sim) / sim).
type Report struct {
	Scenario string  `json:"scenario"`
	Seed     uint64  `json:"seed"`
	Duration float64 `json:"duration_s"`
	// TimeScale is the real side's (Options.TimeScale).
	TimeScale float64 `json:"time_scale"`
	Sim       Side    `json:"sim"`
	Real      Side    `json:"real"`
	GapP50    float64 `json:"gap_ttft_p50"`
	GapP99    float64 `json:"gap_ttft_p99"`
	GapHit    float64 `json:"gap_hit_rate"`
}

// Gap is (real − sim) / sim.
func Gap(sim, real float64) float64 {
	if sim == 0 {
		return math.Inf(1)
	}
	return (real - sim) / sim
}

// Run runs the scenario in the simulator, then through the real stack.
func Run(ctx context.Context, o Options) (*Report, error) {
	sc, err := prepare(o)
	if err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.TimeScale == 0 {
		o.TimeScale = 1
	}
	if !(o.TimeScale > 0) {
		return nil, fmt.Errorf("simreal: time scale must be > 0, got %v", o.TimeScale)
	}
	rep := &Report{Scenario: sc.Name, Seed: sc.Seed, Duration: sc.Duration.Seconds(), TimeScale: o.TimeScale}
	o.progressf("sim: %s, %v of traffic, seed %d", sc.Name, sc.Duration, sc.Seed)
	res, err := fleetsim.RunScenario(ctx, sc, fleetsim.RunOptions{Policies: []string{fleetsim.PolicyInferlb}, Seed: sc.Seed, Seeds: 1, Parallel: 1, IdlePlacement: true, CachePlacement: true})
	if err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	p := res.Policies[0]
	rep.Sim = Side{Requests: p.Served, TTFTP50: p.TTFT.P50, TTFTP90: p.TTFT.P90, TTFTP99: p.TTFT.P99, HitRate: p.HitRate, TPOTP50: p.TPOTP50Ms, Errors: p.Shed + p.Failed + p.Rejected}
	rttSum := 0.0
	for i, e := range p.Engines {
		rep.Sim.Engines = append(rep.Sim.Engines, Engine{ID: e.ID, Served: e.Served, TTFTP50: e.TTFTP50Ms, TTFTP99: e.TTFTP99Ms})
		rtt, _ := sc.Fleet.RTTMs(sc.Fleet.Frontends[0].Region, sc.Fleet.Engines[i].Region)
		rttSum += float64(e.Served) * rtt
	}
	if p.Served > 0 {
		rep.Sim.PathMs = rttSum / float64(p.Served)
	}
	o.progressf("sim: %d served, TTFT p50 %.1f ms p99 %.1f ms, hit rate %.3f", rep.Sim.Requests, rep.Sim.TTFTP50, rep.Sim.TTFTP99, rep.Sim.HitRate)
	if rep.Real, err = runReal(ctx, o, sc); err != nil {
		return nil, fmt.Errorf("real stack: %w", err)
	}
	o.progressf("real: %d served, TTFT p50 %.1f ms p99 %.1f ms, hit rate %.3f", rep.Real.Requests, rep.Real.TTFTP50, rep.Real.TTFTP99, rep.Real.HitRate)
	rep.GapP50 = Gap(rep.Sim.TTFTP50, rep.Real.TTFTP50)
	rep.GapP99 = Gap(rep.Sim.TTFTP99, rep.Real.TTFTP99)
	rep.GapHit = Gap(rep.Sim.HitRate, rep.Real.HitRate)
	return rep, nil
}

// prepare checks that the scenario is one both sides can run and applies
// the overrides. The warm-up is cut to 0: the load generator's report
// covers every request, so the simulator's figures must too.
func prepare(o Options) (*fleetsim.Scenario, error) {
	if o.Scenario == nil || o.Scenario.Fleet == nil {
		return nil, errors.New("simreal: no scenario")
	}
	c := *o.Scenario
	sc := &c
	var errs []error
	if sc.Workload.Kind != fleetsim.Sessions {
		errs = append(errs, fmt.Errorf("workload kind %q: the real side replays sessions only", sc.Workload.Kind))
	}
	if n := len(sc.Fleet.Frontends); n != 1 {
		errs = append(errs, fmt.Errorf("%d frontends: the real side runs one Envoy", n))
	}
	if len(sc.Fleet.Classes) != 1 {
		errs = append(errs, fmt.Errorf("%d classes: the real side sends one class", len(sc.Fleet.Classes)))
	}
	for i, f := range sc.Faults {
		if f.Kind != fleetsim.Surge {
			errs = append(errs, fmt.Errorf("faults[%d]: %s: the real side emulates surges only", i, f.Kind))
		}
	}
	if sc.Workload.Users > 0 {
		errs = append(errs, errors.New("workload users: the real side sends open-loop sessions (sessions_per_s)"))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("simreal: scenario %s: %w", sc.Name, errors.Join(errs...))
	}
	if o.Duration > 0 {
		sc.Duration = o.Duration
	}
	if o.Seed != 0 {
		sc.Seed = o.Seed
	}
	sc.Warmup = 0
	// Free ports for the engines, on both sides: the simulator's Maglev
	// tables are built from the same addresses as Envoy's.
	f := *sc.Fleet
	f.Engines = slices.Clone(f.Engines)
	for i := range f.Engines {
		port, err := envoyrun.FreePort()
		if err != nil {
			return nil, err
		}
		f.Engines[i].Address = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	}
	spec, err := fleet.New(f)
	if err != nil {
		return nil, err
	}
	sc.Fleet = spec
	return sc, nil
}

// scheduled sends a MultiTurn's sessions at the simulator's session start
// times (fleetsim.SessionStarts): a timed source for the load generator's
// trace replay; follow-up turns come from the MultiTurn.
type scheduled struct {
	*workload.MultiTurn
	starts []time.Duration
	next   int
}

func (s *scheduled) Timed() bool { return true }

func (s *scheduled) Next(time.Duration) (workload.Request, bool) {
	if s.next >= len(s.starts) {
		return workload.Request{}, false
	}
	at := s.starts[s.next]
	s.next++
	r, ok := s.MultiTurn.Next(at)
	r.Offset = at
	return r, ok
}

// group runs the rig's goroutines and stops them in reverse order.
type group struct {
	wg   sync.WaitGroup
	stop []func()
}

func (g *group) goRun(f func()) { g.wg.Go(f) }

func (g *group) close() {
	for i := len(g.stop) - 1; i >= 0; i-- {
		g.stop[i]()
	}
	g.wg.Wait()
}

// wall is a simulated duration in real time.
func (o *Options) wall(d time.Duration) time.Duration { return time.Duration(float64(d) * o.TimeScale) }

func (o *Options) progressf(format string, args ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, format+"\n", args...)
	}
}

func runReal(ctx context.Context, o Options, sc *fleetsim.Scenario) (Side, error) {
	spec := sc.Fleet
	ctx, cancel := context.WithCancel(ctx)
	g := &group{}
	defer func() { cancel(); g.close() }()
	dir := o.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "inferlb-simreal-")
		if err != nil {
			return Side{}, err
		}
		defer os.RemoveAll(d)
		dir = d
	}

	// Engines on the fleet's addresses, each holding a request for the
	// round trip from the frontend's region (the header ext_proc sets).
	var sims []*enginesim.Server
	for i, e := range spec.Engines {
		prof, ok := spec.ProfileOf(e)
		if !ok {
			return Side{}, fmt.Errorf("engine %s: no profile", e.ID)
		}
		srv, err := enginesim.Start(ctx, enginesim.Options{Listen: e.Address, ID: e.ID, Model: e.Model, Replicas: e.Replicas,
			Region: e.Region, Fleet: spec, Profile: prof, MaxContextTokens: prof.MaxContextTokens, TimeScale: o.TimeScale, Logger: o.Logger, Seed: uint64(i + 1)})
		if err != nil {
			return Side{}, fmt.Errorf("engine %s on %s: %w", e.ID, e.Address, err)
		}
		g.stop = append(g.stop, func() { _ = srv.Close() })
		sims = append(sims, srv)
	}

	// The control plane at its production periods, as the simulator runs
	// it, in the engines' time: the fleet in real time (profiles and round
	// trips scaled) and every period × the time scale.
	// The simulator's ext_procs count tokens with its word tokenizer (the
	// engines' rule); the real one gets the same, or it would bound
	// prompts by their bytes and report other demand to the plan.
	tokSpec, tok, err := fleetsim.WithSimTokenizer(spec)
	if err != nil {
		return Side{}, err
	}
	realSpec, err := tokSpec.InRealTime(o.TimeScale)
	if err != nil {
		return Side{}, err
	}
	cfg := controlplane.DefaultRunConfig()
	cfg.Fleet, cfg.XDSListen, cfg.AdminListen, cfg.Logger = realSpec, "127.0.0.1:0", "127.0.0.1:0", o.Logger
	cfg.Interval, cfg.ScrapeInterval = sc.Control.Interval, sc.Control.ScrapeInterval
	for _, d := range []*time.Duration{&cfg.Interval, &cfg.ScrapeInterval, &cfg.ScrapeTimeout, &cfg.StaleAfter, &cfg.Smoothing, &cfg.DemandWindow, &cfg.Warmup} {
		*d = o.wall(*d)
	}
	runner, err := controlplane.NewRunner(cfg)
	if err != nil {
		return Side{}, err
	}
	cpCtx, cpCancel := context.WithCancel(ctx)
	cpStart := time.Now()
	g.goRun(func() { _ = runner.Run(cpCtx) })
	g.stop = append(g.stop, cpCancel)
	xdsAddr, _, err := runner.Addrs(ctx)
	if err != nil {
		return Side{}, err
	}

	fe := spec.Frontends[0]
	ext, extPort, err := startExtProc(ctx, g, xdsAddr, fe, o.wall(sc.Control.ReportInterval), tok, o.Logger)
	if err != nil {
		return Side{}, err
	}

	_, xp, _ := net.SplitHostPort(xdsAddr)
	xdsPort, _ := strconv.Atoi(xp)
	listen, err := envoyrun.FreePort()
	if err != nil {
		return Side{}, err
	}
	// A generous ext_proc message timeout: on a busy machine a decision
	// can take longer than the production second, and a 504 there
	// measures the machine.
	boot, err := envoyconfigs.Render(envoyconfigs.Params{Variant: envoyconfigs.FailClosed, NodeID: fe.NodeID, Region: fe.Region,
		ListenPort: listen, ExtProcPort: extPort, XDSPort: xdsPort, BodyLimit: extproc.DefaultBodyLimit, MessageTimeout: "10s"})
	if err != nil {
		return Side{}, err
	}
	envoy, err := envoyrun.Start(envoyrun.Options{Bootstrap: boot}, dir)
	if err != nil {
		return Side{}, err
	}
	g.stop = append(g.stop, envoy.Stop)
	class := spec.Classes[0].Name
	want := len(spec.EligibleEngines(class))
	if err := envoyrun.Poll(ctx, 60*time.Second, 50*time.Millisecond, func() error {
		if ext.Policy() == nil {
			return errors.New("ext_proc has no policy")
		}
		cs, err := envoy.Clusters()
		if err != nil {
			return err
		}
		n := 0
		for _, h := range cs["inferlb_"+class] {
			if h.Routable() {
				n++
			}
		}
		if n != want {
			return fmt.Errorf("%d routable engines in inferlb_%s, want %d", n, class, want)
		}
		return nil
	}); err != nil {
		return Side{}, fmt.Errorf("rig not ready: %w", err)
	}
	// Traffic starts fleetsim.Lead after the control plane, as in the
	// simulator, so that its cycles fall at the same phases of the traffic:
	// the first cycle that sees traffic anchors the class's cached-share
	// estimate (controlplane's shape), and the deadband then holds the plan
	// made from it. Started at another phase the two sides plan with
	// different cached shares (0.13 in the simulator, 0.44 in a real run
	// whose first cycle came 5 s into the traffic) and route differently.
	// A rig slower to start than the lead (a busy machine) waits whole
	// control intervals more: the phase is what counts.
	lead := o.wall(fleetsim.Lead)
	for time.Since(cpStart) > lead {
		lead += o.wall(sc.Control.Interval)
	}
	o.progressf("real: rig ready (%d engines, Envoy %s) after %v; traffic starts %v after the control plane", len(spec.Engines), envoy.AdminURL, time.Since(cpStart).Round(time.Millisecond), lead)
	select {
	case <-ctx.Done():
		return Side{}, ctx.Err()
	case <-time.After(time.Until(cpStart.Add(lead))):
	}

	mtOpt := sc.Workload.MultiTurn
	mtOpt.Seed = sc.Seed
	mt, err := workload.NewMultiTurn(mtOpt)
	if err != nil {
		return Side{}, err
	}
	client := &loadgen.Client{HTTP: loadgen.NewHTTPClient(512), BaseURL: fmt.Sprintf("http://127.0.0.1:%d", listen), Model: spec.Classes[0].Model,
		Headers: loadgen.DefaultHeaderNames(), IgnoreEOS: true, Timeout: 120 * time.Second}
	defer client.CloseIdleConnections()
	if o.Progress != nil {
		stop := watchWeights(ctx, o, envoy, "inferlb_"+class, spec)
		defer stop()
	}
	src := &scheduled{MultiTurn: mt, starts: fleetsim.SessionStarts(sc, sc.Seed)}
	lg, err := loadgen.Run(ctx, loadgen.Config{Client: client, Source: src, Arrival: loadgen.Arrival{Kind: loadgen.Trace, Speedup: 1},
		Duration: sc.Duration, Seed: sc.Seed, TimeScale: o.TimeScale})
	if err != nil {
		return Side{}, err
	}
	side := Side{}
	engSum, engN := 0.0, 0
	for i, srv := range sims {
		e := spec.Engines[i]
		rtt, _ := spec.RTTMs(spec.Frontends[0].Region, e.Region)
		n, p50, p99, sum, err := engineFigures(srv)
		if err != nil {
			return Side{}, err
		}
		engSum += 1000 * sum / o.TimeScale
		engN += n
		// The histogram is in real seconds (engine-sim's metrics are).
		side.Engines = append(side.Engines, Engine{ID: e.ID, Served: n, TTFTP50: p50/o.TimeScale + rtt, TTFTP99: p99/o.TimeScale + rtt})
	}
	c := lg.Requests
	o.progressf("real: %d sent, %d ok, %d shed, %d errors, %d timeouts; send lag p99 %.1f ms", c.Sent, c.OK, c.Rejected, c.Errors, c.Timeouts, lg.SendLag.P99)
	side.Requests, side.TTFTP50, side.TTFTP90, side.TTFTP99 = c.OK, lg.TTFT.P50, lg.TTFT.P90, lg.TTFT.P99
	side.HitRate, side.Errors, side.TPOTP50 = lg.CachedShare, c.Rejected+c.Errors+c.Timeouts, lg.TPOT.P50
	if engN > 0 {
		side.PathMs = lg.TTFT.Mean - engSum/float64(engN)
	}
	return side, nil
}

// startExtProc runs an ext_proc server for the frontend, subscribed to the
// control plane and reporting to it; it returns the server and its port.
func startExtProc(ctx context.Context, g *group, xdsAddr string, fe fleet.Frontend, report time.Duration, tok *hf.Tokenizer, log *slog.Logger) (*extproc.Server, int, error) {
	ext := extproc.New(extproc.Options{Logger: log, IdlePlacement: true, CachePlacement: true, Tokenizers: map[string]*hf.Tokenizer{tok.SHA256(): tok}})
	conn, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, 0, err
	}
	g.stop = append(g.stop, func() { conn.Close() })
	sub := &cpclient.Subscriber{Conn: conn, NodeID: fe.NodeID, Region: fe.Region, Apply: ext.SetPolicy, Logger: log, MinBackoff: 20 * time.Millisecond}
	repo := &cpclient.Reporter{Conn: conn, NodeID: fe.NodeID, Instance: "simreal", Interval: report, Flush: ext.Observer().Flush, Logger: log}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, 0, err
	}
	gs := grpc.NewServer(service.ServerOptions(extproc.DefaultBodyLimit)...)
	ext.Register(gs)
	epCtx, epCancel := context.WithCancel(ctx)
	g.goRun(func() { _ = sub.Run(epCtx) })
	g.goRun(func() { _ = repo.Run(epCtx) })
	g.goRun(func() { _ = gs.Serve(lis) })
	g.stop = append(g.stop, gs.Stop, epCancel)
	return ext, lis.Addr().(*net.TCPAddr).Port, nil
}

// engineFigures reads an engine's requests served, its TTFT histogram's
// p50 and p99 in milliseconds (Prometheus' histogram_quantile: linear within
// the bucket) and the histogram's sum in seconds (real time).
func engineFigures(srv *enginesim.Server) (served int, p50, p99, sum float64, err error) {
	mfs, err := srv.Registry().Gather()
	if err != nil {
		return 0, 0, 0, 0, err
	}
	var h dist.Histogram
	for _, mf := range mfs {
		switch mf.GetName() {
		case "vllm:request_success_total":
			for _, m := range mf.GetMetric() {
				served += int(m.GetCounter().GetValue())
			}
		case "vllm:time_to_first_token_seconds":
			for _, m := range mf.GetMetric() {
				sum += m.GetHistogram().GetSampleSum()
				h.Add(m.GetHistogram())
			}
		}
	}
	return served, 1000 * h.Quantile(0.5), 1000 * h.Quantile(0.99), sum, nil
}

// watchWeights prints the class cluster's EDS priorities and weights as
// Envoy holds them, every control interval, until stop is called.
func watchWeights(ctx context.Context, o Options, envoy *envoyrun.Envoy, cluster string, spec *fleet.Spec) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	addr := map[string]string{}
	for _, e := range spec.Engines {
		addr[e.Address] = e.ID
	}
	start := time.Now()
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(o.wall(5 * time.Second)):
			}
			cs, err := envoy.Clusters()
			if err != nil {
				continue
			}
			line := fmt.Sprintf("real: t=%.0fs", time.Since(start).Seconds()/o.TimeScale)
			for _, e := range spec.Engines {
				if h, ok := cs[cluster][e.Address]; ok {
					line += fmt.Sprintf(" %s p%d w%d", addr[e.Address], h.Priority, h.Weight)
				}
			}
			o.progressf("%s", line)
		}
	}()
	return func() { cancel(); <-done }
}
