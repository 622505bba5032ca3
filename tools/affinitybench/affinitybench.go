// Package affinitybench measures cache affinity through the real request
// path: simulated engines, the control plane, the ext_proc service and a
// real Envoy, replaying multi-turn conversations whose prompts all open with
// one long shared preamble inside the first user message (the traffic that
// collapsed the old 2 KB prefix key onto one engine).
//
// Each mode runs on a fresh rig (engines with empty caches): "prefix" keys
// requests on their prefix chain through the learned split table, "random"
// turns affinity off for the class (a fresh key per request, so Envoy
// spreads requests evenly), "session" sends each conversation's id in
// x-session-id. A recording proxy in front of every engine sees what Envoy
// sent it: the affinity key, and the conversation and turn of the body, so
// distinct keys, per-engine load and remaps (a turn served by another engine
// than its conversation's previous turn) are measured where they happen.
//
// `inferlb-lab bench affinity` runs it at full size; a test in this package runs
// it small.
package affinitybench

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/api/headers"
	"github.com/inferlb/inferlb/controlplane"
	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/extproc"
	"github.com/inferlb/inferlb/extproc/cpclient"
	"github.com/inferlb/inferlb/extproc/service"
	"github.com/inferlb/inferlb/internal/dist"
	"github.com/inferlb/inferlb/internal/envoyrun"
	"github.com/inferlb/inferlb/internal/tokens"
	"github.com/inferlb/inferlb/internal/words"
	"github.com/inferlb/inferlb/tools/enginesim"
	"github.com/inferlb/inferlb/tools/loadgen"
	"github.com/inferlb/inferlb/tools/workload"
)

// Modes.
const (
	ModePrefix  = "prefix"
	ModeRandom  = "random"
	ModeSession = "session"
)

// Options configure a run. Start from DefaultOptions.
type Options struct {
	// Modes to run, in order (each on a fresh rig).
	Modes []string
	// Engines is the number of simulated engines (one class).
	Engines int
	// Profile is the engines' latency profile (in simulated time).
	Profile fleet.Profile
	// TimeScale is real seconds per simulated second for the engines and
	// the load generator; the control plane's fleet spec describes the
	// engines in real time (the profile scaled), so its utilization and
	// latency views hold.
	TimeScale float64
	// Requests per mode; Rate is new conversations per simulated second.
	Requests int
	Rate     float64
	// The conversations: a shared preamble of PreambleTokens tokens in the
	// first user message, Turns per conversation, UserTokens per user
	// message, OutputTokens per answer, ThinkTime between turns.
	PreambleTokens int
	Turns          workload.Range
	UserTokens     workload.Range
	OutputTokens   workload.Range
	ThinkTime      time.Duration
	Seed           uint64
	// Mooncake, when set, replaces the conversations: every mode replays
	// these Mooncake rows (prompts that share long prefixes inside one user
	// message each) at their own times, MooncakeSpeedup times faster (in
	// simulated time), each hash id MooncakeBlockTokens words; Requests and
	// Rate do not apply.
	Mooncake            []workload.MooncakeRow
	MooncakeBlockTokens int
	MooncakeSpeedup     float64
	// HashBalanceFactor is the class clusters' bounded-load factor (percent;
	// 0: off).
	HashBalanceFactor uint32
	// Dir holds Envoy's files (a temporary directory if "").
	Dir    string
	Logger *slog.Logger
	// Progress, if set, receives a line per phase step.
	Progress io.Writer
}

// DefaultOptions is the full-size run of `inferlb-lab bench affinity`.
func DefaultOptions() Options {
	prof := enginesim.H100Llama8B
	prof.Model = "m"
	prof.MaxContextTokens = 32768
	return Options{
		Modes: []string{ModePrefix, ModeRandom}, Engines: 4, Profile: prof, TimeScale: 0.5,
		Requests: 1000, Rate: 2, PreambleTokens: 4096,
		Turns: workload.Range{Min: 5, Max: 9}, UserTokens: workload.Range{Min: 200, Max: 400},
		OutputTokens: workload.Range{Min: 80, Max: 160}, ThinkTime: time.Second, Seed: 1,
		HashBalanceFactor: 150,
	}
}

