package enginesim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/api/headers"
	"github.com/inferlb/inferlb/internal/tokens"
	"github.com/inferlb/inferlb/tools/loadgen"
	"github.com/lni/goutils/leaktest"
)

func TestStreamingChatSSE(t *testing.T) {
	defer leaktest.AfterTest(t)()
	s := start(t, Options{TimeScale: 0.2})
	defer s.Close()
	res := streamChat(t, s, chatBody("m", "be brief", "hello there engine", 7, true), nil)
	if !res.done {
		t.Fatal("no [DONE]")
	}
	// role chunk, 7 token chunks, usage chunk
	if len(res.chunks) != 9 {
		t.Fatalf("%d chunks, want 9", len(res.chunks))
	}
	first := res.chunks[0]
	if first.Object != "chat.completion.chunk" || first.Model != "m" || !strings.HasPrefix(first.ID, "chatcmpl-") ||
		first.Choices[0].Delta == nil || first.Choices[0].Delta.Role != "assistant" {
		t.Errorf("first chunk %+v", first)
	}
	for i, c := range res.chunks {
		if c.ID != first.ID {
			t.Errorf("chunk %d id %q != %q", i, c.ID, first.ID)
		}
		fr := c.Choices
		if i >= 1 && i < 7 && (len(fr) != 1 || fr[0].FinishReason != nil) {
			t.Errorf("chunk %d: finish reason before the end", i)
		}
	}
	if res.finish != "length" {
		t.Errorf("finish %q", res.finish)
	}
	if got := tokens.Count(res.content); got != 7 {
		t.Errorf("content %q has %d tokens, want 7", res.content, got)
	}
	u := res.chunks[8].Usage
	if u == nil || len(res.chunks[8].Choices) != 0 {
		t.Fatalf("last chunk is not a usage chunk: %+v", res.chunks[8])
	}
	wantPrompt := tokens.CountChat([]tokens.Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hello there engine"}})
	if u.PromptTokens != wantPrompt || u.CompletionTokens != 7 || u.TotalTokens != wantPrompt+7 {
		t.Errorf("usage %+v, want prompt %d", u, wantPrompt)
	}
	// Deterministic text: the same request gives the same words.
	again := streamChat(t, s, chatBody("m", "be brief", "hello there engine", 7, true), nil)
	if again.content != res.content {
		t.Errorf("text differs: %q vs %q", again.content, res.content)
	}
}

func TestNonStreamingAndCompletions(t *testing.T) {
	defer leaktest.AfterTest(t)()
	s := start(t, Options{TimeScale: 0.2, DefaultMaxTokens: 5})
	defer s.Close()
	resp, _ := post(t, context.Background(), s.URL()+"/v1/chat/completions", chatBody("m", "sys", "user words", 0, false), nil)
	var cr struct {
		Object  string `json:"object"`
		Choices []struct {
			Message      struct{ Role, Content string } `json:"message"`
			FinishReason string                         `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	decode(t, resp, 200, &cr)
	if cr.Object != "chat.completion" || cr.Choices[0].Message.Role != "assistant" ||
		tokens.Count(cr.Choices[0].Message.Content) != 5 || cr.Choices[0].FinishReason != "stop" || cr.Usage.CompletionTokens != 5 {
		t.Errorf("default-length chat response %+v", cr)
	}

	body := []byte(`{"model":"m","prompt":"one two three four","max_tokens":3}`)
	resp, _ = post(t, context.Background(), s.URL()+"/v1/completions", body, nil)
	var co struct {
		Object  string `json:"object"`
		Choices []struct {
			Text         string `json:"text"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	decode(t, resp, 200, &co)
	if co.Object != "text_completion" || tokens.Count(co.Choices[0].Text) != 3 || co.Choices[0].FinishReason != "length" || co.Usage.PromptTokens != 4 {
		t.Errorf("completion %+v", co)
	}

	body = []byte(`{"model":"m","prompt":"one two three four","max_tokens":4,"stream":true}`)
	resp, t0 := post(t, context.Background(), s.URL()+"/v1/completions", body, nil)
	res := readSSE(t, resp.Body, t0)
	resp.Body.Close()
	if !res.done || len(res.chunks) != 4 || res.chunks[0].Object != "text_completion" || res.finish != "length" || tokens.Count(res.content) != 4 {
		t.Errorf("completion stream: %d chunks, finish %q, content %q", len(res.chunks), res.finish, res.content)
	}

	resp, err := http.Get(s.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var ml struct {
		Object string `json:"object"`
		Data   []struct {
			ID          string `json:"id"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	decode(t, resp, 200, &ml)
	if ml.Object != "list" || len(ml.Data) != 1 || ml.Data[0].ID != "m" || ml.Data[0].MaxModelLen != 4096 {
		t.Errorf("models %+v", ml)
	}
}

func decode(t *testing.T, resp *http.Response, status int, v any) {
	t.Helper()
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d: %s", resp.StatusCode, status, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%v: %s", err, b)
	}
}

func TestErrors(t *testing.T) {
	defer leaktest.AfterTest(t)()
	s := start(t, Options{TimeScale: 0.2, MaxBodyBytes: 64 << 10})
	defer s.Close()
	long := text("w", 5000)
	cases := []struct {
		name, path string
		body       []byte
		status     int
		typ, msg   string
	}{
		{"malformed", "/v1/chat/completions", []byte(`{"model":"m","messages":[`), 400, "BadRequestError", "invalid JSON"},
		{"not an object", "/v1/completions", []byte(`[1,2]`), 400, "BadRequestError", "invalid JSON"},
		{"unknown model", "/v1/chat/completions", chatBody("gpt-9", "a", "b", 3, false), 404, "NotFoundError", "The model `gpt-9` does not exist."},
		{"too long", "/v1/chat/completions", chatBody("m", "a", text("w", 4000), 200, false), 400, "BadRequestError", "maximum context length is 4096 tokens"},
		{"too large", "/v1/chat/completions", chatBody("m", "a", long+long+long, 3, false), 413, "RequestEntityTooLarge", "larger than 65536 bytes"},
		{"no messages", "/v1/chat/completions", []byte(`{"model":"m"}`), 400, "BadRequestError", "messages: field required"},
		{"bad max_tokens", "/v1/completions", []byte(`{"model":"m","prompt":"a","max_tokens":0}`), 400, "BadRequestError", "max_tokens: must be at least 1"},
		{"n>1", "/v1/completions", []byte(`{"model":"m","prompt":"a","n":2}`), 400, "BadRequestError", "n=2"},
		{"image part", "/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]}`), 400, "BadRequestError", "only text parts"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, _ := post(t, context.Background(), s.URL()+c.path, c.body, nil)
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Code    int    `json:"code"`
				} `json:"error"`
			}
			decode(t, resp, c.status, &e)
			if e.Error.Type != c.typ || e.Error.Code != c.status || !strings.Contains(e.Error.Message, c.msg) {
				t.Errorf("error %+v, want type %s containing %q", e.Error, c.typ, c.msg)
			}
		})
	}
}

// TestPrefixCacheAcrossTurns: each turn of a conversation repeats the last
// one's prompt and answer, so cached_tokens rises, and the cache metrics
// follow. The answer's KV is cached too (as vLLM keeps generated tokens'):
// a turn finds the whole previous turn cached, in full blocks.
func TestPrefixCacheAcrossTurns(t *testing.T) {
	defer leaktest.AfterTest(t)()
	s := start(t, Options{TimeScale: 0.2})
	defer s.Close()
	msgs := []map[string]any{{"role": "system", "content": text("sys", 100)}}
	var cached, prompts []int
	hits := 0
	queries := 0
	const answer = 20 // tokens: every answer crosses a block boundary
	for turn := range 4 {
		msgs = append(msgs, map[string]any{"role": "user", "content": text("q"+string(rune('a'+turn)), 40)})
		b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "max_tokens": answer, "stream": true,
			"stream_options": map[string]any{"include_usage": true}})
		res := streamChat(t, s, b, nil)
		u := res.chunks[len(res.chunks)-1].Usage
		cached = append(cached, u.PromptTokensDetails.CachedTokens)
		prompts = append(prompts, u.PromptTokens)
		hits += u.PromptTokensDetails.CachedTokens
		queries += u.PromptTokens
		msgs = append(msgs, map[string]any{"role": "assistant", "content": res.content})
	}
	if cached[0] != 0 {
		t.Errorf("first turn cached %d", cached[0])
	}
	for i := 1; i < len(cached); i++ {
		if cached[i] <= cached[i-1] {
			t.Errorf("cached tokens did not rise: %v", cached)
		}
		// The previous prompt, the assistant's role marker and its answer.
		if want := (prompts[i-1] + 1 + answer) / 16 * 16; cached[i] != want {
			t.Errorf("turn %d cached %d tokens, want %d (turn %d's %d prompt tokens and its answer, in whole blocks)",
				i, cached[i], want, i-1, prompts[i-1])
		}
	}
	mf := scrape(t, s)
	if got := value(t, mf, "vllm:prefix_cache_hits_total", nil); got != float64(hits) {
		t.Errorf("prefix_cache_hits_total %v, want %d", got, hits)
	}
	if got := value(t, mf, "vllm:prefix_cache_queries_total", nil); got != float64(queries) {
		t.Errorf("prefix_cache_queries_total %v, want %d", got, queries)
	}
}

