package signals

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
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
	// EvidenceWindow is how far back Engine.Window looks: the latency
	// evidence penalties are judged on accumulates over this many seconds
	// of scrapes (at 1 request/s, a 1-s scrape rarely holds 3 first
	// tokens). 0 means 10 s.
	EvidenceWindow time.Duration
	// IdleReset: an engine that produced no first token for this long
	// forgets its smoothed TTFT and TBOT (they describe a load long gone).
	// 0 means 60 s.
	IdleReset time.Duration
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
	// Window is the evidence of the last EvidenceWindow: histogram and
	// counter deltas summed over the scrapes in it, gauges averaged.
	Window Window `json:"window"`
	// Resets counts the times the latency memory was cleared (restart,
	// counter reset, long idle); LastReset says why the last one was.
	Resets    int    `json:"latency_resets"`
	LastReset string `json:"last_reset,omitempty"`
	// QueueMs and E2EMs are the mean time requests waited to be scheduled
	// and their mean end-to-end latency over recent intervals (NaN until
	// seen). TTFTExcludesQueue is set once the engine's queue time summed
	// since its start exceeded its TTFT summed since its start, which a
	// TTFT that counts queueing never does; from then on TTFTMs is the reported TTFT plus the queue time,
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

// Window is an engine's evidence over the tracker's evidence window, from
// the scrapes since the engine's last reset.
type Window struct {
	Seconds float64 `json:"seconds"`
	// First tokens and inter-token gaps observed, with their means (ms;
	// 0 without samples).
	TTFTCount  float64 `json:"ttft_count"`
	TTFTMeanMs float64 `json:"ttft_mean_ms"`
	// TTFTSDMs is the first tokens' standard deviation (ms) where every
	// scrape with first tokens had the histogram's buckets (Metrics.TTFTSquares);
	// 0 when unknown.
	TTFTSDMs   float64 `json:"ttft_sd_ms,omitempty"`
	ITLCount   float64 `json:"itl_count"`
	TBOTMeanMs float64 `json:"tbot_mean_ms"`
	// Requests scheduled (their queue wait ended) and their mean wait in
	// the waiting queue (ms; 0 without samples), from the engine's queue
	// time histogram (vllm:request_queue_time_seconds) where it has one.
	QueueCount  float64 `json:"queue_count"`
	QueueMeanMs float64 `json:"queue_mean_ms"`
	// Mean running and waiting requests over the window's time (each
	// scrape interval counted at the mean of its two ends: gaugeMean).
	Running float64 `json:"running"`
	Waiting float64 `json:"waiting"`
	// Rates over the window: requests finished, prompt tokens not served
	// from the prefix cache, generated tokens.
	CompletionsPerS    float64 `json:"completions_per_s"`
	UncachedPromptPerS float64 `json:"uncached_prompt_tokens_per_s"`
	GenerationPerS     float64 `json:"generation_tokens_per_s"`
}

