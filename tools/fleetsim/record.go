package fleetsim

import (
	"container/list"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane"
	"github.com/inferlb/inferlb/internal/dist"
)

// outcome is how a request ended (or, from Admit, that it may go on).
type outcome uint8

const (
	outcomeAdmitted outcome = iota
	outcomeServed
	outcomeShed     // 429 from admission
	outcomeFailed   // 5xx, reset, no healthy upstream, or still running at the end
	outcomeRejected // 4xx before routing (no class, no policy yet)
)

// record is one request's figures, compact (a million of them fit).
type record struct {
	arrival float32 // seconds since traffic start
	ttft    float32 // seconds, client side
	tpot    float32 // seconds
	prompt  int32
	cached  int32
	engine  int16
	out     outcome
	retries uint8
	remap   int8 // −1 first turn, 0 same engine as the last turn, 1 moved
	prio    int8 // index into the fleet's priorities, −1 none given
	far     bool // served by an engine outside the frontend's region
}

// recorder accumulates a run's figures.
type recorder struct {
	s        *Sim
	recs     []record
	nArrived int
	// oracle: the fleet's KV capacity pooled as one LRU block cache.
	oracle             *pooledLRU
	oracleQ, oracleHit float64
	// regional: each region's KV capacity pooled, fed the requests that
	// come from it: the best a router that keeps requests in their region
	// can do (regionHit over oracleQ).
	regional  map[string]*pooledLRU
	regionHit float64
	// series
	samples []float64   // sample times (s since traffic start)
	load    [][]float32 // sample → engine in-flight
	loadSum []float64
	loadN   int
	// work[j] is the capacity-seconds engine j spent on measured requests
	// (workCost's per-token costs); tokSec[j] those costs.
	work      []float64
	tokSec    []tokenCost
	weightsT  []float64
	weights   []map[string]float64
	churnSum  float64
	churnN    int
	cycles    int
	marks     []mark
	notes     []string
	noteCount map[string]int
	noteFirst map[string]string
}

type mark struct {
	At    float64 `json:"at_s"`
	Label string  `json:"label"`
}

// priorityIndex is the named priority's index in the fleet spec, −1 for
// none (or more than an int8 holds).
func (r *recorder) priorityIndex(name string) int8 {
	if name == "" {
		return -1
	}
	for i, p := range r.s.spec.Priorities {
		if p.Name == name && i < math.MaxInt8 {
			return int8(i)
		}
	}
	return -1
}

// tokenCost is an engine's work model: seconds of one replica's capacity
// per uncached prompt token and per output token.
type tokenCost struct{ prompt, output float64 }

func newRecorder(s *Sim) *recorder {
	r := &recorder{s: s, loadSum: make([]float64, len(s.engines)), work: make([]float64, len(s.engines)),
		noteCount: map[string]int{}, noteFirst: map[string]string{}}
	for _, e := range s.engines {
		r.tokSec = append(r.tokSec, engineTokenCost(s.spec, e.spec))
	}
	if !s.opt.NoSeries {
		blocks := 0
		for _, e := range s.engines {
			blocks += e.cfg.KVCapacityTokens / e.cfg.BlockSize * max(e.spec.Replicas, 1)
		}
		r.oracle = newPooledLRU(blocks)
		perRegion := map[string]int{}
		for _, e := range s.engines {
			perRegion[e.spec.Region] += e.cfg.KVCapacityTokens / e.cfg.BlockSize * max(e.spec.Replicas, 1)
		}
		r.regional = map[string]*pooledLRU{}
		for reg, b := range perRegion {
			r.regional[reg] = newPooledLRU(b)
		}
	}
	return r
}

func (r *recorder) rel(t time.Duration) float64 { return (t - lead).Seconds() }

func (r *recorder) measured(t time.Duration) bool { return t-lead >= r.s.sc.Warmup }

