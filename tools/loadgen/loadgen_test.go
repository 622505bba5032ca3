package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"

	"github.com/inferlb/inferlb/internal/envoyrun"
	"github.com/inferlb/inferlb/internal/llmclient"
	"github.com/inferlb/inferlb/internal/llmclient/llmclienttest"
	"github.com/inferlb/inferlb/internal/tokens"
	"github.com/inferlb/inferlb/internal/words"
	"github.com/inferlb/inferlb/tools/workload"
)

func testClient(t testing.TB, url string) *Client {
	c := &Client{HTTP: NewHTTPClient(256), BaseURL: url, Model: "m", Headers: DefaultHeaderNames(), IgnoreEOS: true, Timeout: 10 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

// fixed is a workload of n identical-size chat requests.
type fixed struct {
	n, prompt, out int
	i              int
}

func (f *fixed) Timed() bool { return false }
func (f *fixed) Next(time.Duration) (workload.Request, bool) {
	if f.n > 0 && f.i >= f.n {
		return workload.Request{}, false
	}
	f.i++
	msgs := []tokens.Message{{Role: "user", Content: words.Words(uint64(f.i), f.prompt-1)}}
	return workload.Request{Index: f.i - 1, Messages: msgs, PromptTokens: tokens.CountChat(msgs), MaxTokens: f.out}, true
}

func TestMetricsOfAKnownServer(t *testing.T) {
	for _, netHTTP := range []bool{false, true} {
		t.Run(map[bool]string{false: "direct", true: "net-http"}[netHTTP], func(t *testing.T) { testMetricsOfAKnownServer(t, netHTTP) })
	}
}

func testMetricsOfAKnownServer(t *testing.T, netHTTP bool) {
	t.Cleanup(leaktest.AfterTest(t)) // runs after the servers and clients close
	const ttft, itl = 30 * time.Millisecond, 4 * time.Millisecond
	eng := llmclienttest.Start(t, &llmclienttest.Engine{TTFT: ttft, ITL: itl, CachedShare: 0.25})
	c := testClient(t, eng.URL())
	c.NetHTTP = netHTTP
	slo := SLO{TTFT: time.Second, TPOT: time.Second}
	var mu sync.Mutex
	meets := 0 // requests whose own TTFT and TPOT are within slo
	probe := StartJitterProbe()
	rep, err := Run(context.Background(), Config{
		Client: c, Source: &fixed{prompt: 100, out: 11}, Arrival: Arrival{Kind: Closed, Concurrency: 4},
		MaxRequests: 24, SLO: slo,
		OnResult: func(_ *workload.Request, res *Result) {
			tpot, _ := res.TPOT()
			mu.Lock()
			defer mu.Unlock()
			if res.Outcome == OK && res.TTFT > 0 && res.TTFT <= slo.TTFT && tpot <= slo.TPOT {
				meets++
			}
		},
	})
	starved := Starvation(probe())
	if err != nil {
		t.Fatal(err)
	}
	// Goodput counts exactly the requests that met the SLO, judged from
	// their own results: on an idle machine all 24 do, but a stall of a
	// second on a loaded one can push one past it, which is not a loadgen
	// error (the tight SLO below checks the other side).
	q := rep.Requests
	if q.Sent != 24 || q.OK != 24 || rep.Goodput != meets || rep.UsageRequests != 24 {
		t.Fatalf("requests %+v goodput %d (%d requests met the SLO) usage %d", q, rep.Goodput, meets, rep.UsageRequests)
	}
	if rep.PromptTokens != 24*100 || rep.OutputTokens != 24*11 || rep.CachedTokens != 24*25 || math.Abs(rep.CachedShare-0.25) > 1e-9 {
		t.Fatalf("tokens: prompt %d output %d cached %d share %v", rep.PromptTokens, rep.OutputTokens, rep.CachedTokens, rep.CachedShare)
	}
	// Lower bounds are exact: they hold however late the client reads a
	// chunk. Upper bounds leave room for a loaded, race-instrumented
	// machine, plus the CPU starvation the probe measured during the run.
	msf := func(d time.Duration) float64 { return float64(d) / 1e6 }
	if rep.TTFT.P50 < msf(ttft) || rep.TTFT.P50 > msf(ttft)+200+msf(starved) || rep.TTFT.Count != 24 {
		t.Errorf("TTFT p50 %.2f ms, want in [%.0f, %.0f + 200 + %.0f starved]", rep.TTFT.P50, msf(ttft), msf(ttft), msf(starved))
	}
	if rep.TPOT.P50 > msf(itl)+50+msf(starved) || rep.TPOT.Count != 24 {
		t.Errorf("TPOT p50 %.2f ms, want ≤ %.0f + 50 + %.0f starved", rep.TPOT.P50, msf(itl), msf(starved))
	}
	if rep.ITL.Count != 24*10 || rep.ITL.P50 > msf(itl)+50+msf(starved) {
		t.Errorf("ITL %+v, want 240 gaps, p50 ≤ %.0f + 50 + %.0f starved", rep.ITL, msf(itl), msf(starved))
	}
	// A single gap or TPOT is not bounded below: a first token read late
	// shrinks TPOT and the gap after it, and chunks read together are ~0
	// apart. But the last token leaves the server no earlier than
	// ttft + 10·itl after the request arrived, so TTFT plus the sum of a
	// request's gaps (its last token's arrival) is at least that, and so is
	// TTFT + 10·TPOT (its end); in the report's exact means, over 24
	// requests of 10 gaps each:
	floor := msf(ttft + 10*itl)
	if got := rep.TTFT.Mean + 10*rep.ITL.Mean; got < floor-1e-6 {
		t.Errorf("TTFT mean %.2f + 10 × ITL mean %.2f = %.2f ms, want ≥ %.0f (the server's last token)", rep.TTFT.Mean, rep.ITL.Mean, got, floor)
	}
	if got := rep.TTFT.Mean + 10*rep.TPOT.Mean; got < floor-1e-6 {
		t.Errorf("TTFT mean %.2f + 10 × TPOT mean %.2f = %.2f ms, want ≥ %.0f (the server's last token)", rep.TTFT.Mean, rep.TPOT.Mean, got, floor)
	}
	if e := msf(ttft + 10*itl); rep.E2E.P50 < e {
		t.Errorf("E2E p50 %.2f < %.2f", rep.E2E.P50, e)
	}
	if rep.RequestsPerS <= 0 || rep.OutputTokensPerS != float64(rep.OutputTokens)/rep.DurationS {
		t.Errorf("throughput %v req/s, %v tok/s", rep.RequestsPerS, rep.OutputTokensPerS)
	}
	// A TTFT bound below the server's TTFT leaves no goodput.
	rep2, err := Run(context.Background(), Config{
		Client: c, Source: &fixed{prompt: 10, out: 3}, Arrival: Arrival{Kind: Closed, Concurrency: 2},
		MaxRequests: 4, SLO: SLO{TTFT: ttft / 2},
	})
	if err != nil || rep2.Goodput != 0 || rep2.Requests.OK != 4 {
		t.Fatalf("goodput under a tight SLO: %+v, %v", rep2.Requests, err)
	}
}

func TestOutcomesAreCountedApart(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t)) // runs after the servers and clients close
	modes := []string{"", "429", "500", "hang", "cut", "errchunk", "", "429"}
	eng := llmclienttest.Start(t, &llmclienttest.Engine{Behave: func(r *http.Request, b *llmclient.APIRequest) string {
		return modes[len(tokens.Append(nil, b.Messages[0].Content))%len(modes)]
	}})
	c := testClient(t, eng.URL())
	// The timeout applies to every request (the client has no per-request
	// one), so it is long enough that a stalled OK or 429 on a loaded
	// machine is not counted as a timeout; only "hang" reaches it.
	c.Timeout = 2 * time.Second
	// Prompt sizes 1..16 words: each mode twice.
	src := &sized{}
	rep, err := Run(context.Background(), Config{Client: c, Source: src, Arrival: Arrival{Kind: Closed, Concurrency: 8}, MaxRequests: 16})
	if err != nil {
		t.Fatal(err)
	}
	want := Counts{Sent: 16, OK: 4, Rejected: 4, Timeouts: 2, Errors: 6}
	if rep.Requests != want {
		t.Fatalf("counts %+v, want %+v (errors %v)", rep.Requests, want, rep.Errors)
	}
	var sawCut, saw500, sawChunk bool
	for msg := range rep.Errors {
		sawCut = sawCut || strings.Contains(msg, "before data: [DONE]")
		saw500 = saw500 || strings.Contains(msg, "HTTP 500")
		sawChunk = sawChunk || strings.Contains(msg, "engine died")
	}
	if !sawCut || !saw500 || !sawChunk {
		t.Fatalf("error messages %v", rep.Errors)
	}
}

