package extproc

import "github.com/prometheus/client_golang/prometheus"

type metrics struct {
	decisions      *prometheus.CounterVec // class, priority, outcome
	keys           *prometheus.CounterVec // class, key
	rejected       *prometheus.CounterVec // status
	decisionTime   prometheus.Histogram
	bodyBytes      prometheus.Histogram
	inflight       *prometheus.GaugeVec // class
	retriesGranted *prometheus.CounterVec
	responses      *prometheus.CounterVec // engine, code
	headerLatency  prometheus.Histogram
	policyUpdates  *prometheus.CounterVec // result
	policyInfo     *prometheus.GaugeVec   // version
	streams        prometheus.Gauge
	contextBounds  *prometheus.CounterVec // method
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferlb_extproc_decisions_total",
			Help: "Routing decisions by class, priority and outcome (admitted, shed_policy, shed_local).",
		}, []string{"class", "priority", "outcome"}),
		keys: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferlb_extproc_affinity_keys_total",
			Help: "Affinity keys by class and kind: session, prompt_cache_key, user; conversation, group, spread (from the prefix chain and the split table); none (nothing to key on: a fresh key); off (affinity off for the class).",
		}, []string{"class", "key"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferlb_extproc_rejected_total",
			Help: "Requests answered with an error before routing, by HTTP status and reason.",
		}, []string{"status", "reason"}),
		decisionTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "inferlb_extproc_decision_seconds",
			Help:    "Time to decide on a request once its body arrived (parse, route, admit).",
			Buckets: prometheus.ExponentialBuckets(5e-6, 2.5, 12),
		}),
		bodyBytes: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "inferlb_extproc_request_body_bytes",
			Help:    "Size of the request bodies decided on.",
			Buckets: prometheus.ExponentialBuckets(1024, 4, 8),
		}),
		inflight: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inferlb_extproc_inflight",
			Help: "Admitted requests of a class whose ext_proc stream is still open at this instance.",
		}, []string{"class"}),
		retriesGranted: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferlb_extproc_retries_granted_total",
			Help: "Retries granted to requests (x-envoy-max-retries), by class.",
		}, []string{"class"}),
		responses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferlb_extproc_upstream_responses_total",
			Help: "Responses observed, by engine (upstream address when unknown) and status class.",
		}, []string{"engine", "code"}),
		headerLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "inferlb_extproc_response_header_seconds",
			Help:    "Time from request headers to response headers, as seen by ext_proc.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		policyUpdates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferlb_extproc_policy_updates_total",
			Help: "RoutingPolicy updates received, by result (applied, rejected).",
		}, []string{"result"}),
		policyInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "inferlb_extproc_policy_info",
			Help: "1 for the RoutingPolicy version in force.",
		}, []string{"version"}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inferlb_extproc_streams",
			Help: "Open ext_proc streams.",
		}),
		contextBounds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferlb_extproc_context_bounds_total",
			Help: "Requests routed by their context need, by how the prompt was bounded: short (11× bytes fit the smallest class), bytes (tokens.Bound), tokenizer (the model's tokenizer.json counted the texts).",
		}, []string{"method"}),
	}
	reg.MustRegister(m.decisions, m.keys, m.rejected, m.decisionTime, m.bodyBytes, m.inflight, m.retriesGranted,
		m.responses, m.headerLatency, m.policyUpdates, m.policyInfo, m.streams, m.contextBounds)
	return m
}
