package extproc_test

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/extproc"
	"github.com/inferlb/inferlb/internal/envoylb"
	"github.com/inferlb/inferlb/internal/envoytest"
)

func noLeaks(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	t.Cleanup(client.CloseIdleConnections)
}

// Every turn of a conversation lands on the same engine, whichever key the
// conversation has (session header, prompt_cache_key, user, stable prefix);
// 1,000 conversations spread over the engines in proportion to their EDS
// weights (chi-square).
func TestAffinityAndWeights(t *testing.T) {
	noLeaks(t)
	weights := []uint32{10, 20, 30}
	r := startRig(t, rigOptions{weights: weights})

	// Stickiness: 40 conversations of 4 growing turns, keyed four ways.
	for c := 0; c < 40; c++ {
		system := fmt.Sprintf("You are assistant number %d.", c%3) // shared system prompts
		msgs := []msg{{"system", system}, {"user", fmt.Sprintf("question %d about topic %d", c, c*7)}}
		var hdr map[string]string
		extra := map[string]any{}
		switch c % 4 {
		case 1:
			hdr = map[string]string{"x-session-id": fmt.Sprintf("sess-%d", c)}
		case 2:
			extra["prompt_cache_key"] = fmt.Sprintf("pck-%d", c)
		case 3:
			extra["user"] = fmt.Sprintf("user-%d", c)
		}
		first := ""
		for turn := 0; turn < 4; turn++ {
			res := r.post(chatMsgs("llama-3-8b", msgs, extra), hdr)
			if res.status != 200 {
				t.Fatalf("conversation %d turn %d: %d %s", c, turn, res.status, res.body)
			}
			if turn == 0 {
				first = res.engine
			} else if res.engine != first {
				t.Fatalf("conversation %d (key kind %d): turn %d on %s, turn 0 on %s", c, c%4, turn, res.engine, first)
			}
			msgs = append(msgs, msg{"assistant", "answer " + strconv.Itoa(turn)}, msg{"user", "follow-up " + strconv.Itoa(turn)})
		}
	}

	// Spread: 1,000 conversations, one request each.
	const n = 1000
	var mu sync.Mutex
	count := map[string]int{}
	parallel(n, 8, func(i int) {
		res := r.post(chat("You are helpful.", fmt.Sprintf("conversation %d: tell me about %d", i, i*31)), nil)
		mu.Lock()
		defer mu.Unlock()
		if res.status != 200 {
			t.Errorf("request %d: %d %s", i, res.status, res.body)
			return
		}
		count[res.engine]++
	})
	total := 0.0
	for _, w := range weights {
		total += float64(w)
	}
	chi2 := 0.0
	for i, w := range weights {
		exp := n * float64(w) / total
		got := float64(count[fmt.Sprintf("e%d", i)])
		chi2 += (got - exp) * (got - exp) / exp
		t.Logf("engine e%d weight %d: %d of %d (expected %.0f, share %.3f vs %.3f)", i, w, int(got), n, exp, got/n, float64(w)/total)
	}
	// Two degrees of freedom: P(χ² > 13.82) = 0.001.
	if chi2 > 13.82 {
		t.Fatalf("spread does not follow the EDS weights: chi-square %.2f > 13.82 (%v)", chi2, count)
	}
	t.Logf("chi-square %.2f (df 2, critical 13.82 at p=0.001)", chi2)
}

