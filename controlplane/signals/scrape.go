// Package signals collects what the control plane knows about engines and
// demand:
//
//   - Scraper reads an engine's Prometheus /metrics (vLLM names, parsed with
//     expfmt) and its /health, concurrently, each with a timeout;
//   - Tracker turns successive scrapes into smoothed per-engine signals
//     (load, KV usage, observed TTFT and TBOT over the last interval,
//     prefix-cache hit rate) and tracks staleness: an engine whose scrapes
//     fail is Stale — unknown, never "idle";
//   - Intake aggregates the ext_proc services' reports into demand per
//     (frontend, class, priority) and per-engine evidence (responses,
//     errors, header latency).
//
// Scraper does I/O; Tracker and Intake are driven by explicit timestamps so
// the control loop can run them in virtual time.
package signals

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// vLLM metric names read from /metrics (the current ones; Mapping lists
// the older names and SGLang's).
const (
	MetricRunning      = "vllm:num_requests_running"
	MetricWaiting      = "vllm:num_requests_waiting"
	MetricKVUsage      = "vllm:kv_cache_usage_perc"
	MetricPrefixHits   = "vllm:prefix_cache_hits_total"
	MetricPrefixQuery  = "vllm:prefix_cache_queries_total"
	MetricTTFT         = "vllm:time_to_first_token_seconds"
	MetricITL          = "vllm:inter_token_latency_seconds"
	MetricSuccess      = "vllm:request_success_total"
	MetricPromptTokens = "vllm:prompt_tokens_total"
	MetricGenTokens    = "vllm:generation_tokens_total"
	MetricQueueTime    = "vllm:request_queue_time_seconds"
	MetricE2E          = "vllm:e2e_request_latency_seconds"
	MetricCacheConfig  = "vllm:cache_config_info"
)

// Metrics is one parse of an engine's /metrics. Counters and histogram sums
// are cumulative; a missing metric is NaN (absent, not zero): servers such
// as SGLang create their series at the first request.
type Metrics struct {
	Running, Waiting, KVUsage float64
	PrefixHits, PrefixQueries float64
	// PrefixHitRate is a server's own hit-rate gauge (SGLang's
	// cache_hit_rate, vLLM v0's gpu_prefix_cache_hit_rate), read when the
	// hit and query counters are absent.
	PrefixHitRate      float64
	TTFTSum, TTFTCount float64
	// TTFTBuckets is the TTFT histogram: its finite upper bounds (s) and
	// the cumulative count at each, summed over the series; nil when the
	// page has no buckets (or its series disagree on them). The spread of
	// a window's first tokens is read from it (Window.TTFTSDMs).
	TTFTBuckets             *Buckets
	ITLSum, ITLCount        float64
	Success                 float64
	PromptTokens, GenTokens float64
	// QueueSum/QueueCount: time requests waited before being scheduled;
	// E2ESum/E2ECount: arrival to last token. Queueing shows in them (and
	// in Waiting) even where a server's TTFT leaves it out.
	QueueSum, QueueCount float64
	E2ESum, E2ECount     float64
	// StartTime is process_start_time_seconds (a changed value is a
	// restart).
	StartTime float64
	// BlockSize and KVBlocks are vLLM's cache_config_info labels
	// (block_size, num_gpu_blocks); KVTokens is SGLang's
	// max_total_num_tokens. NaN when absent.
	BlockSize, KVBlocks, KVTokens float64
	// Missing names the mapped signals the page lacked.
	Missing []string
}

// Buckets is a histogram's finite upper bounds, increasing, and the
// cumulative count at each.
type Buckets struct {
	Bounds, Cumulative []float64
}

// histBuckets returns the buckets of the first of names that is a
// histogram, summed over its series (nil if it has none, or its series
// have different bounds).
func histBuckets(fams map[string]*dto.MetricFamily, names []string) *Buckets {
	for _, n := range names {
		f, ok := fams[n]
		if !ok || f.GetType() != dto.MetricType_HISTOGRAM {
			continue
		}
		var out *Buckets
		for _, x := range f.Metric {
			var b Buckets
			for _, bk := range x.GetHistogram().GetBucket() {
				if ub := bk.GetUpperBound(); !math.IsInf(ub, 1) {
					b.Bounds = append(b.Bounds, ub)
					b.Cumulative = append(b.Cumulative, float64(bk.GetCumulativeCount()))
				}
			}
			switch {
			case len(b.Bounds) == 0:
				return nil
			case out == nil:
				out = &b
			case !slices.Equal(out.Bounds, b.Bounds):
				return nil
			default:
				for i := range out.Cumulative {
					out.Cumulative[i] += b.Cumulative[i]
				}
			}
		}
		return out
	}
	return nil
}

