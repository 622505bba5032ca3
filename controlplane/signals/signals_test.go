package signals

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"
	"google.golang.org/protobuf/types/known/timestamppb"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
)

// vllmText is /metrics in vLLM's format (two label sets for the gauges, as
// with data parallelism).
func vllmText(running, waiting, kv float64, success, ttftSum, ttftCount float64) string {
	return fmt.Sprintf(`# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} %g
vllm:num_requests_running{engine="1",model_name="m"} 0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} %g
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} %g
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 400
# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} %g
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{engine="0",model_name="m"} %g
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} %g
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 1
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} %g
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} %g
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} %g
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 0.1
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 10
`, running, waiting, kv, success, success*200, success*100, ttftCount, ttftSum, ttftCount)
}

func TestParseMetrics(t *testing.T) {
	m, err := ParseMetrics(strings.NewReader(vllmText(5, 2, 0.25, 10, 1.5, 10)))
	if err != nil {
		t.Fatal(err)
	}
	if m.Running != 5 || m.Waiting != 2 || m.KVUsage != 0.25 || m.Success != 10 || m.TTFTCount != 10 || m.TTFTSum != 1.5 ||
		m.PrefixHits != 400 || m.PrefixQueries != 1000 || m.ITLCount != 10 || m.PromptTokens != 2000 {
		t.Fatalf("parsed %+v", m)
	}
}

