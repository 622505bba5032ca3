package rivalbench

import (
	"bufio"
	"context"
	"fmt"
	"math"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/inferlb/inferlb/tools/enginesim"
	"github.com/inferlb/inferlb/tools/loadgen"
	"github.com/inferlb/inferlb/tools/workload"
)

// historySlack is how many prompt tokens a follow-up turn may find uncached
// of its previous turn's prompt and still count as served with its
// conversation's history: one KV block (the engines' block_size), since an
// engine caches whole blocks only.
const historySlack = 16

// measure gathers one router's per-request observations.
type measure struct {
	mu sync.Mutex
	// prev is each session's last prompt length served (usage), by the
	// session's first-turn index.
	prev      map[int]int
	ttfts     []time.Duration
	sent, ok  int
	followUps int // follow-ups whose previous turn was served
	misses    int // of them, served without their history
	// regions are the same figures by the requests' source region (with
	// several regions).
	regions map[string]*regionMeasure
}

type regionMeasure struct {
	ttfts                             []time.Duration
	sent, ok, shed, followUps, misses int
}

func newMeasure() *measure {
	return &measure{prev: map[int]int{}, regions: map[string]*regionMeasure{}}
}

// observe is the load generator's OnResult.
func (m *measure) observe(req *workload.Request, res *loadgen.Result) {
	m.mu.Lock()
	defer m.mu.Unlock()
	rm := &regionMeasure{} // discarded without a region
	if req.Region != "" {
		if rm = m.regions[req.Region]; rm == nil {
			rm = &regionMeasure{}
			m.regions[req.Region] = rm
		}
	}
	m.sent++
	rm.sent++
	if res.Outcome != loadgen.OK {
		if res.Outcome == loadgen.Rejected {
			rm.shed++
		}
		delete(m.prev, req.Index)
		return
	}
	m.ok++
	rm.ok++
	if res.TTFT > 0 {
		m.ttfts = append(m.ttfts, res.TTFT)
		rm.ttfts = append(rm.ttfts, res.TTFT)
	}
	if !res.HasUsage || req.Turns == 0 { // not a conversation
		return
	}
	if req.Turn > 1 {
		if p, ok := m.prev[req.Index]; ok {
			m.followUps++
			rm.followUps++
			if res.CachedTokens < p-historySlack {
				m.misses++
				rm.misses++
			}
		}
	}
	m.prev[req.Index] = res.PromptTokens
	if req.Turn >= req.Turns {
		delete(m.prev, req.Index)
	}
}

func (m *measure) counts() (sent, ok int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.sent, m.ok
}

// ttftsMs are the TTFTs of the requests served, in milliseconds, sorted.
func (m *measure) ttftsMs() []float64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]float64, len(m.ttfts))
	for i, d := range m.ttfts {
		out[i] = float64(d) / float64(time.Millisecond)
	}
	slices.Sort(out)
	return out
}