// Mapping names a server kind's metrics, each with alternatives tried in
// order (current names first, then older ones).
type Mapping struct {
	Server                                   string
	Running, Waiting, KVUsage                []string
	PrefixHits, PrefixQueries, PrefixHitRate []string
	TTFT, ITL, Queue, E2E                    []string
	Success, PromptTokens, GenTokens         []string
	CacheConfigInfo, KVTokens                []string
	// PromptExcludesHits: the server's prompt-token counter leaves out the
	// tokens served from its prefix cache (llama.cpp's counts only the
	// tokens it evaluated). The hits are added back, so PromptTokens is
	// every prompt token as for vLLM, and that total is also the count of
	// prefix-cache queries.
	PromptExcludesHits bool
	// Required gauges: a page without them is an error (a wrong port, a
	// server of another kind). SGLang's and generic servers' gauges may be
	// absent before the first request, so none is required for them.
	Required bool
}

// Mappings by fleet server kind (engines[].server).
var Mappings = map[string]*Mapping{
	"vllm": {
		Server:  "vllm",
		Running: []string{MetricRunning}, Waiting: []string{MetricWaiting},
		KVUsage:    []string{MetricKVUsage, "vllm:gpu_cache_usage_perc"},
		PrefixHits: []string{MetricPrefixHits, "vllm:gpu_prefix_cache_hits_total"}, PrefixQueries: []string{MetricPrefixQuery, "vllm:gpu_prefix_cache_queries_total"},
		PrefixHitRate: []string{"vllm:gpu_prefix_cache_hit_rate"},
		TTFT:          []string{MetricTTFT}, ITL: []string{MetricITL, "vllm:time_per_output_token_seconds"},
		Queue: []string{MetricQueueTime}, E2E: []string{MetricE2E},
		Success: []string{MetricSuccess}, PromptTokens: []string{MetricPromptTokens}, GenTokens: []string{MetricGenTokens},
		CacheConfigInfo: []string{MetricCacheConfig, "vllm:cache_config"},
		Required:        true,
	},
	"sglang": {
		Server:  "sglang",
		Running: []string{"sglang:num_running_reqs"}, Waiting: []string{"sglang:num_queue_reqs"},
		KVUsage:    []string{"sglang:token_usage"},
		PrefixHits: []string{"sglang:cached_tokens_total"}, PrefixQueries: []string{"sglang:prompt_tokens_total"},
		PrefixHitRate: []string{"sglang:cache_hit_rate"},
		TTFT:          []string{"sglang:time_to_first_token_seconds"}, ITL: []string{"sglang:inter_token_latency_seconds", "sglang:time_per_output_token_seconds"},
		Queue: []string{"sglang:queue_time_seconds"}, E2E: []string{"sglang:e2e_request_latency_seconds"},
		Success: []string{"sglang:num_requests_total"}, PromptTokens: []string{"sglang:prompt_tokens_total"}, GenTokens: []string{"sglang:generation_tokens_total"},
		KVTokens: []string{"sglang:max_total_num_tokens"},
	},
	// llama.cpp's llama-server (--metrics): no histograms, no request
	// counter, no KV-cache gauge in current builds (older ones had
	// kv_cache_usage_ratio, read when present); TTFT, TBOT, queue and
	// end-to-end latency, finished requests and the cache size stay
	// unknown. Its gauges exist from the start, but a server without
	// --metrics answers 501, so none is required here either: the scrape
	// fails with that status.
	"llamacpp": {
		Server:  "llamacpp",
		Running: []string{"llamacpp:requests_processing"}, Waiting: []string{"llamacpp:requests_deferred"},
		KVUsage:            []string{"llamacpp:kv_cache_usage_ratio"},
		PrefixHits:         []string{"llamacpp:prompt_tokens_cached_total"},
		PromptTokens:       []string{"llamacpp:prompt_tokens_total"},
		GenTokens:          []string{"llamacpp:tokens_predicted_total"},
		PromptExcludesHits: true,
	},
}

