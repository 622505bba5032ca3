package controlplane

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/tools/enginesim"
)

// An engine simulator at time scale 0.5 (the demo's documented
// --time-scale 0.5) is judged by its profile like a real engine: its
// /metrics are in real time and the controller plans with the fleet in
// real time (control-plane --time-scale), so its latency residuals are
// about 1 and it is not penalized. Before, its histograms were in
// simulated time against rates per real second: residuals of about
// 1/0.5 penalized every engine.
func TestTimeScaledEnginesAreJudgedByTheirProfile(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	const scale = 0.5
	prof := enginesim.H100Llama8B
	prof.Model = "m"
	ctx := context.Background()
	eng, err := enginesim.Start(ctx, enginesim.Options{ID: "e1", Model: "m", Profile: prof, TimeScale: scale,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	sim, err := fleet.Parse([]byte(fmt.Sprintf(`name: scaled
regions: [{name: east}]
frontends: [{name: fe, region: east}]
models: [{name: m, max_context_tokens: 8192}]
profiles:
  - {gpu: H100, model: m, prefill_tokens_per_s: %g, overhead_ms: %g, decode_step_ms: %g, decode_step_per_seq_ms: %g, kv_capacity_tokens: %d, max_running: %d}
classes: [{name: chat, model: m, mean_prompt_tokens: 400, mean_output_tokens: 24}]
engines:
  - {id: e1, address: %q, region: east, gpu: H100, model: m}
`, prof.PrefillTokensPerS, prof.OverheadMs, prof.DecodeStepMs, prof.DecodeStepPerSeqMs, prof.KVCapacityTokens, prof.MaxRunning, eng.Addr())))
	if err != nil {
		t.Fatal(err)
	}
	spec, err := sim.InRealTime(scale)
	if err != nil {
		t.Fatal(err)
	}
	// Traffic: two clients, 400-token prompts, 24 output tokens, while the
	// engine is scraped every 200 ms.
	tr := signals.NewTracker(signals.TrackerOptions{StaleAfter: 5 * time.Second}, []string{"e1"})
	sc := &signals.Scraper{Timeout: 2 * time.Second}
	target := signals.Target{ID: "e1", Address: eng.Addr()}
	tr.Observe(sc.Scrape(ctx, target))
	// Each prompt begins with its own words, so none is a prefix-cache hit:
	// the profile the engine is judged by prices every prompt token, and
	// with one prompt repeated the measured TTFT fell to a third of it
	// whenever the scrapes caught mostly cached requests.
	body := func(c, i int) string {
		return fmt.Sprintf(`{"model":"m","max_tokens":24,"messages":[{"role":"user","content":%q}]}`,
			fmt.Sprintf("client %d request %d ", c, i)+strings.Repeat("word ", 396))
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var failures []string
	for c := 0; c < 2; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			for i := 0; i < 20; i++ {
				res, err := http.Post("http://"+eng.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(body(c, i)))
				if err == nil {
					_, _ = io.Copy(io.Discard, res.Body)
					res.Body.Close()
					if res.StatusCode != 200 {
						err = fmt.Errorf("status %d", res.StatusCode)
					}
				}
				if err != nil {
					mu.Lock()
					failures = append(failures, err.Error())
					mu.Unlock()
				}
			}
		}(c)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for running := true; running; {
		select {
		case <-done:
			running = false
		case <-tick.C:
		}
		tr.Observe(sc.Scrape(ctx, target))
	}
	if len(failures) > 0 {
		t.Fatalf("requests failed: %v", failures)
	}
	c, err := NewController(spec, DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	r, err := c.Step(ctx, Inputs{Now: now, Engines: tr.Engines(now)})
	if err != nil {
		t.Fatal(err)
	}
	v := r.Engines[0]
	t.Logf("at time scale %g: TTFT %.1f ms (predicted %.1f), TBOT %.2f ms (predicted %.2f): residuals %.2f and %.2f, penalty %.2f %s",
		scale, v.TTFTResidual*v.TTFTPredMs, v.TTFTPredMs, v.TBOTResidual*v.TBOTPredMs, v.TBOTPredMs, v.TTFTResidual, v.TBOTResidual, v.Penalty, v.PenaltyWhy)
	if v.TTFTResidual == 0 || v.TBOTResidual == 0 {
		t.Fatalf("no latency evidence: %+v", v)
	}
	if v.Penalty > 0 || max(v.TTFTResidual, v.TBOTResidual) > 1.5 || min(v.TTFTResidual, v.TBOTResidual) < 0.67 {
		t.Fatalf("a healthy engine at time scale %g judged %.2f× (TTFT) and %.2f× (TBOT) its profile, penalty %.2f", scale, v.TTFTResidual, v.TBOTResidual, v.Penalty)
	}
}
