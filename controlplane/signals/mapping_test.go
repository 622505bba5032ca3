package signals

import (
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func parseFile(t *testing.T, server, name string) (Metrics, error) {
	t.Helper()
	f, err := os.Open(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return MappingFor(server).Parse(f)
}

// TestRecordedPages: each server kind's mapping reads its recorded page
// (current vLLM, older vLLM, SGLang), including the cache configuration
// inferlb profile writes into a fleet profile.
func TestRecordedPages(t *testing.T) {
	nan := math.NaN()
	cases := []struct {
		server, file                              string
		running, waiting, kv                      float64
		hits, queries, hitRate                    float64
		success, prompt, gen                      float64
		ttftCount, itlCount, queueCount, e2eCount float64
		blockSize, kvBlocks, kvTokens, startTime  float64
		missing                                   []string
	}{
		{"vllm", "vllm-v1.metrics", 12, 3, 0.42, 1e6, 2.5e6, nan, 2000, 2.5e6, 4e5, 2000, 398000, 2000, 2000, 16, 27448, nan, 1.76443e9, nil},
		{"vllm", "vllm-v0.metrics", 5, 0, 0.17, nan, nan, 0.35, 600, 120000, 30000, 600, 29400, nan, 600, 32, 7000, nan, nan, nil},
		{"sglang", "sglang.metrics", 7, 2, 0.28, 4e6, 8.128902e6, 0.49, 83, 8.128902e6, 7.557572e6, 11008, 7.55e6, 11008, 11008, nan, nan, 442356, nan, nil},
		// A vLLM page read as a generic server: the same values.
		{"generic", "vllm-v1.metrics", 12, 3, 0.42, 1e6, 2.5e6, nan, 2000, 2.5e6, 4e5, 2000, 398000, 2000, 2000, 16, 27448, nan, 1.76443e9, nil},
		// llama.cpp (llama-server 11434 on the tests' tiny model, two
		// slots busy and one request deferred): load gauges and token
		// counters only; the prompt total is the evaluated tokens plus the
		// cached ones, which are also the prefix-cache queries; latencies,
		// finished requests, KV use and size unknown.
		{"llamacpp", "llamacpp.metrics", 2, 1, nan, 1985, 4081, nan, nan, 4081, 608, nan, nan, nan, nan, nan, nan, nan, nan,
			[]string{"llamacpp:kv_cache_usage_ratio"}},
		// SGLang before its first request: parsed, every signal unknown.
		{"sglang", "sglang-fresh.metrics", nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, nan, 1.76443e9,
			[]string{"sglang:generation_tokens_total", "sglang:num_queue_reqs", "sglang:num_requests_total", "sglang:num_running_reqs",
				"sglang:prompt_tokens_total", "sglang:time_to_first_token_seconds", "sglang:token_usage"}},
	}
	eq := func(a, b float64) bool { return a == b || math.IsNaN(a) && math.IsNaN(b) }
	for _, c := range cases {
		t.Run(c.server+"/"+c.file, func(t *testing.T) {
			m, err := parseFile(t, c.server, c.file)
			if err != nil {
				t.Fatal(err)
			}
			got := []float64{m.Running, m.Waiting, m.KVUsage, m.PrefixHits, m.PrefixQueries, m.PrefixHitRate, m.Success, m.PromptTokens, m.GenTokens,
				m.TTFTCount, m.ITLCount, m.QueueCount, m.E2ECount, m.BlockSize, m.KVBlocks, m.KVTokens, m.StartTime}
			want := []float64{c.running, c.waiting, c.kv, c.hits, c.queries, c.hitRate, c.success, c.prompt, c.gen,
				c.ttftCount, c.itlCount, c.queueCount, c.e2eCount, c.blockSize, c.kvBlocks, c.kvTokens, c.startTime}
			names := strings.Fields("running waiting kv hits queries hitRate success prompt gen ttftCount itlCount queueCount e2eCount blockSize kvBlocks kvTokens startTime")
			for i := range got {
				if !eq(got[i], want[i]) {
					t.Errorf("%s = %v, want %v", names[i], got[i], want[i])
				}
			}
			if !slices.Equal(m.Missing, c.missing) {
				t.Errorf("missing = %q, want %q", m.Missing, c.missing)
			}
		})
	}
}

// TestMappingRequired: a vLLM mapping refuses a page of another server
// (naming the kind); SGLang and generic servers may lack every gauge.
func TestMappingRequired(t *testing.T) {
	if _, err := parseFile(t, "vllm", "sglang.metrics"); err == nil || !strings.Contains(err.Error(), "is this a vllm /metrics?") {
		t.Errorf("vllm mapping on an SGLang page: %v", err)
	}
	for _, server := range []string{"sglang", "generic", "llamacpp"} {
		if _, err := parseFile(t, server, "sglang-fresh.metrics"); err != nil {
			t.Errorf("%s on a fresh page: %v", server, err)
		}
	}
	if _, err := parseFile(t, "vllm", "llamacpp.metrics"); err == nil || !strings.Contains(err.Error(), "is this a vllm /metrics?") {
		t.Errorf("vllm mapping on a llama.cpp page: %v", err)
	}
	if MappingFor("tgi") != nil || MappingFor("") != Mappings["vllm"] {
		t.Error("MappingFor: unknown kinds have no mapping; empty is vLLM")
	}
}

// TestFreshThenServing: an SGLang engine that has served nothing is up
// with unknown gauges (null in the JSON view), not idle zeros; its first
// requests bring the signals in.
func TestFreshThenServing(t *testing.T) {
	t0 := time.Unix(1000, 0)
	tr := NewTracker(TrackerOptions{StaleAfter: 5 * time.Second}, []string{"s"})
	fresh, err := parseFile(t, "sglang", "sglang-fresh.metrics")
	if err != nil {
		t.Fatal(err)
	}
	tr.Observe(Sample{ID: "s", At: t0, Healthy: true, Metrics: fresh})
	e := tr.Engines(t0)[0]
	if e.Status() != Up || !math.IsNaN(e.Running) || !math.IsNaN(e.KVUsage) || len(e.Missing) == 0 {
		t.Fatalf("fresh engine: %v running %v kv %v missing %v", e.Status(), e.Running, e.KVUsage, e.Missing)
	}
	js, err := e.MarshalJSON()
	if err != nil || !strings.Contains(string(js), `"running":null`) {
		t.Fatalf("json %s, %v", js, err)
	}
	serving, _ := parseFile(t, "sglang", "sglang.metrics")
	tr.Observe(Sample{ID: "s", At: t0.Add(time.Second), Healthy: true, Metrics: serving})
	if e := tr.Engines(t0.Add(time.Second))[0]; e.Running != 7 || e.Waiting != 2 || e.KVUsage != 0.28 || e.Restarts != 0 {
		t.Fatalf("serving engine: %+v", e)
	}
	// A later page without a gauge keeps its last value (missing is not 0).
	partial := serving
	partial.Running = math.NaN()
	tr.Observe(Sample{ID: "s", At: t0.Add(2 * time.Second), Healthy: true, Metrics: partial})
	if e := tr.Engines(t0.Add(2 * time.Second))[0]; e.Running != 7 {
		t.Fatalf("gauge absent from one page: running %v, want the last value 7", e.Running)
	}
}

// TestRestartDetected: a restart shows as counters going down, counters
// vanishing (SGLang recreates them at its first request), or a new process
// start time; rates are not computed across it.
func TestRestartDetected(t *testing.T) {
	base, err := parseFile(t, "vllm", "vllm-v1.metrics")
	if err != nil {
		t.Fatal(err)
	}
	fresh, _ := parseFile(t, "sglang", "sglang-fresh.metrics")
	sg, _ := parseFile(t, "sglang", "sglang.metrics")
	// llama.cpp has no process start time: a restart shows as its token
	// counters starting over.
	llama, err := parseFile(t, "llamacpp", "llamacpp.metrics")
	if err != nil {
		t.Fatal(err)
	}
	llamaRestarted := llama
	llamaRestarted.PromptTokens, llamaRestarted.GenTokens, llamaRestarted.PrefixHits = 40, 8, 0
	down := base
	down.Success, down.PromptTokens = 3, 100
	newStart := base
	newStart.StartTime++
	cases := []struct {
		name      string
		prev, cur Metrics
		want      bool
	}{
		{"same page", base, base, false},
		{"counters went down", base, down, true},
		{"counters vanished", sg, fresh, true},
		{"first requests after a fresh start", fresh, sg, false},
		{"new process start time", base, newStart, true},
		{"llama.cpp counters started over", llama, llamaRestarted, true},
		{"llama.cpp counters grew", llamaRestarted, llama, false},
	}
	for _, c := range cases {
		if got := c.cur.RestartedSince(c.prev); got != c.want {
			t.Errorf("%s: RestartedSince = %v, want %v", c.name, got, c.want)
		}
	}
	t0 := time.Unix(1000, 0)
	tr := NewTracker(TrackerOptions{}, []string{"s"})
	tr.Observe(Sample{ID: "s", At: t0, Healthy: true, Metrics: sg})
	tr.Observe(Sample{ID: "s", At: t0.Add(time.Second), Healthy: true, Metrics: fresh})
	if e := tr.Engines(t0.Add(time.Second))[0]; e.Restarts != 1 || e.RequestsPerS != 0 {
		t.Fatalf("after a restart: restarts %d, rate %v", e.Restarts, e.RequestsPerS)
	}
}

// TestTTFTExcludingQueue: an engine whose TTFT leaves out queueing (its
// queue time summed since its start exceeds its TTFT so summed) has TTFT
// evidence of TTFT plus queue time, so a queue behind it is not
// invisible; one whose TTFT counts queueing keeps its TTFT, also in an
// interval where a draining queue's finishing requests waited longer than
// the first tokens of the interval took.
func TestTTFTExcludingQueue(t *testing.T) {
	page := func(n, ttftSum, queueSum float64) Metrics {
		return Metrics{Running: 1, Waiting: 5, KVUsage: 0.5, Success: n, PromptTokens: 100 * n, GenTokens: 10 * n,
			TTFTSum: ttftSum, TTFTCount: n, QueueSum: queueSum, QueueCount: n, E2ESum: 2 * n, E2ECount: n,
			ITLSum: math.NaN(), ITLCount: math.NaN(), StartTime: math.NaN()}
	}
	t0 := time.Unix(1000, 0)
	for _, c := range []struct {
		name string
		// before: the first 10 requests, per request.
		before            [2]float64
		ttft, queue, want float64 // the next 10, per request seconds; want ms
		excludes          bool
	}{
		{"TTFT counts the queue", [2]float64{0.5, 0.4}, 0.5, 0.4, 500, false},
		{"TTFT leaves the queue out", [2]float64{0.1, 0.4}, 0.1, 0.4, 500, true},
		// Ten requests whose first tokens took 2 s (they queued 1.5 s)
		// finish in the interval; the ten first tokens in it, after the
		// queue drained, took 0.2 s. The interval's means (1.5 s queue,
		// 0.2 s TTFT) would call it a server whose TTFT leaves the
		// queue out.
		{"TTFT counts the queue, the queue draining", [2]float64{2, 0.1}, 0.2, 1.5, 200, false},
	} {
		tr := NewTracker(TrackerOptions{}, []string{"e"})
		tr.Observe(Sample{ID: "e", At: t0, Healthy: true, Metrics: page(10, 10*c.before[0], 10*c.before[1])})
		tr.Observe(Sample{ID: "e", At: t0.Add(time.Second), Healthy: true, Metrics: page(20, 10*c.before[0]+10*c.ttft, 10*c.before[1]+10*c.queue)})
		e := tr.Engines(t0.Add(time.Second))[0]
		if math.Abs(e.TTFTMs-c.want) > 1e-6 || e.TTFTExcludesQueue != c.excludes || math.Abs(e.QueueMs-1000*c.queue) > 1e-6 || e.E2EMs != 2000 {
			t.Errorf("%s: ttft %v (want %v) excludes %v queue %v e2e %v", c.name, e.TTFTMs, c.want, e.TTFTExcludesQueue, e.QueueMs, e.E2EMs)
		}
	}
}

func FuzzMappings(f *testing.F) {
	for _, n := range []string{"vllm-v1.metrics", "vllm-v0.metrics", "sglang.metrics", "sglang-fresh.metrics", "llamacpp.metrics"} {
		b, err := os.ReadFile(filepath.Join("testdata", n))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(b))
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, mp := range Mappings {
			m, err := mp.Parse(strings.NewReader(s))
			if err == nil && (m.Running < 0 || m.Waiting < 0 || m.KVUsage < 0) {
				t.Fatalf("%s accepted negative gauges: %+v", mp.Server, m)
			}
		}
	})
}
