package drills

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/tools/llamacpp"
	"github.com/inferlb/inferlb/xds/xdstest"
)

// The drills with a real engine: llama.cpp's llama-server (built by
// scripts/setup.sh --engines) serving a tiny random-weight llama model with
// GPT-2's tokenizer, behind Envoy, the control plane and ext_proc. Each
// server runs on one thread with a small context; the machine has 2 cores.
// What they prove holds for an engine the project did not write: its
// metrics are read (llamacpp mapping), its health is probed, its prefix
// cache rewards affinity, its tokenizer is never undercounted.

// llamaProfile is the tiny model's fleet profile on one thread of this
// class of machine, from llama-server's own timings on the shared test
// machine: a 1,947-token prefill in 1.4 s (1,400 tokens/s), 9 ms a token
// decoding one sequence, 12 ms a step decoding two. It only has to be
// roughly right: the load these drills put on a server shows in its gauges.
const llamaProfile = `{gpu: G, model: m, prefill_tokens_per_s: 1400, overhead_ms: 10, decode_step_ms: 6, decode_step_per_seq_ms: 3, max_running: %d, kv_capacity_tokens: %d, max_context_tokens: %d}`

// llamaOptions put llama.cpp servers behind a drill stack.
type llamaOptions struct {
	// servers are the engines' options (slots and context); address,
	// model, alias and log are filled in.
	servers []llamacpp.Options
	// fleet is the spec for the engines' addresses.
	fleet func(addrs []string) string
}

// llamaFleet is n identical servers (2 slots of slotCtx tokens) in the
// drills' fleet shape: one class "chat", engines e0.. of server kind
// llamacpp.
func llamaFleet(n, slotCtx int) *llamaOptions {
	o := &llamaOptions{}
	for range n {
		o.servers = append(o.servers, llamacpp.Options{Slots: 2, SlotContext: slotCtx})
	}
	o.fleet = func(addrs []string) string {
		y := fleetYAML(fmt.Sprintf(llamaProfile, 2, 2*slotCtx, slotCtx), addrs, 0)
		return strings.ReplaceAll(y, "model: m}\n", "model: m, server: llamacpp}\n")
	}
	return o
}

// requireLlama skips the test when llama-server or its model is missing,
// except in CI (CI=true), where that fails it: `make test` builds them.
func requireLlama(t *testing.T) {
	t.Helper()
	if err := llamacpp.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and no llama-server: %v", err)
		}
		t.Skipf("no real engine here, skipped (with CI=true this fails): %v", err)
	}
}

func startLlamas(t *testing.T, dir string, o *llamaOptions) []*llamacpp.Server {
	t.Helper()
	var out []*llamacpp.Server
	for i, so := range o.servers {
		so.Alias = "m"
		so.LogPath = filepath.Join(dir, fmt.Sprintf("llama-e%d.log", i))
		srv, err := llamacpp.Start(context.Background(), so)
		if err != nil {
			t.Fatalf("e%d: %v", i, err)
		}
		t.Cleanup(func() {
			srv.Stop()
			if t.Failed() {
				b, _ := os.ReadFile(so.LogPath)
				lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
				t.Logf("llama-server e%d log tail:\n%s", i, strings.Join(lines[max(0, len(lines)-15):], "\n"))
			}
		})
		out = append(out, srv)
	}
	return out
}

// chatBody is a non-streamed chat completion request of model m.
func chatBody(msgs []llamacpp.Message, maxTokens int) []byte {
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs, "max_tokens": maxTokens, "ignore_eos": true, "temperature": 0})
	return b
}

var chatClient = &http.Client{Timeout: 120 * time.Second}