// Phase is one mode's measurement.
type Phase struct {
	Mode string `json:"mode"`
	// EngineAddrs are the engines' addresses (their recording proxies'),
	// in fleet order: Envoy's Maglev table is built from them, so a
	// simulation of the same run uses them too.
	EngineAddrs []string `json:"engine_addresses"`
	// Requests the engines served (through Envoy) and the load
	// generator's report.
	Requests int             `json:"requests"`
	Loadgen  *loadgen.Report `json:"loadgen"`
	// EngineTTFTP50Ms and EngineTTFTP99Ms are the engines' own time to
	// first token (their vllm:time_to_first_token_seconds histograms,
	// merged, interpolated within buckets), in simulated time: queueing and
	// prefill, without the request path's own delays, which on a busy
	// machine (or under the race detector) can dwarf them.
	EngineTTFTP50Ms float64 `json:"engine_ttft_p50_ms"`
	EngineTTFTP99Ms float64 `json:"engine_ttft_p99_ms"`
	// DistinctKeys is the number of distinct affinity keys the engines
	// saw; KeysPer1000 the same per 1,000 requests.
	DistinctKeys int     `json:"distinct_keys"`
	KeysPer1000  float64 `json:"keys_per_1000_requests"`
	// Conversations seen, and their later turns: Remaps of them went to
	// another engine than the conversation's previous turn, KeyMoves got
	// another key.
	Conversations int `json:"conversations"`
	LaterTurns    int `json:"later_turns"`
	Remaps        int `json:"remaps"`
	KeyMoves      int `json:"key_moves"`
	// EngineRequests per engine id; MaxOverMean their max over mean.
	EngineRequests map[string]int `json:"engine_requests"`
	MaxOverMean    float64        `json:"max_over_mean"`
	IdleEngines    int            `json:"idle_engines"`
	// WeightChanges counts the changes of the class's EDS weights Envoy
	// had during the run (sampled every 250 ms), WeightTV the total
	// variation they moved: Maglev remaps about 1.35× that share of the
	// keys. Remaps beyond that come from Envoy's bounded load
	// (hash_balance_factor) sending a request past a busy engine.
	WeightChanges int     `json:"weight_changes"`
	WeightTV      float64 `json:"weight_tv"`
	// TableRules is the class's split table size at the end, TableVersion
	// its version.
	TableRules   int    `json:"table_rules"`
	TableVersion string `json:"table_version,omitempty"`
	// SharedDepthBytes is the table's shared-prefix depth at the end (0:
	// none).
	SharedDepthBytes uint32 `json:"shared_depth_bytes,omitempty"`
}

// TTFTP50 and the others read the load generator's report (simulated ms).
func (p *Phase) TTFTP50() float64 { return p.Loadgen.TTFT.P50 }

// TTFTP99 is the p99 time to first token (simulated ms).
func (p *Phase) TTFTP99() float64 { return p.Loadgen.TTFT.P99 }

// HitRate is the share of prompt tokens the engines served from cache.
func (p *Phase) HitRate() float64 { return p.Loadgen.CachedShare }

// Report is a run's phases.
type Report struct {
	Options Options  `json:"-"`
	Phases  []*Phase `json:"phases"`
}

// Phase returns the phase of a mode (nil if not run).
func (r *Report) Phase(mode string) *Phase {
	for _, p := range r.Phases {
		if p.Mode == mode {
			return p
		}
	}
	return nil
}

// Run runs every mode in order.
func Run(ctx context.Context, o Options) (*Report, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.Dir == "" {
		d, err := os.MkdirTemp("", "inferlb-affinity-")
		if err != nil {
			return nil, err
		}
		defer os.RemoveAll(d)
		o.Dir = d
	}
	rep := &Report{Options: o}
	for i, m := range o.Modes {
		dir := fmt.Sprintf("%s/%d-%s", o.Dir, i, m)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, err
		}
		ph, err := runPhase(ctx, o, m, dir)
		if err != nil {
			return nil, fmt.Errorf("mode %s: %w", m, err)
		}
		rep.Phases = append(rep.Phases, ph)
	}
	return rep, nil
}

