package extproc

import (
	"math"
	"time"

	"github.com/inferlb/inferlb/extproc/body"
	"github.com/inferlb/inferlb/internal/envoylb"
)

// Cache-aware placement (Decider.SetCachePlacement; the default of
// `inferlb extproc`): every request is placed on an engine by its own
// prompt, inside the plan.
//
// The placer remembers which engines it sent each prefix to: the request's
// prefix chain (body.Chain) names its prefixes by chained hashes, so an
// engine that was sent a point's hash holds that whole prefix (until the
// engine evicts it, which the placer does not see: an entry older than
// prefixMaxAge is not believed). For a request, the cached prefix at each
// engine is the deepest of its points that engine was sent, and the
// request's first token there is predicted as
//
//	T(e) = max(busy(e), now) + (prompt − cached(e)) / rate(e) + inflight(e)·inflightCost
//
// (busy(e): when the prefills this service sent to e end; rate(e): the
// engine's prefill rate from the policy, defaultPrefillRate if unknown).
// The request goes to the engine with the smallest T among the engines of
// the first priority with a healthy engine (the plan's engines for this
// frontend and class)
// that are inside their budget; ties go to the longer cached prefix, then
// to home (where the affinity key lands on the class's table, the same at
// every replica), then to fewer requests in flight.
//
// The budget is the plan: each engine's share of the class's weights. The
// placer counts the requests it places per class and engine, decayed with
// budgetHalfLife; an engine whose count share exceeds its weight share by
// more than the slack takes no new request, so over a window the picks
// follow the plan's shares within that bound, and the geo spill, capacity,
// penalties and shedding the optimizer computed still hold. The slack is
// budgetSlack divided by the class's predicted utilization (at least
// minBudgetUtilization): when the engines are busy the shares bind within
// half again; when they have room, a hot prefix may stay on the engines
// that hold it well past their share rather than be prefilled afresh on a
// cold one, while an engine the plan gives a sliver (another region's)
// still takes a sliver.
//
// A conversation stays where its history is: the engine that was sent the
// request's own history (a point of its chain at or past the anchor, the
// end of its first user message) keeps it unless that engine is unhealthy,
// out of the plan (no weight, or failover only), or over its budget by
// more than twice the slack (at full utilization, twice its share). A weight change moves no
// conversation by itself. A new conversation goes by T, which prices
// each engine by what it lacks: the prefill of the prefix it was not sent.
//
// The pick travels as the affinity key: a key that lands on the chosen
// engine on the class's table (keyLandingOn), so Envoy's Maglev (or the
// endpoint picker) routes there with nothing but the header, and routes
// by the affinity key alone when ext_proc is not there.
//
// Memory: the index holds at most maxIndexPoints prefix points, each about
// 100 bytes with its map entry (about 13 MB), evicted oldest first.

// Cache-aware placement's constants. budgetSlack lets an engine with a hot
// prefix take half again its share before the prefix spills; the decay
// half-life is long enough to span a few seconds of requests at a few per
// second and short enough to follow the plan's cycle.
const (
	budgetSlack          = 0.5
	minBudgetUtilization = 0.1
	budgetHalfLife       = 10 * time.Second
	budgetPrior          = 16 // requests spread by share before any was counted
	defaultPrefillRate   = 10000
	inflightCost         = time.Millisecond
	prefixMaxAge         = 5 * time.Minute
	maxIndexPoints       = 1 << 17
	indexWays            = 4
)

// prefixSlot is the engines (by addrID, 0 empty) most recently sent a
// prefix, and when.
type prefixSlot struct {
	addr [indexWays]uint16
	at   [indexWays]int64
}

// prefixIndex maps prefix point hashes to the engines sent them; guarded
// by the placer's mu.
type prefixIndex struct {
	slots map[uint64]prefixSlot
	ring  []uint64 // keys in insertion order; next is the oldest once full
	next  int
	ids   map[string]uint16 // engine address → addrID (from 1)
}

func newPrefixIndex() *prefixIndex {
	return &prefixIndex{slots: map[uint64]prefixSlot{}, ids: map[string]uint16{}}
}

// id is the address's number (0 when the table of numbers is full).
func (x *prefixIndex) id(addr string) uint16 {
	if n, ok := x.ids[addr]; ok {
		return n
	}
	if len(x.ids) >= math.MaxUint16-1 {
		return 0
	}
	n := uint16(len(x.ids) + 1)
	x.ids[addr] = n
	return n
}

// record notes that the chain's prefixes were sent to addr at now.
func (x *prefixIndex) record(c *body.Chain, addr string, now time.Time) {
	id := x.id(addr)
	if id == 0 || c == nil {
		return
	}
	ns := now.UnixNano()
	for _, pt := range c.At() {
		s, ok := x.slots[pt.Hash]
		if !ok {
			if len(x.ring) < maxIndexPoints {
				x.ring = append(x.ring, pt.Hash)
			} else {
				delete(x.slots, x.ring[x.next])
				x.ring[x.next] = pt.Hash
				x.next = (x.next + 1) % maxIndexPoints
			}
		}
		// The way holding addr, else the oldest.
		w := 0
		for i := range s.addr {
			if s.addr[i] == id {
				w = i
				break
			}
			if s.at[i] < s.at[w] {
				w = i
			}
		}
		s.addr[w], s.at[w] = id, ns
		x.slots[pt.Hash] = s
	}
}

