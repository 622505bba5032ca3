package enginesim

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The versions the engine reports (GET /version, /get_server_info,
// /v1/loads): the releases of vLLM and SGLang whose HTTP API engine-sim
// follows, marked as simulated by their build metadata.
const (
	vllmVersion   = "0.20.0+enginesim"
	sglangVersion = "0.5.4+enginesim"
)

// version is the mimicked server's version.
func (s *Server) version() string {
	if s.opts.Server == ServerSGLang {
		return sglangVersion
	}
	return vllmVersion
}

// showVersion serves GET /version as vLLM does ({"version": ...}).
func (s *Server) showVersion(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"version": s.version()})
}

// serverInfo serves SGLang's GET /get_server_info (and /server_info, its
// newer name): the server arguments and scheduler limits a router reads.
// model_path and tokenizer_path are the served model's name, as SGLang
// reports the path it was started with.
func (s *Server) serverInfo(w http.ResponseWriter, _ *http.Request) {
	m := s.opts.Model
	writeJSON(w, http.StatusOK, map[string]any{
		"model_path":           m,
		"tokenizer_path":       m,
		"served_model_name":    m,
		"tp_size":              1,
		"dp_size":              1,
		"pp_size":              1,
		"context_length":       s.maxCtx,
		"max_running_requests": s.maxRunning(),
		"max_total_num_tokens": s.kvTokens(),
		"page_size":            s.cfg.BlockSize,
		"chunked_prefill_size": s.cfg.MaxBatchedTokens,
		"max_prefill_tokens":   s.cfg.MaxBatchedTokens,
		"disaggregation_mode":  "null",
		"load_balance_method":  "round_robin",
		"is_embedding":         false,
		"enable_metrics":       true,
		"version":              s.version(),
		"internal_states":      []any{map[string]any{"last_gen_throughput": s.genThroughput()}},
	})
}

// modelInfo serves SGLang's GET /get_model_info (and /model_info).
func (s *Server) modelInfo(w http.ResponseWriter, _ *http.Request) {
	m := s.opts.Model
	writeJSON(w, http.StatusOK, map[string]any{
		"model_path":                m,
		"tokenizer_path":            m,
		"is_generation":             true,
		"preferred_sampling_params": nil,
		"weight_version":            "default",
		"has_image_understanding":   false,
		"has_audio_understanding":   false,
		"model_type":                nil,
		"architectures":             nil,
	})
}

// maxRunning and kvTokens are the engine's running slots and KV tokens,
// summed over its replicas.
func (s *Server) maxRunning() int { return s.opts.Replicas * s.cfg.MaxRunning }

func (s *Server) kvTokens() int {
	return s.opts.Replicas * (s.cfg.KVCapacityTokens / s.cfg.BlockSize) * s.cfg.BlockSize
}

// loadSections are the optional sections of SGLang's /v1/loads (include=).
var loadSections = []string{"core", "memory", "spec", "lora", "disagg", "queues"}

// loads serves SGLang's GET /v1/loads and, with a model query parameter,
// the /loads route smg asks first: the scheduler's current load, one
// data-parallel rank. Query parameters as SGLang's: dp_rank (another rank
// than 0 gets no loads), include (comma-separated sections; default all)
// and format (json only). While the engine is loading its model the list
// is empty, as SGLang's is before its schedulers report.
func (s *Server) loads(w http.ResponseWriter, hr *http.Request) {
	q := hr.URL.Query()
	if m := q.Get("model"); m != "" {
		if aerr := s.checkModel(m); aerr != nil {
			writeError(w, aerr)
			return
		}
	}
	if f := q.Get("format"); f != "" && f != "json" {
		writeError(w, &apiError{status: 400, typ: "BadRequestError", param: "format",
			message: fmt.Sprintf("format: the simulator serves json only, got %q", f)})
		return
	}
	include := map[string]bool{}
	if inc := q.Get("include"); inc != "" {
		var bad []string
		for _, sec := range strings.Split(inc, ",") {
			sec = strings.TrimSpace(sec)
			switch {
			case sec == "all":
				for _, x := range loadSections {
					include[x] = true
				}
			case slices.Contains(loadSections, sec):
				include[sec] = true
			default:
				bad = append(bad, sec)
			}
		}
		if len(bad) > 0 {
			writeError(w, &apiError{status: 400, typ: "BadRequestError", param: "include",
				message: fmt.Sprintf("include: invalid sections %q; valid: all, %s", bad, strings.Join(loadSections, ", "))})
			return
		}
	} else {
		for _, x := range loadSections {
			include[x] = true
		}
	}
	rank := 0
	if r := q.Get("dp_rank"); r != "" {
		var err error
		if rank, err = strconv.Atoi(r); err != nil {
			writeError(w, &apiError{status: 400, typ: "BadRequestError", param: "dp_rank",
				message: fmt.Sprintf("dp_rank: must be an integer, got %q", r)})
			return
		}
	}
	ranks := []map[string]any{}
	if rank == 0 && !s.loading() {
		ranks = append(ranks, s.rankLoad(include))
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"timestamp": time.Now().UTC().Format("2006-01-02T15:04:05.000000+00:00"),
		"version":   s.version(),
		"loads":     ranks,
	})
}