func (o *Options) validate() error {
	var errs []error
	for _, m := range o.Modes {
		if m != ModePrefix && m != ModeRandom && m != ModeSession {
			errs = append(errs, fmt.Errorf("mode %q: want %s, %s or %s", m, ModePrefix, ModeRandom, ModeSession))
		}
	}
	if len(o.Modes) == 0 {
		errs = append(errs, errors.New("no mode to run"))
	}
	if o.Engines < 1 {
		errs = append(errs, fmt.Errorf("engines: at least 1, got %d", o.Engines))
	}
	if !(o.TimeScale > 0) {
		errs = append(errs, fmt.Errorf("time scale must be > 0, got %v", o.TimeScale))
	}
	switch {
	case o.Mooncake != nil:
		if len(o.Mooncake) == 0 {
			errs = append(errs, errors.New("mooncake: no rows"))
		}
		if !(o.MooncakeSpeedup > 0) {
			errs = append(errs, fmt.Errorf("mooncake speedup must be > 0, got %v", o.MooncakeSpeedup))
		}
		if o.MooncakeBlockTokens < 1 || o.MooncakeBlockTokens > workload.MooncakeBlockTokens {
			errs = append(errs, fmt.Errorf("mooncake block tokens %d out of range [1, %d]", o.MooncakeBlockTokens, workload.MooncakeBlockTokens))
		}
	default:
		if o.Requests < 1 {
			errs = append(errs, fmt.Errorf("requests: at least 1, got %d", o.Requests))
		}
		if !(o.Rate > 0) {
			errs = append(errs, fmt.Errorf("rate must be > 0, got %v", o.Rate))
		}
	}
	return errors.Join(errs...)
}

// seen is one request an engine's proxy forwarded.
type seen struct {
	engine, key string
	conv        uint64
	turn        int
}

// recorder is the proxies' log.
type recorder struct {
	mu   sync.Mutex
	reqs []seen
}

// proxy forwards to an engine and records what Envoy sent: the key and
// the body's conversation (its first user message) and turn (its user
// messages).
func (rc *recorder) proxy(engine string, target *url.URL) http.Handler {
	rp := &httputil.ReverseProxy{Rewrite: func(pr *httputil.ProxyRequest) { pr.SetURL(target) }, FlushInterval: -1,
		ErrorLog: nil}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(b))
			var body struct {
				Messages []struct {
					Role    string `json:"role"`
					Content string `json:"content"`
				} `json:"messages"`
			}
			if json.Unmarshal(b, &body) == nil && len(body.Messages) > 0 {
				// The conversation is its first user message; its turn
				// the number of user messages.
				h := fnv.New64a()
				turn := 0
				for _, m := range body.Messages {
					if m.Role == "user" {
						if turn == 0 {
							h.Write([]byte(m.Content))
						}
						turn++
					}
				}
				rc.mu.Lock()
				rc.reqs = append(rc.reqs, seen{engine: engine, key: r.Header.Get(headers.AffinityKey), conv: h.Sum64(), turn: turn})
				rc.mu.Unlock()
			}
		}
		rp.ServeHTTP(w, r)
	})
}

// cachedCapacityRPS is the engines' capacity (simulated requests per second)
// given to the control plane. Its step model counts every prompt token as
// prefill, which for these prompts (mostly a cached preamble and history)
// would make it shed well below what the engines serve; the rig measures
// affinity, not admission, so it states the capacity instead.
const cachedCapacityRPS = 25.0