// TestTTFTFollowsProfile: idle, TTFT is overhead + one prefill step; with B
// sequences decoding it is overhead + the rest of the step in flight + a
// step with B decodes and the prefill. Tolerance: the client-side TTFT (the
// fastest of three probes) may exceed the prediction by up to 30 ms (HTTP,
// timers, a loaded machine) and fall short by at most 2 ms.
func TestTTFTFollowsProfile(t *testing.T) {
	defer leaktest.AfterTest(t)()
	s := start(t, Options{TimeScale: 1})
	defer s.Close()
	cfg := ConfigFromProfile(testProfile)
	const L = 500 // prompt words: prompt is L+2 tokens
	// Noise (HTTP, timers, other processes) only adds latency, so the
	// fastest of three probes estimates the model's TTFT.
	// The upper bound also grows by the CPU starvation measured while the
	// probes ran (a starved machine delays even the fastest of three).
	probe := func(k int) (best, starved time.Duration) {
		stop := loadgen.StartJitterProbe()
		best = time.Hour
		for i := range 3 {
			res := streamChat(t, s, chatBody("m", "probe", text(fmt.Sprintf("p%d_%d_", k, i), L), 2, true), nil)
			best = min(best, res.firstTok)
		}
		return best, loadgen.Starvation(stop())
	}
	overhead := cfg.Overhead()
	idleWant := overhead + cfg.StepDuration(0, L+2)
	const slack, under = 30 * time.Millisecond, 2 * time.Millisecond
	idle, starved := probe(0)
	if idle < idleWant-under || idle > idleWant+slack+starved {
		t.Errorf("idle TTFT %v, want %v (+%v, +%v starved)", idle, idleWant, slack, starved)
	}

	// Load: B long streams decoding.
	const B = 40
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var started sync.WaitGroup
	started.Add(B)
	for i := range B {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "POST", s.URL()+"/v1/chat/completions",
				bytes.NewReader(chatBody("m", "load", text("l"+string(rune('a'+i%26))+string(rune('a'+i/26)), 10), 2000, true)))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				started.Done()
				return
			}
			defer resp.Body.Close()
			buf := make([]byte, 4096)
			once := false
			for {
				if _, err := resp.Body.Read(buf); err != nil {
					if !once {
						started.Done()
					}
					return
				}
				if !once && bytes.Contains(buf, []byte(`"content":"`)) && !bytes.Contains(buf, []byte(`"content":""`)) {
					once = true
					started.Done()
				}
			}
		}()
	}
	started.Wait()
	eventually(t, 5*time.Second, "40 running", func() bool { st := s.Stats(); return st.Running == B && st.Waiting == 0 })
	step := cfg.StepDuration(B, 0)
	loadLo := overhead + cfg.StepDuration(B, L+2)
	loadHi := loadLo + step
	got, starved := probe(1)
	// The lower bound is also what says "slower under load": loadLo is
	// about twice the model's idle TTFT. (Comparing with the idle probe
	// instead would compare two wall-clock probes by the machine's noise.)
	if got < loadLo-under || got > loadHi+slack+starved {
		t.Errorf("TTFT under load %v, want in [%v, %v] (+%v, +%v starved; idle: model %v, probe %v)",
			got, loadLo, loadHi, slack, starved, idleWant, idle)
	}
	cancel()
	wg.Wait()
	eventually(t, 5*time.Second, "load aborted", func() bool { return s.Stats().Running == 0 })
	mf := scrape(t, s)
	if got := value(t, mf, "vllm:request_success_total", map[string]string{"finished_reason": "abort"}); got != B {
		t.Errorf("aborted requests %v, want %d", got, B)
	}
}

