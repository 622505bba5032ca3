package extproc_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane"
	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/extproc"
	"github.com/inferlb/inferlb/extproc/cpclient"
	"github.com/inferlb/inferlb/internal/enginesim"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/xds/xdstest"
)

// The whole loop with the real control plane: simulated engines, `inferlb
// control-plane` (Runner), this ext_proc (policy over ADS, evidence in
// Reports) and a real Envoy with the envoy-configs bootstrap. An engine that
// starts failing half its requests gets an outlier penalty within seconds
// from ext_proc's evidence, and the penalty decays after recovery; both
// times are logged, with e1's weight in Envoy.
func TestErrorEvidencePenalizesEngine(t *testing.T) {
	noLeaks(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	prof := enginesim.H100Llama8B
	prof.Model = "m"
	var engines []*enginesim.Server
	for i := 0; i < 3; i++ {
		s, err := enginesim.Start(context.Background(), enginesim.Options{ID: fmt.Sprintf("e%d", i), Model: "m", Profile: prof, Logger: log, Seed: uint64(i + 1)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		engines = append(engines, s)
	}
	spec, err := fleet.Parse([]byte(fmt.Sprintf(`name: evidence
regions: [{name: east, residency: us}]
network: {same_region_rtt_ms: 1}
frontends: [{name: fe-east, region: east, node_id: fe-east}]
models: [{name: m, max_context_tokens: 8192}]
profiles:
  - {gpu: H100, model: m, prefill_tokens_per_s: 25000, overhead_ms: 10, decode_step_ms: 6.5, decode_step_per_seq_ms: 0.055, kv_capacity_tokens: 450000}
classes: [{name: chat, model: m, mean_prompt_tokens: 50, mean_output_tokens: 4}]
priorities: [{name: high, level: 0, shed_cost: 10000}, {name: low, level: 1, shed_cost: 100}]
engines:
  - {id: e0, address: %q, region: east, gpu: H100, model: m}
  - {id: e1, address: %q, region: east, gpu: H100, model: m}
  - {id: e2, address: %q, region: east, gpu: H100, model: m}
`, engines[0].Addr(), engines[1].Addr(), engines[2].Addr())))
	if err != nil {
		t.Fatal(err)
	}
	cfg := controlplane.DefaultRunConfig()
	cfg.Fleet, cfg.XDSListen, cfg.AdminListen, cfg.Logger = spec, "127.0.0.1:0", "127.0.0.1:0", log
	cfg.Interval, cfg.ScrapeInterval, cfg.ScrapeTimeout = 500*time.Millisecond, 100*time.Millisecond, 500*time.Millisecond
	cfg.StaleAfter, cfg.Smoothing, cfg.DemandWindow, cfg.Warmup = 2*time.Second, 300*time.Millisecond, 2*time.Second, 300*time.Millisecond
	cfg.Cycle.Penalty.HalfLife = time.Second
	// Retries stay on (the control plane's defaults): failed attempts that
	// Envoy retried elsewhere still reach the evidence (upstream log).
	runner, err := controlplane.NewRunner(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	wg.Add(1)
	go func() { defer wg.Done(); _ = runner.Run(ctx) }()
	xdsAddr, _, err := runner.Addrs(ctx)
	if err != nil {
		t.Fatal(err)
	}

	ext := extproc.New(extproc.Options{Logger: log})
	conn, err := grpc.NewClient(xdsAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	sub := &cpclient.Subscriber{Conn: conn, NodeID: "fe-east", Region: "east", Apply: ext.SetPolicy, Logger: log, MinBackoff: 20 * time.Millisecond}
	rep := &cpclient.Reporter{Conn: conn, NodeID: "fe-east", Instance: "t", Interval: 200 * time.Millisecond, Flush: ext.Observer().Flush, Logger: log}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	ext.Register(g)
	wg.Add(3)
	go func() { defer wg.Done(); _ = sub.Run(ctx) }()
	go func() { defer wg.Done(); _ = rep.Run(ctx) }()
	go func() { defer wg.Done(); _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)

	_, xp, _ := net.SplitHostPort(xdsAddr)
	xdsPort, _ := strconv.Atoi(xp)
	listen := envoytest.FreePort(t)
	boot, err := envoyconfigs.Render(envoyconfigs.Params{Variant: envoyconfigs.FailClosed, NodeID: "fe-east", Region: "east",
		ListenPort: listen, ExtProcPort: lis.Addr().(*net.TCPAddr).Port, XDSPort: xdsPort, BodyLimit: extproc.DefaultBodyLimit})
	if err != nil {
		t.Fatal(err)
	}
	envoy := envoytest.Start(t, envoytest.Options{Bootstrap: boot})
	t.Cleanup(envoy.Stop)

	// Steady traffic: distinct conversations, 4 at a time.
	url := fmt.Sprintf("http://127.0.0.1:%d/v1/chat/completions", listen)
	hc := &http.Client{Timeout: 10 * time.Second}
	t.Cleanup(hc.CloseIdleConnections)
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	t.Cleanup(stopTraffic)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; trafficCtx.Err() == nil; i++ {
				body := fmt.Sprintf(`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"worker %d conversation %d"}]}`, w, i)
				req, _ := http.NewRequestWithContext(trafficCtx, "POST", url, bytes.NewBufferString(body))
				req.Header.Set("content-type", "application/json")
				if resp, err := hc.Do(req); err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
				}
			}
		}()
	}

	share := func() (float64, error) {
		cs, err := xdstest.Clusters(envoy)
		if err != nil {
			return 0, err
		}
		hosts := cs["inferlb_chat"]
		if len(hosts) != 3 {
			return 0, fmt.Errorf("%d hosts in inferlb_chat", len(hosts))
		}
		var sum, mine float64
		for addr, h := range hosts {
			if h.Priority != 0 {
				continue
			}
			sum += float64(h.Weight)
			if addr == engines[1].Addr() {
				mine = float64(h.Weight)
			}
		}
		return mine / sum, nil
	}
	var before float64
	if err := envoytest.Poll(ctx, 20*time.Second, 50*time.Millisecond, func() error {
		s, err := share()
		if err != nil {
			return err
		}
		if s < 0.2 {
			return fmt.Errorf("e1 share %.2f before the fault", s)
		}
		before = s
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("e1 share before the fault: %.3f", before)

	penalty := func(id string) (float64, string) {
		last := runner.Last()
		if last == nil {
			return 0, ""
		}
		for _, ev := range last.Engines {
			if ev.ID == id {
				return ev.Penalty, ev.PenaltyWhy
			}
		}
		return 0, ""
	}
	if err := engines[1].SetFaults(enginesim.Faults{ErrorRate: 0.5}); err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	if err := envoytest.Poll(ctx, 10*time.Second, 20*time.Millisecond, func() error {
		if p, _ := penalty("e1"); p < 0.3 {
			return fmt.Errorf("e1 penalty %.2f", p)
		}
		return nil
	}); err != nil {
		t.Fatalf("no penalty from the error evidence: %v", err)
	}
	lose := time.Since(t0)
	p1, why := penalty("e1")
	t.Logf("e1 failing half its requests: penalty %.2f (%s) after %v", p1, why, lose.Round(10*time.Millisecond))
	for _, id := range []string{"e0", "e2"} {
		if p, why := penalty(id); p > 0 {
			t.Fatalf("healthy %s penalized: %.2f (%s)", id, p, why)
		}
	}
	// The weight: Envoy's share of e1 (logged; whether the optimizer moves
	// weight for a penalty when capacity is not binding is the control
	// plane's policy).
	_ = envoytest.Poll(ctx, 3*time.Second, 50*time.Millisecond, func() error {
		s, err := share()
		if err != nil {
			return err
		}
		if s > before/2 {
			return fmt.Errorf("e1 share %.3f", s)
		}
		return nil
	})
	sNow, _ := share()
	t.Logf("e1 share in Envoy %.3f → %.3f (%.1fs after the fault)", before, sNow, time.Since(t0).Seconds())

	if err := engines[1].SetFaults(enginesim.Faults{}); err != nil {
		t.Fatal(err)
	}
	t1 := time.Now()
	if err := envoytest.Poll(ctx, 20*time.Second, 20*time.Millisecond, func() error {
		if p, _ := penalty("e1"); p > 0.05 {
			return fmt.Errorf("e1 penalty %.2f", p)
		}
		return nil
	}); err != nil {
		t.Fatalf("penalty did not decay after recovery: %v", err)
	}
	t.Logf("e1 recovered: penalty below 0.05 after %v", time.Since(t1).Round(10*time.Millisecond))
	sNow, _ = share()
	t.Logf("e1 share in Envoy after recovery %.3f", sNow)
	stopTraffic()
}