func fleetYAML(o Options, mode string, addrs []string) string {
	p := o.Profile
	affinity := "{mode: 'on'}"
	if mode == ModeRandom {
		affinity = "{mode: 'off'}"
	}
	meanPrompt := o.PreambleTokens + (o.Turns.Min+o.Turns.Max)/2*(o.UserTokens.Max+o.OutputTokens.Max)/2
	meanOutput := (o.OutputTokens.Min + o.OutputTokens.Max) / 2
	if len(o.Mooncake) > 0 {
		in, out := 0, 0
		for _, r := range o.Mooncake {
			in += r.InputLength * o.MooncakeBlockTokens / workload.MooncakeBlockTokens
			out += r.OutputLength
		}
		meanPrompt, meanOutput = max(in/len(o.Mooncake), 1), max(out/len(o.Mooncake), 1)
	}
	y := fmt.Sprintf(`name: affinity-bench
regions: [{name: local}]
network: {same_region_rtt_ms: 0.1}
frontends: [{name: fe, region: local, node_id: fe}]
models: [{name: %s, max_context_tokens: %d}]
profiles:
  - {gpu: %s, model: %s, prefill_tokens_per_s: %g, overhead_ms: %g, decode_step_ms: %g, decode_step_per_seq_ms: %g, max_running: %d, max_batched_tokens: %d, kv_capacity_tokens: %d, block_size: %d, capacity_rps: %g}
classes: [{name: chat, model: %s, mean_prompt_tokens: %d, mean_output_tokens: %d, affinity: %s}]
priorities: [{name: default, level: 0, shed_cost: 1000}]
engines:
`, p.Model, p.MaxContextTokens, p.GPU, p.Model, p.PrefillTokensPerS, p.OverheadMs, p.DecodeStepMs, p.DecodeStepPerSeqMs,
		p.MaxRunning, p.MaxBatchedTokens, p.KVCapacityTokens, p.BlockSize, cachedCapacityRPS, p.Model, meanPrompt, meanOutput, affinity)
	for i, a := range addrs {
		y += fmt.Sprintf("  - {id: e%d, address: %q, region: local, gpu: %s, model: %s}\n", i, a, p.GPU, p.Model)
	}
	return y
}

// group runs the rig's goroutines and waits for them.
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

func (o *Options) progressf(format string, args ...any) {
	if o.Progress != nil {
		fmt.Fprintf(o.Progress, format+"\n", args...)
	}
}