// postChat sends a chat completion to base (Envoy or a server) and returns
// the status, the decoded response (on 200) and the raw body.
func postChat(ctx context.Context, base string, body []byte) (int, llamacpp.ChatResponse, []byte, error) {
	var cr llamacpp.ChatResponse
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		return 0, cr, nil, err
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-inferlb-priority", "high")
	resp, err := chatClient.Do(req)
	if err != nil {
		return 0, cr, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, cr, b, err
	}
	if resp.StatusCode == 200 {
		err = json.Unmarshal(b, &cr)
	}
	return resp.StatusCode, cr, b, err
}

// evaluated is every server's count of prompt tokens evaluated plus tokens
// generated (its own /metrics): the server a request went to is the one
// whose count moved.
func (s *stack) evaluated(t *testing.T) []float64 {
	t.Helper()
	out := make([]float64, len(s.llamas))
	for i, l := range s.llamas {
		p, err := metric(l.URL()+"/metrics", "llamacpp:prompt_tokens_total")
		if err != nil {
			t.Fatal(err)
		}
		g, err := metric(l.URL()+"/metrics", "llamacpp:tokens_predicted_total")
		if err != nil {
			t.Fatal(err)
		}
		out[i] = p + g
	}
	return out
}

// servedBy names the one server whose count moved between two readings.
func servedBy(t *testing.T, before, after []float64) int {
	t.Helper()
	who := -1
	for i := range before {
		if after[i] > before[i] {
			if who >= 0 {
				t.Fatalf("two servers moved (e%d and e%d): %v → %v", who, i, before, after)
			}
			who = i
		}
	}
	if who < 0 {
		t.Fatalf("no server served the request: %v → %v", before, after)
	}
	return who
}

// signalsOf is replica 0's tracker view of one engine (the scraped
// signals: null where unknown).
type scraped struct {
	State    string   `json:"state"`
	Running  *float64 `json:"running"`
	Waiting  *float64 `json:"waiting"`
	KVUsage  *float64 `json:"kv_usage"`
	Missing  []string `json:"missing"`
	Restarts int      `json:"restarts"`
	GenPerS  float64  `json:"generation_tokens_per_s"`
}

func (s *stack) scraped(id string) (scraped, error) {
	var sig struct {
		Engines []struct {
			ID string `json:"id"`
			scraped
		} `json:"engines"`
	}
	if err := getJSON(s.cpAdmin[0]+"/signals", &sig); err != nil {
		return scraped{}, err
	}
	for _, e := range sig.Engines {
		if e.ID == id {
			return e.scraped, nil
		}
	}
	return scraped{}, fmt.Errorf("engine %s not in /signals", id)
}