// With hash_balance_factor, a hot conversation key spills to other engines
// once its engine holds more than the bound of in-flight requests.
func TestHashBalanceFactorSpillsHotKey(t *testing.T) {
	noLeaks(t)
	for _, factor := range []uint32{0, 150} {
		t.Run(fmt.Sprintf("factor=%d", factor), func(t *testing.T) {
			r := startRig(t, rigOptions{balance: factor})
			hold := make(chan struct{})
			for _, e := range r.engines {
				e.mu.Lock()
				e.hold = hold
				e.mu.Unlock()
			}
			const n = 12
			arrived := func() int64 {
				var s int64
				for _, e := range r.engines {
					s += e.arrived.Load()
				}
				return s
			}
			var wg sync.WaitGroup
			results := make([]result, n)
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					results[i] = r.post(chat("sys", "hot"), map[string]string{"x-session-id": "hot-key"})
				}()
				// One at a time, so each pick sees the previous ones in flight.
				if err := envoytest.Poll(context.Background(), 10*time.Second, 2*time.Millisecond, func() error {
					if got := arrived(); got < int64(i+1) {
						return fmt.Errorf("%d of %d requests reached an engine", got, i+1)
					}
					return nil
				}); err != nil {
					close(hold)
					wg.Wait()
					t.Fatal(err)
				}
			}
			per := map[string]int64{}
			for _, e := range r.engines {
				per[e.id] = e.arrived.Load()
			}
			close(hold)
			wg.Wait()
			used := 0
			var most int64
			for _, c := range per {
				if c > 0 {
					used++
				}
				most = max(most, c)
			}
			t.Logf("hot key in flight per engine: %v", per)
			if factor == 0 && used != 1 {
				t.Fatalf("without a bound the hot key should stay on one engine: %v", per)
			}
			if factor > 0 {
				// Bound: 1.5 × the average in flight (n/3 at the end).
				if used < 2 || float64(most) > 1.5*float64(n)/3+1 {
					t.Fatalf("with hash_balance_factor %d the hot key should spill: %v", factor, per)
				}
			}
		})
	}
}

// Shedding at published fractions: lowest priority first, matching the
// fraction within ±2 points, the highest never shed while lower ones are,
// deterministic per conversation.
func TestShedding(t *testing.T) {
	noLeaks(t)
	cases := []struct {
		name     string
		fraction map[uint32]float64
		want     map[string]float64
	}{
		{"batch 40%", map[uint32]float64{2: 0.4}, map[string]float64{"interactive": 0, "standard": 0, "batch": 0.4}},
		{"batch all, standard 30%", map[uint32]float64{2: 1, 1: 0.3}, map[string]float64{"interactive": 0, "standard": 0.3, "batch": 1}},
		// An inconsistent policy (interactive shed while batch is mostly
		// admitted) is guarded: interactive is not shed.
		{"inconsistent", map[uint32]float64{0: 0.5, 2: 0.2}, map[string]float64{"interactive": 0, "standard": 0, "batch": 0.2}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r := startRig(t, rigOptions{policy: func(p *policyv1.RoutingPolicy) {
				p.Classes[0].ShedFractionByLevel = c.fraction
			}})
			for _, prio := range []string{"interactive", "standard", "batch"} {
				// Fractional shares need many conversations for ±2 points;
				// all-or-nothing ones are exact with fewer.
				n := 2500
				if w := c.want[prio]; w == 0 || w == 1 {
					n = 400
				}
				var mu sync.Mutex
				shed := 0
				parallel(n, 8, func(i int) {
					body := chat("You are helpful.", fmt.Sprintf("%s conversation %d", prio, i))
					res := r.post(body, map[string]string{"x-priority": prio})
					switch res.status {
					case 200:
					case 429:
						if res.header.Get("retry-after") == "" {
							t.Errorf("429 without Retry-After")
						}
						if _, typ, _ := openAIError(t, res.body); typ != "rate_limit_exceeded" {
							t.Errorf("429 type %q", typ)
						}
						mu.Lock()
						shed++
						mu.Unlock()
					default:
						t.Errorf("status %d: %s", res.status, res.body)
					}
				})
				got := float64(shed) / float64(n)
				t.Logf("%s: shed %.3f (published effective %.2f)", prio, got, c.want[prio])
				if math.Abs(got-c.want[prio]) > 0.02 {
					t.Fatalf("%s: shed fraction %.3f, want %.2f ± 0.02", prio, got, c.want[prio])
				}
			}
			// Deterministic per conversation: a later turn gets the same answer.
			for i := 0; i < 50; i++ {
				first := r.post(chat("You are helpful.", fmt.Sprintf("batch conversation %d", i)), map[string]string{"x-priority": "batch"})
				again := r.post(chatMsgs("llama-3-8b", []msg{{"system", "You are helpful."}, {"user", fmt.Sprintf("batch conversation %d", i)},
					{"assistant", "a"}, {"user", "more"}}, nil), map[string]string{"x-priority": "batch"})
				if first.status != again.status {
					t.Fatalf("conversation %d: turn 1 got %d, turn 2 got %d", i, first.status, again.status)
				}
			}
		})
	}
}