func TestParseMetricsErrors(t *testing.T) {
	for name, tc := range map[string]struct{ text, want string }{
		"not vllm":  {"# TYPE up gauge\nup 1\n", "missing vllm:kv_cache_usage_perc, vllm:num_requests_running, vllm:num_requests_waiting"},
		"garbage":   {"vllm:num_requests_running{ 1\n", "parse metrics"},
		"negative":  {"vllm:num_requests_running -1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n", "vllm:num_requests_running is -1"},
		"empty":     {"", "missing"},
		"wrongtype": {"# TYPE vllm:time_to_first_token_seconds gauge\nvllm:time_to_first_token_seconds 1\nvllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0\n", ""},
	} {
		t.Run(name, func(t *testing.T) {
			m, err := ParseMetrics(strings.NewReader(tc.text))
			if tc.want == "" {
				if err != nil || !math.IsNaN(m.TTFTCount) {
					t.Fatalf("err %v, ttft count %v (want NaN: absent as a histogram)", err, m.TTFTCount)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
}

func FuzzParseMetrics(f *testing.F) {
	f.Add(vllmText(5, 2, 0.25, 10, 1.5, 10))
	f.Add("vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 0.5\n")
	f.Add("# TYPE x histogram\nx_bucket{le=\"+Inf\"} 1\nx_sum 1\nx_count 1\n")
	f.Add("")
	f.Fuzz(func(t *testing.T, s string) {
		m, err := ParseMetrics(strings.NewReader(s))
		if err == nil && (m.Running < 0 || m.Waiting < 0 || m.KVUsage < 0) {
			t.Fatalf("accepted negative gauges: %+v", m)
		}
	})
}

func TestScrapeConcurrentWithTimeouts(t *testing.T) {
	defer leaktest.AfterTest(t)()
	var healthy atomic.Bool
	healthy.Store(true)
	block := make(chan struct{})
	mux := http.NewServeMux()
	mux.HandleFunc("/metrics", func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, vllmText(3, 0, 0.1, 5, 0.5, 5)) })
	mux.HandleFunc("/health", func(w http.ResponseWriter, r *http.Request) {
		if !healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	ok := httptest.NewServer(mux)
	defer ok.Close()
	hang := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-block:
		case <-r.Context().Done():
		}
	}))
	defer hang.Close()
	defer close(block)
	// The timeout also bounds the healthy engine's requests: 2 s, so a
	// stalled machine does not make it time out.
	s := &Scraper{Timeout: 2 * time.Second}
	addr := func(u string) string { return strings.TrimPrefix(u, "http://") }
	start := time.Now()
	out := s.ScrapeAll(context.Background(), []Target{{ID: "a", Address: addr(ok.URL)}, {ID: "h", Address: addr(hang.URL)}, {ID: "x", Address: "127.0.0.1:1"}})
	// Without the timeouts the hanging engine would hold the scrape until
	// the test ends; 5 timeouts leave room for a starved machine.
	if el := time.Since(start); el > 5*s.Timeout {
		t.Fatalf("scrape took %v despite %v timeouts", el, s.Timeout)
	}
	if !out[0].Healthy || out[0].MetricsErr != nil || out[0].Metrics.Running != 3 {
		t.Errorf("ok engine: %+v", out[0])
	}
	if out[1].Healthy || !isTimeout(out[1].MetricsErr) || !isTimeout(out[1].HealthErr) {
		t.Errorf("hanging engine: %+v", out[1])
	}
	if out[2].Healthy || out[2].HealthErr == nil {
		t.Errorf("refused engine: %+v", out[2])
	}
	healthy.Store(false)
	if s := s.Scrape(context.Background(), Target{ID: "a", Address: addr(ok.URL)}); s.Healthy || !strings.Contains(s.HealthErr.Error(), "503") {
		t.Errorf("503 health: %+v", s)
	}
}

// A /health that only ever timed out says nothing: the engine is unknown
// (stale), not down, until some /health answers; a timeout after that keeps
// the last verdict, a refusal is down.
func TestTrackerHealthTimeoutIsNotDown(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tr := NewTracker(TrackerOptions{StaleAfter: 3 * time.Second}, []string{"e"})
	timeout := context.DeadlineExceeded
	m := Metrics{Running: 1, Waiting: 0, KVUsage: 0.1}
	tr.Observe(Sample{ID: "e", At: t0, HealthErr: timeout, Metrics: m})
	if got := tr.Engines(t0)[0].Status(); got != Stale {
		t.Fatalf("after a timed-out first /health: %v, want stale", got)
	}
	tr.Observe(Sample{ID: "e", At: t0.Add(time.Second), Healthy: true, Metrics: m})
	tr.Observe(Sample{ID: "e", At: t0.Add(2 * time.Second), HealthErr: timeout, Metrics: m})
	if got := tr.Engines(t0.Add(2 * time.Second))[0].Status(); got != Up {
		t.Fatalf("healthy, then a timeout: %v, want up", got)
	}
	tr.Observe(Sample{ID: "e", At: t0.Add(3 * time.Second), HealthErr: errors.New("connection refused"), Metrics: m})
	if got := tr.Engines(t0.Add(3 * time.Second))[0].Status(); got != Down {
		t.Fatalf("refused: %v, want down", got)
	}
}

func TestTrackerSmoothingStalenessAndRates(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tr := NewTracker(TrackerOptions{Smoothing: 2 * time.Second, StaleAfter: 3 * time.Second}, []string{"e"})
	if got := tr.Engines(t0)[0].Status(); got != New {
		t.Fatalf("before any scrape: %v", got)
	}
	parse := func(s string) Metrics {
		m, err := ParseMetrics(strings.NewReader(s))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if !tr.Observe(Sample{ID: "e", At: t0, Healthy: true, Metrics: parse(vllmText(10, 0, 0.1, 100, 10, 100))}) {
		t.Error("first sample did not report a state change")
	}
	// One second later: 20 requests finished with a mean TTFT of 50 ms.
	tr.Observe(Sample{ID: "e", At: t0.Add(time.Second), Healthy: true, Metrics: parse(vllmText(10, 0, 0.1, 120, 11, 120))})
	e := tr.Engines(t0.Add(time.Second))[0]
	if e.Status() != Up || math.Abs(e.TTFTMs-50) > 1e-9 || math.Abs(e.RequestsPerS-20) > 1e-9 {
		t.Fatalf("after two samples: %+v", e)
	}
	// Running jumps to 30; smoothing absorbs 1−e^(−1/2) of the step.
	tr.Observe(Sample{ID: "e", At: t0.Add(2 * time.Second), Healthy: true, Metrics: parse(vllmText(30, 0, 0.1, 120, 11, 120))})
	e = tr.Engines(t0.Add(2 * time.Second))[0]
	if want := 10 + 20*(1-math.Exp(-0.5)); math.Abs(e.Running-want) > 1e-9 {
		t.Errorf("smoothed running %v, want %v", e.Running, want)
	}
	// Metrics fail but health passes: stale after 3 s, never idle.
	changed := tr.Observe(Sample{ID: "e", At: t0.Add(6 * time.Second), Healthy: true, MetricsErr: fmt.Errorf("timeout")})
	e = tr.Engines(t0.Add(6 * time.Second))[0]
	if !changed || e.Status() != Stale || e.Running == 0 {
		t.Errorf("stale: changed=%v %+v", changed, e)
	}
	if !tr.Observe(Sample{ID: "e", At: t0.Add(7 * time.Second), Healthy: false}) {
		t.Error("health failure is not a change")
	}
	if got := tr.Engines(t0.Add(7 * time.Second))[0].Status(); got != Down {
		t.Errorf("state %v, want down", got)
	}
	// A restarted engine (counters reset) does not produce negative rates.
	tr.Observe(Sample{ID: "e", At: t0.Add(8 * time.Second), Healthy: true, Metrics: parse(vllmText(1, 0, 0, 1, 0.01, 1))})
	tr.Observe(Sample{ID: "e", At: t0.Add(9 * time.Second), Healthy: true, Metrics: parse(vllmText(1, 0, 0, 3, 0.03, 3))})
	if e := tr.Engines(t0.Add(9 * time.Second))[0]; e.RequestsPerS < 0 || e.Status() != Up {
		t.Errorf("after restart: %+v", e)
	}
}

func TestIntake(t *testing.T) {
	now := time.Unix(5000, 0)
	in, err := NewIntake(IntakeOptions{Window: 10 * time.Second, Nodes: []string{"fe"}, Classes: []string{"c"},
		Priorities: []string{"p", "q"}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	// Rates divide by the window: a window of 0 is refused, not turned into
	// infinite demand.
	if _, err := NewIntake(IntakeOptions{}); err == nil || !strings.Contains(err.Error(), "window must be positive") {
		t.Errorf("zero window: err = %v", err)
	}
	now = now.Add(20 * time.Second) // the intake has run for a whole window
	rep := func(req, shed uint64) *policyv1.ReportRequest {
		return &policyv1.ReportRequest{NodeId: "fe", Instance: "i1",
			IntervalStart: timestamppb.New(now.Add(-time.Second)), IntervalEnd: timestamppb.New(now),
			Demand:  []*policyv1.DemandSample{{Class: "c", Priority: "p", Requests: req, Shed: shed, PromptTokens: req * 100, OutputTokens: req * 50}},
			Engines: []*policyv1.EngineEvidence{{Address: "10.0.0.1:8000", Responses: 10, Errors: 5, HeaderLatencySumSeconds: 1, HeaderLatencyCount: 10}}}
	}
	for i := 0; i < 10; i++ {
		if err := in.Report(context.Background(), rep(20, 2)); err != nil {
			t.Fatal(err)
		}
		now = now.Add(time.Second)
	}
	d, ev := in.Snapshot(now.Add(-time.Second)) // the window [now−11s, now−1s] holds all ten
	got := d[DemandKey{"fe", "c", "p"}]
	if math.Abs(got.RequestsPerS-20) > 1e-9 || math.Abs(got.ShedPerS-2) > 1e-9 || got.PromptTokens != 100 || got.OutputTokens != 50 {
		t.Errorf("demand %+v, want 20 req/s, 2 shed/s, 100/50 tokens", got)
	}
	e := ev["10.0.0.1:8000"]
	if e.ErrorRate() != 0.5 || math.Abs(e.HeaderLatencyMs-100) > 1e-9 {
		t.Errorf("evidence %+v", e)
	}
	// Old reports leave the window.
	d, _ = in.Snapshot(now.Add(30 * time.Second))
	if len(d) != 0 {
		t.Errorf("demand after the window: %v", d)
	}
	for name, tc := range map[string]struct {
		mut  func(r *policyv1.ReportRequest)
		want string
	}{
		"node":     {func(r *policyv1.ReportRequest) { r.NodeId = "zz" }, `node_id "zz" is not a frontend`},
		"class":    {func(r *policyv1.ReportRequest) { r.Demand[0].Class = "k" }, `demand[0].class "k"`},
		"priority": {func(r *policyv1.ReportRequest) { r.Demand[0].Priority = "k" }, `demand[0].priority "k"`},
		"shed":     {func(r *policyv1.ReportRequest) { r.Demand[0].Shed = 99 }, "shed 99 > requests 20"},
		"errors":   {func(r *policyv1.ReportRequest) { r.Engines[0].Errors = 11 }, "errors 11 > responses 10"},
		"interval": {func(r *policyv1.ReportRequest) { r.IntervalEnd = r.IntervalStart }, "is not after interval_start"},
		// Without an interval the counts cannot become rates; they must not
		// silently count as (almost) no demand.
		"no start": {func(r *policyv1.ReportRequest) { r.IntervalStart = nil }, "interval_start and interval_end are required"},
		"no end":   {func(r *policyv1.ReportRequest) { r.IntervalEnd = nil }, "interval_start and interval_end are required"},
		"bad end":  {func(r *policyv1.ReportRequest) { r.IntervalEnd = &timestamppb.Timestamp{Seconds: 1, Nanos: -1} }, "interval_end: "},
	} {
		t.Run(name, func(t *testing.T) {
			r := rep(20, 2)
			tc.mut(r)
			if err := in.Report(context.Background(), r); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want %q", err, tc.want)
			}
		})
	}
	if st := in.Status(); st.Rejected != 9 || st.Accepted != 10 {
		t.Errorf("status %+v", st)
	}
}

// Implausible reports are refused whole, with the bound they break named
// (the forgeries: 2^64−1 requests, 10^9/s, timestamps in 1970 and a
// century ahead, 1000 errors per engine without requests); plausible but
// large ones are capped at the frontend's bound in the demand, per instance
// and per node.
func TestIntakePlausibility(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	in, err := NewIntake(IntakeOptions{Window: 10 * time.Second, Nodes: []string{"fe"}, Classes: []string{"c"},
		Priorities: []string{"p"}, Now: func() time.Time { return now },
		MaxRequestsPerS: map[string]float64{"fe": 100}, MaxInflight: map[string]float64{"fe": 10},
		MaxAttempts: 3, MaxTokensPerRequest: 8192})
	if err != nil {
		t.Fatal(err)
	}
	rep := func(inst string, req uint64, resp uint64) *policyv1.ReportRequest {
		return &policyv1.ReportRequest{NodeId: "fe", Instance: inst,
			IntervalStart: timestamppb.New(now.Add(-time.Second)), IntervalEnd: timestamppb.New(now),
			Demand: []*policyv1.DemandSample{{Class: "c", Priority: "p", Requests: req, PromptTokens: req * 100, OutputTokens: req * 50}},
			Engines: []*policyv1.EngineEvidence{{Address: "10.0.0.1:8000", Responses: resp, Errors: resp,
				Completed: 0}}}
	}
	for name, tc := range map[string]struct {
		r      *policyv1.ReportRequest
		reason string
		want   string
	}{
		"2^64-1 requests": {rep("a", math.MaxUint64, 0), "rate", "exceed the 100/s frontend fe can carry"},
		"1e9 per second":  {rep("a", 1_000_000_000, 0), "rate", "exceed the 100/s"},
		"1970": {func() *policyv1.ReportRequest {
			r := rep("a", 1, 0)
			r.IntervalStart, r.IntervalEnd = timestamppb.New(time.Unix(0, 0)), timestamppb.New(time.Unix(1, 0))
			return r
		}(), "clock", "from the control plane's clock"},
		"a century ahead": {func() *policyv1.ReportRequest {
			r := rep("a", 1, 0)
			r.IntervalStart, r.IntervalEnd = timestamppb.New(now.AddDate(100, 0, 0)), timestamppb.New(now.AddDate(100, 0, 0).Add(time.Second))
			return r
		}(), "clock", "at most 10s is accepted"},
		"interval from 1970 to now": {func() *policyv1.ReportRequest {
			r := rep("a", 1, 0)
			r.IntervalStart = timestamppb.New(time.Unix(0, 0))
			return r
		}(), "clock", "more than the 1m0s accepted"},
		"tokens": {func() *policyv1.ReportRequest {
			r := rep("a", 2, 0)
			r.Demand[0].PromptTokens = 1 << 40
			return r
		}(), "tokens", "a request has at most 8192"},
		// Credit: 3 attempts × 10 in flight = 30 responses without requests.
		"1000 errors without requests": {rep("b", 0, 1000), "evidence", "1000 engine responses, more than its 0 admitted requests"},
		"latency count": {func() *policyv1.ReportRequest {
			r := rep("a", 2, 2)
			r.Engines[0].HeaderLatencyCount = 3
			return r
		}(), "malformed", "may not exceed responses 2"},
	} {
		t.Run(name, func(t *testing.T) {
			err := in.Report(context.Background(), tc.r)
			var rj *Rejection
			if !errors.As(err, &rj) || rj.Reason != tc.reason || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want a %q rejection containing %q", err, tc.reason, tc.want)
			}
		})
	}
	// The credit carries: 30 responses in flight at start, then 3 per
	// admitted request; beyond, refused (each report a new interval: one
	// with the interval_start of another is a resend, counted once).
	if err := in.Report(context.Background(), rep("c", 0, 30)); err != nil {
		t.Fatalf("responses of the requests in flight at start: %v", err)
	}
	now = now.Add(time.Second)
	if err := in.Report(context.Background(), rep("c", 5, 15)); err != nil {
		t.Fatalf("3 responses per admitted request: %v", err)
	}
	now = now.Add(time.Second)
	if err := in.Report(context.Background(), rep("c", 0, 1)); err == nil {
		t.Fatal("a response beyond the credit was accepted")
	}
	// Caps: two instances at 90/s each (each plausible) make 180/s: the
	// node's demand counts its bound, 100/s.
	for k := 0; k < 10; k++ {
		now = now.Add(time.Second)
		for _, inst := range []string{"x", "y"} {
			if err := in.Report(context.Background(), rep(inst, 90, 0)); err != nil {
				t.Fatal(err)
			}
		}
	}
	d, _ := in.Snapshot(now)
	if got := d[DemandKey{"fe", "c", "p"}].RequestsPerS; math.Abs(got-100) > 1e-6 {
		t.Fatalf("node demand %.2f/s from two instances at 90/s each, want the bound 100/s", got)
	}
}

// The evidence window accumulates first tokens across scrapes (one a
// second makes 3 in 3 s, where one scrape never holds 3), forgets what is
// older than the window, and the latency memory is cleared when the engine
// restarts (counters go down, or it comes back from down) or has been idle
// for IdleReset: a restarted engine is judged on what it does now.
func TestTrackerEvidenceWindowAndResets(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tr := NewTracker(TrackerOptions{Smoothing: time.Second, StaleAfter: 3 * time.Second, EvidenceWindow: 5 * time.Second, IdleReset: 20 * time.Second}, []string{"e"})
	// m: n first tokens so far, each 100 ms (slow), n·10 gaps of 50 ms.
	m := func(n float64, running, waiting float64) Metrics {
		return Metrics{Running: running, Waiting: waiting, TTFTSum: 0.1 * n, TTFTCount: n, ITLSum: 0.5 * n, ITLCount: 10 * n,
			Success: n, PromptTokens: 100 * n, PrefixHits: 40 * n, GenTokens: 10 * n, PrefixQueries: 100 * n}
	}
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	for s := 0; s <= 3; s++ {
		tr.Observe(Sample{ID: "e", At: at(s), Healthy: true, Metrics: m(float64(s), 2, 1)})
	}
	w := tr.Engines(at(3))[0].Window
	if w.TTFTCount != 3 || math.Abs(w.TTFTMeanMs-100) > 1e-9 || w.ITLCount != 30 || math.Abs(w.TBOTMeanMs-50) > 1e-9 ||
		w.Running != 2 || w.Waiting != 1 || math.Abs(w.CompletionsPerS-1) > 1e-9 || math.Abs(w.UncachedPromptPerS-60) > 1e-9 {
		t.Fatalf("window after 3 s at one request a second: %+v", w)
	}
	// Ten seconds without traffic: the window is empty again.
	for s := 4; s <= 13; s++ {
		tr.Observe(Sample{ID: "e", At: at(s), Healthy: true, Metrics: m(3, 0, 0)})
	}
	if w := tr.Engines(at(13))[0].Window; w.TTFTCount != 0 {
		t.Fatalf("window after 10 quiet seconds: %+v", w)
	}
	e := tr.Engines(at(13))[0]
	if math.IsNaN(e.TTFTMs) {
		t.Fatal("smoothed TTFT forgotten before the idle reset")
	}
	// Idle for more than 20 s: forgotten.
	for s := 14; s <= 25; s++ {
		tr.Observe(Sample{ID: "e", At: at(s), Healthy: true, Metrics: m(3, 0, 0)})
	}
	if e := tr.Engines(at(25))[0]; !math.IsNaN(e.TTFTMs) || !math.IsNaN(e.TBOTMs) || e.Resets != 1 || !strings.Contains(e.LastReset, "no first token") {
		t.Fatalf("after 22 s idle: TTFT %v TBOT %v resets %d (%s)", e.TTFTMs, e.TBOTMs, e.Resets, e.LastReset)
	}
	// Traffic again, then a restart: counters start over.
	tr.Observe(Sample{ID: "e", At: at(26), Healthy: true, Metrics: m(6, 1, 0)})
	tr.Observe(Sample{ID: "e", At: at(27), Healthy: true, Metrics: m(8, 1, 0)})
	if e := tr.Engines(at(27))[0]; math.IsNaN(e.TTFTMs) || e.Window.TTFTCount != 5 {
		t.Fatalf("traffic after the idle reset: %+v", e)
	}
	tr.Observe(Sample{ID: "e", At: at(28), Healthy: true, Metrics: m(1, 1, 0)})
	if e := tr.Engines(at(28))[0]; !math.IsNaN(e.TTFTMs) || e.Window.TTFTCount != 0 || e.Resets != 2 || !strings.Contains(e.LastReset, "counters reset") {
		t.Fatalf("after a counter reset: %+v", e)
	}
	// Down, then up again (a restart whose counters happen to be higher).
	tr.Observe(Sample{ID: "e", At: at(29), Healthy: true, Metrics: m(3, 1, 0)})
	tr.Observe(Sample{ID: "e", At: at(30), HealthErr: errors.New("connection refused"), MetricsErr: errors.New("connection refused")})
	tr.Observe(Sample{ID: "e", At: at(31), Healthy: true, Metrics: m(9, 1, 0)})
	if e := tr.Engines(at(31))[0]; e.Status() != Up || !math.IsNaN(e.TTFTMs) || e.Resets != 3 || !strings.Contains(e.LastReset, "from down") {
		t.Fatalf("back from down: %+v", e)
	}
}

// Whatever a reporter sends, the intake neither panics nor lets a number
// through that is not finite or that exceeds the frontend's bound.
func FuzzIntakeReport(f *testing.F) {
	f.Add(uint64(10), uint64(1), uint64(1000), uint64(500), uint64(8), uint64(1), 0.5, int64(-1), int64(0), uint64(3), 1.5)
	f.Add(uint64(math.MaxUint64), uint64(0), uint64(0), uint64(0), uint64(1000), uint64(1000), math.Inf(1), int64(-1<<40), int64(1<<40), uint64(0), math.NaN())
	f.Fuzz(func(t *testing.T, req, shed, pt, ot, resp, errs uint64, lat float64, startS, endS int64, completed uint64, compSec float64) {
		now := time.Unix(1_800_000_000, 0)
		in, err := NewIntake(IntakeOptions{Window: 10 * time.Second, Nodes: []string{"fe"}, Classes: []string{"c"}, Priorities: []string{"p"},
			Now: func() time.Time { return now }, MaxRequestsPerS: map[string]float64{"fe": 100}, MaxInflight: map[string]float64{"fe": 10},
			MaxTokensPerRequest: 8192})
		if err != nil {
			t.Fatal(err)
		}
		r := &policyv1.ReportRequest{NodeId: "fe", Instance: "i",
			IntervalStart: &timestamppb.Timestamp{Seconds: now.Unix() + startS}, IntervalEnd: &timestamppb.Timestamp{Seconds: now.Unix() + endS},
			Demand: []*policyv1.DemandSample{{Class: "c", Priority: "p", Requests: req, Shed: shed, PromptTokens: pt, OutputTokens: ot}},
			Engines: []*policyv1.EngineEvidence{{Address: "a:1", Responses: resp, Errors: errs, HeaderLatencySumSeconds: lat, HeaderLatencyCount: resp,
				Completed: completed, CompletionSecondsSum: compSec}}}
		_ = in.Report(context.Background(), r)
		d, ev := in.Snapshot(now)
		for k, x := range d {
			for _, v := range []float64{x.RequestsPerS, x.ShedPerS, x.PromptTokens, x.OutputTokens} {
				if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
					t.Fatalf("%v: %+v", k, x)
				}
			}
			if x.RequestsPerS > 100+1e-9 {
				t.Fatalf("%v: %.1f requests/s above the bound", k, x.RequestsPerS)
			}
		}
		for a, e := range ev {
			if math.IsNaN(e.Responses+e.Errors+e.HeaderLatencyMs+e.CompletionSeconds) || e.Errors > e.Responses {
				t.Fatalf("%s: %+v", a, e)
			}
		}
	})
}

// SetBounds moves the plausibility bounds that follow the fleet's engines
// (Kubernetes discovery): a rate clipped under the old bound is not under
// the new one, and evidence for an engine that joined is kept, not dropped
// as unknown.
func TestIntakeSetBounds(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	var adjusted []string
	opt := IntakeOptions{Window: 10 * time.Second, Nodes: []string{"fe"}, Classes: []string{"c"},
		Priorities: []string{"p"}, Now: func() time.Time { return now },
		MaxRequestsPerS: map[string]float64{"fe": 100}, MaxInflight: map[string]float64{"fe": 10}, MaxAttempts: 3,
		Engines: map[string]string{"10.0.0.1:8000": "e1"}, OnAdjust: func(r string) { adjusted = append(adjusted, r) }}
	in, err := NewIntake(opt)
	if err != nil {
		t.Fatal(err)
	}
	rep := func(inst string) *policyv1.ReportRequest {
		return &policyv1.ReportRequest{NodeId: "fe", Instance: inst,
			IntervalStart: timestamppb.New(now.Add(-time.Second)), IntervalEnd: timestamppb.New(now),
			Demand:  []*policyv1.DemandSample{{Class: "c", Priority: "p", Requests: 150}},
			Engines: []*policyv1.EngineEvidence{{Address: "10.0.0.2:8000", Responses: 1}}}
	}
	if err := in.Report(context.Background(), rep("a")); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(adjusted, []string{"rate_clipped", "unknown_engine"}) {
		t.Fatalf("under a 100/s bound, with 10.0.0.2 unknown: adjusted %v, want rate_clipped and unknown_engine", adjusted)
	}
	adjusted = nil
	opt.MaxRequestsPerS = map[string]float64{"fe": 200}
	opt.Engines = map[string]string{"10.0.0.1:8000": "e1", "10.0.0.2:8000": "e2"}
	in.SetBounds(opt)
	if err := in.Report(context.Background(), rep("b")); err != nil {
		t.Fatal(err)
	}
	if len(adjusted) != 0 {
		t.Errorf("under a 200/s bound, with 10.0.0.2 an engine: adjusted %v, want nothing", adjusted)
	}
}

// The TTFT histogram's buckets give the window's spread (the penalty's
// confidence in a mean, controlplane/penalty.go): its lower bound, each
// first token as near the window's mean as its bucket allows; a window
// with a scrape that had no buckets has no spread (0), never a made-up
// one.
func TestTTFTSpreadFromBuckets(t *testing.T) {
	page := func(n0, n1, n2 float64) string {
		return fmt.Sprintf(`# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.1
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} %g
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.5",model_name="m"} %g
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} %g
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} %g
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} %g
`, n0, n0+n1, n0+n1+n2, 0.05*n0+0.3*n1+0.9*n2, n0+n1+n2)
	}
	parse := func(text string) Metrics {
		t.Helper()
		m, err := ParseMetrics(strings.NewReader(text))
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	m := parse(page(4, 2, 1))
	if b := m.TTFTBuckets; b == nil || !slices.Equal(b.Bounds, []float64{0.1, 0.5}) || !slices.Equal(b.Cumulative, []float64{4, 6}) {
		t.Fatalf("buckets %+v, want bounds [0.1 0.5] and cumulative counts [4 6]", b)
	}
	t0 := time.Unix(1000, 0)
	for _, tc := range []struct {
		name          string
		first, second Metrics
		sdMs          float64
	}{
		// 10 first tokens: 5 under 100 ms, 5 in 100-500 ms, mean 175 ms:
		// the first five are at least 75 ms from it, the others may be
		// at it: sd ≥ √(5·75²/10) = 53.03 ms.
		{"spread over two buckets", m, parse(page(9, 7, 1)), 53.033},
		// All 5 in the mean's bucket: nothing proven.
		{"one bucket", m, parse(page(4, 7, 1)), 0},
		{"a scrape without buckets", func() Metrics { x := m; x.TTFTBuckets = nil; return x }(), parse(page(9, 7, 1)), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := NewTracker(TrackerOptions{StaleAfter: 5 * time.Second, EvidenceWindow: 10 * time.Second}, []string{"e"})
			tr.Observe(Sample{ID: "e", At: t0, Healthy: true, Metrics: tc.first})
			tr.Observe(Sample{ID: "e", At: t0.Add(time.Second), Healthy: true, Metrics: tc.second})
			w := tr.Engines(t0.Add(time.Second))[0].Window
			if math.Abs(w.TTFTSDMs-tc.sdMs) > 1e-3 {
				t.Fatalf("TTFT spread %.3f ms, want %.3f (window %+v)", w.TTFTSDMs, tc.sdMs, w)
			}
		})
	}
}

// The window's gauges describe the same intervals as its counters: each
// scrape interval at the mean of the gauge at its two ends. A queue seen
// at one scrape whose delayed first tokens are counted at the next still
// shows in the window after that first scrape has left it, and a page
// without the gauge takes the other end's value.
func TestWindowGaugesCoverTheirIntervals(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	tr := NewTracker(TrackerOptions{StaleAfter: 5 * time.Second, EvidenceWindow: 5 * time.Second}, []string{"e"})
	idle := Metrics{Success: 100, TTFTSum: 3, TTFTCount: 100}
	tr.Observe(Sample{ID: "e", At: at(0), Healthy: true, Metrics: idle})
	// A burst: 1 running and 3 waiting at the scrape at 1 s.
	busy := idle
	busy.Running, busy.Waiting = 1, 3
	tr.Observe(Sample{ID: "e", At: at(1), Healthy: true, Metrics: busy})
	// By the next scrape the queue is gone: its 3 first tokens (400 ms
	// each) and completions are counted there, the gauges read 0.
	done := idle
	done.Success, done.TTFTSum, done.TTFTCount = 103, 3+3*0.4, 103
	for s := 2; s <= 7; s++ {
		tr.Observe(Sample{ID: "e", At: at(s), Healthy: true, Metrics: done})
	}
	// At 7 s the window (5 s back) holds the scrapes at 2-7 s, the
	// intervals 1-7 s: the burst's scrape at 1 s has left it, its first
	// tokens have not.
	w := tr.Engines(at(7))[0].Window
	if w.TTFTCount != 3 || math.Abs(w.TTFTMeanMs-400) > 1e-9 {
		t.Fatalf("window's first tokens %+v, want 3 at 400 ms", w)
	}
	// The interval 1-2 s: (3+0)/2 waiting, (1+0)/2 running, over 6 s.
	if math.Abs(w.Waiting-0.25) > 1e-9 || math.Abs(w.Running-0.5/6) > 1e-9 || w.Seconds != 6 {
		t.Fatalf("window gauges running %.3f waiting %.3f over %.0f s, want 0.083 and 0.25 over 6 s", w.Running, w.Waiting, w.Seconds)
	}

	// A page without the gauges: the interval takes the known end.
	tr = NewTracker(TrackerOptions{StaleAfter: 5 * time.Second, EvidenceWindow: 5 * time.Second}, []string{"e"})
	tr.Observe(Sample{ID: "e", At: at(0), Healthy: true, Metrics: busy})
	missing := busy
	missing.Running, missing.Waiting = math.NaN(), math.NaN()
	tr.Observe(Sample{ID: "e", At: at(1), Healthy: true, Metrics: missing})
	if w := tr.Engines(at(1))[0].Window; w.Running != 1 || w.Waiting != 3 {
		t.Fatalf("gauges missing at one end: running %v waiting %v, want 1 and 3", w.Running, w.Waiting)
	}
}

// TestIntakeCountsInstances: Instances counts a node's ext_proc instances
// with a report in the window, so that the control plane knows when none
// of them sees all of an engine's requests.
func TestIntakeCountsInstances(t *testing.T) {
	now := time.Unix(5000, 0)
	in, err := NewIntake(IntakeOptions{Window: 10 * time.Second, Nodes: []string{"fe", "fe2"}, Classes: []string{"c"},
		Priorities: []string{"p"}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(20 * time.Second)
	report := func(node, inst string) {
		t.Helper()
		r := &policyv1.ReportRequest{NodeId: node, Instance: inst,
			IntervalStart: timestamppb.New(now.Add(-time.Second)), IntervalEnd: timestamppb.New(now),
			Demand: []*policyv1.DemandSample{{Class: "c", Priority: "p", Requests: 1}}}
		if err := in.Report(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	report("fe", "a")
	report("fe2", "x")
	if got := in.Instances(now); got["fe"] != 1 || got["fe2"] != 1 {
		t.Fatalf("one instance per node: %v", got)
	}
	now = now.Add(5 * time.Second)
	report("fe", "b")
	if got := in.Instances(now); got["fe"] != 2 || got["fe2"] != 1 {
		t.Fatalf("a second instance of fe: %v", got)
	}
	// a's and x's reports leave the window; b's stays.
	if got := in.Instances(now.Add(8 * time.Second)); got["fe"] != 1 || got["fe2"] != 0 {
		t.Fatalf("after the first reports left the window: %v", got)
	}
}
