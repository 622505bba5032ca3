package enginesim

import (
	"strconv"

	"github.com/inferlb/inferlb/internal/enginesim/model"
	"github.com/prometheus/client_golang/prometheus"
)

// Bucket boundaries as in vLLM's vllm/v1/metrics/loggers.py.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
		0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
		1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	requestLatencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0,
		30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

type metrics struct {
	ttft, itl, e2e, queue prometheus.Histogram
	success               [3]prometheus.Counter // by model.FinishReason
}

// newMetrics registers vLLM's metrics on s.reg. Labels are vLLM's:
// model_name and engine (the engine-core index, always "0" here).
func newMetrics(s *Server) *metrics {
	labels := prometheus.Labels{"model_name": s.opts.Model, "engine": "0"}
	stats := func(f func(model.Stats) float64) func() float64 {
		return func() float64 {
			s.mu.Lock()
			defer s.mu.Unlock()
			return f(s.eng.Stats())
		}
	}
	gauge := func(name, help string, f func(model.Stats) float64) {
		s.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, stats(f)))
	}
	counter := func(name, help string, f func(model.Stats) float64) {
		s.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, stats(f)))
	}
	hist := func(name, help string, b []float64) prometheus.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: b, ConstLabels: labels})
		s.reg.MustRegister(h)
		return h
	}
	gauge("vllm:num_requests_running", "Number of requests in model execution batches.",
		func(st model.Stats) float64 { return float64(st.Running) })
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.",
		func(st model.Stats) float64 { return float64(st.Waiting) })
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.",
		func(st model.Stats) float64 { return st.KVUsage })
	counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.",
		func(st model.Stats) float64 { return float64(st.PrefixQueries) })
	counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.",
		func(st model.Stats) float64 { return float64(st.PrefixHits) })
	counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.",
		func(st model.Stats) float64 { return float64(st.PromptTokens) })
	counter("vllm:generation_tokens_total", "Number of generation tokens processed.",
		func(st model.Stats) float64 { return float64(st.GenerationTokens) })

	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
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

	m := &metrics{
		ttft:  hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets),
		itl:   hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets),
		e2e:   hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", requestLatencyBuckets),
		queue: hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", requestLatencyBuckets),
	}
	success := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vllm:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: labels,
	}, []string{"finished_reason"})
	s.reg.MustRegister(success)
	for _, r := range []model.FinishReason{model.FinishLength, model.FinishStop, model.FinishAbort} {
		m.success[r] = success.WithLabelValues(r.String())
	}
	return m
}