// sized sends prompts of 1, 2, 3, ... content words.
type sized struct{ i int }

func (s *sized) Timed() bool { return false }
func (s *sized) Next(time.Duration) (workload.Request, bool) {
	s.i++
	msgs := []tokens.Message{{Role: "user", Content: words.Words(uint64(s.i), s.i)}}
	return workload.Request{Messages: msgs, PromptTokens: s.i + 1, MaxTokens: 3}, true
}

func TestOpenLoopBounds(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t)) // runs after the servers and clients close
	eng := llmclienttest.Start(t, &llmclienttest.Engine{})
	c := testClient(t, eng.URL())
	rep, err := Run(context.Background(), Config{Client: c, Source: &fixed{prompt: 5, out: 2}, Arrival: Arrival{Kind: Poisson, Rate: 400}, MaxRequests: 50})
	if err != nil || rep.Requests.Sent != 50 || rep.Requests.OK != 50 || len(eng.Requests()) != 50 {
		t.Fatalf("count bound: %+v %v", rep.Requests, err)
	}
	start := time.Now()
	rep, err = Run(context.Background(), Config{Client: c, Source: &fixed{prompt: 5, out: 2}, Arrival: Arrival{Kind: Poisson, Rate: 100}, Duration: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// 30 expected (a Poisson count has sd ≈ 5.5); fewer if the machine
	// stalls the sender, never more.
	if n := rep.Requests.Sent; n < 1 || n > 55 || rep.Requests.OK != n {
		t.Fatalf("duration bound: %+v", rep.Requests)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("a 300 ms run took %v", el)
	}
	// Cancelling the context stops the run and cancels requests in flight.
	hang := llmclienttest.Start(t, &llmclienttest.Engine{Behave: func(*http.Request, *llmclient.APIRequest) string { return "hang" }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *Report)
	go func() {
		rep, _ := Run(ctx, Config{Client: testClient(t, hang.URL()), Source: &fixed{prompt: 5, out: 2}, Arrival: Arrival{Kind: Closed, Concurrency: 3}, MaxRequests: 100})
		done <- rep
	}()
	if err := envoyrun.Poll(context.Background(), 5*time.Second, 5*time.Millisecond, func() error {
		if n := len(hang.Requests()); n < 3 {
			return fmt.Errorf("%d of 3 requests reached the hanging engine", n)
		}
		return nil
	}); err != nil {
		cancel()
		<-done
		t.Fatal(err)
	}
	cancel()
	rep = <-done
	if !rep.Interrupted || rep.Requests.Cancelled != 3 || rep.Requests.Sent != 3 {
		t.Fatalf("cancelled run: %+v interrupted=%v", rep.Requests, rep.Interrupted)
	}
	for _, bad := range []Config{
		{Client: c, Source: &fixed{}, Arrival: Arrival{Kind: Poisson}},
		{Client: c, Source: &fixed{}, Arrival: Arrival{Kind: Closed}},
		{Client: c, Source: &fixed{}, Arrival: Arrival{Kind: Trace}, MaxRequests: 1},
		{Client: c, Source: &fixed{}, Arrival: Arrival{Kind: Poisson, Rate: 1}},
	} {
		if _, err := Run(context.Background(), bad); err == nil {
			t.Errorf("config %+v accepted", bad.Arrival)
		}
	}
}

func TestTraceReplaySendsTheTraceAtItsTimes(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t)) // runs after the servers and clients close
	rows, err := workload.LoadAzure(filepath.Join("..", "workload", "testdata", "azure_code_head.csv"))
	if err != nil {
		t.Fatal(err)
	}
	rows = rows[:60]
	src, _ := workload.NewAzure(rows, workload.AzureOptions{})
	eng := llmclienttest.Start(t, &llmclienttest.Engine{})
	c := testClient(t, eng.URL())
	span := rows[len(rows)-1].Time.Sub(rows[0].Time)
	speedup := span.Seconds() / 0.5            // replay in half a second
	sentAt := make([]time.Duration, len(rows)) // each index written once
	probe := StartJitterProbe()
	rep, err := Run(context.Background(), Config{Client: c, Source: src, Arrival: Arrival{Kind: Trace, Speedup: speedup},
		OnResult: func(req *workload.Request, res *Result) {
			sentAt[req.Index] = time.Duration(res.Sent.UnixNano())
		}})
	stall := time.Duration(probe().Max()) // the longest the scheduler ran late
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests.Sent != 60 || rep.Requests.OK != 60 {
		t.Fatalf("%+v", rep.Requests)
	}
	got := eng.Requests()
	bySize := map[[2]int]int{}
	for _, s := range got {
		msgs := []tokens.Message{{Role: "user", Content: s.Body.Messages[0].Content}}
		bySize[[2]int{tokens.CountChat(msgs), s.Body.MaxTokens}]++
		if !s.Body.Stream || !s.Body.StreamOptions.IncludeUsage || !s.Body.IgnoreEOS || s.Path != "/v1/chat/completions" {
			t.Fatalf("request body %+v path %s", s.Body, s.Path)
		}
	}
	for _, r := range rows {
		k := [2]int{r.ContextTokens, r.GeneratedTokens}
		if bySize[k] == 0 {
			t.Fatalf("trace row %v not sent", k)
		}
		bySize[k]--
	}
	// Each request is sent at its offset ÷ speedup, never before; how late
	// depends on the machine: the median is bounded loosely, for a loaded
	// race-instrumented run, plus the longest stall the probe measured (one
	// dispatcher sends every request, so a stall of the process delays all
	// those due during it, by at most its length: the dispatcher catches
	// up at once after it; the probe waits through the same stall). Its
	// longest stall, not its summed lateness: that adds up timer slack
	// (~0.1 s over this run under -race) and would hide a dispatcher slow
	// by tens of ms a request.
	for i, r := range rows {
		due := rep.Start.Add(time.Duration(float64(r.Time.Sub(rows[0].Time)) / speedup))
		if sent := time.Unix(0, int64(sentAt[i])); sent.Before(due) {
			t.Fatalf("row %d sent %v before its time", i, due.Sub(sent))
		}
	}
	t.Logf("send lag p50 %.3f ms p99 %.3f ms (longest stall %v)", rep.SendLag.P50, rep.SendLag.P99, stall)
	if limit := 250 + float64(stall)/1e6; rep.SendLag.P50 > limit {
		t.Errorf("median send lag %.1f ms, want ≤ 250 + %.1f ms longest stall", rep.SendLag.P50, float64(stall)/1e6)
	}
}

