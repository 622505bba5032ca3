package signals

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net"
	"sort"
	"time"
)

// TrackerOptions configure a Tracker.
type TrackerOptions struct {
	// Smoothing is the EWMA time constant: a step change is 63% absorbed
	// after this long. 0 means no smoothing (last interval only).
	Smoothing time.Duration
	// StaleAfter: an engine without a successful metrics scrape for this
	// long is Stale (its load is unknown, not zero).
	StaleAfter time.Duration
}

// State is the control plane's verdict on an engine.
type State int

const (
	// Up: /health passes and metrics are fresh.
	Up State = iota
	// Down: /health failed on the last scrape.
	Down
	// Stale: no fresh metrics, or no /health verdict yet (every one timed
	// out); load or health unknown.
	Stale
	// New: never scraped yet.
	New
)

func (s State) String() string {
	return [...]string{"up", "down", "stale", "new"}[s]
}

// Engine is the smoothed view of one engine at a point in time.
type Engine struct {
	ID          string    `json:"id"`
	State       string    `json:"state"`
	LastScrape  time.Time `json:"last_scrape"`
	LastMetrics time.Time `json:"last_metrics"`
	// AgeSeconds is the age of the last good metrics at the query time
	// (-1: never scraped successfully).
	AgeSeconds float64 `json:"age_seconds"`
	LastError  string  `json:"last_error,omitempty"`
	// Smoothed gauges.
	Running float64 `json:"running"`
	Waiting float64 `json:"waiting"`
	KVUsage float64 `json:"kv_usage"`
	// Smoothed rates per second over recent intervals.
	RequestsPerS       float64 `json:"requests_per_s"`
	PromptTokensPerS   float64 `json:"prompt_tokens_per_s"`
	CachedTokensPerS   float64 `json:"cached_tokens_per_s"`
	GenerationTokPerS  float64 `json:"generation_tokens_per_s"`
	PrefixCacheHitRate float64 `json:"prefix_cache_hit_rate"`
	// Observed mean TTFT and TBOT (inter-token latency) in ms over recent
	// intervals; NaN until a request completed.
	TTFTMs float64 `json:"ttft_ms"`
	TBOTMs float64 `json:"tbot_ms"`
	// TTFTSamples counts first tokens seen in the last interval (evidence
	// weight for the residual).
	TTFTSamples float64 `json:"ttft_samples"`
	// QueueMs and E2EMs are the mean time requests waited to be scheduled
	// and their mean end-to-end latency over recent intervals (NaN until
	// seen). TTFTExcludesQueue is set once the engine's mean queue time
	// exceeded its mean TTFT, which a TTFT that counts queueing never
	// does; from then on TTFTMs is the reported TTFT plus the queue time,
	// so queueing is never invisible in the latency evidence.
	QueueMs           float64 `json:"queue_ms"`
	E2EMs             float64 `json:"e2e_ms"`
	TTFTExcludesQueue bool    `json:"ttft_excludes_queue,omitempty"`
	// Missing names the mapped metrics the last page lacked (a server
	// creating them at its first request, or a mapping that does not fit).
	Missing []string `json:"missing,omitempty"`
	// Restarts counts restarts seen (a counter went down or vanished, or
	// the process start time changed).
	Restarts int `json:"restarts,omitempty"`

	state State
}

// Status is the engine's verdict.
func (e Engine) Status() State { return e.state }

type track struct {
	e        Engine
	prev     Metrics
	prevAt   time.Time
	havePrev bool
	healthOK bool
	// healthKnown: some /health answered (or failed) without timing out.
	healthKnown bool
	scraped     bool
	hasTTFT     bool
	hasTBOT     bool
	hasGauges   bool
	hasRates    bool
}

// Tracker turns samples into smoothed signals. Not safe for concurrent
// use; the control loop owns it.
type Tracker struct {
	opt    TrackerOptions
	tracks map[string]*track
}

// NewTracker returns a tracker for the given engine ids.
func NewTracker(opt TrackerOptions, ids []string) *Tracker {
	t := &Tracker{opt: opt, tracks: map[string]*track{}}
	for _, id := range ids {
		nan := math.NaN()
		t.tracks[id] = &track{e: Engine{ID: id, Running: nan, Waiting: nan, KVUsage: nan, TTFTMs: nan, TBOTMs: nan, QueueMs: nan, E2EMs: nan}}
	}
	return t
}

func (t *Tracker) alpha(dt time.Duration) float64 {
	if t.opt.Smoothing <= 0 || dt <= 0 {
		return 1
	}
	return 1 - math.Exp(-dt.Seconds()/t.opt.Smoothing.Seconds())
}

func ewma(old, v, a float64, have bool) float64 {
	if !have || math.IsNaN(old) {
		return v
	}
	return old + a*(v-old)
}