// TestLlamaCppWeightsFollowLoad: three llama-servers behind the stack, a
// light load through Envoy. Another tenant's requests, sent straight to
// e0, fill its two slots and queue two more: the control plane reads
// that from llama-server's own gauges (requests_processing,
// requests_deferred) and moves e0's weight to the idle servers; when the
// other tenant leaves, e0 gets its share back. llama-server has no KV
// gauge: its KV use stays unknown (null), never 0.
func TestLlamaCppWeightsFollowLoad(t *testing.T) {
	s := startStack(t, stackOptions{llama: llamaFleet(3, 1024)})
	tr := s.startTraffic(trafficOptions{rate: 1, maxTokens: 4, words: 20})
	before := s.waitShare(t, "e0", func(x float64) bool { return x > 0.2 }, 30*time.Second, "a fair share before the other tenant")

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var bgErr error
	var bgMu sync.Mutex
	// Four clients on two slots: two requests running, two deferred.
	for k := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := chatBody([]llamacpp.Message{{Role: "user", Content: fmt.Sprintf("another tenant's request %d", k)}}, 300)
			for ctx.Err() == nil {
				if code, _, b, err := postChat(ctx, s.llamas[0].URL(), body); ctx.Err() == nil && (err != nil || code != 200) {
					bgMu.Lock()
					bgErr = fmt.Errorf("background request: %d %v %.200s", code, err, b)
					bgMu.Unlock()
					return
				}
			}
		}()
	}
	stopBackground := func() { cancel(); wg.Wait() }
	t.Cleanup(stopBackground)
	loadedAt := time.Now()
	var seen scraped
	if err := envoytest.Poll(context.Background(), 20*time.Second, 100*time.Millisecond, func() error {
		sc, err := s.scraped("e0")
		if err != nil {
			return err
		}
		if sc.Running == nil || *sc.Running < 1.5 || sc.Waiting == nil || *sc.Waiting < 0.5 {
			return fmt.Errorf("e0 scraped as %+v", sc)
		}
		seen = sc
		return nil
	}); err != nil {
		t.Fatalf("the control plane never read e0's slots full and a request waiting: %v", err)
	}
	t.Logf("e0 scraped with the other tenant: running %.2f, waiting %.2f, kv %v, missing %v", *seen.Running, *seen.Waiting, seen.KVUsage, seen.Missing)
	if seen.KVUsage != nil {
		t.Errorf("llama-server has no KV gauge, but the control plane has a KV use of %v for it (missing must stay unknown)", *seen.KVUsage)
	}
	loaded := s.waitShare(t, "e0", func(x float64) bool { return x < before/3 }, 40*time.Second, "a third of its share while another tenant fills it")
	t.Logf("e0's share %.3f → %.3f %.1f s after the other tenant came", before, loaded, time.Since(loadedAt).Seconds())
	bgMu.Lock()
	if bgErr != nil {
		t.Fatal(bgErr)
	}
	bgMu.Unlock()

	stopBackground()
	left := time.Now()
	back := s.waitShare(t, "e0", func(x float64) bool { return x >= before/2 }, 60*time.Second, "half its share back once the other tenant left")
	t.Logf("e0's share back to %.3f %.1f s after the other tenant left", back, time.Since(left).Seconds())
	if tally := tr.stop(); tally.all.failed != 0 || tally.all.cut != 0 {
		t.Errorf("requests lost: %s", tally)
	}
}

// longText is n words of varied English, so that GPT-2 makes about one
// token of each.
func longText(seed, n int) string {
	words := strings.Fields("the river bank was quiet while a small boat drifted past old stone bridges and tall green trees under a pale morning sky that slowly turned blue")
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[(i*7+seed*13+i/len(words))%len(words)])
	}
	return b.String()
}