// delta is one scrape's contribution to the evidence window.
type delta struct {
	at                                 time.Time
	dt                                 float64 // seconds since the previous scrape
	ttftSum, ttftCount, itlSum, itlCnt float64
	// ttftBounds and ttftIn: the TTFT histogram's bounds and the first
	// tokens of this scrape in each bucket, the last the overflow (nil:
	// no buckets).
	ttftBounds, ttftIn     []float64
	queueSum, queueCount   float64
	success, uncached, gen float64
	// running and waiting: the gauges' mean over the interval, taken as
	// the mean of its two ends (see gaugeMean).
	running, waiting float64
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
	deltas      []delta   // evidence window, oldest first
	lastTTFT    time.Time // last scrape that saw a first token
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

// SetEngines makes ids the tracked engines (a fleet update): engines that
// stay keep their signals, new ones start never scraped, the others are
// dropped.
func (t *Tracker) SetEngines(ids []string) {
	keep := map[string]*track{}
	for _, id := range ids {
		if tr, ok := t.tracks[id]; ok {
			keep[id] = tr
			continue
		}
		nan := math.NaN()
		keep[id] = &track{e: Engine{ID: id, Running: nan, Waiting: nan, KVUsage: nan, TTFTMs: nan, TBOTMs: nan, QueueMs: nan, E2EMs: nan}}
	}
	t.tracks = keep
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
	wasScraped := tr.scraped
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
	after := t.state(tr, s.At)
	if wasScraped && after == Up && (before == Down || before == Stale) {
		// Back from down (often a restart on the same address) or from
		// silence: what was measured before says nothing about now.
		t.resetLatency(tr, "back "+after.String()+" from "+before.String())
	}
	if !tr.lastTTFT.IsZero() && s.At.Sub(tr.lastTTFT) > t.idleReset() && tr.hasTTFT {
		t.resetLatency(tr, fmt.Sprintf("no first token for %v", s.At.Sub(tr.lastTTFT).Round(time.Second)))
	}
	return before != after
}

func (t *Tracker) idleReset() time.Duration {
	if t.opt.IdleReset > 0 {
		return t.opt.IdleReset
	}
	return time.Minute
}

func (t *Tracker) evidenceWindow() time.Duration {
	if t.opt.EvidenceWindow > 0 {
		return t.opt.EvidenceWindow
	}
	return 10 * time.Second
}

// resetLatency forgets the engine's latency memory: the smoothed TTFT and
// TBOT and the evidence window.
func (t *Tracker) resetLatency(tr *track, why string) {
	tr.e.TTFTMs, tr.e.TBOTMs, tr.e.TTFTSamples = math.NaN(), math.NaN(), 0
	tr.hasTTFT, tr.hasTBOT = false, false
	tr.deltas = tr.deltas[:0]
	tr.lastTTFT = time.Time{}
	tr.e.Resets++
	tr.e.LastReset = why
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
		// rebase, and forget the latency measured before.
		reset := m.RestartedSince(p)
		if reset {
			tr.e.Restarts++
			t.resetLatency(tr, "counters reset (engine restarted)")
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
			d := delta{at: at, dt: sec, running: gaugeMean(p.Running, m.Running), waiting: gaugeMean(p.Waiting, m.Waiting)}
			pos := func(cur, prev float64) float64 {
				if math.IsNaN(cur) || math.IsNaN(prev) || cur < prev {
					return 0
				}
				return cur - prev
			}
			d.ttftSum, d.ttftCount = pos(m.TTFTSum, p.TTFTSum), pos(m.TTFTCount, p.TTFTCount)
			d.ttftBounds, d.ttftIn = bucketDelta(m.TTFTBuckets, p.TTFTBuckets, m.TTFTCount-p.TTFTCount)
			d.queueSum, d.queueCount = pos(m.QueueSum, p.QueueSum), pos(m.QueueCount, p.QueueCount)
			d.itlSum, d.itlCnt = pos(m.ITLSum, p.ITLSum), pos(m.ITLCount, p.ITLCount)
			d.success, d.gen = pos(m.Success, p.Success), pos(m.GenTokens, p.GenTokens)
			d.uncached = math.Max(0, pos(m.PromptTokens, p.PromptTokens)-pos(m.PrefixHits, p.PrefixHits))
			if d.ttftCount > 0 {
				tr.lastTTFT = at
			}
			tr.deltas = append(tr.deltas, d)
			cut := 0
			for cut < len(tr.deltas) && at.Sub(tr.deltas[cut].at) > t.evidenceWindow() {
				cut++
			}
			tr.deltas = append(tr.deltas[:0], tr.deltas[cut:]...)
		}
	}
	tr.prev, tr.prevAt, tr.havePrev = m, at, true
}

// bucketDelta returns a scrape's first tokens per bucket (cur less prev,
// the overflow last, its share of count) with the bounds, or nils when
// either scrape has no buckets, their bounds differ, or a count fell (a
// restart).
func bucketDelta(cur, prev *Buckets, count float64) (bounds, in []float64) {
	if cur == nil || prev == nil || !slices.Equal(cur.Bounds, prev.Bounds) {
		return nil, nil
	}
	in = make([]float64, len(cur.Bounds)+1)
	below := 0.0
	for i := range cur.Cumulative {
		c := cur.Cumulative[i] - prev.Cumulative[i]
		if c < below {
			return nil, nil
		}
		in[i], below = c-below, c
	}
	if count < below {
		return nil, nil
	}
	in[len(cur.Bounds)] = count - below
	return cur.Bounds, in
}