func init() {
	// generic: an OpenAI-compatible server of unknown metrics; vLLM's
	// names are read when present, none is required.
	g := *Mappings["vllm"]
	g.Server, g.Required = "generic", false
	Mappings["generic"] = &g
}

// MappingFor returns the mapping of a server kind ("" is vLLM), or nil.
func MappingFor(server string) *Mapping {
	if server == "" {
		server = "vllm"
	}
	return Mappings[server]
}

// maxMetricsBytes bounds a /metrics body.
const maxMetricsBytes = 8 << 20

// ParseMetrics parses a vLLM /metrics page (vLLM's Mapping.Parse).
func ParseMetrics(r io.Reader) (Metrics, error) { return MappingFor("vllm").Parse(r) }

// Parse parses Prometheus text exposition and extracts the mapped signals,
// summing over label sets (servers label by model, engine index, TP rank).
// A required mapping's three gauges (running, waiting, KV usage) must be
// present; gauges must be finite and ≥ 0.
func (mp *Mapping) Parse(r io.Reader) (Metrics, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(io.LimitReader(r, maxMetricsBytes))
	if err != nil {
		return Metrics{}, fmt.Errorf("parse metrics: %w", err)
	}
	m := Metrics{}
	sum := func(name string) float64 {
		f, ok := fams[name]
		if !ok {
			return math.NaN()
		}
		v := 0.0
		for _, x := range f.Metric {
			switch f.GetType() {
			case dto.MetricType_COUNTER:
				v += x.GetCounter().GetValue()
			case dto.MetricType_GAUGE:
				v += x.GetGauge().GetValue()
			case dto.MetricType_UNTYPED:
				v += x.GetUntyped().GetValue()
			default:
				return math.NaN()
			}
		}
		return v
	}
	// The first name present; counters may appear with or without _total.
	first := func(names []string) float64 {
		for _, n := range names {
			if v := sum(n); !math.IsNaN(v) {
				return v
			}
			if t, ok := strings.CutSuffix(n, "_total"); ok {
				if v := sum(t); !math.IsNaN(v) {
					return v
				}
			}
		}
		return math.NaN()
	}
	hist := func(names []string) (s, c float64) {
		for _, n := range names {
			f, ok := fams[n]
			if !ok || f.GetType() != dto.MetricType_HISTOGRAM {
				continue
			}
			for _, x := range f.Metric {
				s += x.GetHistogram().GetSampleSum()
				c += float64(x.GetHistogram().GetSampleCount())
			}
			return s, c
		}
		return math.NaN(), math.NaN()
	}
	m.Running, m.Waiting, m.KVUsage = first(mp.Running), first(mp.Waiting), first(mp.KVUsage)
	m.PrefixHits, m.PrefixQueries, m.PrefixHitRate = first(mp.PrefixHits), first(mp.PrefixQueries), first(mp.PrefixHitRate)
	m.Success, m.PromptTokens, m.GenTokens = first(mp.Success), first(mp.PromptTokens), first(mp.GenTokens)
	m.TTFTSum, m.TTFTCount = hist(mp.TTFT)
	m.TTFTBuckets = histBuckets(fams, mp.TTFT)
	m.ITLSum, m.ITLCount = hist(mp.ITL)
	m.QueueSum, m.QueueCount = hist(mp.Queue)
	m.E2ESum, m.E2ECount = hist(mp.E2E)
	if mp.PromptExcludesHits && !math.IsNaN(m.PromptTokens) && !math.IsNaN(m.PrefixHits) {
		m.PromptTokens += m.PrefixHits
		m.PrefixQueries = m.PromptTokens
	}
	m.StartTime = sum("process_start_time_seconds")
	m.KVTokens = first(mp.KVTokens)
	m.BlockSize, m.KVBlocks = math.NaN(), math.NaN()
	for _, n := range mp.CacheConfigInfo {
		if f, ok := fams[n]; ok && len(f.Metric) > 0 {
			for _, l := range f.Metric[0].GetLabel() {
				v, err := strconv.ParseFloat(l.GetValue(), 64)
				if err != nil || v <= 0 || math.IsInf(v, 0) {
					continue
				}
				switch l.GetName() {
				case "block_size":
					m.BlockSize = v
				case "num_gpu_blocks":
					m.KVBlocks = v
				}
			}
			break
		}
	}
	// A signal a mapping has no name for is unknown by design, not missing
	// from the page.
	name0 := func(names []string) string {
		if len(names) == 0 {
			return ""
		}
		return names[0]
	}
	gauges := []struct {
		name string
		v    float64
	}{{name0(mp.Running), m.Running}, {name0(mp.Waiting), m.Waiting}, {name0(mp.KVUsage), m.KVUsage}}
	var missing []string
	for _, g := range gauges {
		if g.name == "" && math.IsNaN(g.v) {
			continue
		}
		if math.IsNaN(g.v) {
			missing = append(missing, g.name)
		} else if g.v < 0 || math.IsInf(g.v, 0) {
			return Metrics{}, fmt.Errorf("metrics: %s is %v, must be a finite number ≥ 0", g.name, g.v)
		}
	}
	if mp.Required && len(missing) > 0 {
		return Metrics{}, fmt.Errorf("metrics: missing %s (is this a %s /metrics?)", strings.Join(sortStrings(missing), ", "), mp.Server)
	}
	for _, c := range []struct {
		name string
		v    float64
	}{{name0(mp.TTFT), m.TTFTCount}, {name0(mp.Success), m.Success}, {name0(mp.PromptTokens), m.PromptTokens}, {name0(mp.GenTokens), m.GenTokens}} {
		if c.name != "" && math.IsNaN(c.v) {
			missing = append(missing, c.name)
		}
	}
	m.Missing = sortStrings(missing)
	return m, nil
}

