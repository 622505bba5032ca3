package controlplane

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/xds/xdstest"
)

// fakeEngine serves constant vLLM metrics and a switchable /health.
type fakeEngine struct {
	srv  *httptest.Server
	down atomic.Bool
}

func newFakeEngine(b testing.TB) *fakeEngine {
	f := &fakeEngine{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			if f.down.Load() {
				w.WriteHeader(http.StatusServiceUnavailable)
			}
		case "/metrics":
			fmt.Fprint(w, "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.1\n")
		default:
			fmt.Fprint(w, "ok")
		}
	}))
	b.Cleanup(f.srv.Close)
	return f
}

func (f *fakeEngine) addr() string { return strings.TrimPrefix(f.srv.URL, "http://") }

// BenchmarkSignalToEnvoy measures the time from an engine's /health
// changing to Envoy having applied the resulting EDS update (seen through
// its admin /clusters, polled every 2 ms): scrape (every 50 ms here) →
// immediate cycle → ADS push → Envoy. "cycle-to-envoy" is the part after
// the cycle started (the control plane's own publication latency).
func BenchmarkSignalToEnvoy(b *testing.B) {
	var eng [4]*fakeEngine
	var addrs [4]string
	for i := range eng {
		eng[i] = newFakeEngine(b)
		addrs[i] = eng[i].addr()
	}
	spec, err := fleet.Parse([]byte(testFleetYAML(addrs)))
	if err != nil {
		b.Fatal(err)
	}
	cfg := DefaultRunConfig()
	cfg.Fleet, cfg.XDSListen, cfg.AdminListen = spec, "127.0.0.1:0", "127.0.0.1:0"
	cfg.Interval, cfg.ScrapeInterval, cfg.ScrapeTimeout = 10*time.Second, 50*time.Millisecond, time.Second
	cfg.Warmup, cfg.DemandWindow = 0, 50*time.Millisecond
	// Envoy's own health check is slow here, so what moves the host is
	// the control plane's EDS update.
	cfg.Cycle.Translate.HealthCheck.Interval = 30 * time.Second
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := NewRunner(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	xds, _, err := r.Addrs(ctx)
	if err != nil {
		b.Fatal(err)
	}
	env := envoytest.Start(b, envoytest.Options{Bootstrap: xdstest.Bootstrap(b, xdstest.BootstrapOptions{NodeID: "fe-east", Region: "east", XDSAddress: xds})})
	target := eng[3].addr()
	eds := func() string {
		cs, err := xdstest.Clusters(env)
		if err != nil {
			return ""
		}
		return cs["inferlb_chat"][target].EDSHealth
	}
	if err := envoytest.Poll(ctx, 20*time.Second, 10*time.Millisecond, func() error {
		if h := eds(); h != "HEALTHY" {
			return fmt.Errorf("target EDS health %q", h)
		}
		return nil
	}); err != nil {
		b.Fatal(err)
	}
	var total, publish []time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		down := i%2 == 0
		want := map[bool]string{true: "UNHEALTHY", false: "HEALTHY"}[down]
		t0 := time.Now()
		eng[3].down.Store(down)
		// Polled every 2 ms: the resolution of the measured delay.
		if err := envoytest.Poll(context.Background(), 10*time.Second, 2*time.Millisecond, func() error {
			if got := eds(); got != want {
				return fmt.Errorf("Envoy shows %s, want %s", got, want)
			}
			return nil
		}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		total = append(total, t1.Sub(t0))
		if res := r.Last(); res != nil && res.At.After(t0) {
			publish = append(publish, t1.Sub(res.At))
		}
	}
	b.StopTimer()
	q := func(d []time.Duration, p float64) float64 {
		if len(d) == 0 {
			return 0
		}
		s := append([]time.Duration(nil), d...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return float64(s[min(len(s)-1, int(p*float64(len(s))))].Microseconds()) / 1000
	}
	b.ReportMetric(q(total, 0.5), "ms-signal-to-envoy-p50")
	b.ReportMetric(q(total, 0.99), "ms-signal-to-envoy-p99")
	b.ReportMetric(q(publish, 0.5), "ms-cycle-to-envoy-p50")
	b.ReportMetric(q(publish, 0.99), "ms-cycle-to-envoy-p99")
}