func TestMultiTurnSendsTheStreamedAnswerAndHeaders(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t)) // runs after the servers and clients close
	us := llmclienttest.Start(t, &llmclienttest.Engine{})
	eu := llmclienttest.Start(t, &llmclienttest.Engine{})
	mt, err := workload.NewMultiTurn(workload.MultiTurnOptions{
		SystemPrompts: 2, SystemPromptTokens: 20, Turns: workload.Range{Min: 3, Max: 3}, UserTokens: workload.Range{Min: 4, Max: 6},
		OutputTokens: workload.Range{Min: 3, Max: 5}, ThinkTime: 5 * time.Millisecond, SessionIDs: true,
		Priorities: []workload.Share{{Name: "high", Weight: 1}, {Name: "low", Weight: 1}},
		Regions:    []workload.RegionPhase{{Shares: []workload.Share{{Name: "us", Weight: 1}, {Name: "eu", Weight: 1}}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := testClient(t, us.URL())
	c.RegionURLs = map[string]string{"eu": eu.URL()}
	c.Headers = HeaderNames{Session: "x-conv", Priority: "x-prio", Region: "x-inferlb-source-region"}
	rep, err := Run(context.Background(), Config{Client: c, Source: mt, Arrival: Arrival{Kind: Closed, Concurrency: 3}, MaxRequests: 30})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests.OK != 30 || len(rep.Groups) != 4 || rep.Groups["region=eu"].Requests.OK+rep.Groups["region=us"].Requests.OK != 30 {
		t.Fatalf("%+v groups %v", rep.Requests, rep.Groups)
	}
	sessions := map[string][]llmclienttest.Seen{}
	for region, eng := range map[string]*llmclienttest.Engine{"us": us, "eu": eu} {
		for _, s := range eng.Requests() {
			if s.Header.Get("x-inferlb-source-region") != region || s.Header.Get("x-conv") == "" || s.Header.Get("x-prio") == "" {
				t.Fatalf("%s engine got headers %v", region, s.Header)
			}
			id := s.Header.Get("x-conv")
			sessions[id] = append(sessions[id], s)
		}
	}
	full := 0
	for id, turns := range sessions {
		// Order a session's turns by length; each must extend the one before
		// with exactly the answer the server streamed, then a user message.
		for i := 1; i < len(turns); i++ {
			for j := i; j > 0 && len(turns[j].Body.Messages) < len(turns[j-1].Body.Messages); j-- {
				turns[j], turns[j-1] = turns[j-1], turns[j]
			}
		}
		for k := 1; k < len(turns); k++ {
			prev, cur := turns[k-1].Body.Messages, turns[k].Body.Messages
			if len(cur) != len(prev)+2 || cur[len(prev)].Role != "assistant" || cur[len(prev)].Content != turns[k-1].Answer {
				t.Fatalf("session %s turn %d does not append the streamed answer %q: %+v", id, k+1, turns[k-1].Answer, cur)
			}
			for i := range prev {
				if cur[i] != prev[i] {
					t.Fatalf("session %s turn %d rewrote message %d", id, k+1, i)
				}
			}
		}
		if len(turns) == 3 {
			full++
		}
	}
	if full < 8 {
		t.Fatalf("only %d complete 3-turn sessions in 30 requests", full)
	}
}

func TestReportWriters(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t)) // runs after the servers and clients close
	eng := llmclienttest.Start(t, &llmclienttest.Engine{CachedShare: 0.5})
	c := testClient(t, eng.URL())
	var prog bytes.Buffer
	rep, err := Run(context.Background(), Config{Client: c, Source: &fixed{prompt: 10, out: 4}, Arrival: Arrival{Kind: Poisson, Rate: 200},
		MaxRequests: 20, SLO: SLO{TTFT: time.Second}, Progress: &prog, ProgressEvery: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(prog.String(), "loadgen") || !strings.Contains(prog.String(), "req/s") {
		t.Fatalf("progress %q", prog.String())
	}
	var js bytes.Buffer
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back map[string]any
	if err := json.Unmarshal(js.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"ttft", "tpot", "itl", "e2e", "requests", "goodput_requests_per_s", "cached_prompt_share", "send_lag"} {
		if _, ok := back[k]; !ok {
			t.Errorf("JSON report lacks %q: %s", k, js.String())
		}
	}
	var tab bytes.Buffer
	if err := rep.WriteTable(&tab); err != nil {
		t.Fatal(err)
	}
	for _, s := range []string{"TTFT (ms)", "TPOT (ms)", "20 sent, 20 ok", "prefix cache: 50.0%", "goodput"} {
		if !strings.Contains(tab.String(), s) {
			t.Errorf("table lacks %q:\n%s", s, tab.String())
		}
	}
}

// limited lets a multi-turn source start only n sessions.
type limited struct {
	*workload.MultiTurn
	n int
}

func (l *limited) Next(at time.Duration) (workload.Request, bool) {
	if l.n == 0 {
		return workload.Request{}, false
	}
	l.n--
	return l.MultiTurn.Next(at)
}

func TestOpenLoopSessionsFinishAfterTheLastStart(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	eng := llmclienttest.Start(t, &llmclienttest.Engine{})
	mt, err := workload.NewMultiTurn(workload.MultiTurnOptions{Turns: workload.Range{Min: 3, Max: 3}, SystemPromptTokens: 10,
		UserTokens: workload.Range{Min: 5, Max: 5}, OutputTokens: workload.Range{Min: 2, Max: 2}, ThinkTime: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(context.Background(), Config{Client: testClient(t, eng.URL()), Source: &limited{mt, 4}, Arrival: Arrival{Kind: Poisson, Rate: 500}, MaxRequests: 100})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Requests.Sent != 12 || rep.Requests.OK != 12 {
		t.Fatalf("4 sessions of 3 turns: %+v", rep.Requests)
	}
}

func TestTimeScaleRunsInTheTargetsTime(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	const ttft = 20 * time.Millisecond // real
	eng := llmclienttest.Start(t, &llmclienttest.Engine{TTFT: ttft})
	c := testClient(t, eng.URL())
	// The target runs 10× faster than real time: 20 ms real is 200 ms of its time.
	rep, err := Run(context.Background(), Config{Client: c, Source: &fixed{prompt: 5, out: 3}, Arrival: Arrival{Kind: Closed, Concurrency: 2},
		MaxRequests: 6, TimeScale: 0.1, SLO: SLO{TTFT: 150 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	if rep.TimeScale != 0.1 || rep.TTFT.P50 < 200 || rep.Goodput != 0 || rep.Requests.OK != 6 {
		t.Fatalf("time scale %v: TTFT p50 %.1f ms (want ≥ 200 in the target's time), goodput %d", rep.TimeScale, rep.TTFT.P50, rep.Goodput)
	}
	// Poisson at 2/s of the target's time for 20 s of it: 40 expected, in
	// 0.2 s real. Read as real time the run would take 20 s, so a bound of
	// 10 s tells the two apart with room for a starved machine.
	start := time.Now()
	rep, err = Run(context.Background(), Config{Client: c, Source: &fixed{prompt: 5, out: 3}, Arrival: Arrival{Kind: Poisson, Rate: 2},
		Duration: 20 * time.Second, TimeScale: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	if n := rep.Requests.Sent; n < 1 || n > 80 || time.Since(start) > 10*time.Second {
		t.Fatalf("sent %d in %v", n, time.Since(start))
	}
	if _, err := Run(context.Background(), Config{Client: c, Source: &fixed{}, Arrival: Arrival{Kind: Closed, Concurrency: 1}, MaxRequests: 1, TimeScale: -1}); err == nil {
		t.Fatal("negative time scale accepted")
	}
}
