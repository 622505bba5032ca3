package enginesim

import (
	"strconv"
	"strings"

	dto "github.com/prometheus/client_model/go"

	"github.com/inferlb/inferlb/tools/enginesim/model"
	"github.com/prometheus/client_golang/prometheus"
)

// Bucket boundaries as in vLLM's vllm/v1/metrics/loggers.py.
var (
	ttftBuckets = model.TTFTBuckets
	itlBuckets  = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
		1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	requestLatencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
		30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

type metrics struct {
	ttft, itl, e2e, queue prometheus.Histogram
	success               [3]prometheus.Counter // by model.FinishReason
	// bySource counts completion requests by the x-inferlb-source-region
	// they carried ("none" without one): the simulator's own series, not a
	// vLLM or SGLang one, so a bench can tell which requests crossed
	// regions.
	bySource *prometheus.CounterVec
}

// SourceRegionMetric is the simulator's count of completion requests by
// their source region (label source_region; engine_region is the
// engine's).
const SourceRegionMetric = "enginesim_requests_by_source_region_total"

// metricNames are one server kind's metric names.
type metricNames struct {
	running, waiting, kvUsage                  string
	queries, hits, prompt, generation          string
	ttft, itl, e2e, queue, success             string
	successByReason                            bool   // a finished_reason label
	hitRateGauge, kvTokensGauge, cacheInfoInfo string // "" = not exposed
}

var (
	vllmNames = metricNames{
		running: "vllm:num_requests_running", waiting: "vllm:num_requests_waiting", kvUsage: "vllm:kv_cache_usage_perc",
		queries: "vllm:prefix_cache_queries_total", hits: "vllm:prefix_cache_hits_total",
		prompt: "vllm:prompt_tokens_total", generation: "vllm:generation_tokens_total",
		ttft: "vllm:time_to_first_token_seconds", itl: "vllm:inter_token_latency_seconds",
		e2e: "vllm:e2e_request_latency_seconds", queue: "vllm:request_queue_time_seconds",
		success: "vllm:request_success_total", successByReason: true, cacheInfoInfo: "vllm:cache_config_info",
	}
	// SGLang's names (docs/references/production_metrics.md); SGLang has
	// no prefix-query counter: the hit rate is cached over prompt tokens.
	sglangNames = metricNames{
		running: "sglang:num_running_reqs", waiting: "sglang:num_queue_reqs", kvUsage: "sglang:token_usage",
		hits: "sglang:cached_tokens_total", prompt: "sglang:prompt_tokens_total", generation: "sglang:generation_tokens_total",
		ttft: "sglang:time_to_first_token_seconds", itl: "sglang:inter_token_latency_seconds",
		e2e: "sglang:e2e_request_latency_seconds", queue: "sglang:queue_time_seconds",
		success: "sglang:num_requests_total", hitRateGauge: "sglang:cache_hit_rate", kvTokensGauge: "sglang:max_total_num_tokens",
	}
)

// newMetrics registers the server kind's metrics on s.reg (vLLM's names
// and labels, model_name and engine; or SGLang's, model_name, tp_rank and
// engine_type).
func newMetrics(s *Server) *metrics {
	n, labels := vllmNames, prometheus.Labels{"model_name": s.opts.Model, "engine": "0"}
	if s.opts.Server == ServerSGLang {
		n, labels = sglangNames, prometheus.Labels{"model_name": s.opts.Model, "tp_rank": "0", "pp_rank": "0", "engine_type": "unified"}
	}
	stats := func(f func(model.Stats) float64) func() float64 {
		return func() float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			return f(s.eng.Stats())
		}
	}
	gauge := func(name, help string, f func(model.Stats) float64) {
		if name != "" {
			s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, stats(f)))
		}
	}
	counter := func(name, help string, f func(model.Stats) float64) {
		if name != "" {
			s.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, stats(f)))
		}
	}
	hist := func(name, help string, b []float64) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: b, ConstLabels: labels})
		s.reg.MustRegister(h)
		return h
	}
	gauge(n.running, "Number of requests in model execution batches.",
		func(st model.Stats) float64 { return float64(st.Running) })
	gauge(n.waiting, "Number of requests waiting to be processed.",
		func(st model.Stats) float64 { return float64(st.Waiting) })
	gauge(n.kvUsage, "KV-cache usage. 1 means 100 percent usage.",
		func(st model.Stats) float64 { return st.KVUsage })
	counter(n.queries, "Prefix cache queries, in terms of number of queried tokens.",
		func(st model.Stats) float64 { return float64(st.PrefixQueries) })
	counter(n.hits, "Prefix cache hits, in terms of number of cached tokens.",
		func(st model.Stats) float64 { return float64(st.PrefixHits) })
	counter(n.prompt, "Number of prefill tokens processed.",
		func(st model.Stats) float64 { return float64(st.PromptTokens) })
	counter(n.generation, "Number of generation tokens processed.",
		func(st model.Stats) float64 { return float64(st.GenerationTokens) })
	gauge(n.hitRateGauge, "The prefix cache hit rate.", func(st model.Stats) float64 {
		if st.PrefixQueries == 0 {
			return 0
		}
		return float64(st.PrefixHits) / float64(st.PrefixQueries)
	})
	gauge(n.kvTokensGauge, "The maximum number of tokens in the KV pool.",
		func(model.Stats) float64 { return float64(s.opts.Replicas * s.cfg.KVCapacityTokens) })

	if n.cacheInfoInfo != "" {
		info := prometheus.NewGauge(prometheus.GaugeOpts{
			Name: n.cacheInfoInfo, Help: "Information of the LLMEngine CacheConfig",
			ConstLabels: prometheus.Labels{
				"model_name":             s.opts.Model,
				"engine":                 "0",
				"block_size":             strconv.Itoa(s.cfg.BlockSize),
				"num_gpu_blocks":         strconv.Itoa(s.opts.Replicas * (s.cfg.KVCapacityTokens / s.cfg.BlockSize)),
				"enable_prefix_caching":  "True",
				"cache_dtype":            "auto",
				"gpu_memory_utilization": "0.9",
			},
		})
		info.Set(1)
		s.reg.MustRegister(info)
	}

	m := &metrics{
		bySource: prometheus.NewCounterVec(prometheus.CounterOpts{Name: SourceRegionMetric,
			Help:        "Completion requests by the source region they carried (engine-sim's own series).",
			ConstLabels: prometheus.Labels{"model_name": s.opts.Model, "engine_region": s.opts.Region}}, []string{"source_region"}),
		ttft:  hist(n.ttft, "Histogram of time to first token in seconds.", ttftBuckets),
		itl:   hist(n.itl, "Histogram of inter-token latency in seconds.", itlBuckets),
		e2e:   hist(n.e2e, "Histogram of e2e request latency in seconds.", requestLatencyBuckets),
		queue: hist(n.queue, "Histogram of time spent in WAITING phase for request.", requestLatencyBuckets),
	}
	s.reg.MustRegister(m.bySource)
	if !n.successByReason {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: n.success, Help: "Number of requests processed.", ConstLabels: labels})
		s.reg.MustRegister(c)
		m.success = [3]prometheus.Counter{c, c, c}
		return m
	}
	success := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: n.success, Help: "Count of successfully processed requests.", ConstLabels: labels,
	}, []string{"finished_reason"})
	s.reg.MustRegister(success)
	for _, r := range []model.FinishReason{model.FinishLength, model.FinishStop, model.FinishAbort} {
		m.success[r] = success.WithLabelValues(r.String())
	}
	return m
}

// gatherer is what /metrics serves: SGLang creates its series when its
// first request arrives, so in that mode they are hidden until then.
func (s *Server) gatherer() prometheus.Gatherer {
	if s.opts.Server != ServerSGLang {
		return s.reg
	}
	return prometheus.GathererFunc(func() ([]*dto.MetricFamily, error) {
		fams, err := s.reg.Gather()
		if s.served.Load() {
			return fams, err
		}
		out := fams[:0]
		for _, f := range fams {
			if !strings.HasPrefix(f.GetName(), "sglang:") {
				out = append(out, f)
			}
		}
		return out, err
	})
}