// TestLlamaCppConversationAffinity: conversations of two turns through the
// stack, each opening with a ~2,000-token turn. The second turn of each
// lands on the server that served the first (ext_proc's prefix key,
// Envoy's consistent hash), and that server's own timings show it: the
// first turn's prompt came from its slot cache (cache_n), and its prefill
// took a fraction of what the same second turn costs a server that never
// saw the conversation.
func TestLlamaCppConversationAffinity(t *testing.T) {
	// The production scrape and cycle periods and a smoothing of seconds:
	// with the drills' 250-ms scrapes and 1-s smoothing, one 2,000-token
	// prefill (1.4 s of one server's work inside a scrape or two) reads as
	// an overloaded server, and the weights move away from it between a
	// conversation's turns.
	s := startStack(t, stackOptions{llama: llamaFleet(3, 3072), cpArgs: []string{"--interval", "5s", "--scrape-interval", "1s", "--smoothing", "5s"}})
	ctx := context.Background()
	const convs = 3
	var warm []float64 // second turns' prefill ms
	var cold llamacpp.Timings
	var firstPrompt int
	for c := range convs {
		msgs := []llamacpp.Message{{Role: "system", Content: fmt.Sprintf("conversation %d", c)}, {Role: "user", Content: longText(c, 1900)}}
		b0 := s.evaluated(t)
		w1, _ := s.envoyShares()
		code, r1, raw, err := postChat(ctx, s.url, chatBody(msgs, 4))
		if err != nil || code != 200 {
			t.Fatalf("conversation %d turn 1: %d %v %.300s", c, code, err, raw)
		}
		first := servedBy(t, b0, s.evaluated(t))
		msgs = append(msgs, llamacpp.Message{Role: "assistant", Content: r1.Choices[0].Message.Content},
			llamacpp.Message{Role: "user", Content: "and then?"})
		turn2 := chatBody(msgs, 4)
		b1 := s.evaluated(t)
		code, r2, raw, err := postChat(ctx, s.url, turn2)
		if err != nil || code != 200 {
			t.Fatalf("conversation %d turn 2: %d %v %.300s", c, code, err, raw)
		}
		second := servedBy(t, b1, s.evaluated(t))
		t.Logf("conversation %d: turn 1 on e%d (%d prompt tokens evaluated in %.0f ms), turn 2 on e%d (%d from its cache, %d evaluated in %.0f ms)",
			c, first, r1.Timings.PromptN, r1.Timings.PromptMs, second, r2.Timings.CacheN, r2.Timings.PromptN, r2.Timings.PromptMs)
		if second != first {
			w2, _ := s.envoyShares()
			t.Errorf("conversation %d: turn 1 on e%d, turn 2 on e%d (Envoy's shares %v before, %v after)", c, first, second, w1, w2)
			continue
		}
		if r2.Timings.CacheN < r1.Timings.PromptN*9/10 || r2.Timings.PromptN > r1.Timings.PromptN/10 {
			t.Errorf("conversation %d: turn 2 reused %d tokens of its server's cache and evaluated %d, want most of turn 1's %d reused",
				c, r2.Timings.CacheN, r2.Timings.PromptN, r1.Timings.PromptN)
		}
		warm = append(warm, r2.Timings.PromptMs)
		if c > 0 {
			continue
		}
		firstPrompt = r1.Timings.PromptN
		// The same second turn on a server that never saw the
		// conversation: a cold prefill.
		coldServer := s.llamas[(first+1)%len(s.llamas)]
		code, rc, raw, err := postChat(ctx, coldServer.URL(), turn2)
		if err != nil || code != 200 {
			t.Fatalf("turn 2 on a cold server: %d %v %.300s", code, err, raw)
		}
		cold = rc.Timings
	}
	// The second turns' median prefill against the cold one: single
	// prefills on a shared 2-core machine are noisy (a 39-token one took
	// 48 to 270 ms in one run), the median of three is not.
	sort.Float64s(warm)
	med := warm[len(warm)/2]
	t.Logf("turn 2 on a cold server: %d from its cache, %d evaluated in %.0f ms; on the warm server (median of %d) %.0f ms: %.1f× faster",
		cold.CacheN, cold.PromptN, cold.PromptMs, len(warm), med, cold.PromptMs/med)
	if cold.PromptN < firstPrompt || med*2 > cold.PromptMs {
		t.Errorf("turn 2's prefill: median %.0f ms warm, %.0f ms cold (%d evaluated): want the warm one under half the cold one",
			med, cold.PromptMs, cold.PromptN)
	}
}

// hostOf is an engine's host in Envoy's class cluster.
func (s *stack) hostOf(i int) (xdstest.Host, error) {
	cs, err := xdstest.Clusters(s.envoy)
	if err != nil {
		return xdstest.Host{}, err
	}
	h, ok := cs["inferlb_chat"][s.addrs[i]]
	if !ok {
		return h, fmt.Errorf("e%d not in Envoy's inferlb_chat", i)
	}
	return h, nil
}

// healthWindow bounds how long a dead or stalled engine may keep getting
// traffic: Envoy's active health check (translate.DefaultOptions: every
// 2 s, 1 s timeout, 2 failures) and the control plane's probe with every
// scrape (250 ms in the drills) each take it out. A refused connection
// fails the control plane's probe at once; a stalled server's probe only
// times out, which says nothing, so Envoy's check decides: two checks
// that each wait an interval and time out, 2 × (2 + 1) s. Two seconds of
// slack for a loaded machine.
const healthWindow = 8 * time.Second