func runPhase(ctx context.Context, o Options, mode, dir string) (ph *Phase, err error) {
	log := o.Logger
	ctx, cancel := context.WithCancel(ctx)
	g := &group{}
	defer func() { cancel(); g.close() }()

	// Engines, each behind a recording proxy.
	rc := &recorder{}
	addrs, sims, err := startEngines(ctx, o, g, rc)
	if err != nil {
		return nil, err
	}
	spec, err := fleet.Parse([]byte(fleetYAML(o, mode, addrs)))
	if err == nil {
		// The engines in real time: what the control plane reads of them.
		spec, err = spec.InRealTime(o.TimeScale)
	}
	if err != nil {
		return nil, fmt.Errorf("fleet spec: %w", err)
	}

	// The control plane.
	xdsAddr, err := startControlPlane(ctx, o, g, spec)
	if err != nil {
		return nil, err
	}

	// ext_proc, subscribed to the policy and reporting.
	ext, extPort, err := startExtProc(ctx, g, xdsAddr, log)
	if err != nil {
		return nil, err
	}

	// Envoy.
	_, xp, _ := net.SplitHostPort(xdsAddr)
	xdsPort, _ := strconv.Atoi(xp)
	listen, err := envoyrun.FreePort()
	if err != nil {
		return nil, err
	}
	// A generous ext_proc message timeout: on a busy machine (or under the
	// race detector) a decision can take longer than the production
	// second, and a 504 there measures the machine, not affinity.
	boot, err := envoyconfigs.Render(envoyconfigs.Params{Variant: envoyconfigs.FailClosed, NodeID: "fe", Region: "local",
		ListenPort: listen, ExtProcPort: extPort, XDSPort: xdsPort, BodyLimit: extproc.DefaultBodyLimit,
		MessageTimeout: "10s"})
	if err != nil {
		return nil, err
	}
	envoy, err := envoyrun.Start(envoyrun.Options{Bootstrap: boot}, dir)
	if err != nil {
		return nil, err
	}
	g.stop = append(g.stop, envoy.Stop)
	if err := envoyrun.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() error {
		if ext.Policy() == nil {
			return errors.New("ext_proc has no policy")
		}
		cs, err := envoy.Clusters()
		if err != nil {
			return err
		}
		n := 0
		for _, h := range cs["inferlb_chat"] {
			if h.Routable() {
				n++
			}
		}
		if n != o.Engines {
			return fmt.Errorf("%d routable engines in inferlb_chat, want %d", n, o.Engines)
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("rig not ready: %w", err)
	}
	// The conversations, or the Mooncake rows.
	var src workload.Source
	arrival, maxRequests := loadgen.Arrival{Kind: loadgen.Poisson, Rate: o.Rate}, o.Requests
	if o.Mooncake != nil {
		mc, err := workload.NewMooncake(o.Mooncake, workload.MooncakeOptions{Format: workload.Chat, BlockTokens: o.MooncakeBlockTokens, Seed: o.Seed})
		if err != nil {
			return nil, err
		}
		src, arrival, maxRequests = mc, loadgen.Arrival{Kind: loadgen.Trace, Speedup: o.MooncakeSpeedup}, len(o.Mooncake)
	} else {
		mt, err := workload.NewMultiTurn(workload.MultiTurnOptions{SystemPrompts: 1, SystemPromptTokens: 40, Turns: o.Turns,
			UserTokens: o.UserTokens, OutputTokens: o.OutputTokens, ThinkTime: o.ThinkTime, SessionIDs: mode == ModeSession, Seed: o.Seed})
		if err != nil {
			return nil, err
		}
		src = &preambled{MultiTurn: mt, preamble: words.Words(o.Seed^0x707265616d626c65, o.PreambleTokens) + "\n\n"}
	}
	o.progressf("%s: rig ready (%d engines, Envoy %s); sending %d requests", mode, o.Engines, envoy.AdminURL, maxRequests)
	client := &loadgen.Client{HTTP: loadgen.NewHTTPClient(256), BaseURL: fmt.Sprintf("http://127.0.0.1:%d", listen), Model: o.Profile.Model,
		Headers: loadgen.DefaultHeaderNames(), IgnoreEOS: true, Timeout: 60 * time.Second}
	defer client.CloseIdleConnections()
	stopSampling := sampleWeights(ctx, envoy)
	lg, err := loadgen.Run(ctx, loadgen.Config{Client: client, Source: src, Arrival: arrival,
		MaxRequests: maxRequests, TimeScale: o.TimeScale, Seed: o.Seed})
	changes, moved := stopSampling()
	if err != nil {
		return nil, err
	}
	ph = &Phase{Mode: mode, EngineAddrs: addrs, Loadgen: lg, WeightChanges: changes, WeightTV: math.Round(moved*1000) / 1000}
	if a := ext.Policy(); a != nil {
		for _, c := range a.Classes() {
			ph.TableRules, ph.TableVersion = c.TableRules()
			ph.SharedDepthBytes = c.SharedDepthBytes()
		}
	}
	rc.mu.Lock()
	reqs := slices.Clone(rc.reqs)
	rc.mu.Unlock()
	summarize(ph, reqs, o.Engines)
	if ph.EngineTTFTP50Ms, ph.EngineTTFTP99Ms, err = engineTTFT(sims); err != nil {
		return nil, err
	}
	o.progressf("%s: %d requests, %d distinct keys, TTFT p50 %.0f ms p99 %.0f ms (engines: %.0f, %.0f), hit rate %.3f, max/mean %.2f, remaps %d of %d later turns, %d weight changes (TV %.3f)",
		mode, ph.Requests, ph.DistinctKeys, ph.TTFTP50(), ph.TTFTP99(), ph.EngineTTFTP50Ms, ph.EngineTTFTP99Ms, ph.HitRate(), ph.MaxOverMean, ph.Remaps, ph.LaterTurns, ph.WeightChanges, ph.WeightTV)
	return ph, nil
}

// startEngines starts o.Engines simulated engines, each behind a proxy that
// records its requests in rc, and returns the proxies' addresses.
func startEngines(ctx context.Context, o Options, g *group, rc *recorder) (addrs []string, sims []*enginesim.Server, err error) {
	log := o.Logger
	for i := 0; i < o.Engines; i++ {
		id := fmt.Sprintf("e%d", i)
		srv, err := enginesim.Start(ctx, enginesim.Options{ID: id, Model: o.Profile.Model, Profile: o.Profile,
			MaxContextTokens: o.Profile.MaxContextTokens, TimeScale: o.TimeScale, Logger: log, Seed: uint64(i + 1)})
		if err != nil {
			return nil, nil, err
		}
		g.stop = append(g.stop, func() { _ = srv.Close() })
		sims = append(sims, srv)
		target, _ := url.Parse(srv.URL())
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, nil, err
		}
		hs := &http.Server{Handler: rc.proxy(id, target), ReadHeaderTimeout: 10 * time.Second}
		g.goRun(func() { _ = hs.Serve(lis) })
		g.stop = append(g.stop, func() { _ = hs.Close() })
		addrs = append(addrs, lis.Addr().String())
	}
	return addrs, sims, nil
}

