package signals_test

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"

	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/tools/enginesim"
)

// TestScrapeEngineSimModes: the engine simulator mimicking vLLM and SGLang,
// scraped with the fleet's server kind. SGLang's series are absent until
// the first request (parsed as unknown, not zero), then carry the load; an
// engine still loading its model fails its health path until it is ready.
func TestScrapeEngineSimModes(t *testing.T) {
	defer leaktest.AfterTest(t)()
	for _, c := range []struct {
		server, health string
		loading        time.Duration
	}{
		{"vllm", "/health", 0},
		// Loading until FinishLoading: a real-time loading period would end
		// before the first scrape if the machine stalls.
		{"sglang", "/health_generate", 10 * time.Minute},
	} {
		t.Run(c.server, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			e, err := enginesim.Start(ctx, enginesim.Options{Model: "m", Profile: enginesim.H100Llama8B, Server: c.server, LoadingFor: c.loading, TimeScale: 0.01})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			sc := &signals.Scraper{Timeout: 5 * time.Second}
			tg := signals.Target{ID: "e", Address: e.Addr(), Server: c.server, HealthPath: c.health}
			s := sc.Scrape(ctx, tg)
			if s.MetricsErr != nil {
				t.Fatalf("first scrape: %v", s.MetricsErr)
			}
			if c.loading > 0 && (s.Healthy || !strings.Contains(s.HealthErr.Error(), "503")) {
				t.Fatalf("loading engine: healthy %v (%v), want 503 on %s", s.Healthy, s.HealthErr, c.health)
			}
			fresh := c.server == "sglang"
			if got := math.IsNaN(s.Metrics.Running); got != fresh {
				t.Fatalf("before any request: running %v (absent %v, want %v)", s.Metrics.Running, got, fresh)
			}
			if c.loading > 0 {
				e.FinishLoading()
			}
			// Ready (after loading): healthy, and a request is served.
			err = envoytest.Poll(ctx, 20*time.Second, 20*time.Millisecond, func() error {
				if s := sc.Scrape(ctx, tg); !s.Healthy {
					return fmt.Errorf("not healthy: %v", s.HealthErr)
				}
				resp, err := http.Post(e.URL()+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi there","max_tokens":2}`))
				if err != nil {
					return err
				}
				resp.Body.Close()
				if resp.StatusCode != 200 {
					return fmt.Errorf("completion: %s", resp.Status)
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
			s = sc.Scrape(ctx, tg)
			m := s.Metrics
			if s.MetricsErr != nil || m.Running != 0 || m.Waiting != 0 || m.Success < 1 || m.TTFTCount < 1 || m.PromptTokens < 1 || len(m.Missing) != 0 {
				t.Fatalf("after a request: %+v, %v", m, s.MetricsErr)
			}
			if c.server == "vllm" && (m.BlockSize != 16 || m.KVBlocks != 450000/16) || c.server == "sglang" && m.KVTokens != 450000 {
				t.Errorf("cache config: block %v blocks %v kv tokens %v", m.BlockSize, m.KVBlocks, m.KVTokens)
			}
		})
	}
}