// TestLlamaCppKilledServerDrained: a llama-server killed (SIGKILL) under
// traffic is out of Envoy's routing within the health window, and every
// request sent after that succeeds on the others. Started again on its
// port, it is routable again and the control plane counts a restart (its
// counters started over: llama-server has no process start time).
func TestLlamaCppKilledServerDrained(t *testing.T) {
	s := startStack(t, stackOptions{llama: llamaFleet(3, 1024)})
	tr := s.startTraffic(trafficOptions{rate: 2, maxTokens: 4, words: 20})
	s.waitShare(t, "e1", func(x float64) bool { return x > 0.2 }, 30*time.Second, "a fair share before the kill")
	// e1 has served requests, and the control plane has scraped its
	// counters since: a restart is seen as those counters starting over.
	if err := envoytest.Poll(context.Background(), 30*time.Second, 100*time.Millisecond, func() error {
		sc, err := s.scraped("e1")
		if err != nil {
			return err
		}
		if sc.GenPerS <= 0 {
			return fmt.Errorf("the control plane has seen e1 generate nothing yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	s.llamas[1].Kill()
	killed := time.Now()
	if err := envoytest.Poll(context.Background(), 20*time.Second, 50*time.Millisecond, func() error {
		h, err := s.hostOf(1)
		if err != nil {
			return err
		}
		if h.Routable() {
			return fmt.Errorf("e1 still routable: %+v", h)
		}
		return nil
	}); err != nil {
		t.Fatalf("killed e1 not drained: %v", err)
	}
	drained := time.Since(killed)
	h, _ := s.hostOf(1)
	t.Logf("killed e1 out of Envoy's routing after %.2f s (EDS %s, active HC failed %v)", drained.Seconds(), h.EDSHealth, h.FailedActiveHC)
	if drained > healthWindow {
		t.Errorf("killed e1 drained after %.1f s, want ≤ %v", drained.Seconds(), healthWindow)
	}
	drainedAt := time.Now()
	tr.waitSent(t, tr.sentCount()+10, 30*time.Second)

	if err := s.llamas[1].Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	s.waitShare(t, "e1", func(x float64) bool { return x > 0.2 }, 40*time.Second, "a fair share after its restart")
	if err := envoytest.Poll(context.Background(), 30*time.Second, 100*time.Millisecond, func() error {
		h, err := s.hostOf(1)
		if err != nil {
			return err
		}
		sc, err := s.scraped("e1")
		if err != nil {
			return err
		}
		if !h.Routable() || sc.State != "up" {
			return fmt.Errorf("restarted e1: Envoy %+v, control plane %s", h, sc.State)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// Served something after the restart: its counters, from 0 again,
	// are below where they were, which is how the restart shows.
	if err := envoytest.Poll(context.Background(), 30*time.Second, 100*time.Millisecond, func() error {
		sc, err := s.scraped("e1")
		if err != nil {
			return err
		}
		if sc.Restarts < 1 {
			return fmt.Errorf("e1 restarts %d", sc.Restarts)
		}
		return nil
	}); err != nil {
		t.Errorf("the control plane did not count e1's restart: %v", err)
	}
	tally := tr.stop()
	after := tr.tally(drainedAt, time.Time{})
	t.Logf("sent after the drain: %s; whole run: %s", after, tally)
	if after.all.failed+after.all.cut != 0 {
		t.Errorf("requests sent after the killed server was drained were lost: %s", after)
	}
}

// TestLlamaCppStalledServerPenalized: a llama-server stalled with SIGSTOP
// still accepts connections but answers nothing. Envoy's health check
// times out and takes it out of routing within the health window; the
// control plane's scrapes time out and it holds the engine's load as
// unknown (stale), not idle. Requests sent after that succeed on the
// others; resumed (SIGCONT), the server is routable again.
func TestLlamaCppStalledServerPenalized(t *testing.T) {
	s := startStack(t, stackOptions{llama: llamaFleet(3, 1024)})
	tr := s.startTraffic(trafficOptions{rate: 2, maxTokens: 4, words: 20})
	s.waitShare(t, "e2", func(x float64) bool { return x > 0.2 }, 30*time.Second, "a fair share before the stall")
	if err := s.llamas[2].Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			_ = s.llamas[2].Resume()
		}
	}()
	stalled := time.Now()
	var out time.Duration
	if err := envoytest.Poll(context.Background(), 30*time.Second, 50*time.Millisecond, func() error {
		h, err := s.hostOf(2)
		if err != nil {
			return err
		}
		if h.Routable() {
			return fmt.Errorf("e2 still routable: %+v", h)
		}
		if out == 0 {
			out = time.Since(stalled)
		}
		sc, err := s.scraped("e2")
		if err != nil {
			return err
		}
		if sc.State == "up" {
			return fmt.Errorf("the control plane has the stalled e2 up")
		}
		return nil
	}); err != nil {
		t.Fatalf("stalled e2 not taken out: %v", err)
	}
	h, _ := s.hostOf(2)
	sc, _ := s.scraped("e2")
	w, _ := s.weights(0)
	t.Logf("stalled e2 out of Envoy's routing after %.2f s (EDS %s, active HC failed %v); control plane: %s, published share %.3f",
		out.Seconds(), h.EDSHealth, h.FailedActiveHC, sc.State, w["e2"])
	if out > healthWindow {
		t.Errorf("stalled e2 taken out after %.1f s, want ≤ %v", out.Seconds(), healthWindow)
	}
	outAt := time.Now()
	tr.waitSent(t, tr.sentCount()+10, 30*time.Second)
	resumeAt := time.Now()
	if err := s.llamas[2].Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	if err := envoytest.Poll(context.Background(), 30*time.Second, 100*time.Millisecond, func() error {
		h, err := s.hostOf(2)
		if err != nil {
			return err
		}
		if !h.Routable() {
			return fmt.Errorf("resumed e2 not routable: %+v", h)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	tally := tr.stop()
	after := tr.tally(outAt, resumeAt)
	t.Logf("sent while e2 was out: %s; whole run: %s", after, tally)
	if after.all.failed+after.all.cut != 0 {
		t.Errorf("requests sent after the stalled server was taken out were lost: %s", after)
	}
}

// TestLlamaCppContextLimitByServerTokens: two deployments of the model, a
// server of 512-token slots ("small", e0) and one of 4,096 (e1, alone in
// class "long"). ext_proc bounds each request with GPT-2's tokenizer (the
// model's tokenizer.json, as the fleet spec names it); the servers count
// with their own (the GGUF's vocabulary, the same GPT-2 BPE, after their
// chat template). A prompt of digits and commas that the server counts
// above 512 tokens must go to e1 (e0 itself refuses it: 400); an English
// prompt of more bytes than 512 whose tokens fit goes to e0. Without the
// tokenizer the bytes bound sends it to e1.
func TestLlamaCppContextLimitByServerTokens(t *testing.T) {
	tokPath, err := filepath.Abs("../../internal/tokens/hf/testdata/gpt2.tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	const small, large = 512, 4096
	o := &llamaOptions{servers: []llamacpp.Options{{Slots: 1, SlotContext: small}, {Slots: 1, SlotContext: large}}}
	o.fleet = func(addrs []string) string {
		return fmt.Sprintf(`name: llama-context
regions: [{name: east}]
frontends: [{name: fe-east, region: east, node_id: %s}]
models: [{name: m, max_context_tokens: %d, tokenizer: %q}]
profiles:
  - {gpu: cpu-small, model: m, prefill_tokens_per_s: 1400, overhead_ms: 10, decode_step_ms: 6, decode_step_per_seq_ms: 3, max_running: 1, kv_capacity_tokens: %d, max_context_tokens: %d}
  - {gpu: cpu-large, model: m, prefill_tokens_per_s: 1400, overhead_ms: 10, decode_step_ms: 6, decode_step_per_seq_ms: 3, max_running: 1, kv_capacity_tokens: %d, max_context_tokens: %d}
classes:
  - {name: chat, model: m, mean_prompt_tokens: 100, mean_output_tokens: 16}
  - {name: long, model: m, min_context_tokens: %d, mean_prompt_tokens: 1000, mean_output_tokens: 16}
engines:
  - {id: e0, address: %q, region: east, gpu: cpu-small, model: m, server: llamacpp}
  - {id: e1, address: %q, region: east, gpu: cpu-large, model: m, server: llamacpp}
`, nodeID, large, tokPath, small, small, large, large, small+1, addrs[0], addrs[1])
	}
	digits := []llamacpp.Message{{Role: "user", Content: strings.Repeat("9,", 280)}}
	english := []llamacpp.Message{{Role: "user", Content: longText(1, 250)}}
	for _, c := range []struct {
		name                  string
		tokenizer             bool
		wantDigits, wantWords string // the class cluster
	}{
		{"with the tokenizer", true, "long", "chat"},
		{"bytes bound only", false, "long", "long"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var ext []string
			if c.tokenizer {
				ext = []string{"--tokenizer", tokPath}
			}
			s := startStack(t, stackOptions{llama: o, extArgs: ext})
			ctx := context.Background()
			// The premise, in the small server's own counts: the digits
			// exceed its context, the English prompt fits it though its
			// bytes do not.
			nd, err := s.llamas[0].PromptTokens(ctx, digits)
			if err != nil {
				t.Fatal(err)
			}
			nw, err := s.llamas[0].PromptTokens(ctx, english)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("the server counts %d tokens for the digits (%d bytes), %d for the English prompt (%d bytes)",
				nd, len(digits[0].Content), nw, len(english[0].Content))
			if nd+1 <= small || nw+1+64 > small || len(english[0].Content) <= small {
				t.Fatalf("premise: digits %d tokens, English %d tokens of %d bytes, against %d", nd, nw, len(english[0].Content), small)
			}
			if code, _, raw, err := postChat(ctx, s.llamas[0].URL(), chatBody(digits, 1)); err != nil || code != 400 || !strings.Contains(string(raw), "exceed_context_size") {
				t.Fatalf("the small server took the digits itself: %d %v %.300s", code, err, raw)
			}
			for _, r := range []struct {
				what string
				msgs []llamacpp.Message
				want string
			}{{"digits", digits, c.wantDigits}, {"English", english, c.wantWords}} {
				before, cb := s.evaluated(t), s.classRequests(t)
				code, _, raw, err := postChat(ctx, s.url, chatBody(r.msgs, 1))
				if err != nil || code != 200 {
					t.Fatalf("%s through the stack: %d %v %.300s", r.what, code, err, raw)
				}
				who, ca := servedBy(t, before, s.evaluated(t)), s.classRequests(t)
				got := "none"
				for _, cl := range []string{"chat", "long"} {
					if ca[cl] > cb[cl] {
						got = cl
					}
				}
				t.Logf("%s: class %s, served by e%d", r.what, got, who)
				if got != r.want || (r.want == "long" && who != 1) {
					t.Errorf("%s: class %s, served by e%d; want class %s", r.what, got, who, r.want)
				}
			}
		})
	}
}

// classRequests is Envoy's count of upstream requests per class cluster.
func (s *stack) classRequests(t *testing.T) map[string]float64 {
	t.Helper()
	b, err := s.envoy.Admin("/stats?filter=^cluster.inferlb_.*.upstream_rq_total$")
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, line := range strings.Split(string(b), "\n") {
		name, v, ok := strings.Cut(line, ": ")
		if !ok {
			continue
		}
		var n float64
		if _, err := fmt.Sscan(v, &n); err != nil {
			t.Fatalf("envoy stat %q: %v", line, err)
		}
		out[strings.TrimSuffix(strings.TrimPrefix(name, "cluster.inferlb_"), ".upstream_rq_total")] = n
	}
	return out
}