// Client-supplied internal headers change nothing: the request lands where
// it would without them, and the engine sees ext_proc's values.
func TestForgedHeadersChangeNothing(t *testing.T) {
	noLeaks(t)
	r := startRig(t, rigOptions{policy: func(p *policyv1.RoutingPolicy) {
		p.Classes[0].ShedFractionByLevel = map[uint32]float64{2: 1}
	}})
	forged := map[string]string{
		"x-inferlb-cluster":        "class-qwen",
		"x-inferlb-affinity-key":   "forged",
		"x-inferlb-class":          "qwen",
		"x-inferlb-priority-level": "0",
		"x-inferlb-source-region":  "mars",
		"x-envoy-max-retries":      "7",
	}
	for i := 0; i < 30; i++ {
		body := chat("sys", fmt.Sprintf("forgery %d", i))
		clean := r.post(body, nil)
		f := r.post(body, forged)
		if clean.status != 200 || f.status != 200 {
			t.Fatalf("status %d / %d: %s %s", clean.status, f.status, clean.body, f.body)
		}
		if f.engine != clean.engine {
			t.Fatalf("forged headers moved request %d from %s to %s", i, clean.engine, f.engine)
		}
		for k, v := range f.seen {
			if k == "x-inferlb-request-id" {
				continue // a fresh id per request
			}
			if clean.seen[k] != v {
				t.Fatalf("engine saw %s=%q with forged headers, %q without", k, v, clean.seen[k])
			}
		}
		if f.seen["x-inferlb-source-region"] != "eu-west" || f.seen["x-inferlb-class"] != "llama" || f.seen["x-inferlb-priority-level"] != "1" {
			t.Fatalf("engine saw %v", f.seen)
		}
		// Envoy adds its attempt count to responses only when a route asks
		// it to: retries stay invisible to clients.
		if f.header.Get("x-envoy-attempt-count") != "" || clean.header.Get("x-envoy-attempt-count") != "" {
			t.Fatal("Envoy's x-envoy-attempt-count reached the client")
		}
	}
	// ext_proc still learns which engine served each response (from
	// Envoy's request log, flushed every 200 ms), though no internal header
	// reaches the client.
	if err := envoytest.Poll(context.Background(), 5*time.Second, 20*time.Millisecond, func() error {
		if n := observedResponses(t, r.ext); n < 60 {
			return fmt.Errorf("ext_proc observed %v successful responses by engine, want all 60", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// A batch request stays shed even when it claims level 0.
	res := r.post(chat("sys", "batch forgery"), map[string]string{"x-priority": "batch", "x-inferlb-priority-level": "0"})
	if res.status != 429 {
		t.Fatalf("forged level admitted a shed priority: %d", res.status)
	}
}

// Malformed, oversized, unknown-model and other bad requests get the right
// status and a precise OpenAI-format message.
func TestBadRequests(t *testing.T) {
	noLeaks(t)
	const limit = 64 << 10
	r := startRig(t, rigOptions{bodyLimit: limit})
	big := chat("sys", strings.Repeat("word ", limit/5))
	cases := []struct {
		name      string
		path      string
		body      []byte
		hdr       map[string]string
		status    int
		msgSubstr string
	}{
		{"malformed", "/v1/chat/completions", []byte(`{"model":"llama-3-8b","messages":[{"role":"user","content":"hi"}`), nil, 400, "invalid JSON at byte"},
		{"not an object", "/v1/chat/completions", []byte(`["x"]`), nil, 400, "expected a JSON object"},
		{"missing messages", "/v1/chat/completions", []byte(`{"model":"llama-3-8b"}`), nil, 400, `field "messages": missing`},
		{"unknown model", "/v1/chat/completions", chatMsgs("gpt-7", []msg{{"user", "hi"}}, nil), nil, 404, `The model "gpt-7" does not exist`},
		{"unknown priority", "/v1/chat/completions", chat("s", "u"), map[string]string{"x-priority": "vip"}, 400, `Unknown priority "vip"`},
		{"residency", "/v1/chat/completions", chat("s", "u"), map[string]string{"x-data-residency": "us"}, 404, `not served in data-residency zone "us"`},
		{"unknown path", "/v1/chat", chat("s", "u"), nil, 404, "Unknown request URL: POST /v1/chat."},
		{"embeddings", "/v1/embeddings", []byte(`{"model":"llama-3-8b","input":"x"}`), nil, 404, "POST /v1/embeddings (embeddings) is not served through this load balancer"},
		{"responses", "/v1/responses", []byte(`{"model":"llama-3-8b","input":"x"}`), nil, 404, "POST /v1/responses (the Responses API) is not served"},
		{"models by POST", "/v1/models", []byte(`{}`), nil, 405, "Method POST not allowed for /v1/models; use GET."},
		{"oversized", "/v1/chat/completions", big, nil, 413, "exceeds the limit of 65536 bytes"},
	}
	for _, c := range cases {
		res := r.postPath(c.path, c.body, c.hdr)
		if res.status != c.status {
			t.Errorf("%s: status %d, want %d (%s)", c.name, res.status, c.status, res.body)
			continue
		}
		if ct := res.header.Get("content-type"); !strings.HasPrefix(ct, "application/json") {
			t.Errorf("%s: content-type %q", c.name, ct)
		}
		m, _, _ := openAIError(t, res.body)
		if !strings.Contains(m, c.msgSubstr) {
			t.Errorf("%s: message %q lacks %q", c.name, m, c.msgSubstr)
		}
	}
	// Chunked (no content-length) oversized body: Envoy's buffer limit.
	res := r.postChunked("/v1/chat/completions", big)
	if res.status != 413 {
		t.Fatalf("chunked oversized: %d %s", res.status, res.body)
	}
	if m, _, _ := openAIError(t, res.body); !strings.Contains(m, "exceeds the limit") {
		t.Fatalf("chunked oversized message %q", m)
	}
	// The other class's model goes to its own cluster.
	if res := r.post(chatMsgs("qwen-2-7b", []msg{{"user", "hi"}}, nil), nil); res.status != 200 || res.engine != "qwen0" {
		t.Fatalf("qwen request: %d %s %s", res.status, res.engine, res.body)
	}
}

// With ext_proc unreachable, fail-closed refuses every request and
// fail-open routes to the fallback cluster without letting forged internal
// headers through.
func TestExtProcDown(t *testing.T) {
	noLeaks(t)
	t.Run("fail-closed", func(t *testing.T) {
		r := startRig(t, rigOptions{variant: envoyconfigs.FailClosed, noExtProc: true})
		res := r.post(chat("s", "u"), nil)
		if res.status != 503 || res.header.Get("retry-after") == "" {
			t.Fatalf("fail-closed with ext_proc down: %d %s", res.status, res.body)
		}
		if _, _, code := openAIError(t, res.body); code != "no_routing_decision" {
			t.Fatalf("fail-closed error code %q", code)
		}
		for _, e := range r.engines {
			if e.arrived.Load() != 0 {
				t.Fatalf("a request reached engine %s", e.id)
			}
		}
		t.Logf("fail-closed answer: %d %s", res.status, res.body)
	})
	t.Run("fail-open", func(t *testing.T) {
		r := startRig(t, rigOptions{variant: envoyconfigs.FailOpen, noExtProc: true})
		for i := 0; i < 10; i++ {
			res := r.post(chat("s", "u"), map[string]string{"x-session-id": "s1", "x-inferlb-cluster": "class-qwen"})
			if res.status != 200 || !strings.HasPrefix(res.engine, "e") {
				t.Fatalf("fail-open with ext_proc down: %d %s %s", res.status, res.engine, res.body)
			}
			if len(res.seen) != 0 {
				t.Fatalf("forged headers reached the engine: %v", res.seen)
			}
		}
	})
}

// An engine failing half its requests shows up in the evidence reported to
// the control plane within a few report intervals (the control plane turns
// it into a penalty); a healthy engine shows no errors.
func TestEvidenceReports(t *testing.T) {
	noLeaks(t)
	// Retries on (budget 100%, one per request): clients get the retry's
	// answer, yet the failed attempts still count against the engine.
	r := startRig(t, rigOptions{reportInt: 50 * time.Millisecond, policy: func(p *policyv1.RoutingPolicy) {
		p.Classes[0].RetryBudgetFraction = 1
		p.Classes[0].MaxRetries = 1
	}})
	r.engines[0].mu.Lock()
	r.engines[0].failEvery = 2
	r.engines[0].mu.Unlock()
	start := time.Now()
	var clientErrors atomic.Int64
	parallel(300, 8, func(i int) {
		if res := r.post(chat("s", fmt.Sprintf("evidence %d", i)), nil); res.status != 200 {
			if clientErrors.Add(1) <= 3 {
				t.Logf("client error: %d %q %v", res.status, res.body, res.header)
			}
		}
	})
	// Without retries half of e0's third would fail (~50 of 300); with
	// them a client sees an error only when Envoy's re-picks for the retry
	// all land on e0 again. Which keys do is fixed by the Maglev table, so
	// by the engines' (ephemeral) ports: with 5 re-picks it was 0 to 10 of
	// 300 keys from run to run, hence this test's flakes. The bound is
	// exact: the keys the Envoy model sends back to e0.
	if n, stuck := clientErrors.Load(), stuckOnRetry(t, r, 0); n > int64(stuck) {
		t.Errorf("%d of 300 clients saw an error despite retries; Envoy's re-picks keep %d of e0's keys on e0", n, stuck)
	}
	t.Logf("clients seeing an error with retries on: %d of 300", clientErrors.Load())
	type ev struct{ resp, errs uint64 }
	var got map[string]ev
	var demand, shed uint64
	err := envoytest.Poll(context.Background(), 5*time.Second, 20*time.Millisecond, func() error {
		got = map[string]ev{}
		demand = 0
		for _, rep := range r.cp.Reports() {
			if rep.NodeId != nodeID || rep.Instance != "test" {
				return fmt.Errorf("report from %q/%q", rep.NodeId, rep.Instance)
			}
			for _, e := range rep.Engines {
				x := got[e.EngineId]
				x.resp += e.Responses
				x.errs += e.Errors
				got[e.EngineId] = x
			}
			for _, d := range rep.Demand {
				demand += d.Requests
				shed += d.Shed
			}
		}
		if demand < 300 {
			return fmt.Errorf("demand %d < 300", demand)
		}
		// Every attempt e0 saw is evidence exactly once: successes from
		// the response path, failures (retried or not) from the upstream log.
		e := r.engines[0]
		if e0 := got["e0"]; e0.resp != uint64(e.arrived.Load()+e.warmup) || e0.errs != uint64(e.failed.Load()) {
			return fmt.Errorf("e0 evidence %+v, engine saw %d attempts, %d failed", e0, e.arrived.Load()+e.warmup, e.failed.Load())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("evidence after %v: %v (demand %d)", time.Since(start), got, demand)
	bad := got["e0"]
	if bad.resp == 0 || math.Abs(float64(bad.errs)/float64(bad.resp)-0.5) > 0.1 {
		t.Fatalf("failing engine evidence %+v, want about half errors", bad)
	}
	for _, id := range []string{"e1", "e2"} {
		if got[id].errs != 0 {
			t.Fatalf("healthy engine %s reported errors: %+v", id, got[id])
		}
	}
}

// stuckOnRetry counts the distinct affinity keys engine i received whose
// retry Envoy sends back to i: every host-selection re-pick (the frontend
// bootstrap's host_selection_retry_max_attempts) lands on i again, in
// internal/envoylb's model of Envoy's Maglev (checked against Envoy there).
func stuckOnRetry(t *testing.T, r *rig, i int) int {
	t.Helper()
	var hosts []envoylb.Host
	for _, e := range r.engines {
		hosts = append(hosts, envoylb.Host{Key: e.addr(), Weight: 1, Healthy: true})
	}
	lb, err := envoylb.New(envoylb.Config{Policy: envoylb.Maglev}, hosts)
	if err != nil {
		t.Fatal(err)
	}
	e := r.engines[i]
	e.mu.Lock()
	keys := slices.Clone(e.keys)
	e.mu.Unlock()
	stuck := map[string]bool{}
	for _, k := range keys {
		h := envoylb.HeaderHash(k)
		if lb.Choose(h, nil, nil, 0) == i && lb.Choose(h, nil, func(x int) bool { return x == i }, envoyconfigs.HostSelectionRetryMaxAttempts) == i {
			stuck[k] = true
		}
	}
	return len(stuck)
}

// The local in-flight guardrail: with a class limit of 10, the least
// important priority is refused from 6 in flight (40% reserve), the most
// important only at 10; requests in flight include those streaming their
// response (until Envoy's request log reports their end).
func TestLocalInflightLimit(t *testing.T) {
	noLeaks(t)
	r := startRig(t, rigOptions{engines: 1, policy: func(p *policyv1.RoutingPolicy) {
		p.Classes[0].LocalInflightLimit = 10
	}})
	hold := make(chan struct{})
	e := r.engines[0]
	e.mu.Lock()
	e.hold = hold
	e.mu.Unlock()
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.post(chat("s", fmt.Sprintf("held %d", i)), map[string]string{"x-priority": "interactive"})
		}()
	}
	if err := envoytest.Poll(context.Background(), 10*time.Second, 20*time.Millisecond, func() error {
		if n := e.arrived.Load(); n < 8 {
			return fmt.Errorf("%d of 8 in flight", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if res := r.post(chat("s", "batch 9th"), map[string]string{"x-priority": "batch"}); res.status != 429 {
		t.Fatalf("batch at 8 in flight of 10: %d, want 429", res.status)
	}
	if m, _, _ := openAIError(t, r.post(chat("s", "batch 9th"), map[string]string{"x-priority": "batch"}).body); !strings.Contains(m, "Too many requests in flight") {
		t.Fatalf("message %q", m)
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		r.post(chat("s", "interactive 9th"), map[string]string{"x-priority": "interactive"})
	}()
	if err := envoytest.Poll(context.Background(), 10*time.Second, 20*time.Millisecond, func() error {
		if n := e.arrived.Load(); n < 9 {
			return fmt.Errorf("%d of 9 in flight", n)
		}
		return nil
	}); err != nil {
		t.Fatalf("interactive at 8 of 10 was not admitted: %v", err)
	}
	close(hold)
	wg.Wait()
	// Released: in flight drops back (streams closed) and batch is admitted.
	if err := envoytest.Poll(context.Background(), 5*time.Second, 20*time.Millisecond, func() error {
		if res := r.post(chat("s", "batch after"), map[string]string{"x-priority": "batch"}); res.status != 200 {
			return fmt.Errorf("status %d", res.status)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// observedResponses sums inferlb_extproc_upstream_responses_total over
// engines: responses whose serving engine ext_proc read from Envoy.
func observedResponses(t *testing.T, s *extproc.Server) float64 {
	t.Helper()
	return counterValue(t, s, "inferlb_extproc_upstream_responses_total")
}
