package extproc

import (
	"hash/fnv"

	"github.com/prometheus/client_golang/prometheus"
)

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
	policyVersion  prometheus.Gauge       // VersionHash of the policy in force
	streams        prometheus.Gauge
	// requestsExpired counts admitted requests dropped from the request
	// table without an access-log entry; unknownLogs access-log entries for
	// requests this instance does not know.
	requestsExpired prometheus.Counter
	unknownLogs     *prometheus.CounterVec // log: request or upstream
	completion      prometheus.Histogram
	contextBounds   *prometheus.CounterVec // method
	// memoryTrims counts MemoryTrim's returns of memory to the OS.
	memoryTrims prometheus.Counter
	// slowUploads counts streamed bodies whose upload outlasted
	// UploadGrace (Envoy's message timer was extended for them).
	slowUploads prometheus.Counter
	// laneWaits and laneTimeouts: large buffered bodies' waits for the
	// large-body lane, and those that went on without it.
	laneWaits    prometheus.Histogram
	laneTimeouts prometheus.Counter
	// laneBypassed: large bodies sent beside a full lane, no small
	// request having come in the last SmallRecent.
	laneBypassed prometheus.Counter
	// bodies counts the bodies decided on by how Envoy sent them:
	// buffered (one message) or streamed (chunks, the headers' answer
	// waiting for them).
	bodiesBuffered, bodiesStreamed prometheus.Counter
	// bodyChunks is the chunks a streamed body came in.
	bodyChunks prometheus.Histogram
	// bodiesCut is the streamed bodies refused on what their first bytes
	// proved, before their end.
	bodiesCut prometheus.Counter
	// placements counts the placed requests Envoy's access log reported
	// served, by whether the engine that served them was the one placement
	// chose (outcome: picked or elsewhere: Envoy's bounded load, a retry or
	// a table not yet updated sent it on).
	placements *prometheus.CounterVec
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
			Help: "Admitted requests of a class in flight at this instance (until Envoy's access log reports their end).",
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
			Help:    "Time from the first upstream byte sent to response headers, per served request (Envoy's access log).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}),
		policyUpdates: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferlb_extproc_policy_updates_total",
			Help: "RoutingPolicy updates received, by result (applied, rejected).",
		}, []string{"result"}),
		// A number, not a {version} label: one series for the process's
		// life, however many versions it applies.
		policyVersion: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inferlb_extproc_policy_version_hash",
			Help: "VersionHash of the RoutingPolicy version in force (0 before the first): frontends on the same version show the same number.",
		}),
		streams: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "inferlb_extproc_streams",
			Help: "Open ext_proc streams.",
		}),
		contextBounds: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "inferlb_extproc_context_bounds_total",
			Help: "Requests routed by their context need, by how the prompt was bounded: short (11× bytes fit the smallest class), bytes (tokens.Bound), tokenizer (the model's tokenizer.json counted the texts).",
		}, []string{"method"}),
	}
	m.placements = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "inferlb_extproc_placements_served_total",
		Help: "Placed requests (cache-aware, idle or prefill placement) served, by whether the engine that served them was the placement's pick (outcome=picked) or another (outcome=elsewhere: Envoy's bounded load, a retry, or Envoy's table not yet at the policy's weights)."}, []string{"outcome"})
	m.requestsExpired = prometheus.NewCounter(prometheus.CounterOpts{Name: "inferlb_extproc_requests_expired_total",
		Help: "Admitted requests whose end Envoy's access log never reported; their in-flight slot was taken back after --max-request-age."})
	m.unknownLogs = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "inferlb_extproc_unknown_request_logs_total",
		Help: "Access-log entries not counted: an id this instance did not issue (a previous process's, expired, forged) or, in the upstream log (log=upstream), a failure of the request already counted."}, []string{"log"})
	m.completion = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "inferlb_extproc_upstream_completion_seconds",
		Help: "Time from the first upstream byte sent to the last one received, per served request.", Buckets: prometheus.ExponentialBuckets(0.01, 2, 16)})
	m.memoryTrims = prometheus.NewCounter(prometheus.CounterOpts{Name: "inferlb_extproc_memory_trims_total",
		Help: "Times the resident set was above --idle-memory plus twice the request bodies in flight and free memory was returned to the OS."})
	m.laneWaits = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "inferlb_extproc_large_body_lane_wait_seconds",
		Help:    "How long a large buffered request body's headers waited for the large-body lane (--large-body-lane) before Envoy could send it.",
		Buckets: []float64{0, 0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25}})
	m.laneTimeouts = prometheus.NewCounter(prometheus.CounterOpts{Name: "inferlb_extproc_large_body_lane_timeouts_total",
		Help: "Large buffered request bodies that went on without the large-body lane after waiting 250 ms for it (or whose stream Envoy ended while they waited)."})
	m.laneBypassed = prometheus.NewCounter(prometheus.CounterOpts{Name: "inferlb_extproc_large_body_lane_bypassed_total",
		Help: "Large buffered request bodies sent beside a full large-body lane without waiting, no small request having come in the last second (the lane protects small requests; with none, large bodies keep their throughput)."})
	m.slowUploads = prometheus.NewCounter(prometheus.CounterOpts{Name: "inferlb_extproc_slow_uploads_total",
		Help: "Streamed request bodies not whole after the upload grace: ext_proc extended Envoy's message timer to --upload-timeout for them."})
	bodies := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "inferlb_extproc_request_bodies_total",
		Help: "Request bodies decided on, by how Envoy sent them (the ext_proc filter's request_body_mode): buffered (one message) or streamed (chunks sent without waiting for the headers' answer, which carries the decision)."}, []string{"mode"})
	m.bodiesBuffered, m.bodiesStreamed = bodies.WithLabelValues("buffered"), bodies.WithLabelValues("streamed")
	m.bodyChunks = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "inferlb_extproc_request_body_chunks",
		Help: "Chunks a streamed request body came in until it was whole (each is a message from Envoy and an answer).", Buckets: prometheus.ExponentialBuckets(1, 2, 8)})
	m.bodiesCut = prometheus.NewCounter(prometheus.CounterOpts{Name: "inferlb_extproc_request_bodies_cut_total",
		Help: "Streamed request bodies refused before their end, on a limit their first bytes proved (too many messages or token ids for the largest context): Envoy did not read the rest for ext_proc."})
	reg.MustRegister(m.requestsExpired, m.unknownLogs, m.completion, m.memoryTrims, m.slowUploads, m.laneWaits, m.laneTimeouts, m.laneBypassed, bodies, m.bodyChunks, m.bodiesCut)
	reg.MustRegister(m.decisions, m.keys, m.rejected, m.decisionTime, m.bodyBytes, m.inflight, m.retriesGranted,
		m.responses, m.headerLatency, m.policyUpdates, m.policyVersion, m.streams, m.contextBounds, m.placements)
	return m
}

// VersionHash is the number inferlb_extproc_policy_version_hash shows for a
// RoutingPolicy version: the low 53 bits of the version's FNV-1a hash, so
// that the float64 sample holds it exactly; never 0, which means no policy.
func VersionHash(version string) float64 {
	h := fnv.New64a()
	h.Write([]byte(version))
	if v := h.Sum64() & (1<<53 - 1); v != 0 {
		return float64(v)
	}
	return 1
}