// arrived counts an arrival and feeds the oracle cache.
func (r *recorder) arrived(p *request) {
	r.nArrived++
	if r.oracle == nil {
		return
	}
	bs := r.s.blockSize()
	hs := r.s.blockHashes(p)
	hit := r.oracle.lookup(hs, (len(p.prompt)-1)/bs)
	// A region without engines of its own (or a request without a region)
	// counts against the whole fleet's pool.
	reg := r.regional[p.w.Region]
	regHit := hit
	if reg != nil {
		regHit = reg.lookup(hs, (len(p.prompt)-1)/bs)
	}
	if r.measured(p.arrival) {
		r.oracleQ += float64(len(p.prompt))
		r.oracleHit += float64(hit * bs)
		r.regionHit += float64(regHit * bs)
	}
	full := hs
	if len(p.outTok) > 0 {
		toks := append(slices.Clip(p.prompt), p.outTok...)
		full = chainHashes(toks, bs)
	}
	r.oracle.insert(full)
	if reg != nil {
		reg.insert(full)
	}
}

func (r *recorder) done(p *request, out outcome) {
	rec := record{arrival: float32(r.rel(p.arrival)), out: out, engine: -1, remap: -1, prompt: int32(len(p.prompt)),
		retries: uint8(min(p.retried, 255)), prio: r.priorityIndex(p.w.Priority)}
	if p.engine >= 0 {
		rec.engine = int16(p.engine)
	}
	if out == outcomeServed {
		owd := p.front.owd[p.engine]
		rec.ttft = float32((p.mr.FirstToken + owd - p.arrival).Seconds())
		if p.mr.Generated > 1 {
			rec.tpot = float32((p.mr.LastToken - p.mr.FirstToken).Seconds() / float64(p.mr.Generated-1))
		}
		rec.cached = int32(p.mr.CachedTokens)
		rec.far = r.s.engines[p.engine].region != p.front.spec.Region
		if r.measured(p.arrival) {
			c := r.tokSec[p.engine]
			r.work[p.engine] += float64(len(p.prompt)-p.mr.CachedTokens)*c.prompt + float64(p.mr.Generated)*c.output
		}
		if p.w.Turn > 1 && int(p.conv) < len(r.s.convLast) {
			if last := r.s.convLast[p.conv]; last >= 0 {
				rec.remap = 0
				if int(last) != p.engine {
					rec.remap = 1
				}
			}
		}
	}
	r.recs = append(r.recs, rec)
}

func (r *recorder) sample() {
	if r.s.now < lead {
		return
	}
	row := make([]float32, len(r.s.engines))
	for j, e := range r.s.engines {
		st := e.reps.Stats()
		v := float64(st.Running + st.Waiting + st.Pending)
		row[j] = float32(v)
		if r.measured(r.s.now) {
			r.loadSum[j] += v
		}
	}
	if r.measured(r.s.now) {
		r.loadN++
	}
	if !r.s.opt.NoSeries {
		r.samples = append(r.samples, r.rel(r.s.now))
		r.load = append(r.load, row)
	}
}

func (r *recorder) mark(label string) {
	r.marks = append(r.marks, mark{At: r.rel(r.s.now), Label: label})
}

// note records a problem of the run: one entry per kind, with how often
// it happened and its first detail.
func (r *recorder) note(kind string) { r.noteDetail(kind, "") }

func (r *recorder) noteDetail(kind, detail string) {
	r.noteCount[kind]++
	if r.noteCount[kind] == 1 {
		r.notes = append(r.notes, kind)
		if len(detail) > 300 {
			detail = detail[:300] + "…"
		}
		r.noteFirst[kind] = detail
	}
}

// notesText is the notes as text: "kind (N×): first detail".
func (r *recorder) notesText() []string {
	var out []string
	for _, k := range r.notes {
		t := fmt.Sprintf("%s (%d×)", k, r.noteCount[k])
		if d := r.noteFirst[k]; d != "" {
			t += ": " + d
		}
		out = append(out, t)
	}
	return out
}