// writeTTFTs writes the TTFTs (ms, one a line, sorted) for later charts.
func (m *measure) writeTTFTs(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for _, v := range m.ttftsMs() {
		fmt.Fprintf(w, "%.3f\n", v)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// result is the router's figures from its clients' report and the
// per-request observations.
func (m *measure) result(rep *loadgen.Report) RouterResult {
	m.mu.Lock()
	defer m.mu.Unlock()
	r := RouterResult{
		Sent: rep.Requests.Sent, OK: rep.Requests.OK, Shed: rep.Requests.Rejected,
		Errors:  rep.Requests.Errors + rep.Requests.Timeouts,
		TTFTP50: rep.TTFT.P50, TTFTP90: rep.TTFT.P90, TTFTP99: rep.TTFT.P99,
		TPOTP50: rep.TPOT.P50, E2EP50: rep.E2E.P50,
		RequestsPerS: rep.RequestsPerS, OutputTokensPerS: rep.OutputTokensPerS,
		FollowUps: m.followUps, HistoryMisses: m.misses, ErrorKinds: rep.Errors,
	}
	if m.followUps > 0 {
		r.HistoryMissShare = float64(m.misses) / float64(m.followUps)
	}
	for name, rm := range m.regions {
		if r.Regions == nil {
			r.Regions = map[string]RegionResult{}
		}
		x := RegionResult{Sent: rm.sent, OK: rm.ok, Shed: rm.shed}
		ms := make([]float64, len(rm.ttfts))
		for i, d := range rm.ttfts {
			ms[i] = float64(d) / float64(time.Millisecond)
		}
		slices.Sort(ms)
		x.TTFTP50, x.TTFTP99 = nearestRank(ms, 0.5), nearestRank(ms, 0.99)
		if rm.followUps > 0 {
			x.HistoryMissShare = float64(rm.misses) / float64(rm.followUps)
		}
		r.Regions[name] = x
	}
	return r
}

// nearestRank is the q-quantile of sorted xs by the nearest-rank rule (0
// for none).
func nearestRank(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	k := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[max(0, min(k, len(xs)-1))]
}

// engineCounters are one fleet's engines' counters at a moment, by engine.
type engineCounters map[string]counters

type counters struct {
	hits, queries, requests float64
	// region is the engine's; bySource its completion requests by their
	// source region (engine-sim's own series; "none": no header).
	region   string
	bySource map[string]float64
}

// scrapeFleet reads every engine's /metrics.
func scrapeFleet(ctx context.Context, engines []engine) (engineCounters, error) {
	out := engineCounters{}
	client := &http.Client{Timeout: 5 * time.Second}
	for _, e := range engines {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.url()+"/metrics", nil)
		if err != nil {
			return nil, err
		}
		resp, err := client.Do(req)
		if err != nil {
			return nil, fmt.Errorf("engine %s metrics: %w", e.ID, err)
		}
		parser := expfmt.NewTextParser(model.LegacyValidation)
		fams, err := parser.TextToMetricFamilies(resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, fmt.Errorf("engine %s metrics: %w", e.ID, err)
		}
		c := counters{
			hits:     sum(fams["vllm:prefix_cache_hits_total"]),
			queries:  sum(fams["vllm:prefix_cache_queries_total"]),
			requests: sum(fams["vllm:request_success_total"]),
			region:   e.Region,
			bySource: map[string]float64{},
		}
		for _, m := range fams[enginesim.SourceRegionMetric].GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "source_region" {
					c.bySource[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
		out[e.ID] = c
	}
	return out, nil
}

func sum(f *dto.MetricFamily) float64 {
	if f == nil {
		return 0
	}
	var s float64
	for _, m := range f.Metric {
		if c := m.GetCounter(); c != nil {
			s += c.GetValue()
		} else if u := m.GetUntyped(); u != nil {
			s += u.GetValue()
		}
	}
	return s
}

// engineFigures sets the hit rate and the load spread from the engines'
// counters before and after the traffic.
func (r *RouterResult) engineFigures(before, after engineCounters) {
	var hits, queries float64
	var served []float64
	ids := make([]string, 0, len(after))
	for id := range after {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		a, b := after[id], before[id]
		hits += a.hits - b.hits
		queries += a.queries - b.queries
		served = append(served, a.requests-b.requests)
	}
	if queries > 0 {
		r.HitRate = hits / queries
	}
	r.EngineRequests = served
	// Requests that crossed regions: served by an engine outside the
	// region they came from (requests with no source region came from a
	// router beside the engine).
	var all, crossed float64
	for _, id := range ids {
		a, b := after[id], before[id]
		for src, n := range a.bySource {
			d := n - b.bySource[src]
			all += d
			if src != "none" && src != a.region {
				crossed += d
			}
		}
	}
	if all > 0 {
		r.CrossRegionShare = crossed / all
	}
	var total, most float64
	for _, s := range served {
		total += s
		most = math.Max(most, s)
	}
	if total > 0 {
		r.LoadSpread = most / (total / float64(len(served)))
	}
}

// fmtRatio formats a ratio to two decimals ("-" when undefined).
func fmtRatio(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) || x == 0 {
		return "-"
	}
	return strconv.FormatFloat(x, 'f', 2, 64) + "x"
}