// cached sets cached[i] to the tokens of the chain's deepest prefix sent
// to host i of the table (0: none) within prefixMaxAge of now, and
// depth[i] to that point's index in the chain (-1: none).
func (x *prefixIndex) cached(c *body.Chain, hosts []envoylb.Host, cached, depth []int, now time.Time) {
	for i := range cached {
		cached[i], depth[i] = 0, -1
	}
	if c == nil {
		return
	}
	byID := map[uint16]int{}
	for i, h := range hosts {
		if n, ok := x.ids[h.Key]; ok {
			byID[n] = i
		}
	}
	if len(byID) == 0 {
		return
	}
	oldest := now.Add(-prefixMaxAge).UnixNano()
	left := len(byID)
	pts := c.At()
	for j := len(pts) - 1; j >= 0 && left > 0; j-- {
		s, ok := x.slots[pts[j].Hash]
		if !ok {
			continue
		}
		for w, n := range s.addr {
			i, ok := byID[n]
			if !ok || s.at[w] < oldest || depth[i] >= 0 {
				continue
			}
			cached[i], depth[i] = max(int(pts[j].Tokens), 1), j
			left--
		}
	}
}

type budgetKey struct{ class, addr string }

// placeCache is cache-aware placement (see above) for a request of class
// whose affinity key lands on table host home.
func (pl *placer) placeCache(t *ClassTable, class string, key uint64, table int, chain *body.Chain,
	prompt int, now time.Time) (uint64, string) {
	home := table
	if pl.index == nil {
		pl.index = newPrefixIndex()
	}
	if el := now.Sub(pl.countAt); el > 0 {
		f := math.Exp2(-el.Seconds() / budgetHalfLife.Seconds())
		for k := range pl.count {
			if pl.count[k] *= f; pl.count[k] < 1e-3 {
				delete(pl.count, k)
			}
		}
		pl.countAt = now
	}
	n := len(t.Hosts)
	cached, depth := make([]int, n), make([]int, n)
	pl.index.cached(chain, t.Hosts, cached, depth, now)
	// The plan's engines: the healthy ones of the first priority that has
	// any (Envoy would spill a share of keys to the next priority when a
	// few of the first are unhealthy; the plan gives that one no share).
	prio := uint32(math.MaxUint32)
	for _, h := range t.Hosts {
		if h.Healthy && h.Weight > 0 {
			prio = min(prio, h.Priority)
		}
	}
	inPlan := func(i int) bool {
		h := t.Hosts[i]
		return h.Healthy && h.Weight > 0 && h.Priority == prio
	}
	if prio == math.MaxUint32 {
		return key, ""
	}
	var wsum, csum float64
	for i, h := range t.Hosts {
		if inPlan(i) {
			wsum += float64(h.Weight)
			csum += pl.count[budgetKey{class, h.Key}]
		}
	}
	// over is an engine's share of the requests placed, with this one and
	// a prior of budgetPrior spread by share, against its share of the
	// weights.
	slack := budgetSlack / min(max(t.Utilization, minBudgetUtilization), 1)
	over := func(i int) float64 {
		s := float64(t.Hosts[i].Weight) / wsum
		return (pl.count[budgetKey{class, t.Hosts[i].Key}] + 1 + budgetPrior*s) / (csum + 1 + budgetPrior) / s
	}
	when := func(i int) time.Time {
		start := now
		if b := pl.busy[t.Hosts[i].Key]; b.After(now) {
			start = b
		}
		rate := t.Rates[i]
		if rate <= 0 {
			rate = defaultPrefillRate
		}
		d := float64(max(prompt-cached[i], 0))/rate*float64(time.Second) + float64(pl.inflight[t.Hosts[i].Key])*float64(inflightCost)
		return start.Add(time.Duration(d))
	}
	at := make([]time.Time, n)
	best, conv := -1, -1
	for i := range t.Hosts {
		if !inPlan(i) {
			continue
		}
		at[i] = when(i)
		// The conversation's engine holds its own history: a point at or
		// past the anchor (a shared prefix before it is not the
		// conversation's, and follows T).
		if chain != nil && chain.Anchor >= 0 && depth[i] >= chain.Anchor && (conv < 0 || depth[i] > depth[conv]) {
			conv = i
		}
		if over(i) > 1+slack {
			continue
		}
		if best < 0 || pl.better(t, i, best, home, at, cached) {
			best = i
		}
	}
	if at[home].IsZero() { // home out of the plan: commit's fallback needs its time
		at[home] = when(home)
	}
	if best < 0 { // cannot be: some engine is at or under its share
		best = home
	}
	if conv >= 0 && over(conv) <= 1+2*slack {
		best = conv // the conversation stays where its history is
	}
	out, addr := pl.commit(t, key, table, home, at[home], best, at[best], prompt, false)
	pl.count[budgetKey{class, addr}]++
	pl.index.record(chain, addr, now)
	return out, addr
}

// better says whether host i is a better pick than host j: sooner by more
// than a millisecond, else the longer cached prefix, home, fewer in flight.
func (pl *placer) better(t *ClassTable, i, j, home int, at []time.Time, cached []int) bool {
	if d := at[j].Sub(at[i]); d > time.Millisecond || d < -time.Millisecond {
		return d > 0
	}
	if cached[i] != cached[j] {
		return cached[i] > cached[j]
	}
	if i == home || j == home {
		return i == home
	}
	return pl.inflight[t.Hosts[i].Key] < pl.inflight[t.Hosts[j].Key]
}
