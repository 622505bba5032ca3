package controlplane

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	endpointv3 "github.com/envoyproxy/go-control-plane/envoy/config/endpoint/v3"
	"github.com/lni/goutils/leaktest"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/inferlb/inferlb/api/fleet"
	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/internal/dist"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/internal/syncbuf"
	"github.com/inferlb/inferlb/tools/enginesim"
	"github.com/inferlb/inferlb/tools/loadgen"
	"github.com/inferlb/inferlb/xds/xdstest"
)

type e2e struct {
	t       *testing.T
	spec    *fleet.Spec
	engines map[string]*enginesim.Server
	cfg     RunConfig
	runner  *Runner
	stop    func()
	xds     string
	envoys  map[string]*envoytest.Envoy
	ports   map[string]int
}

func startEngines(t *testing.T) (map[string]*enginesim.Server, [4]string) {
	prof := enginesim.H100Llama8B
	prof.Model = "m"
	ids := []string{"e-east-1", "e-east-2", "e-west-1", "e-west-2"}
	out := map[string]*enginesim.Server{}
	var addrs [4]string
	for i, id := range ids {
		s, err := enginesim.Start(context.Background(), enginesim.Options{ID: id, Model: "m", Profile: prof,
			Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		out[id], addrs[i] = s, s.Addr()
	}
	return out, addrs
}

func (e *e2e) startRunner(xdsListen string) {
	e.t.Helper()
	cfg := e.cfg
	cfg.XDSListen = xdsListen
	r, err := NewRunner(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	e.runner = r
	e.stop = func() {
		cancel()
		if err := <-done; err != nil {
			e.t.Errorf("runner: %v", err)
		}
	}
	xds, _, err := r.Addrs(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	e.xds = xds
}

// reportDemand plays the ext_proc services: every 100 ms each frontend
// reports its demand (fe-east 40 req/s, fe-west 20 req/s). Each report
// covers the time since the last one and carries the requests of that time
// (fractions carried over), so the control plane's demand estimate does not
// fall when a loaded machine makes the ticker late: the weights then depend
// on the demand, not on how starved the test machine is.
func reportDemand(ctx context.Context, t *testing.T, addr string, wg *sync.WaitGroup) {
	// Reconnect quickly after the control plane restarts (gRPC's default
	// backoff grows to seconds).
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.2, MaxDelay: 200 * time.Millisecond},
			MinConnectTimeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		defer conn.Close()
		c := policyv1.NewReportsClient(conn)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		rates := map[string]float64{"fe-east": 40, "fe-west": 20} // req/s
		start := time.Now().Add(-100 * time.Millisecond)
		last := map[string]time.Time{"fe-east": start, "fe-west": start} // end of the last accepted report
		carry := map[string]float64{}                                    // fractions of a request
		for {
			now := time.Now()
			for node, rate := range rates {
				// A report lost while the control plane restarts is merged
				// into the next, which then covers the whole time since the
				// last accepted one (as the ext_proc reporter does).
				x := carry[node] + rate*now.Sub(last[node]).Seconds()
				n := uint64(x)
				rctx, cancel := context.WithTimeout(ctx, time.Second)
				_, err := c.Report(rctx, &policyv1.ReportRequest{NodeId: node, Instance: "test",
					IntervalStart: timestamppb.New(last[node]), IntervalEnd: timestamppb.New(now),
					Demand: []*policyv1.DemandSample{{Class: "chat", Priority: "high", Requests: n, PromptTokens: n * 200, OutputTokens: n * 200}}})
				cancel()
				if err == nil {
					last[node], carry[node] = now, x-float64(n)
				}
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}

// envoyMatches checks that an Envoy's chat cluster shows exactly the
// published integer weights and priorities.
func (e *e2e) envoyMatches(node string) error { return e.envoyMatchesResult(node, e.runner.Last()) }

// envoyMatchesResult compares Envoy's chat cluster at node with the
// weights and priorities of one cycle's result.
func (e *e2e) envoyMatchesResult(node string, res *Result) error {
	if res == nil {
		return fmt.Errorf("no cycle yet")
	}
	cd := res.Nodes[node].Classes["chat"]
	cs, err := xdstest.Clusters(e.envoys[node])
	if err != nil {
		return err
	}
	hosts := cs["inferlb_chat"]
	if len(hosts) != 4 {
		return fmt.Errorf("%s: %d hosts in inferlb_chat", node, len(hosts))
	}
	for id, w := range cd.EnvoyW {
		h := hosts[e.engines[id].Addr()]
		if h.Weight != w || h.Priority != cd.Priority[id] {
			return fmt.Errorf("%s: %s has weight %d priority %d in Envoy, published %d priority %d", node, id, h.Weight, h.Priority, w, cd.Priority[id])
		}
	}
	return nil
}

func (e *e2e) envoyWeight(node, id string) uint32 {
	cs, err := xdstest.Clusters(e.envoys[node])
	if err != nil {
		return 0
	}
	h := cs["inferlb_chat"][e.engines[id].Addr()]
	if h.Priority != 0 {
		return 0
	}
	return h.Weight
}

func TestEndToEndWithEnvoy(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	engines, addrs := startEngines(t)
	spec, err := fleet.Parse([]byte(testFleetYAML(addrs)))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultRunConfig()
	cfg.Fleet = spec
	cfg.AdminListen = "127.0.0.1:0"
	cfg.Interval, cfg.ScrapeInterval, cfg.ScrapeTimeout = 500*time.Millisecond, 100*time.Millisecond, time.Second
	cfg.StaleAfter, cfg.Smoothing, cfg.DemandWindow, cfg.Warmup = 5*time.Second, 300*time.Millisecond, 2*time.Second, 300*time.Millisecond
	cfg.Cycle.DeadbandTV = 0.05
	// The reported demand is constant: with demand smoothing (tested in
	// demand_test.go) the restart's comparison would depend on how far the
	// old process's mean had come from its first, partly filled window.
	cfg.Cycle.DemandSmoothing = 0
	// Latency penalties are tested in virtual time (cycle_test.go); here a
	// busy 2-core machine would make the real-time simulator look slow.
	cfg.Cycle.Penalty.LatencyTolerance = 10
	cfg.StateFile = filepath.Join(t.TempDir(), "state.json")
	cfg.Cycle.Translate.HealthCheck.Interval = 200 * time.Millisecond
	cfg.Cycle.Translate.HealthCheck.Timeout = 200 * time.Millisecond
	cfg.Cycle.Translate.HealthCheck.HealthyThreshold = 1
	// The control plane's warnings (a refused publish, a failed scrape)
	// explain a failure of this test: printed only then.
	var warnings syncbuf.Buffer
	cfg.Logger = slog.New(slog.NewTextHandler(&warnings, &slog.HandlerOptions{Level: slog.LevelWarn}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("control plane warnings:\n%s", warnings.String())
		}
	})
	e := &e2e{t: t, spec: spec, engines: engines, cfg: cfg, envoys: map[string]*envoytest.Envoy{}, ports: map[string]int{}}
	e.startRunner("127.0.0.1:0")
	defer func() { e.stop() }()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	reportDemand(ctx, t, e.xds, &wg)

	for node, delta := range map[string]bool{"fe-east": false, "fe-west": true} {
		e.ports[node] = envoytest.FreePort(t)
		e.envoys[node] = envoytest.Start(t, envoytest.Options{Bootstrap: xdstest.Bootstrap(t, xdstest.BootstrapOptions{
			NodeID: node, Region: node[3:], XDSAddress: e.xds, Delta: delta, ListenerPort: e.ports[node], Retries: 1})})
	}

	// 1. Each node shows its own optimizer weights: those of a steady
	// loop, after a few cycles that started from published weights (the
	// first cycle solves cold, without the stability term, and a later one
	// may still move by more than the deadband).
	if err := envoytest.Poll(ctx, 15*time.Second, 50*time.Millisecond, func() error {
		e.runner.mu.Lock()
		n := e.runner.cycles
		e.runner.mu.Unlock()
		if n < 4 {
			return fmt.Errorf("%d cycles so far", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"fe-east", "fe-west"} {
		if err := envoytest.Poll(ctx, 15*time.Second, 50*time.Millisecond, func() error { return e.envoyMatches(node) }); err != nil {
			t.Fatal(err)
		}
	}
	last := e.runner.Last()
	we, ww := last.Nodes["fe-east"].Classes["chat"].EnvoyW, last.Nodes["fe-west"].Classes["chat"].EnvoyW
	t.Logf("fe-east weights %v\nfe-west weights %v", we, ww)
	if fmt.Sprint(we) == fmt.Sprint(ww) {
		t.Fatal("the two frontends got the same weights")
	}

	// 2. Restart: Envoy serves on its last config with no failed request,
	// and the new process publishes the same weights.
	var sent, failed atomic.Int64
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	var twg sync.WaitGroup
	twg.Add(1)
	go func() {
		defer twg.Done()
		client := &http.Client{Timeout: 10 * time.Second}
		for i := 0; trafficCtx.Err() == nil; i++ {
			body := `{"model":"m","messages":[{"role":"user","content":"hello"}],"max_tokens":4}`
			req, _ := http.NewRequestWithContext(trafficCtx, http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", e.ports["fe-east"]), bytes.NewBufferString(body))
			req.Header.Set("x-session-id", fmt.Sprintf("conv-%d", i%50)) // the direct frontend's hash key
			req.Header.Set("content-type", "application/json")
			resp, err := client.Do(req)
			if trafficCtx.Err() != nil {
				return
			}
			sent.Add(1)
			if err != nil {
				failed.Add(1)
				continue
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				failed.Add(1)
			}
		}
	}()
	xdsAddr := e.xds
	e.stop()
	before := map[string]map[string]uint32{}
	proposed := map[string]map[string]float64{}
	for n, nd := range e.runner.Last().Nodes {
		before[n] = nd.Classes["chat"].EnvoyW // the last weights the old process published
		// and what its optimizer last proposed (the deadband may hold a
		// move it does not find worth its cache misses: deadband.go)
		proposed[n] = nd.Classes["chat"].Proposed
	}
	// While the control plane is down, traffic flows on the last config:
	// requests keep completing after the stop (each one that fails counts
	// in failed, checked below). The deadline is only a hang guard: the
	// requests are sequential, so a count within a short deadline would
	// ask a loaded machine for a request rate, not for flowing traffic.
	mark := sent.Load()
	if err := envoytest.Poll(ctx, 30*time.Second, 20*time.Millisecond, func() error {
		if n := sent.Load() - mark; n < 20 {
			return fmt.Errorf("%d requests sent since the control plane stopped", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e.startRunner(xdsAddr)
	if err := envoytest.Poll(ctx, 15*time.Second, 50*time.Millisecond, func() error {
		for _, st := range e.runner.Server().Status() {
			if st.Streams == 0 {
				return fmt.Errorf("%s not reconnected", st.NodeID)
			}
		}
		if len(e.runner.Server().Status()) < 2 {
			return fmt.Errorf("nodes not reconnected")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"fe-east", "fe-west"} {
		if err := envoytest.Poll(ctx, 10*time.Second, 50*time.Millisecond, func() error { return e.envoyMatches(node) }); err != nil {
			t.Fatal(err)
		}
		cd := e.runner.Last().Nodes[node].Classes["chat"]
		d, dp := tvInt(cd.EnvoyW, before[node]), dist.TotalVariation(cd.Weights, proposed[node])
		t.Logf("%s after restart: %v, before %v (total variation %.4f; %.4f from the old process's last proposal)", node, cd.EnvoyW, before[node], d, dp)
		if math.Min(d, dp) > cfg.Cycle.DeadbandTV {
			t.Errorf("%s did not reconverge: total variation %.3f from the old process's weights, %.3f from its last proposal, both > deadband %.3f", node, d, dp, cfg.Cycle.DeadbandTV)
		}
	}
	stopTraffic()
	twg.Wait()
	t.Logf("restart: %d requests through Envoy, %d failed", sent.Load(), failed.Load())
	if failed.Load() != 0 {
		t.Errorf("%d of %d requests failed across the restart", failed.Load(), sent.Load())
	}

	// 3. Loading one engine through the simulator shifts weight away from it
	// within two control cycles of the signal.
	const hot = "e-east-1"
	w0 := e.envoyWeight("fe-east", hot)
	loadCtx, stopLoad := context.WithCancel(ctx)
	var lwg sync.WaitGroup
	for i := 0; i < 150; i++ {
		lwg.Add(1)
		go func() {
			defer lwg.Done()
			body := `{"model":"m","messages":[{"role":"user","content":"load"}],"max_tokens":4000}`
			req, _ := http.NewRequestWithContext(loadCtx, http.MethodPost, engines[hot].URL()+"/v1/chat/completions", bytes.NewBufferString(body))
			req.Header.Set("content-type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	loaded := time.Now()
	loadProbe := loadgen.StartJitterProbe()
	// Judged in cycles, not seconds: on a starved machine the cycles slow
	// down with everything else. sawCycle is the first cycle whose input
	// showed the load, plannedCycle the first whose plan for fe-east cut
	// the engine's share to half; the wall clock bounds only the delivery
	// of that plan to Envoy.
	var sawSignal, planned time.Time
	sawCycle, plannedCycle := -1, -1
	w0share := 0.0
	if cd := e.runner.Last().Nodes["fe-east"].Classes["chat"]; cd != nil {
		w0share = cd.Weights[hot]
	}
	cycles := func() int {
		e.runner.mu.Lock()
		defer e.runner.mu.Unlock()
		return e.runner.cycles
	}
	// The deadline is only a hang guard.
	err = envoytest.Poll(ctx, 60*time.Second, 20*time.Millisecond, func() error {
		res := e.runner.Last()
		if res != nil && sawSignal.IsZero() {
			if v := view(res, hot); v.ObservedUtilization > 0.5 || v.Penalty > 0 {
				sawSignal, sawCycle = res.At, cycles()
			}
		}
		if sawSignal.IsZero() {
			return fmt.Errorf("no cycle has seen the load yet: %+v", view(res, hot))
		}
		if planned.IsZero() {
			if cd := res.Nodes["fe-east"].Classes["chat"]; cd != nil && cd.Weights[hot] < w0share/2 {
				planned, plannedCycle = time.Now(), cycles()
			}
		}
		if w := e.envoyWeight("fe-east", hot); w >= w0/2 {
			return fmt.Errorf("weight of the loaded engine still %d (was %d): %+v", w, w0, view(res, hot))
		}
		return nil
	})
	shifted := time.Now()
	loadStarved := loadgen.Starvation(loadProbe())
	stopLoad()
	lwg.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if planned.IsZero() { // Envoy had it before the poll saw the plan
		planned, plannedCycle = shifted, cycles()
	}
	t.Logf("load: weight %d → %d; seen %v after loading began, planned %d cycles later, in Envoy %v after the plan (starvation %v)",
		w0, e.envoyWeight("fe-east", hot), sawSignal.Sub(loaded), plannedCycle-sawCycle, shifted.Sub(planned), loadStarved)
	if seen := sawSignal.Sub(loaded); seen > 10*time.Second+loadStarved {
		t.Errorf("a cycle saw the load %v after it began; want within 10 s (+%v starvation)", seen, loadStarved)
	}
	// The poll samples the latest cycle, so the count may run one over.
	if n := plannedCycle - sawCycle; n > 3 {
		t.Errorf("the plan cut the loaded engine %d cycles after a cycle saw the load; want within two", n)
	}
	if lag := shifted.Sub(planned); lag > time.Second+loadStarved {
		t.Errorf("Envoy had the plan %v after it was made; want within 1 s (+%v starvation)", lag, loadStarved)
	}

	// 4. An engine failing its health check is out of routing within the
	// health-check window.
	const sick = "e-west-1"
	if err := engines[sick].SetFaults(enginesim.Faults{HealthFail: true}); err != nil {
		t.Fatal(err)
	}
	failedAt := time.Now()
	probe := loadgen.StartJitterProbe()
	window := time.Duration(cfg.Cycle.Translate.HealthCheck.UnhealthyThreshold+1) * cfg.Cycle.Translate.HealthCheck.Interval
	for _, node := range []string{"fe-east", "fe-west"} {
		// A hang guard only: the check below judges how fast, with the
		// starvation allowance (a shorter deadline would cap it).
		if err := envoytest.Poll(ctx, 30*time.Second, 10*time.Millisecond, func() error {
			cs, err := xdstest.Clusters(e.envoys[node])
			if err != nil {
				return err
			}
			if h := cs["inferlb_chat"][engines[sick].Addr()]; h.Routable() {
				return fmt.Errorf("%s still routable at %s: %+v", sick, node, h)
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	out := time.Since(failedAt)
	// The tolerance grows by the CPU starvation measured meanwhile, so a
	// loaded CI machine does not fail a timing it could not give.
	starved := loadgen.Starvation(probe())
	t.Logf("health: %s out of routing at both nodes after %v (window %v, starvation %v)", sick, out, window, starved)
	if out > window+2*time.Second+starved {
		t.Errorf("out of routing after %v, health-check window %v (+2 s, +%v starvation)", out, window, starved)
	}

	// 5. A NACKed update (an EDS address that is not an IP, which Envoy
	// rejects past the protos' constraints) shows in the admin view and
	// the metrics, and Envoy keeps the last good config.
	lastGood := e.runner.Last()
	good := lastGood.Nodes["fe-east"].Resources
	bad := proto.Clone(good.Endpoints[0]).(*endpointv3.ClusterLoadAssignment)
	bad.Endpoints[0].LbEndpoints[0].GetEndpoint().GetAddress().GetSocketAddress().Address = "not-an-ip"
	broken := *good
	broken.Endpoints = []*endpointv3.ClusterLoadAssignment{bad}
	broken.EndpointVersion = "broken-by-test"
	if err := e.runner.Server().Publish(ctx, &broken); err != nil {
		t.Fatal(err)
	}
	_, adminAddr, _ := e.runner.Addrs(ctx)
	if err := envoytest.Poll(ctx, 10*time.Second, 50*time.Millisecond, func() error {
		resp, err := http.Get("http://" + adminAddr + "/xds")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if !strings.Contains(string(b), `"rejected_version": "broken-by-test"`) {
			// The runner's own cycle may have published a good snapshot
			// over the broken one before Envoy fetched it (a health
			// change from step 4 on a loaded machine): publish it again.
			if err := e.runner.Server().Publish(ctx, &broken); err != nil {
				return err
			}
			return fmt.Errorf("/xds shows no NACK yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Envoy keeps a good config: the one before the broken snapshot, or
	// one the runner's own cycle published meanwhile (the republishing
	// above can replace that one in the cache before Envoy fetches it,
	// and Envoy then stays on the one before; a clean-clone CI run saw
	// that).
	if err := envoytest.Poll(ctx, 10*time.Second, 50*time.Millisecond, func() error {
		if e.envoyMatchesResult("fe-east", lastGood) == nil {
			return nil
		}
		return e.envoyMatches("fe-east")
	}); err != nil {
		t.Errorf("after the NACK Envoy left its last good config: %v", err)
	}

	// 6. The admin view: weights, explanations, xDS ACK state, metrics.
	_, admin, _ := e.runner.Addrs(ctx)
	get := func(path string) string {
		resp, err := http.Get("http://" + admin + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %s %s", path, resp.Status, b)
		}
		return string(b)
	}
	for path, wants := range map[string][]string{
		"/weights?node=fe-east":            {`"fe-east"`, `"envoy_weights"`, `"e-west-1": "unhealthy"`},
		"/explain?node=fe-west&class=chat": {`"capacity_price_ms"`, `"network_ms"`},
		"/xds":                             {`"fe-east"`, `"acked"`, `"eds"`},
		"/signals":                         {`"e-east-1"`, `"fe-east/chat/high"`, `"utilization_limit"`, `"cached_share"`},
		"/metrics":                         {"inferlb_xds_acks_total", "inferlb_cycles_total", "inferlb_engine_penalty", "inferlb_xds_streams 2"},
	} {
		if err := envoytest.Poll(ctx, 5*time.Second, 50*time.Millisecond, func() error {
			body := get(path)
			for _, w := range wants {
				if !strings.Contains(body, w) {
					return fmt.Errorf("GET %s lacks %q", path, w)
				}
			}
			// Step 5 republishes the broken snapshot until Envoy has
			// rejected it, so Envoy may have NACKed it more than once.
			if path == "/metrics" && !edsNacked.MatchString(body) {
				return fmt.Errorf("GET /metrics counts no EDS NACK")
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
	}
}

// edsNacked matches a nonzero count of EDS NACKs in the /metrics page.
var edsNacked = regexp.MustCompile(`(?m)^inferlb_xds_nacks_total\{type="eds"\} [1-9]`)

func tvInt(a, b map[string]uint32) float64 {
	fa, fb := map[string]float64{}, map[string]float64{}
	for k, v := range a {
		fa[k] = float64(v)
	}
	for k, v := range b {
		fb[k] = float64(v)
	}
	return dist.TotalVariation(fa, fb)
}
