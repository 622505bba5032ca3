package loadgen

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/inferlb/inferlb/tools/workload"
)

// stats are the latency histograms and token counts of a set of requests.
type stats struct {
	ok, rejected, timeouts, failed, cancelled int
	goodput                                   int
	ttft, tpot, itl, e2e                      Histogram
	promptTokens, outputTokens                int64 // completed requests
	usagePrompt, usageCached                  int64 // from usage blocks
	usageCount                                int
}

func (s *stats) add(req *workload.Request, res *Result, slo SLO) {
	switch res.Outcome {
	case Rejected:
		s.rejected++
		return
	case Timeout:
		s.timeouts++
		return
	case Failed:
		s.failed++
		return
	case Cancelled:
		s.cancelled++
		return
	}
	s.ok++
	s.e2e.RecordDuration(res.E2E)
	if res.TTFT > 0 {
		s.ttft.RecordDuration(res.TTFT)
	}
	tpot, hasTPOT := res.TPOT()
	if hasTPOT {
		s.tpot.RecordDuration(tpot)
	}
	for _, d := range res.ITLs {
		s.itl.RecordDuration(d)
	}
	if (slo.TTFT == 0 || (res.TTFT > 0 && res.TTFT <= slo.TTFT)) && (slo.TPOT == 0 || !hasTPOT || tpot <= slo.TPOT) {
		s.goodput++
	}
	prompt := req.PromptTokens
	if res.HasUsage {
		prompt = res.PromptTokens
		s.usageCount++
		s.usagePrompt += int64(res.PromptTokens)
		s.usageCached += int64(res.CachedTokens)
	}
	s.promptTokens += int64(prompt)
	s.outputTokens += int64(res.OutputTokens)
}

// collector gathers results from concurrent requests.
type collector struct {
	slo   SLO
	scale float64 // real seconds per target second
	start time.Time

	mu        sync.Mutex
	sentN     int
	inflight  int
	lag       Histogram
	all       stats
	groups    map[string]*stats
	lastDone  time.Time
	errs      map[string]int
	lastProg  time.Time
	lastProgN int
}

func newCollector(slo SLO, scale float64) *collector {
	return &collector{slo: slo, scale: scale, groups: map[string]*stats{}, errs: map[string]int{}}
}

// target converts a real duration to the target's time.
func (c *collector) target(d time.Duration) time.Duration {
	if c.scale == 1 {
		return d
	}
	return time.Duration(float64(d) / c.scale)
}

func (c *collector) begin(start time.Time) {
	c.mu.Lock()
	c.start = start
	c.mu.Unlock()
}

func (c *collector) sent(lag time.Duration) {
	c.mu.Lock()
	c.sentN++
	c.inflight++
	c.lag.RecordDuration(c.target(lag))
	c.mu.Unlock()
}

func (c *collector) group(key string) *stats {
	g := c.groups[key]
	if g == nil {
		g = &stats{}
		c.groups[key] = g
	}
	return g
}

const maxErrorKinds = 20

func (c *collector) done(req *workload.Request, res *Result) {
	now := time.Now()
	if c.scale != 1 {
		scaled := *res
		scaled.TTFT, scaled.E2E = c.target(res.TTFT), c.target(res.E2E)
		scaled.ITLs = make([]time.Duration, len(res.ITLs))
		for i, d := range res.ITLs {
			scaled.ITLs[i] = c.target(d)
		}
		res = &scaled
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.inflight--
	c.lastDone = now
	c.all.add(req, res, c.slo)
	if req.Priority != "" {
		c.group("priority="+req.Priority).add(req, res, c.slo)
	}
	if req.Region != "" {
		c.group("region="+req.Region).add(req, res, c.slo)
	}
	if res.Err != nil && res.Outcome != Cancelled {
		msg := res.Err.Error()
		if len(msg) > 200 {
			msg = msg[:200]
		}
		if _, ok := c.errs[msg]; ok || len(c.errs) < maxErrorKinds {
			c.errs[msg]++
		}
	}
}

func ms(ns float64) float64 { return ns / 1e6 }

func (c *collector) progress(now time.Time) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lastProg.IsZero() {
		c.lastProg = c.start
	}
	done := c.all.ok
	rate := float64(done-c.lastProgN) / c.target(now.Sub(c.lastProg)).Seconds()
	c.lastProg, c.lastProgN = now, done
	cached := ""
	if c.all.usagePrompt > 0 {
		cached = fmt.Sprintf(" | cached %.1f%%", 100*float64(c.all.usageCached)/float64(c.all.usagePrompt))
	}
	return fmt.Sprintf("loadgen %5.0fs: sent %d ok %d inflight %d | 429 %d timeout %d err %d | %.1f req/s | TTFT p50 %.1fms p99 %.1fms | TPOT p50 %.2fms%s",
		c.target(now.Sub(c.start)).Seconds(), c.sentN, c.all.ok, c.inflight, c.all.rejected, c.all.timeouts, c.all.failed, rate,
		ms(c.all.ttft.Quantile(0.5)), ms(c.all.ttft.Quantile(0.99)), ms(c.all.tpot.Quantile(0.5)), cached)
}