// startControlPlane runs the control plane for spec at the rig's pace and
// returns its xDS address.
func startControlPlane(ctx context.Context, o Options, g *group, spec *fleet.Spec) (string, error) {
	log := o.Logger
	cfg := controlplane.DefaultRunConfig()
	cfg.Fleet, cfg.XDSListen, cfg.AdminListen, cfg.Logger = spec, "127.0.0.1:0", "127.0.0.1:0", log
	cfg.Interval, cfg.ScrapeInterval, cfg.ScrapeTimeout = 500*time.Millisecond, 200*time.Millisecond, time.Second
	cfg.StaleAfter, cfg.Smoothing, cfg.DemandWindow, cfg.Warmup = 3*time.Second, time.Second, 5*time.Second, 300*time.Millisecond
	cfg.Cycle.Translate.HashBalanceFactor = o.HashBalanceFactor
	runner, err := controlplane.NewRunner(cfg)
	if err != nil {
		return "", err
	}
	cpCtx, cpCancel := context.WithCancel(ctx)
	g.goRun(func() { _ = runner.Run(cpCtx) })
	g.stop = append(g.stop, cpCancel)
	xdsAddr, _, err := runner.Addrs(ctx)
	return xdsAddr, err
}

// startExtProc runs an ext_proc server subscribed to the control plane at
// xdsAddr and reporting to it; it returns the server and its port.
func startExtProc(ctx context.Context, g *group, xdsAddr string, log *slog.Logger) (*extproc.Server, int, error) {
	// Idle placement and no cache-aware placement: the bench measures the
	// affinity keys, and cache-aware placement places by the prompt
	// whatever the key (a random key does as well under it).
	ext := extproc.New(extproc.Options{Logger: log, IdlePlacement: true})
	conn, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, 0, err
	}
	g.stop = append(g.stop, func() { conn.Close() })
	sub := &cpclient.Subscriber{Conn: conn, NodeID: "fe", Region: "local", Apply: ext.SetPolicy, Logger: log, MinBackoff: 20 * time.Millisecond}
	repo := &cpclient.Reporter{Conn: conn, NodeID: "fe", Instance: "bench", Interval: 500 * time.Millisecond, Flush: ext.Observer().Flush, Logger: log}
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