// TestMetricsMatchRequests sends known requests and checks every counter and
// histogram count, parsing /metrics with expfmt.
func TestMetricsMatchRequests(t *testing.T) {
	defer leaktest.AfterTest(t)()
	s := start(t, Options{TimeScale: 0.1})
	defer s.Close()
	var wg sync.WaitGroup
	prompts, gen := 0, 0
	const n = 12
	var mu sync.Mutex
	cachedSum := 0
	for i := range n {
		words, maxTok := 20+7*i, 3+i
		prompts += words + 3
		gen += maxTok
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := streamChat(t, s, chatBody("m", "x", text("k"+string(rune('a'+i)), words), maxTok, true), nil)
			mu.Lock()
			cachedSum += res.chunks[len(res.chunks)-1].Usage.PromptTokensDetails.CachedTokens
			mu.Unlock()
		}()
	}
	wg.Wait()
	mf := scrape(t, s)
	checks := []struct {
		name string
		want float64
		l    map[string]string
	}{
		{"vllm:prompt_tokens_total", float64(prompts), nil},
		{"vllm:generation_tokens_total", float64(gen), nil},
		{"vllm:prefix_cache_queries_total", float64(prompts), nil},
		{"vllm:prefix_cache_hits_total", float64(cachedSum), nil},
		{"vllm:request_success_total", n, map[string]string{"finished_reason": "length"}},
		{"vllm:request_success_total", 0, map[string]string{"finished_reason": "abort"}},
		{"vllm:time_to_first_token_seconds", n, nil},
		{"vllm:inter_token_latency_seconds", float64(gen - n), nil},
		{"vllm:e2e_request_latency_seconds", n, nil},
		{"vllm:request_queue_time_seconds", n, nil},
		{"vllm:num_requests_running", 0, nil},
		{"vllm:num_requests_waiting", 0, nil},
		{"vllm:kv_cache_usage_perc", 0, nil},
		{"vllm:cache_config_info", 1, map[string]string{"block_size": "16", "num_gpu_blocks": "12500"}},
	}
	for _, c := range checks {
		if got := value(t, mf, c.name, c.l); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.l, got, c.want)
		}
	}
	// vLLM's bucket boundaries and a TTFT sum within the profile's range.
	for name, want := range map[string][]float64{
		"vllm:time_to_first_token_seconds": ttftBuckets,
		"vllm:inter_token_latency_seconds": itlBuckets,
		"vllm:e2e_request_latency_seconds": requestLatencyBuckets,
		"vllm:request_queue_time_seconds":  requestLatencyBuckets,
	} {
		h := mf[name].Metric[0].Histogram
		if n := len(h.Bucket); n > 0 && h.Bucket[n-1].GetUpperBound() > 1e300 {
			h.Bucket = h.Bucket[:n-1] // +Inf
		}
		if len(h.Bucket) != len(want) {
			t.Fatalf("%s: %d buckets, want %d", name, len(h.Bucket), len(want))
		}
		for i, b := range h.Bucket {
			if b.GetUpperBound() != want[i] {
				t.Errorf("%s bucket %d = %v, want %v", name, i, b.GetUpperBound(), want[i])
			}
		}
	}
	// In real time: the simulated TTFT (within the profile's range) × the
	// time scale, 0.1.
	h := mf["vllm:time_to_first_token_seconds"].Metric[0].Histogram
	if mean := h.GetSampleSum() / float64(h.GetSampleCount()); mean < 0.1*0.03 || mean > 0.1*0.5 {
		t.Errorf("mean TTFT %v real s outside the profile's range at time scale 0.1", mean)
	}

	// Gauges while requests run.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, _ := post(t, ctx, s.URL()+"/v1/chat/completions", chatBody("m", "x", text("g", 300), 1000, true), nil)
	defer resp.Body.Close()
	eventually(t, 5*time.Second, "one running", func() bool { return s.Stats().Running == 1 })
	mf = scrape(t, s)
	if got := value(t, mf, "vllm:num_requests_running", nil); got != 1 {
		t.Errorf("running %v", got)
	}
	// 302 + 1000 tokens reserved: 82 of 12500 blocks.
	if got := value(t, mf, "vllm:kv_cache_usage_perc", nil); got != 82.0/12500 {
		t.Errorf("kv usage %v, want %v", got, 82.0/12500)
	}
}

