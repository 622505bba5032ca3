package affinitybench

import (
	"context"
	"testing"

	"github.com/lni/goutils/leaktest"

	"github.com/inferlb/inferlb/tools/workload"
)

// The affinity bar's Envoy check, small: through a real Envoy with the engine
// simulator, conversations whose prompts all open with a 4,096-token
// preamble in the first user message get more than 100 distinct keys per
// 1,000 requests (the 2 KB prefix key gave them one), a TTFT p50 at most
// 0.8× that of random keys in the same test, no idle engine, and no key
// that moves between a conversation's turns. `inferlb bench affinity` runs
// the same at 1,000 requests per mode.
//
// The TTFT compared is the engines' own (queueing and prefill, simulated
// time): under the race detector on two shared cores, the client-side TTFT
// measures CPU starvation of the request path (both modes' p50s several
// times the engines'). Without the race detector the client-side ratio is
// checked as well.
func TestSharedPreambleThroughEnvoy(t *testing.T) {
	defer leaktest.AfterTest(t)()
	if testing.Short() {
		t.Skip("runs the whole request path for about a minute")
	}
	o := DefaultOptions()
	o.Requests = 200
	// Shorter answers, longer questions: the same history per turn with
	// half the streamed tokens (the CPU of the request path), so a machine
	// busy with other tests does not starve the rig.
	o.UserTokens, o.OutputTokens = workload.Range{Min: 250, Max: 450}, workload.Range{Min: 30, Max: 60}
	o.Dir = t.TempDir()
	rep, err := Run(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	p, r := rep.Phase(ModePrefix), rep.Phase(ModeRandom)
	for _, ph := range rep.Phases {
		t.Logf("%s: %d requests, %.0f keys/1000, TTFT p50 %.0f ms p99 %.0f ms (engines: %.0f, %.0f), hit rate %.3f, engines %v (max/mean %.2f), remaps %d/%d, key moves %d, weight changes %d (TV %.3f), table %d rules",
			ph.Mode, ph.Requests, ph.KeysPer1000, ph.TTFTP50(), ph.TTFTP99(), ph.EngineTTFTP50Ms, ph.EngineTTFTP99Ms, ph.HitRate(), ph.EngineRequests, ph.MaxOverMean,
			ph.Remaps, ph.LaterTurns, ph.KeyMoves, ph.WeightChanges, ph.WeightTV, ph.TableRules)
	}
	if p.Loadgen.Requests.OK != o.Requests || r.Loadgen.Requests.OK != o.Requests {
		t.Fatalf("requests ok: prefix %+v, random %+v; errors %v %v", p.Loadgen.Requests, r.Loadgen.Requests, p.Loadgen.Errors, r.Loadgen.Errors)
	}
	if p.KeysPer1000 <= 100 {
		t.Errorf("prefix keys: %.0f distinct per 1,000 requests, want more than 100", p.KeysPer1000)
	}
	if ratio := p.EngineTTFTP50Ms / r.EngineTTFTP50Ms; !(ratio <= 0.8) {
		t.Errorf("engines' TTFT p50: prefix %.0f ms, random %.0f ms: %.2f×, want ≤ 0.8×", p.EngineTTFTP50Ms, r.EngineTTFTP50Ms, ratio)
	}
	if ratio := p.TTFTP50() / r.TTFTP50(); !raceEnabled && !(ratio <= 0.8) {
		t.Errorf("TTFT p50: prefix %.0f ms, random %.0f ms: %.2f×, want ≤ 0.8×", p.TTFTP50(), r.TTFTP50(), ratio)
	}
	if p.IdleEngines != 0 {
		t.Errorf("prefix: %d idle engines (%v)", p.IdleEngines, p.EngineRequests)
	}
	if p.KeyMoves != 0 {
		t.Errorf("prefix: %d of %d later turns got another key than their conversation's previous turn", p.KeyMoves, p.LaterTurns)
	}
	if p.HitRate() <= r.HitRate() {
		t.Errorf("hit rate: prefix %.3f, random %.3f", p.HitRate(), r.HitRate())
	}
	if p.TableRules == 0 {
		t.Errorf("prefix: the control plane learned no split table (the preamble is hot)")
	}
}
