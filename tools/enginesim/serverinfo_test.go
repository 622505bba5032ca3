package enginesim

import (
	"context"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"
)

// getJSON gets path and decodes the answer into v; it returns the status.
func getJSON(t *testing.T, s *Server, path string, v any) int {
	t.Helper()
	resp, err := http.Get(s.URL() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: content type %q", path, ct)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v: %.300s", path, err, b)
	}
	return resp.StatusCode
}

// TestServerInfo: vLLM's /version and SGLang's server and model info, on
// either kind of server, under both their names.
func TestServerInfo(t *testing.T) {
	defer leaktest.AfterTest(t)()
	for _, kind := range []string{ServerVLLM, ServerSGLang} {
		t.Run(kind, func(t *testing.T) {
			s := start(t, Options{TimeScale: 0.2, Server: kind, Replicas: 2})
			defer s.Close()
			want := map[string]string{ServerVLLM: vllmVersion, ServerSGLang: sglangVersion}[kind]
			var v map[string]string
			if code := getJSON(t, s, "/version", &v); code != 200 || v["version"] != want {
				t.Errorf("/version %d %v, want %s", code, v, want)
			}
			for _, path := range []string{"/get_server_info", "/server_info"} {
				var info map[string]any
				if code := getJSON(t, s, path, &info); code != 200 {
					t.Fatalf("%s: %d", path, code)
				}
				for k, w := range map[string]any{
					"model_path": "m", "tokenizer_path": "m", "served_model_name": "m", "version": want,
					"tp_size": 1.0, "dp_size": 1.0, "context_length": 4096.0, "page_size": 16.0,
					"max_running_requests": 128.0, "max_total_num_tokens": 400000.0, "disaggregation_mode": "null",
				} {
					if info[k] != w {
						t.Errorf("%s: %s = %v, want %v", path, k, info[k], w)
					}
				}
				if st, ok := info["internal_states"].([]any); !ok || len(st) != 1 {
					t.Errorf("%s: internal_states %v", path, info["internal_states"])
				}
			}
			for _, path := range []string{"/get_model_info", "/model_info"} {
				var info map[string]any
				if code := getJSON(t, s, path, &info); code != 200 || info["model_path"] != "m" || info["tokenizer_path"] != "m" ||
					info["is_generation"] != true || info["weight_version"] != "default" {
					t.Errorf("%s: %d %v", path, code, info)
				}
			}
		})
	}
}

type loadsBody struct {
	Timestamp string           `json:"timestamp"`
	Version   string           `json:"version"`
	Loads     []map[string]any `json:"loads"`
}

var coreLoadFields = []string{"dp_rank", "num_running_reqs", "num_waiting_reqs", "num_waiting_uncached_tokens",
	"num_used_tokens", "num_total_tokens", "max_total_num_tokens", "max_running_requests",
	"token_usage", "gen_throughput", "cache_hit_rate", "utilization"}

// TestLoadsShape: SGLang's /v1/loads (and smg's /loads) answer: one rank,
// its core fields, and the optional sections include names.
func TestLoadsShape(t *testing.T) {
	defer leaktest.AfterTest(t)()
	s := start(t, Options{TimeScale: 0.2})
	defer s.Close()
	cases := []struct {
		path  string
		ranks int
		extra []string // keys besides the core fields
	}{
		{"/v1/loads", 1, []string{"memory", "speculative", "lora", "disaggregation", "queues"}},
		{"/v1/loads?include=all", 1, []string{"memory", "speculative", "lora", "disaggregation", "queues"}},
		{"/v1/loads?include=core", 1, nil},
		{"/v1/loads?include=core,disagg,queues,memory", 1, []string{"memory", "disaggregation", "queues"}},
		{"/v1/loads?dp_rank=0&include=queues", 1, []string{"queues"}},
		{"/v1/loads?dp_rank=1", 0, nil},
		{"/v1/loads?format=json", 1, []string{"memory", "speculative", "lora", "disaggregation", "queues"}},
		{"/loads?model=m", 1, []string{"memory", "speculative", "lora", "disaggregation", "queues"}},
		{"/loads", 1, []string{"memory", "speculative", "lora", "disaggregation", "queues"}},
	}
	for _, c := range cases {
		t.Run(c.path, func(t *testing.T) {
			var b loadsBody
			if code := getJSON(t, s, c.path, &b); code != 200 {
				t.Fatalf("status %d", code)
			}
			if _, err := time.Parse(time.RFC3339Nano, b.Timestamp); err != nil || b.Version != vllmVersion || len(b.Loads) != c.ranks {
				t.Fatalf("%+v (%v)", b, err)
			}
			if c.ranks == 0 {
				return
			}
			keys := slices.Sorted(maps.Keys(b.Loads[0]))
			want := slices.Sorted(slices.Values(append(slices.Clone(coreLoadFields), c.extra...)))
			if !slices.Equal(keys, want) {
				t.Errorf("keys %v, want %v", keys, want)
			}
			r := b.Loads[0]
			if r["max_total_num_tokens"] != 200000.0 || r["max_running_requests"] != 64.0 || r["num_running_reqs"] != 0.0 || r["utilization"] != 0.0 {
				t.Errorf("idle rank %v", r)
			}
			if q, ok := r["queues"].(map[string]any); ok && q["waiting"] != 0.0 {
				t.Errorf("queues %v", q)
			}
			if d, ok := r["disaggregation"].(map[string]any); ok && d["mode"] != "null" {
				t.Errorf("disaggregation %v", d)
			}
		})
	}
	errs := []struct {
		path, typ, param, msg string
		status                int
	}{
		{"/v1/loads?include=core,bogus", "BadRequestError", "include", "invalid sections", 400},
		{"/v1/loads?format=prometheus", "BadRequestError", "format", "json only", 400},
		{"/v1/loads?dp_rank=first", "BadRequestError", "dp_rank", "must be an integer", 400},
		{"/loads?model=gpt-9", "NotFoundError", "model", "The model `gpt-9` does not exist.", 404},
	}
	for _, c := range errs {
		t.Run(c.path, func(t *testing.T) {
			var e errorBody
			code := getJSON(t, s, c.path, &e)
			if code != c.status || e.Error.Code != c.status || e.Error.Type != c.typ || e.Error.Param == nil || *e.Error.Param != c.param ||
				!strings.Contains(e.Error.Message, c.msg) {
				t.Errorf("%d %+v", code, e.Error)
			}
		})
	}
}