// cycle records a control cycle's published weights: the first frontend's
// first class for the chart, and the churn (total-variation distance from
// the last cycle, averaged over every (frontend, class)).
func (r *recorder) cycle(pub, last map[string]map[string]map[string]float64) {
	r.cycles++
	if w := firstWeights(r.s, pub); w != nil && !r.s.opt.NoSeries {
		r.weightsT = append(r.weightsT, r.rel(r.s.now))
		r.weights = append(r.weights, w)
	}
	if last == nil || !r.measured(r.s.now) {
		return
	}
	sum, n := 0.0, 0
	// Sorted, so that float sums do not depend on map order.
	for _, node := range slices.Sorted(maps.Keys(pub)) {
		classes := pub[node]
		for _, cl := range slices.Sorted(maps.Keys(classes)) {
			if old, ok := last[node][cl]; ok {
				sum += dist.TotalVariation(old, classes[cl])
				n++
			}
		}
	}
	if n > 0 {
		r.churnSum += sum / float64(n)
		r.churnN++
	}
}

// Quantiles are latency percentiles in milliseconds.
type Quantiles struct {
	P50 float64 `json:"p50_ms"`
	P90 float64 `json:"p90_ms"`
	P95 float64 `json:"p95_ms"`
	P99 float64 `json:"p99_ms"`
}

// quantile of sorted xs (nearest rank).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

func quantilesOf(xs []float64) Quantiles {
	sort.Float64s(xs)
	return Quantiles{P50: quantile(xs, 0.5), P90: quantile(xs, 0.9), P95: quantile(xs, 0.95), P99: quantile(xs, 0.99)}
}

// pooledLRU is the reference cache for the best achievable hit rate: every
// engine's KV blocks pooled into one LRU cache of chained block hashes, fed
// every request in arrival order (prompt, then the answer's blocks as the
// engines keep them). A router cannot do better than one cache holding the
// whole fleet's capacity, up to LRU's own choices.
type pooledLRU struct {
	cap int
	m   map[uint64]*list.Element
	l   list.List
}

func newPooledLRU(blocks int) *pooledLRU {
	return &pooledLRU{cap: max(blocks, 1), m: map[uint64]*list.Element{}}
}

// lookup returns the cached leading blocks (at most limit), refreshing
// them.
func (c *pooledLRU) lookup(hs []uint64, limit int) int {
	n := 0
	for n < len(hs) && n < limit {
		el, ok := c.m[hs[n]]
		if !ok {
			break
		}
		c.l.MoveToFront(el)
		n++
	}
	return n
}

func (c *pooledLRU) insert(hs []uint64) {
	for _, h := range hs {
		if el, ok := c.m[h]; ok {
			c.l.MoveToFront(el)
			continue
		}
		c.m[h] = c.l.PushFront(h)
	}
	for c.l.Len() > c.cap {
		el := c.l.Back()
		delete(c.m, el.Value.(uint64))
		c.l.Remove(el)
	}
}

// engineTokenCost is the work model the control plane plans with for the
// engine (optimizer.Profile's PromptTokenSec and OutputTokenSec, from its
// fleet profile at the model's reference shape): what "capacity" means in
// the utilization figure. Zero when the profile cannot be built (the
// engine then reads as idle rather than failing the run).
func engineTokenCost(spec *fleet.Spec, e fleet.Engine) tokenCost {
	fp, ok := spec.ProfileOf(e)
	refP, refO, okRef := controlplane.ReferenceShape(spec, e.Model)
	if !ok || !okRef {
		return tokenCost{}
	}
	prof, err := controlplane.ProfileFromFleet(fp, refP, refO)
	if err != nil {
		return tokenCost{}
	}
	return tokenCost{prompt: prof.PromptTokenSec, output: prof.OutputTokenSec}
}