// sampleWeights reads Envoy's weights of inferlb_chat every 250 ms until
// the returned function is called, which returns how many times they
// changed and the total variation distance they moved.
func sampleWeights(ctx context.Context, envoy *envoyrun.Envoy) (stop func() (changes int, moved float64)) {
	sampleCtx, cancel := context.WithCancel(ctx)
	var changes int
	var moved float64
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		var last map[string]float64
		for {
			if cs, err := envoy.Clusters(); err == nil {
				w := map[string]float64{}
				for addr, h := range cs["inferlb_chat"] {
					if h.Priority == 0 && h.Routable() {
						w[addr] = float64(h.Weight)
					}
				}
				if last != nil {
					if d := dist.TotalVariation(last, w); d > 0 {
						changes++
						moved += d
					}
				}
				last = w
			}
			select {
			case <-sampleCtx.Done():
				return
			case <-time.After(250 * time.Millisecond):
			}
		}
	}()
	return func() (int, float64) {
		cancel()
		<-sampled
		return changes, moved
	}
}

// preambled opens every conversation's first user message with one shared
// preamble (an application's instructions pasted above the question): every
// prompt shares it, inside one message, and diverges right after it.
type preambled struct {
	*workload.MultiTurn
	preamble string
}

func (p *preambled) Next(at time.Duration) (workload.Request, bool) {
	r, ok := p.MultiTurn.Next(at)
	if !ok {
		return r, false
	}
	r.Messages = slices.Clone(r.Messages)
	for i := range r.Messages {
		if r.Messages[i].Role == "user" {
			r.Messages[i].Content = p.preamble + r.Messages[i].Content
			break
		}
	}
	r.PromptTokens = tokens.CountChat(r.Messages)
	return r, true
}

// summarize derives keys, loads and remaps from what the engines saw.
func summarize(ph *Phase, reqs []seen, engines int) {
	ph.Requests = len(reqs)
	ph.EngineRequests = map[string]int{}
	for i := 0; i < engines; i++ {
		ph.EngineRequests[fmt.Sprintf("e%d", i)] = 0
	}
	keys := map[string]bool{}
	type last struct {
		engine, key string
		turn        int
	}
	convs := map[uint64]last{}
	// Turns in order per conversation (a conversation's turns are
	// sequential, so arrival order is turn order).
	slices.SortStableFunc(reqs, func(a, b seen) int { return cmp.Compare(a.turn, b.turn) })
	for _, r := range reqs {
		keys[r.key] = true
		ph.EngineRequests[r.engine]++
		if l, ok := convs[r.conv]; ok && r.turn > l.turn {
			ph.LaterTurns++
			if l.engine != r.engine {
				ph.Remaps++
			}
			if l.key != r.key {
				ph.KeyMoves++
			}
		}
		convs[r.conv] = last{r.engine, r.key, r.turn}
	}
	ph.DistinctKeys, ph.Conversations = len(keys), len(convs)
	if ph.Requests > 0 {
		ph.KeysPer1000 = 1000 * float64(ph.DistinctKeys) / float64(ph.Requests)
	}
	mx, sum := 0, 0
	for _, n := range ph.EngineRequests {
		mx = max(mx, n)
		sum += n
		if n == 0 {
			ph.IdleEngines++
		}
	}
	if sum > 0 {
		ph.MaxOverMean = float64(mx) / (float64(sum) / float64(len(ph.EngineRequests)))
	}
	ph.MaxOverMean = math.Round(ph.MaxOverMean*1000) / 1000
}

// engineTTFT merges the engines' TTFT histograms and returns their p50 and
// p99 in milliseconds (Prometheus' histogram_quantile: linear within the
// bucket).
func engineTTFT(sims []*enginesim.Server) (p50, p99 float64, err error) {
	var h dist.Histogram
	for _, srv := range sims {
		mfs, err := srv.Registry().Gather()
		if err != nil {
			return 0, 0, err
		}
		for _, mf := range mfs {
			if mf.GetName() != "vllm:time_to_first_token_seconds" {
				continue
			}
			for _, m := range mf.GetMetric() {
				h.Add(m.GetHistogram())
			}
		}
	}
	return 1000 * h.Quantile(0.5), 1000 * h.Quantile(0.99), nil
}
