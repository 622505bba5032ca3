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
	"strings"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// vLLM metric names read from /metrics.
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
)

// Metrics is one parse of an engine's /metrics. Counters and histogram sums
// are cumulative; a missing metric is NaN (absent, not zero).
type Metrics struct {
	Running, Waiting, KVUsage float64
	PrefixHits, PrefixQueries float64
	TTFTSum, TTFTCount        float64
	ITLSum, ITLCount          float64
	Success                   float64
	PromptTokens, GenTokens   float64
}

// maxMetricsBytes bounds a /metrics body.
const maxMetricsBytes = 8 << 20

// ParseMetrics parses Prometheus text exposition and extracts the vLLM
// signals, summing over label sets (vLLM labels by model and engine index).
// The three gauges the control plane cannot do without (running, waiting,
// KV usage) must be present.
func ParseMetrics(r io.Reader) (Metrics, error) {
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
	// Counters in the text format may appear with or without _total.
	counter := func(name string) float64 {
		if v := sum(name); !math.IsNaN(v) {
			return v
		}
		return sum(strings.TrimSuffix(name, "_total"))
	}
	hist := func(name string) (s, c float64) {
		f, ok := fams[name]
		if !ok || f.GetType() != dto.MetricType_HISTOGRAM {
			return math.NaN(), math.NaN()
		}
		for _, x := range f.Metric {
			s += x.GetHistogram().GetSampleSum()
			c += float64(x.GetHistogram().GetSampleCount())
		}
		return s, c
	}
	m.Running = sum(MetricRunning)
	m.Waiting = sum(MetricWaiting)
	m.KVUsage = sum(MetricKVUsage)
	m.PrefixHits = counter(MetricPrefixHits)
	m.PrefixQueries = counter(MetricPrefixQuery)
	m.Success = counter(MetricSuccess)
	m.PromptTokens = counter(MetricPromptTokens)
	m.GenTokens = counter(MetricGenTokens)
	m.TTFTSum, m.TTFTCount = hist(MetricTTFT)
	m.ITLSum, m.ITLCount = hist(MetricITL)
	var missing []string
	for name, v := range map[string]float64{MetricRunning: m.Running, MetricWaiting: m.Waiting, MetricKVUsage: m.KVUsage} {
		if math.IsNaN(v) {
			missing = append(missing, name)
		} else if v < 0 || math.IsInf(v, 0) {
			return Metrics{}, fmt.Errorf("metrics: %s is %v, must be a finite number ≥ 0", name, v)
		}
	}
	if len(missing) > 0 {
		return Metrics{}, fmt.Errorf("metrics: missing %s (is this a vLLM /metrics?)", strings.Join(sortStrings(missing), ", "))
	}
	return m, nil
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

// Scrape reads one engine's /metrics and /health concurrently.
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
		body, err := s.get(ctx, "http://"+t.Address+"/metrics", true)
		if err != nil {
			out.MetricsErr = err
			return
		}
		out.Metrics, out.MetricsErr = ParseMetrics(strings.NewReader(body))
	}()
	go func() {
		defer wg.Done()
		_, err := s.get(ctx, "http://"+t.Address+"/health", false)
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