// ttftSpread is the least standard deviation (s) that samples counted
// in buckets (in, the overflow last) with this mean can have: each
// sample as near the mean as its bucket allows. Midpoints would overstate
// it, wildly where samples sit at the edge of a wide bucket (vLLM's run
// 0.25-0.5, 2.5-5 s): a slow engine whose first tokens all took 3 s would
// look as spread as noise, and keep no penalty. A lower bound only spares
// what the buckets prove is noise.
func ttftSpread(bounds, in []float64, mean float64) float64 {
	n, v := 0.0, 0.0
	lo := 0.0
	for i, c := range in {
		hi := math.Inf(1)
		if i < len(bounds) {
			hi = bounds[i]
		}
		d := 0.0
		switch {
		case mean < lo:
			d = lo - mean
		case mean > hi:
			d = mean - hi
		}
		n += c
		v += c * d * d
		lo = hi
	}
	if !(n > 0) {
		return 0
	}
	return math.Sqrt(v / n)
}

// gaugeMean is a gauge's mean over a scrape interval, from its values at
// the interval's start (prev) and end (cur): their mean (the trapezoid
// rule), or the one known when the other is NaN (a page without it).
//
// Why both ends: the window's counters are deltas over the intervals
// between its scrapes, so its gauges must describe the same intervals.
// With the end values alone, the window's gauges would begin half an
// interval after its counters, and a queue that ended just after a scrape
// would lose its last sample from the window while the first tokens it
// delayed, counted at the next scrape, stayed: those first tokens would be
// judged against an idle engine's prediction, and a few of them (the end of a cancelled
// burst) could give a healthy engine a large penalty
// (TestWindowGaugesCoverTheirIntervals here, controlplane's
// TestCycleQueueBeforeTheWindowIsNotAFault for the penalty).
func gaugeMean(prev, cur float64) float64 {
	switch {
	case math.IsNaN(prev):
		return cur
	case math.IsNaN(cur):
		return prev
	}
	return (prev + cur) / 2
}

// window sums the evidence of the scrapes within the window before now:
// counters summed, gauges averaged over its time.
func (t *Tracker) window(tr *track, now time.Time) Window {
	var w Window
	var ttft, itl, succ, unc, gen, run, wait, qSum, qCount float64
	var bounds, in []float64 // the window's TTFT buckets (nil: unknown)
	known := true
	for _, d := range tr.deltas {
		if now.Sub(d.at) > t.evidenceWindow() {
			continue
		}
		w.Seconds += d.dt
		w.TTFTCount += d.ttftCount
		ttft += d.ttftSum
		if d.ttftCount > 0 && known {
			switch {
			case d.ttftIn == nil || (bounds != nil && !slices.Equal(bounds, d.ttftBounds)):
				known, in = false, nil
			case bounds == nil:
				bounds, in = d.ttftBounds, slices.Clone(d.ttftIn)
			default:
				for i, v := range d.ttftIn {
					in[i] += v
				}
			}
		}
		qSum += d.queueSum
		qCount += d.queueCount
		w.ITLCount += d.itlCnt
		itl += d.itlSum
		succ += d.success
		unc += d.uncached
		gen += d.gen
		run += d.dt * d.running
		wait += d.dt * d.waiting
	}
	if w.Seconds <= 0 {
		return Window{}
	}
	if w.TTFTCount > 0 {
		w.TTFTMeanMs = 1000 * ttft / w.TTFTCount
		if known && in != nil && w.TTFTCount >= 2 {
			w.TTFTSDMs = 1000 * ttftSpread(bounds, in, ttft/w.TTFTCount)
		}
		// An engine whose TTFT leaves out queueing (ttftEvidence) has it
		// added back: the prediction it is judged against includes the
		// queue.
		if tr.e.TTFTExcludesQueue && qCount > 0 {
			w.TTFTMeanMs += 1000 * qSum / qCount
		}
	}
	if w.ITLCount > 0 {
		w.TBOTMeanMs = 1000 * itl / w.ITLCount
	}
	if qCount > 0 {
		w.QueueCount, w.QueueMeanMs = qCount, 1000*qSum/qCount
	}
	w.Running, w.Waiting = run/w.Seconds, wait/w.Seconds
	w.CompletionsPerS, w.UncachedPromptPerS, w.GenerationPerS = succ/w.Seconds, unc/w.Seconds, gen/w.Seconds
	return w
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
		e.Window = t.window(tr, now)
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