func TestFaults(t *testing.T) {
	defer leaktest.AfterTest(t)()
	s := start(t, Options{TimeScale: 0.2, Seed: 7})
	defer s.Close()
	// Faults are on an admin listener of their own, not on the API port.
	adminURL, stopAdmin, err := ServeAdmin(context.Background(), "127.0.0.1:0", []*Server{s})
	if err != nil {
		t.Fatal(err)
	}
	defer stopAdmin()
	adminURL = "http://" + adminURL
	for _, m := range []string{http.MethodGet, http.MethodPost, http.MethodDelete} {
		req, _ := http.NewRequest(m, s.URL()+"/admin/faults", strings.NewReader(`{"crash":true}`))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 404 {
			t.Fatalf("%s /admin/faults on the API port: %d, want 404", m, resp.StatusCode)
		}
	}
	admin := func(body string) (int, string) {
		resp, err := http.Post(adminURL+"/admin/faults", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	status := func(body []byte) int {
		resp, _ := post(t, context.Background(), s.URL()+"/v1/chat/completions", body, nil)
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode
	}

	t.Run("validation", func(t *testing.T) {
		for _, b := range []string{`{"error_rate":1.5}`, `{"slowdown":0}`, `{"hang":"yes"}`, `{"bogus":1}`, `{"restart_after_s":1}`} {
			if code, msg := admin(b); code != 400 {
				t.Errorf("%s: status %d %s", b, code, msg)
			}
		}
	})

	t.Run("error_rate", func(t *testing.T) {
		if code, msg := admin(`{"error_rate":0.5}`); code != 200 {
			t.Fatalf("%d %s", code, msg)
		}
		fails := 0
		for i := range 40 {
			if status(chatBody("m", "e", text("e", i+1), 1, false)) == 500 {
				fails++
			}
		}
		if fails < 10 || fails > 30 {
			t.Errorf("%d of 40 failed at error_rate 0.5", fails)
		}
		resp, _ := http.Get(adminURL + "/admin/engines/" + s.ID() + "/faults")
		var f Faults
		decode(t, resp, 200, &f)
		if f.ErrorRate != 0.5 || f.Slowdown != 1 {
			t.Errorf("GET faults %+v", f)
		}
		admin(`{}`)
		for range 10 {
			if c := status(chatBody("m", "e", "ok", 1, false)); c != 200 {
				t.Fatalf("status %d after clearing", c)
			}
		}
	})

	t.Run("slowdown", func(t *testing.T) {
		// Distinct prompts: nothing is cached, so every request prefills alike.
		body := func(i int) []byte { return chatBody("m", "s"+strconv.Itoa(i), text("s"+strconv.Itoa(i), 300), 2, true) }
		// ttftSum is the engine's own TTFT histogram sum: model time, so it
		// does not move with the machine's load the way wall time does.
		ttftSum := func() float64 {
			return scrape(t, s)["vllm:time_to_first_token_seconds"].Metric[0].Histogram.GetSampleSum()
		}
		sum0 := ttftSum()
		base := min(streamChat(t, s, body(0), nil).firstTok, streamChat(t, s, body(1), nil).firstTok)
		sum1 := ttftSum()
		admin(`{"slowdown":4}`)
		slow := min(streamChat(t, s, body(2), nil).firstTok, streamChat(t, s, body(3), nil).firstTok)
		sum2 := ttftSum()
		admin(`{}`)
		// Every step takes 4× and nothing queues; the per-request overhead
		// (the API server's, before the scheduler) is not slowed.
		ov := 2 * s.real(time.Duration(testProfile.OverheadMs*float64(time.Millisecond))).Seconds()
		if r := (sum2 - sum1 - ov) / (sum1 - sum0 - ov); math.Abs(r-4) > 0.01 {
			t.Errorf("engine TTFT with slowdown 4: %.4fs, without: %.4fs, overhead %.4fs: steps %.3f× slower, want 4×",
				sum2-sum1, sum1-sum0, ov, r)
		}
		// The client sees it too: its first token cannot come before the
		// engine's (slowed) model time, however loaded the machine is; wall
		// time only adds. The two slow requests' model TTFTs are equal to
		// within a token or two of prompt.
		if want := time.Duration(0.95 * (sum2 - sum1) / 2 * float64(time.Second)); slow < want {
			t.Errorf("client TTFT with slowdown 4: %v, before the engine's own %v (without: %v)", slow, want, base)
		}
	})

	t.Run("hang", func(t *testing.T) {
		admin(`{"hang":true}`)
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "POST", s.URL()+"/v1/chat/completions", bytes.NewReader(chatBody("m", "h", "hang", 2, false)))
		_, err := http.DefaultClient.Do(req)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("hung engine answered: %v", err)
		}
		eventually(t, 2*time.Second, "hung request aborted", func() bool { st := s.Stats(); return st.Running+st.Waiting+st.Pending == 0 })
		// A request sent while hung completes once the hang is cleared.
		done := make(chan int, 1)
		go func() { done <- status(chatBody("m", "h", "later", 2, false)) }()
		eventually(t, 2*time.Second, "request queued", func() bool { return s.Stats().Waiting == 1 })
		admin(`{}`)
		if c := <-done; c != 200 {
			t.Errorf("status %d after the hang cleared", c)
		}
	})

	t.Run("health_fail", func(t *testing.T) {
		get := func() int {
			resp, err := http.Get(s.URL() + "/health")
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		if c := get(); c != 200 {
			t.Fatalf("health %d", c)
		}
		admin(`{"health_fail":true}`)
		if c := get(); c != 503 {
			t.Errorf("health %d with health_fail", c)
		}
		admin(`{}`)
		if c := get(); c != 200 {
			t.Errorf("health %d after clearing", c)
		}
	})

	t.Run("crash", func(t *testing.T) {
		// A stream in flight drops when the engine crashes.
		resp, t0 := post(t, context.Background(), s.URL()+"/v1/chat/completions", chatBody("m", "c", "crash me", 2000, true), nil)
		errc := make(chan error, 1)
		go func() {
			_, err := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			errc <- err
		}()
		_ = t0
		eventually(t, 2*time.Second, "stream running", func() bool { return s.Stats().Running == 1 })
		if code, _ := admin(`{"crash":true}`); code != 200 {
			t.Fatalf("crash status %d", code)
		}
		if err := <-errc; err == nil {
			t.Error("stream ended cleanly across a crash")
		}
		// The one stream was in flight at the crash (health checks and
		// scrapes are not completions).
		if n := s.CutAtCrash(); n != 1 {
			t.Errorf("CutAtCrash %d after crashing with one stream in flight, want 1", n)
		}
		if _, err := http.Get(s.URL() + "/health"); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("health after crash: %v, want connection refused", err)
		}
		if !s.Faults().Crash {
			t.Error("Faults().Crash false after crash")
		}
		if err := s.Restart(); err != nil {
			t.Fatal(err)
		}
		if c := status(chatBody("m", "c", "back", 2, false)); c != 200 {
			t.Errorf("status %d after restart", c)
		}
		// restart_after_s brings it back by itself (0.5 simulated s = 100 ms).
		admin(`{"crash":true,"restart_after_s":0.5}`)
		eventually(t, 5*time.Second, "automatic restart", func() bool {
			resp, err := http.Get(s.URL() + "/health")
			if err != nil {
				return false
			}
			resp.Body.Close()
			return resp.StatusCode == 200
		})
	})
}