// Dist summarizes one latency distribution, in milliseconds.
type Dist struct {
	Count uint64  `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

func dist(h *Histogram) Dist {
	return Dist{Count: h.Count(), Mean: ms(h.Mean()), P50: ms(h.Quantile(0.5)), P90: ms(h.Quantile(0.9)), P99: ms(h.Quantile(0.99)), Max: ms(float64(h.Max()))}
}

// Counts are requests by outcome.
type Counts struct {
	Sent      int `json:"sent"`
	OK        int `json:"ok"`
	Rejected  int `json:"rejected_429"`
	Timeouts  int `json:"timeouts"`
	Errors    int `json:"errors"`
	Cancelled int `json:"cancelled"`
}

// Stats are the metrics of a set of requests.
type Stats struct {
	Requests Counts `json:"requests"`
	// RequestsPerS, and the token rates, count completed requests over the
	// run's wall time.
	RequestsPerS     float64 `json:"requests_per_s"`
	InputTokensPerS  float64 `json:"input_tokens_per_s"`
	OutputTokensPerS float64 `json:"output_tokens_per_s"`
	// GoodputPerS is completed requests meeting both SLO bounds per second.
	GoodputPerS float64 `json:"goodput_requests_per_s"`
	Goodput     int     `json:"goodput_requests"`
	TTFT        Dist    `json:"ttft"`
	TPOT        Dist    `json:"tpot"`
	ITL         Dist    `json:"itl"`
	E2E         Dist    `json:"e2e"`
	// PromptTokens and OutputTokens of completed requests.
	PromptTokens int64 `json:"prompt_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// CachedTokens sums usage.prompt_tokens_details.cached_tokens;
	// CachedShare is CachedTokens over the prompt tokens of the requests
	// that reported usage (UsageRequests of them).
	CachedTokens  int64   `json:"cached_prompt_tokens"`
	CachedShare   float64 `json:"cached_prompt_share"`
	UsageRequests int     `json:"usage_requests"`
}

func (s *stats) export(sent int, secs float64) Stats {
	out := Stats{
		Requests:     Counts{Sent: sent, OK: s.ok, Rejected: s.rejected, Timeouts: s.timeouts, Errors: s.failed, Cancelled: s.cancelled},
		Goodput:      s.goodput,
		TTFT:         dist(&s.ttft),
		TPOT:         dist(&s.tpot),
		ITL:          dist(&s.itl),
		E2E:          dist(&s.e2e),
		PromptTokens: s.promptTokens, OutputTokens: s.outputTokens,
		CachedTokens: s.usageCached, UsageRequests: s.usageCount,
	}
	if s.usagePrompt > 0 {
		out.CachedShare = float64(s.usageCached) / float64(s.usagePrompt)
	}
	if secs > 0 {
		out.RequestsPerS = float64(s.ok) / secs
		out.InputTokensPerS = float64(s.promptTokens) / secs
		out.OutputTokensPerS = float64(s.outputTokens) / secs
		out.GoodputPerS = float64(s.goodput) / secs
	}
	return out
}

// Report is the result of a run.
type Report struct {
	Arrival     string  `json:"arrival"`
	Rate        float64 `json:"rate,omitempty"`
	Speedup     float64 `json:"speedup,omitempty"`
	Concurrency int     `json:"concurrency,omitempty"`
	// TimeScale, when set, is the target's time scale: every duration and
	// rate of the report is in the target's (simulated) time.
	TimeScale float64 `json:"time_scale,omitempty"`
	// Start is when the run started (request offsets count from it).
	Start time.Time `json:"start"`
	// DurationS is the time from the start to the last completion.
	DurationS float64 `json:"duration_s"`
	SLO       struct {
		TTFTMs float64 `json:"ttft_ms,omitempty"`
		TPOTMs float64 `json:"tpot_ms,omitempty"`
	} `json:"slo"`
	Stats
	// SendLag is how late requests were sent against their schedule (open
	// loop) — the generator's own delay; large values mean it could not keep
	// up.
	SendLag Dist `json:"send_lag"`
	// IdealCachedShare, when the workload knows it (a Mooncake replay), is
	// the share of prompt tokens an unbounded prefix cache would serve for
	// the rows sent; IdealBlockShare the same in the trace's blocks.
	IdealCachedShare float64 `json:"ideal_cached_prompt_share,omitempty"`
	IdealBlockShare  float64 `json:"ideal_block_share,omitempty"`
	// Groups break the metrics down by "priority=NAME" and "region=NAME".
	Groups map[string]Stats `json:"groups,omitempty"`
	// Errors counts error messages (up to 20 distinct).
	Errors      map[string]int `json:"errors,omitempty"`
	Interrupted bool           `json:"interrupted,omitempty"`
}

func (c *collector) report(end time.Time) *Report {
	c.mu.Lock()
	defer c.mu.Unlock()
	last := c.lastDone
	if last.IsZero() {
		last = end
	}
	secs := c.target(last.Sub(c.start)).Seconds()
	rep := &Report{Start: c.start, DurationS: secs, Stats: c.all.export(c.sentN, secs), SendLag: dist(&c.lag)}
	rep.SLO.TTFTMs = ms(float64(c.slo.TTFT))
	rep.SLO.TPOTMs = ms(float64(c.slo.TPOT))
	if len(c.groups) > 0 {
		rep.Groups = map[string]Stats{}
		keys := make([]string, 0, len(c.groups))
		for k := range c.groups {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			g := c.groups[k]
			rep.Groups[k] = g.export(g.ok+g.rejected+g.timeouts+g.failed+g.cancelled, secs)
		}
	}
	if len(c.errs) > 0 {
		rep.Errors = map[string]int{}
		for k, v := range c.errs {
			rep.Errors[k] = v
		}
	}
	return rep
}
