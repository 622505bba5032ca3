package controlplane

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/tools/enginesim"
	"github.com/inferlb/inferlb/xds/xdstest"
)

// TestLoadingEngineGetsNoTraffic, with the real control plane and a real
// Envoy: a class of two SGLang engines and one vLLM engine. The cluster's
// active health check probes SGLang's /health_generate (most of its
// engines'); the vLLM engine is left to the control plane's probe of its
// /health. An SGLang engine still loading its model fails both Envoy's
// check and the control plane's (/health_generate answers 503), so it is
// not routable until it has loaded; then it is.
func TestLoadingEngineGetsNoTraffic(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	prof := enginesim.H100Llama8B
	prof.Model = "m"
	const loading = 10 * time.Minute // until FinishLoading
	type eng struct {
		id, server string
		loading    time.Duration
	}
	specs := []eng{{"vllm-1", "vllm", 0}, {"sglang-1", "sglang", 0}, {"sglang-2", "sglang", loading}}
	servers := map[string]*enginesim.Server{}
	var lines []string
	for _, e := range specs {
		s, err := enginesim.Start(context.Background(), enginesim.Options{ID: e.id, Model: "m", Profile: prof, Server: e.server,
			LoadingFor: e.loading, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close() })
		servers[e.id] = s
		lines = append(lines, fmt.Sprintf("  - {id: %s, address: %q, region: east, gpu: H100, model: m, server: %s}", e.id, s.Addr(), e.server))
	}
	spec, err := fleet.Parse([]byte(`name: engines
regions: [{name: east}]
frontends: [{name: fe, region: east}]
models: [{name: m, max_context_tokens: 8192}]
profiles:
  - {gpu: H100, model: m, prefill_tokens_per_s: 25000, overhead_ms: 10, decode_step_ms: 6.5, decode_step_per_seq_ms: 0.055, kv_capacity_tokens: 450000}
classes: [{name: chat, model: m}]
engines:
` + strings.Join(lines, "\n") + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultRunConfig()
	cfg.Fleet = spec
	cfg.AdminListen = "127.0.0.1:0"
	cfg.Interval, cfg.ScrapeInterval, cfg.ScrapeTimeout = 300*time.Millisecond, 100*time.Millisecond, time.Second
	cfg.Warmup = 0
	cfg.Cycle.Translate.HealthCheck.Interval = 200 * time.Millisecond
	cfg.Cycle.Translate.HealthCheck.Timeout = 200 * time.Millisecond
	cfg.Cycle.Translate.HealthCheck.HealthyThreshold = 1
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	e := &e2e{t: t, spec: spec, cfg: cfg}
	e.startRunner("127.0.0.1:0")
	defer e.stop()
	ctx := context.Background()
	env := envoytest.Start(t, envoytest.Options{Bootstrap: xdstest.Bootstrap(t, xdstest.BootstrapOptions{
		NodeID: "fe", Region: "east", XDSAddress: e.xds, ListenerPort: envoytest.FreePort(t)})})
	hosts := func() (map[string]xdstest.Host, error) {
		cs, err := xdstest.Clusters(env)
		if err != nil {
			return nil, err
		}
		out := map[string]xdstest.Host{}
		for id, s := range servers {
			h, ok := cs["inferlb_chat"][s.Addr()]
			if !ok {
				return nil, fmt.Errorf("%s not in Envoy's cluster yet", id)
			}
			out[id] = h
		}
		return out, nil
	}
	// While sglang-2 loads: the other two routable, it not.
	if err := envoytest.Poll(ctx, 20*time.Second, 20*time.Millisecond, func() error {
		hs, err := hosts()
		if err != nil {
			return err
		}
		if !hs["vllm-1"].Routable() || !hs["sglang-1"].Routable() {
			return fmt.Errorf("ready engines not routable yet: %+v", hs)
		}
		if hs["sglang-2"].Routable() {
			return fmt.Errorf("loading engine routable: %+v", hs["sglang-2"])
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Both guards hold it back: Envoy's active check on /health_generate
	// and the control plane's probe (EDS UNHEALTHY); the vLLM engine is not
	// checked on SGLang's path.
	if err := envoytest.Poll(ctx, 20*time.Second, 20*time.Millisecond, func() error {
		hs, err := hosts()
		if err != nil {
			return err
		}
		if h := hs["sglang-2"]; !h.FailedActiveHC || h.EDSHealth != "UNHEALTHY" {
			return fmt.Errorf("loading engine: %+v", h)
		}
		if hs["vllm-1"].FailedActiveHC || !hs["vllm-1"].Routable() {
			return fmt.Errorf("vLLM engine: %+v", hs["vllm-1"])
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	servers["sglang-2"].FinishLoading()
	loaded := time.Now()
	// Loaded: routable.
	if err := envoytest.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() error {
		hs, err := hosts()
		if err != nil {
			return err
		}
		if !hs["sglang-2"].Routable() {
			return fmt.Errorf("loaded engine not routable: %+v", hs["sglang-2"])
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("sglang-2 routable %v after it finished loading", time.Since(loaded).Round(time.Millisecond))
}