// rankLoad is the engine's load as one SGLang rank (the replicas summed):
// requests running and waiting in the scheduler (not those still paying
// their API overhead, as with vllm:num_requests_waiting), KV tokens pinned
// and their capacity, and the queued prompt tokens (model.Backlog).
func (s *Server) rankLoad(include map[string]bool) map[string]any {
	s.mu.Lock()
	st := s.eng.Stats()
	bl := s.eng.Backlog()
	s.mu.Unlock()
	capacity := s.kvTokens()
	used := int(math.Round(st.KVUsage * float64(capacity)))
	hit := 0.0
	if st.PrefixQueries > 0 {
		hit = float64(st.PrefixHits) / float64(st.PrefixQueries)
	}
	out := map[string]any{
		"dp_rank":                     0,
		"num_running_reqs":            st.Running,
		"num_waiting_reqs":            st.Waiting,
		"num_waiting_uncached_tokens": bl.UncachedTokens,
		"num_used_tokens":             used,
		"num_total_tokens":            used + bl.WaitingTokens,
		"max_total_num_tokens":        capacity,
		"max_running_requests":        s.maxRunning(),
		"token_usage":                 round(st.KVUsage, 4),
		"gen_throughput":              round(s.genThroughput(), 2),
		"cache_hit_rate":              round(hit, 4),
		// SGLang reports 0: its formula's input has no source yet.
		"utilization": 0.0,
	}
	if include["memory"] {
		out["memory"] = nil // no GPU memory to account
	}
	if include["spec"] {
		out["speculative"] = nil
	}
	if include["lora"] {
		out["lora"] = nil
	}
	if include["disagg"] {
		out["disaggregation"] = map[string]any{
			"mode":                         "null",
			"prefill_bootstrap_queue_reqs": 0,
			"prefill_inflight_queue_reqs":  0,
			"decode_prealloc_queue_reqs":   0,
			"decode_transfer_queue_reqs":   0,
			"decode_retracted_queue_reqs":  0,
			"kv_transfer_speed_gb_s":       0.0,
			"kv_transfer_latency_ms":       0.0,
		}
	}
	if include["queues"] {
		out["queues"] = map[string]any{"waiting": st.Waiting, "grammar": 0, "paused": 0, "retracted": 0}
	}
	return out
}

func round(x float64, digits int) float64 {
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}

// rateMeter measures generated tokens per real second between readings
// at least rateWindow apart, so that routers polling at any rate read a
// steady average.
type rateMeter struct {
	mu   sync.Mutex
	t    time.Time
	n    uint64
	rate float64
}

const rateWindow = time.Second

// read updates the rate with the counter n at now (counting from since
// before the first reading) and returns it. A counter that went back (a
// restarted engine) counts from zero.
func (m *rateMeter) read(now, since time.Time, n uint64) float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.t.IsZero() {
		m.t = since
	}
	if n < m.n {
		m.n = 0
	}
	if dt := now.Sub(m.t); dt >= rateWindow {
		m.rate = float64(n-m.n) / dt.Seconds()
		m.t, m.n = now, n
	}
	return m.rate
}

// genThroughput is the engine's generation throughput in tokens per real
// second (SGLang's gen_throughput).
func (s *Server) genThroughput() float64 {
	s.mu.Lock()
	n := s.eng.Stats().GenerationTokens
	s.mu.Unlock()
	return s.genRate.read(time.Now(), s.epoch, n)
}