// TestErrorRateDeterministic: the same seed fails the same requests.
func TestErrorRateDeterministic(t *testing.T) {
	defer leaktest.AfterTest(t)()
	pattern := func() string {
		s := start(t, Options{TimeScale: 0.1, Seed: 42})
		defer s.Close()
		if err := s.SetFaults(Faults{ErrorRate: 0.3}); err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for range 20 {
			resp, _ := post(t, context.Background(), s.URL()+"/v1/completions", []byte(`{"model":"m","prompt":"x","max_tokens":1}`), nil)
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 500 {
				b.WriteByte('x')
			} else {
				b.WriteByte('.')
			}
		}
		return b.String()
	}
	a, b := pattern(), pattern()
	if a != b || !strings.Contains(a, "x") {
		t.Errorf("patterns %q and %q", a, b)
	}
}

// TestFleetAndNetworkDelay starts the example fleet on ephemeral ports and
// checks the round-trip delay from the source-region header.
func TestFleetAndNetworkDelay(t *testing.T) {
	defer leaktest.AfterTest(t)()
	spec, err := fleet.Load(filepath.Join("..", "..", "examples", "fleet-3region.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	fl, err := StartFleet(context.Background(), spec, FleetOptions{AnyPort: true, TimeScale: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Engines: []string{"us-east-h100-1", "eu-west-a100-1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	if len(fl.Servers()) != 2 || fl.Server("eu-west-a100-1") == nil || fl.Server("nope") != nil {
		t.Fatalf("servers %v", fl.Servers())
	}
	s := fl.Server("us-east-h100-1")
	body := func(i int) []byte { return chatBody("llama-3.1-8b", "n", text("n"+string(rune('a'+i)), 20), 1, true) }
	// The fastest of three TTFTs, to see through scheduling noise.
	ttft := func(k int, hdr map[string]string) time.Duration {
		best := time.Hour
		for i := range 3 {
			best = min(best, streamChat(t, s, body(3*k+i), hdr).firstTok)
		}
		return best
	}
	stop := loadgen.StartJitterProbe()
	none := ttft(0, nil)
	local := ttft(1, map[string]string{headers.SourceRegion: "us-east"})
	far := ttft(2, map[string]string{headers.SourceRegion: "us-west"})
	starved := loadgen.Starvation(stop()) // widens the bounds on a starved machine
	// us-west → us-east is 70 ms; same region 1 ms.
	if far < none+60*time.Millisecond-starved || far > none+100*time.Millisecond+starved {
		t.Errorf("TTFT from us-west %v, without header %v: want about +70 ms (+%v starved)", far, none, starved)
	}
	if local > none+25*time.Millisecond+starved {
		t.Errorf("TTFT from us-east %v, without header %v (+%v starved)", local, none, starved)
	}
	resp, _ := post(t, context.Background(), s.URL()+"/v1/chat/completions", body(20), map[string]string{headers.SourceRegion: "mars"})
	var e struct{ Error struct{ Message string } }
	decode(t, resp, 400, &e)
	if !strings.Contains(e.Error.Message, `unknown region "mars"`) {
		t.Errorf("unknown region error %q", e.Error.Message)
	}
	// The requests by their source region: 3 without a header, 3 from
	// us-east, 3 from us-west, the refused one from mars.
	got := map[string]float64{}
	for _, m := range scrape(t, s)[SourceRegionMetric].GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["engine_region"] != "us-east" || labels["model_name"] != "llama-3.1-8b" {
			t.Errorf("%s labels %v", SourceRegionMetric, labels)
		}
		got[labels["source_region"]] = m.GetCounter().GetValue()
	}
	if want := map[string]float64{"none": 3, "us-east": 3, "us-west": 3, "mars": 1}; !maps.Equal(got, want) {
		t.Errorf("%s by source region %v, want %v", SourceRegionMetric, got, want)
	}
	if _, err := StartFleet(context.Background(), spec, FleetOptions{AnyPort: true, Engines: []string{"nope"}}); err == nil {
		t.Error("unknown engine id accepted")
	}
}

// TestOpenAIPythonClient streams with the official OpenAI Python client.
func TestOpenAIPythonClient(t *testing.T) {
	defer leaktest.AfterTest(t)()
	venv := os.Getenv("INFERLB_VENV")
	if venv == "" {
		venv = "/work/main/.venv"
	}
	py := filepath.Join(venv, "bin", "python")
	if _, err := os.Stat(py); err != nil {
		t.Skipf("no Python virtual environment at %s (run scripts/setup.sh, or make test): %v", venv, err)
	}
	s := start(t, Options{TimeScale: 0.1})
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, filepath.Join("..", "..", "test", "python", "openai_stream.py"), s.URL())
	cmd.Env = append(os.Environ(), "NO_PROXY=127.0.0.1", "no_proxy=127.0.0.1")
	out, err := cmd.Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("%v: %s", err, ee.Stderr)
		}
		t.Fatal(err)
	}
	var got struct {
		Models []string `json:"models"`
		Turns  []struct {
			Content      string   `json:"content"`
			FinishReason string   `json:"finish_reason"`
			Roles        []string `json:"roles"`
			Chunks       int      `json:"chunks"`
			Usage        struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
				TotalTokens      int `json:"total_tokens"`
				CachedTokens     int `json:"cached_tokens"`
			} `json:"usage"`
		} `json:"turns"`
		Whole struct {
			Content          string `json:"content"`
			FinishReason     string `json:"finish_reason"`
			CompletionTokens int    `json:"completion_tokens"`
		} `json:"whole"`
		UnknownModel struct {
			Class  string `json:"class"`
			Status int    `json:"status"`
		} `json:"unknown_model_error"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(got.Models) != 1 || got.Models[0] != "m" || len(got.Turns) != 2 {
		t.Fatalf("client saw %s", out)
	}
	prompt := tokens.CountChat([]tokens.Message{{Role: "system", Content: "You are a helpful assistant."},
		{Role: "user", Content: "Tell me about load balancing for inference engines."}})
	for i, turn := range got.Turns {
		if tokens.Count(turn.Content) != 8 || turn.FinishReason != "length" || len(turn.Roles) != 1 || turn.Roles[0] != "assistant" ||
			turn.Chunks != 10 || turn.Usage.PromptTokens != prompt || turn.Usage.CompletionTokens != 8 || turn.Usage.TotalTokens != prompt+8 {
			t.Errorf("turn %d: %+v (prompt %d)", i, turn, prompt)
		}
	}
	if got.Turns[0].Usage.CachedTokens != 0 || got.Turns[1].Usage.CachedTokens != 16 {
		t.Errorf("cached tokens %d then %d, want 0 then 16", got.Turns[0].Usage.CachedTokens, got.Turns[1].Usage.CachedTokens)
	}
	if tokens.Count(got.Whole.Content) != 4 || got.Whole.FinishReason != "length" || got.Whole.CompletionTokens != 4 {
		t.Errorf("non-streaming: %+v", got.Whole)
	}
	if got.UnknownModel.Class != "NotFoundError" || got.UnknownModel.Status != 404 {
		t.Errorf("unknown model: %+v", got.UnknownModel)
	}
}

// TestReplicas: two replicas behind one address run two requests at once
// with one running slot each; a third waits; metrics sum the replicas.
func TestReplicas(t *testing.T) {
	defer leaktest.AfterTest(t)()
	p := testProfile
	p.MaxRunning = 1
	s := start(t, Options{TimeScale: 0.2, Replicas: 2, Profile: p})
	defer s.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var bodies []io.Closer
	for i := range 3 {
		resp, _ := post(t, ctx, s.URL()+"/v1/chat/completions", chatBody("m", "r", text(fmt.Sprintf("r%d_", i), 50), 1000, true), nil)
		bodies = append(bodies, resp.Body)
	}
	eventually(t, 5*time.Second, "two running, one waiting", func() bool {
		st := s.Stats()
		return st.Running == 2 && st.Waiting == 1
	})
	mf := scrape(t, s)
	if got := value(t, mf, "vllm:num_requests_running", nil); got != 2 {
		t.Errorf("running %v", got)
	}
	if got := value(t, mf, "vllm:cache_config_info", map[string]string{"num_gpu_blocks": "25000"}); got != 1 {
		t.Errorf("cache_config_info %v", got)
	}
	// Each running request holds ceil((53+1000)/16) = 66 blocks of 25000.
	if got := value(t, mf, "vllm:kv_cache_usage_perc", nil); got != 132.0/25000 {
		t.Errorf("kv usage %v, want %v", got, 132.0/25000)
	}
	for _, b := range bodies {
		b.Close()
	}
	eventually(t, 5*time.Second, "all aborted", func() bool { st := s.Stats(); return st.Running+st.Waiting == 0 })
}