// Observe folds a sample in. It returns whether the engine's up/down
// verdict changed (the control loop runs a cycle at once then).
func (t *Tracker) Observe(s Sample) (changed bool) {
	tr, ok := t.tracks[s.ID]
	if !ok {
		return false
	}
	before := t.state(tr, tr.e.LastScrape) // as last seen
	tr.scraped = true
	tr.e.LastScrape = s.At
	// A /health that timed out says nothing (an overloaded engine answers
	// late): keep the last verdict. Refused or non-2xx is a failure.
	if !isTimeout(s.HealthErr) {
		tr.healthOK, tr.healthKnown = s.Healthy, true
	}
	tr.e.LastError = ""
	if s.HealthErr != nil {
		tr.e.LastError = "health: " + s.HealthErr.Error()
	}
	if s.MetricsErr != nil {
		if tr.e.LastError != "" {
			tr.e.LastError += "; "
		}
		tr.e.LastError += "metrics: " + s.MetricsErr.Error()
	} else {
		t.fold(tr, s.Metrics, s.At)
	}
	return before != t.state(tr, s.At)
}

func (t *Tracker) fold(tr *track, m Metrics, at time.Time) {
	dt := at.Sub(tr.prevAt)
	a := t.alpha(dt)
	tr.e.Running = foldGauge(tr.e.Running, m.Running, a, tr.hasGauges)
	tr.e.Waiting = foldGauge(tr.e.Waiting, m.Waiting, a, tr.hasGauges)
	tr.e.KVUsage = foldGauge(tr.e.KVUsage, m.KVUsage, a, tr.hasGauges)
	tr.hasGauges = true
	tr.e.LastMetrics = at
	tr.e.Missing = m.Missing
	if tr.havePrev && dt > 0 {
		p := tr.prev
		// A counter that went down or vanished means the engine restarted:
		// rebase.
		reset := m.RestartedSince(p)
		if reset {
			tr.e.Restarts++
		}
		if !reset {
			sec := dt.Seconds()
			rate := func(cur, prev float64) float64 {
				if math.IsNaN(cur) || math.IsNaN(prev) {
					return 0
				}
				return (cur - prev) / sec
			}
			tr.e.RequestsPerS = ewma(tr.e.RequestsPerS, rate(m.Success, p.Success), a, tr.hasRates)
			tr.e.PromptTokensPerS = ewma(tr.e.PromptTokensPerS, rate(m.PromptTokens, p.PromptTokens), a, tr.hasRates)
			tr.e.CachedTokensPerS = ewma(tr.e.CachedTokensPerS, rate(m.PrefixHits, p.PrefixHits), a, tr.hasRates)
			tr.e.GenerationTokPerS = ewma(tr.e.GenerationTokPerS, rate(m.GenTokens, p.GenTokens), a, tr.hasRates)
			if dq := m.PrefixQueries - p.PrefixQueries; dq > 0 {
				tr.e.PrefixCacheHitRate = ewma(tr.e.PrefixCacheHitRate, (m.PrefixHits-p.PrefixHits)/dq, a, tr.hasRates)
			}
			tr.e.TTFTSamples = 0
			if dc := m.TTFTCount - p.TTFTCount; dc > 0 {
				tr.e.TTFTMs = ewma(tr.e.TTFTMs, ttftEvidence(&tr.e, m, p), a, tr.hasTTFT)
				tr.e.TTFTSamples = dc
				tr.hasTTFT = true
			}
			if dc := m.ITLCount - p.ITLCount; dc > 0 {
				tr.e.TBOTMs = ewma(tr.e.TBOTMs, 1000*(m.ITLSum-p.ITLSum)/dc, a, tr.hasTBOT)
				tr.hasTBOT = true
			}
			foldExtra(&tr.e, m, p, a)
			tr.hasRates = true
		}
	}
	tr.prev, tr.prevAt, tr.havePrev = m, at, true
}

func (t *Tracker) state(tr *track, now time.Time) State {
	switch {
	case !tr.scraped:
		return New
	case !tr.healthKnown:
		// Every /health so far timed out: an overloaded engine answers
		// late, so this says nothing yet; unknown, not down.
		return Stale
	case !tr.healthOK:
		return Down
	case tr.e.LastMetrics.IsZero() || (t.opt.StaleAfter > 0 && now.Sub(tr.e.LastMetrics) > t.opt.StaleAfter):
		return Stale
	}
	return Up
}

// Engines returns every engine's view at now, sorted by id.
func (t *Tracker) Engines(now time.Time) []Engine {
	out := make([]Engine, 0, len(t.tracks))
	for _, tr := range t.tracks {
		e := tr.e
		e.state = t.state(tr, now)
		e.State = e.state.String()
		if !e.LastMetrics.IsZero() {
			e.AgeSeconds = now.Sub(e.LastMetrics).Seconds()
		} else {
			e.AgeSeconds = -1 // never
		}
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// MarshalJSON writes NaN gauges and latencies (not reported, or nothing
// observed yet) as null.
func (e Engine) MarshalJSON() ([]byte, error) {
	type plain Engine
	nan := func(v float64) *float64 {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return nil
		}
		return &v
	}
	return json.Marshal(struct {
		plain
		Running *float64 `json:"running"`
		Waiting *float64 `json:"waiting"`
		KVUsage *float64 `json:"kv_usage"`
		TTFTMs  *float64 `json:"ttft_ms"`
		TBOTMs  *float64 `json:"tbot_ms"`
		QueueMs *float64 `json:"queue_ms"`
		E2EMs   *float64 `json:"e2e_ms"`
	}{plain(e), nan(e.Running), nan(e.Waiting), nan(e.KVUsage), nan(e.TTFTMs), nan(e.TBOTMs), nan(e.QueueMs), nan(e.E2EMs)})
}

func isTimeout(err error) bool {
	if err == nil {
		return false
	}
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}