// intervalMeanMs is the mean of a histogram over an interval, in ms.
func intervalMeanMs(sum, count, psum, pcount float64) (float64, bool) {
	dc := count - pcount
	if !(dc > 0) {
		return 0, false
	}
	return 1000 * (sum - psum) / dc, true
}

// foldGauge smooths a gauge; an absent one (NaN) keeps the last value, or
// stays unknown (NaN) if there is none: missing is not zero.
func foldGauge(old, v, a float64, have bool) float64 {
	if math.IsNaN(v) {
		return old
	}
	return ewma(old, v, a, have)
}

// foldExtra folds one interval's queue and end-to-end latency into e
// (smoothing a), and the server's hit-rate gauge where the hit and query
// counters are absent.
func foldExtra(e *Engine, m, p Metrics, a float64) {
	if math.IsNaN(m.PrefixQueries) && !math.IsNaN(m.PrefixHitRate) {
		e.PrefixCacheHitRate = ewma(e.PrefixCacheHitRate, m.PrefixHitRate, a, true)
	}
	if v, ok := intervalMeanMs(m.QueueSum, m.QueueCount, p.QueueSum, p.QueueCount); ok {
		e.QueueMs = ewma(e.QueueMs, v, a, true)
	}
	if v, ok := intervalMeanMs(m.E2ESum, m.E2ECount, p.E2ESum, p.E2ECount); ok {
		e.E2EMs = ewma(e.E2EMs, v, a, true)
	}
}

// ttftEvidence is the interval's mean TTFT as latency evidence (the caller
// checked that first tokens were seen). An engine whose queue time summed
// since its start exceeds its TTFT summed since its start reports TTFT
// without queueing; from then on its evidence is TTFT plus that
// interval's queue time.
//
// The totals, not an interval's means: a server times a request's queue
// wait when it finishes and its TTFT at its first token, and each request
// that counts queueing in its TTFT adds at least as much to the TTFT sum
// as it later adds to the queue sum, so for such a server the queue total
// never passes the TTFT total. An interval's means compare different
// requests: while a long queue drains, the requests finishing waited
// longer than the ones getting their first token took, so an engine whose
// TTFT counts its queue could be taken for one that does not, its evidence
// then counting the queue twice: a penalty for overload.
func ttftEvidence(e *Engine, m, p Metrics) float64 {
	ttft, _ := intervalMeanMs(m.TTFTSum, m.TTFTCount, p.TTFTSum, p.TTFTCount)
	q, okQ := intervalMeanMs(m.QueueSum, m.QueueCount, p.QueueSum, p.QueueCount)
	if okQ && m.QueueSum > m.TTFTSum {
		e.TTFTExcludesQueue = true
	}
	if e.TTFTExcludesQueue && okQ {
		return ttft + q
	}
	return ttft
}