// TestLoadsFollowTheScheduler: the loads are the scheduler's state: with
// the engine hung, the requests sent wait, with their prompt tokens queued
// and (but for the cached prefix) still to compute; once it runs again,
// they run and hold KV, and the generation throughput shows.
func TestLoadsFollowTheScheduler(t *testing.T) {
	defer leaktest.AfterTest(t)()
	s := start(t, Options{TimeScale: 0.2})
	defer s.Close()
	rank := func() map[string]float64 {
		var b loadsBody
		if code := getJSON(t, s, "/v1/loads?include=core", &b); code != 200 || len(b.Loads) != 1 {
			t.Fatalf("loads %d %+v", code, b)
		}
		out := map[string]float64{}
		for k, v := range b.Loads[0] {
			out[k] = v.(float64)
		}
		return out
	}
	warm := text("warm", 64) // four full blocks of the test profile
	resp, _ := post(t, context.Background(), s.URL()+"/v1/completions", []byte(`{"model":"m","max_tokens":2,"prompt":"`+warm+`"}`), nil)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	if err := s.SetFaults(Faults{Hang: true}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, p := range []string{warm + " " + text("new", 10), text("cold", 30)} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "POST", s.URL()+"/v1/completions",
				strings.NewReader(`{"model":"m","max_tokens":200,"prompt":"`+p+`"}`))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	defer func() { cancel(); wg.Wait() }()
	eventually(t, 2*time.Second, "two requests waiting", func() bool { return rank()["num_waiting_reqs"] == 2 })
	r := rank()
	if r["num_running_reqs"] != 0 || r["num_used_tokens"] != 0 || r["num_total_tokens"] != 74+30 ||
		r["num_waiting_uncached_tokens"] != 10+30 || r["cache_hit_rate"] != 0 {
		t.Errorf("hung: %v", r)
	}

	if err := s.SetFaults(Faults{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "two requests running", func() bool { return rank()["num_running_reqs"] == 2 })
	r = rank()
	// Each reserves its prompt and 200 output tokens: 18 + 15 blocks.
	if r["num_waiting_reqs"] != 0 || r["num_used_tokens"] != 33*16 || r["token_usage"] != round(33*16/200000.0, 4) ||
		r["num_total_tokens"] != r["num_used_tokens"] || r["cache_hit_rate"] != round(64/(64+74+30.0), 4) {
		t.Errorf("running: %v", r)
	}
	eventually(t, 5*time.Second, "a generation throughput", func() bool { return rank()["gen_throughput"] > 0 })
}

// TestLoadsWhileLoading: a loading engine reports no ranks, as SGLang does
// before its schedulers write their first snapshot.
func TestLoadsWhileLoading(t *testing.T) {
	defer leaktest.AfterTest(t)()
	s := start(t, Options{TimeScale: 0.2, LoadingFor: time.Hour})
	defer s.Close()
	var b loadsBody
	if code := getJSON(t, s, "/v1/loads", &b); code != 200 || b.Loads == nil || len(b.Loads) != 0 {
		t.Errorf("loading: %d %+v", code, b)
	}
	var e errorBody
	resp, _ := post(t, context.Background(), s.URL()+"/tokenize", []byte(`{"prompt":"a"}`), nil)
	decode(t, resp, 503, &e)
	s.FinishLoading()
	getJSON(t, s, "/v1/loads", &b)
	if len(b.Loads) != 1 {
		t.Errorf("loaded: %+v", b)
	}
}

func TestRateMeter(t *testing.T) {
	var m rateMeter
	t0 := time.Unix(1000, 0)
	if r := m.read(t0.Add(2*time.Second), t0, 100); r != 50 {
		t.Errorf("first reading %v, want 50 (since the start)", r)
	}
	if r := m.read(t0.Add(2500*time.Millisecond), t0, 900); r != 50 {
		t.Errorf("reading within the window %v, want the last rate", r)
	}
	if r := m.read(t0.Add(4*time.Second), t0, 50); r != 25 {
		t.Errorf("after a restart %v, want 25 (counted from zero)", r)
	}
}