// RestartedSince reports whether the engine restarted between two scrapes:
// a counter went down or vanished, or the process start time changed.
func (m Metrics) RestartedSince(prev Metrics) bool {
	for _, c := range [][2]float64{{m.Success, prev.Success}, {m.TTFTCount, prev.TTFTCount}, {m.PromptTokens, prev.PromptTokens}, {m.GenTokens, prev.GenTokens}} {
		cur, old := c[0], c[1]
		if !math.IsNaN(old) && (math.IsNaN(cur) || cur < old) {
			return true
		}
	}
	return !math.IsNaN(prev.StartTime) && !math.IsNaN(m.StartTime) && m.StartTime != prev.StartTime
}

func sortStrings(s []string) []string {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
	return s
}

// Target is an engine to scrape.
type Target struct {
	ID      string
	Address string // host:port
	// Server is the fleet's server kind (engines[].server), selecting the
	// metric mapping; "" is vLLM.
	Server string
	// HealthPath is probed for readiness (engines[].health_path); "" is
	// /health.
	HealthPath string
}

// Sample is one scrape of one engine.
type Sample struct {
	ID string
	At time.Time
	// Metrics is valid when MetricsErr is nil.
	Metrics    Metrics
	MetricsErr error
	// Healthy is /health's verdict (2xx within the timeout).
	Healthy   bool
	HealthErr error
}

// Scraper scrapes engines over HTTP.
type Scraper struct {
	Client *http.Client
	// Timeout bounds each request (metrics and health separately).
	Timeout time.Duration
	// MaxParallel bounds concurrent engines; 0 means 64.
	MaxParallel int
	// Now stamps samples; nil means time.Now.
	Now func() time.Time
}

// Scrape reads one engine's /metrics and its health path concurrently.
func (s *Scraper) Scrape(ctx context.Context, t Target) Sample {
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	out := Sample{ID: t.ID}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		mp := MappingFor(t.Server)
		if mp == nil {
			out.MetricsErr = fmt.Errorf("unknown server kind %q", t.Server)
			return
		}
		body, err := s.get(ctx, "http://"+t.Address+"/metrics", true)
		if err != nil {
			out.MetricsErr = err
			return
		}
		out.Metrics, out.MetricsErr = mp.Parse(strings.NewReader(body))
	}()
	go func() {
		defer wg.Done()
		path := t.HealthPath
		if path == "" {
			path = "/health"
		}
		_, err := s.get(ctx, "http://"+t.Address+path, false)
		out.Healthy, out.HealthErr = err == nil, err
	}()
	wg.Wait()
	out.At = now()
	return out
}

func (s *Scraper) get(ctx context.Context, url string, read bool) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	c := s.Client
	if c == nil {
		c = http.DefaultClient
	}
	resp, err := c.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var b []byte
	if read {
		b, err = io.ReadAll(io.LimitReader(resp.Body, maxMetricsBytes))
	} else {
		_, err = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	}
	if err != nil {
		return "", err
	}
	if resp.StatusCode/100 != 2 {
		return "", fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return string(b), nil
}

// ScrapeAll scrapes every target concurrently (at most MaxParallel at once)
// and returns the samples in target order.
func (s *Scraper) ScrapeAll(ctx context.Context, ts []Target) []Sample {
	n := s.MaxParallel
	if n <= 0 {
		n = 64
	}
	out := make([]Sample, len(ts))
	sem := make(chan struct{}, n)
	var wg sync.WaitGroup
	for i, t := range ts {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			out[i] = s.Scrape(ctx, t)
		}()
	}
	wg.Wait()
	return out
}

// ErrStale marks an engine whose signals are too old to use.
var ErrStale = errors.New("signals are stale")
