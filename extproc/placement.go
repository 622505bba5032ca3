package extproc

import (
	"fmt"
	"math"
	"sync"
	"time"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc/body"
	"github.com/inferlb/inferlb/internal/envoylb"
)

// ClassTable is one class's host selection as the frontend Envoy's class
// cluster builds it from the policy's endpoints (the same EDS assignment):
// the endpoint picker picks with it, and prefill-aware placement reads
// where a key lands.
type ClassTable struct {
	LB    *envoylb.LB
	Hosts []envoylb.Host
	Index map[string]int // address → host index
	// Rates are the hosts' prefill rates (tokens/s; 0 unknown); Exclusive
	// says no other frontend sends the host requests (Endpoint.exclusive).
	Rates     []float64
	Exclusive []bool
	// Utilization is the optimizer's predicted utilization of the class's
	// engines (ClassPolicy.utilization): how tightly the plan's shares bind.
	Utilization float64
}

// BuildTables builds a policy's tables: one LB per class from its
// endpoints (ClassPolicy.endpoints) and the policy's load balancer.
func BuildTables(pol *Policy) (map[string]*ClassTable, error) {
	src := pol.Source()
	cfg := envoylb.Config{}
	if lb := src.GetLoadBalancer(); lb != nil {
		cfg = envoylb.Config{TableSize: lb.GetMaglevTableSize(), RingMin: lb.GetRingMinSize(), RingMax: lb.GetRingMaxSize(),
			HashBalanceFactor: lb.GetHashBalanceFactor(), PanicThreshold: lb.GetHealthyPanicThreshold()}
		if lb.GetPolicy() == policyv1.LoadBalancer_RING_HASH {
			cfg.Policy = envoylb.RingHash
		}
	}
	out := map[string]*ClassTable{}
	for _, c := range src.GetClasses() {
		t := &ClassTable{Index: map[string]int{}, Utilization: c.GetUtilization()}
		for _, e := range c.GetEndpoints() {
			if _, dup := t.Index[e.GetAddress()]; dup {
				return nil, fmt.Errorf("class %s: endpoint %s twice", c.GetName(), e.GetAddress())
			}
			t.Index[e.GetAddress()] = len(t.Hosts)
			t.Hosts = append(t.Hosts, envoylb.Host{Key: e.GetAddress(), Weight: e.GetWeight(), Priority: e.GetPriority(), Healthy: e.GetHealthy()})
			t.Rates = append(t.Rates, e.GetPrefillTokensPerS())
			t.Exclusive = append(t.Exclusive, e.GetExclusive())
		}
		lb, err := envoylb.New(cfg, t.Hosts)
		if err != nil {
			return nil, fmt.Errorf("class %s: %w", c.GetName(), err)
		}
		t.LB = lb
		out[c.GetName()] = t
	}
	return out, nil
}

// zeroLoad is no request in flight anywhere: where a key lands on the
// table alone.
type zeroLoad struct{}

func (zeroLoad) Active(int) int { return 0 }
func (zeroLoad) Total() int     { return 0 }

// Prefill-aware placement (off by default: Decider.SetPrefillPlacement).
//
// The plan's weights are per class: a 7,000-token prompt lands on a
// slow-prefill engine as often as a 200-token one. The placer predicts,
// for the engines of the class in the home engine's region and priority,
// when this request's first token could come:
//
//	T(e) = max(busy(e), now) + (prompt − cached(e)) / rate(e)
//
// where busy(e) is when the prefills this service already sent to e end
// (its own requests only: another replica's are not seen), rate(e) the
// engine's prefill rate from the policy, and cached(e) is credited to the
// home engine alone: the tokens its last request of the same key left
// there, or the key's prefix (a shared prefix keyed by its point). The
// home is where the key lands, or where the placer moved the key's last
// request. A request leaves home only for an engine that this frontend
// sends nearly all the requests of (Endpoint.exclusive: elsewhere it
// cannot see what the request would queue behind), and then
//   - for a faster engine, when that saves more than PlacementSlack;
//   - for a slower engine under its share of the tokens sent, when home
//     is over its share by more than shareSlack and the request loses at
//     most PlacementSlack there (trading places).
//
// Among engines of one speed the table's placement stands (but see the
// idle rule below). Leaving home
// is done by the key: the placer finds a key that lands on the chosen
// engine on the class's table, so Envoy (or the endpoint picker) routes
// there with nothing but the header; a moved key's next request finds it
// in the memory (bounded, oldest first out) and goes to the same engine.
//
// Idle-engine placement (Decider.SetIdlePlacement; on in `inferlb
// extproc` by default) is a narrower rule, for the engines where the
// prediction above is exact. A request leaves home, under the same 50 ms
// slack, the same key trick and the same memory, only for an exclusive
// engine (one ext_proc instance sees all its requests) of home's region and
// priority with none of this service's prefills outstanding that is
//   - idle: none of this service's requests in flight there (exclusive:
//     nobody else's either). It starts the prompt at once, so T(e) holds,
//     and the move delays nobody. This is a short request keyed behind a
//     24,000-token prefill (vLLM gives each step's budget to the running
//     prefill first), or a long prompt keyed to an idle slow engine while
//     a fast one is idle too; or
//   - faster than home, with fewer of this service's requests in flight:
//     the prompt joins its next step, and the in-flight counts Envoy's
//     bounded load keeps are not made worse.
//
// Under load no engine is idle and among engines of one speed the rule
// does nothing, so the plan's placement and the feedback it learns from
// are untouched there (docs/sim.md: moving on the placer's backlog alone
// changed the plan, and lost). Home is credited with the request's
// deepest hot prefix (Decide's sharedTokens): without it, requests opening
// with a hot preamble would leave a slow home that holds it for an idle
// fast engine that does not, and at light load the fast engines would take
// more of the work than the plan gives them
// (docs/decisions/idle-placement-on.md).
type placer struct {
	// idleOnly: the idle rule alone (idle placement without
	// --prefill-placement); cacheAware: cache-aware placement
	// (cacheplace.go). Set before the placer is shared.
	idleOnly, cacheAware bool
	mu                   sync.Mutex
	// pol and tables: the tables of the policy last seen (rebuilt when the
	// policy changes); err its build error.
	pol    *Policy
	tables map[string]*ClassTable
	err    error
	// busy is when the prefills sent to each address end.
	busy map[string]time.Time
	// inflight counts the requests placed on each address that have not
	// ended (Decider.Release: Envoy's access log, or the request table's
	// expiry); an address with none is absent.
	inflight map[string]int
	// sent is the prompt tokens sent to each address, decayed with
	// sentHalfLife (at sentAt): an engine over its share of them (against
	// its share of the class's weights) trades places.
	sent   map[string]float64
	sentAt time.Time
	// last is each key's last placement: the address and the prompt
	// tokens it left cached there; ring holds the keys in insertion order
	// (next is the oldest once it is full) for eviction beyond
	// maxPlacements.
	last map[uint64]placement
	ring []uint64
	next int
	// index, count and countAt: cache-aware placement's prefixes sent and
	// decayed request counts per class and engine (cacheplace.go).
	index   *prefixIndex
	count   map[budgetKey]float64
	countAt time.Time
}

type placement struct {
	addr   string
	tokens int
	moved  bool // away from where the key lands on the table
}

// PlacementSlack is the predicted saving below which a request stays where
// its key lands: a few decode steps, far below a long prompt's prefill,
// and above the noise of the placer's prediction for short ones.
const PlacementSlack = 50 * time.Millisecond

// shareSlack: an engine's token share may exceed its weight share by this
// fraction before requests that lose little elsewhere are moved off it.
const shareSlack = 0.1

// sentHalfLife is the half-life of the placer's count of tokens sent.
const sentHalfLife = 10 * time.Second

// maxPlacements bounds the placer's memory of keys (about 64 bytes each).
const maxPlacements = 1 << 16

func newPlacer() *placer {
	return &placer{busy: map[string]time.Time{}, inflight: map[string]int{}, last: map[uint64]placement{}, sent: map[string]float64{},
		count: map[budgetKey]float64{}}
}

func (pl *placer) tablesFor(p *Policy) map[string]*ClassTable {
	if pl.pol != p {
		pl.pol = p
		pl.tables, pl.err = BuildTables(p)
	}
	if pl.err != nil {
		return nil
	}
	return pl.tables
}

// place returns the key the request is routed with (key itself, or one
// that lands on an engine where its first token is predicted sooner by more
// than PlacementSlack) and the address the request is counted in flight at
// until done is called with it ("": none). prompt is the request's prompt
// tokens, shared the tokens of the key's prefix when the key names a
// shared prefix (0 otherwise), remember whether the key is the request's
// own (not a fresh one) and its placement is kept for the key's next
// request, now the decision's time.
func (pl *placer) place(p *Policy, class string, key uint64, chain *body.Chain, prompt, shared int, remember bool, now time.Time) (uint64, string) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	t := pl.tablesFor(p)[class]
	if t == nil || len(t.Hosts) < 2 {
		return key, ""
	}
	table := t.LB.Choose(envoylb.HeaderHash(hex16(key)), zeroLoad{}, nil, 0) // where the key lands
	if pl.cacheAware {
		if table < 0 {
			return key, ""
		}
		return pl.placeCache(t, class, key, table, chain, prompt, now)
	}
	home, credit := table, shared
	if prev, ok := pl.last[key]; ok {
		// A key placed elsewhere before goes back there (its cache is
		// there); one that stayed home follows the table, which moves
		// with the plan's weights, and its cache is credited only if the
		// table still sends it to the same engine.
		if i, ok := t.Index[prev.addr]; ok && t.Hosts[i].Healthy && t.Hosts[i].Weight > 0 && (prev.moved || i == home) {
			home, credit = i, max(prev.tokens, shared)
		}
	}
	if home < 0 || t.Rates[home] <= 0 {
		return key, ""
	}
	when := func(i, cached int) time.Time {
		start := now
		if b := pl.busy[t.Hosts[i].Key]; b.After(now) {
			start = b
		}
		return start.Add(time.Duration(float64(max(prompt-cached, 0)) / t.Rates[i] * float64(time.Second)))
	}
	homeAt := when(home, credit)
	region := p.regions[t.Hosts[home].Key]
	// Candidates: the class's engines in home's region and priority (the
	// moves below also need them exclusive).
	eligible := func(i int) bool {
		h := t.Hosts[i]
		return h.Healthy && h.Weight > 0 && h.Priority == t.Hosts[home].Priority && t.Rates[i] > 0 && p.regions[h.Key] == region
	}
	if pl.idleOnly {
		best, bestAt := home, homeAt
		if i, at, ok := pl.idleTarget(t, home, now, eligible, when); ok && homeAt.Sub(at) > PlacementSlack {
			best, bestAt = i, at
		}
		return pl.commit(t, key, table, home, homeAt, best, bestAt, prompt, remember)
	}
	if el := now.Sub(pl.sentAt); el > 0 {
		f := math.Exp2(-el.Seconds() / sentHalfLife.Seconds())
		for a := range pl.sent {
			pl.sent[a] *= f
		}
		pl.sentAt = now
	}
	var wsum, ssum float64
	for i, h := range t.Hosts {
		if eligible(i) {
			wsum += float64(h.Weight)
			ssum += pl.sent[h.Key]
		}
	}
	// over is an engine's share of the tokens sent, with this request,
	// over its share of the weights.
	over := func(i int) float64 {
		return (pl.sent[t.Hosts[i].Key] + float64(prompt)) / (ssum + float64(prompt)) / (float64(t.Hosts[i].Weight) / wsum)
	}
	best, bestAt := home, homeAt
	for i := range t.Hosts {
		if i == home || !eligible(i) || !t.Exclusive[i] || t.Rates[i] <= t.Rates[home] {
			continue
		}
		if at := when(i, 0); at.Before(bestAt) {
			best, bestAt = i, at
		}
	}
	switch {
	case homeAt.Sub(bestAt) > PlacementSlack:
		// Sooner on a faster engine by more than the slack: go. (Among
		// engines of one speed the table's placement stands: the backlog
		// the placer sees is its own prefills only, and under load moving
		// on it between equal engines lost more, in cache and balance,
		// than it won.)
	case over(home) > 1+shareSlack:
		// Home has had more than its share of the tokens (long prompts
		// placed on it): a request that loses at most the slack on a
		// slower engine under its share goes there, so that placement
		// trades places rather than shifting work the plan did not give.
		best, bestAt = home, homeAt
		for i := range t.Hosts {
			if i == home || !eligible(i) || !t.Exclusive[i] || over(i) > 1 || t.Rates[i] >= t.Rates[home] {
				continue
			}
			if at := when(i, 0); at.Sub(homeAt) <= PlacementSlack && (best == home || at.Before(bestAt)) {
				best, bestAt = i, at
			}
		}
	default:
		best, bestAt = home, homeAt
	}
	return pl.commit(t, key, table, home, homeAt, best, bestAt, prompt, remember)
}

// idleTarget is the engine the idle rule may move a request to, and when
// its first token would come there: among the eligible exclusive engines
// (home's region and priority) with none of this service's prefills
// outstanding, those with none of its requests in flight and those faster
// than home with fewer of them, the one predicted soonest (ok false: none
// qualifies).
func (pl *placer) idleTarget(t *ClassTable, home int, now time.Time, eligible func(int) bool,
	when func(i, cached int) time.Time) (best int, at time.Time, ok bool) {
	atHome := pl.inflight[t.Hosts[home].Key]
	for i, h := range t.Hosts {
		if i == home || !eligible(i) || !t.Exclusive[i] {
			continue
		}
		if n := pl.inflight[h.Key]; pl.busy[h.Key].After(now) || n > 0 && (t.Rates[i] <= t.Rates[home] || n >= atHome) {
			continue
		}
		if w := when(i, 0); !ok || w.Before(at) {
			best, at, ok = i, w, true
		}
	}
	return best, at, ok
}

// commit routes the request to best: by the key itself when the table
// puts it there, else by a key that lands there (when none does, by the
// key itself, counted at home as before), and counts its prefill and its
// slot there. table is where the key lands on the class's table (place
// looked it up once).
func (pl *placer) commit(t *ClassTable, key uint64, table, home int, homeAt time.Time, best int, bestAt time.Time,
	prompt int, remember bool) (uint64, string) {
	out := key
	moved := best != table
	if moved {
		if k, ok := keyLandingOn(t, key, best); ok {
			out = k
		} else {
			best, bestAt, moved = home, homeAt, false
		}
	}
	a := t.Hosts[best].Key
	pl.busy[a] = bestAt
	if !pl.idleOnly {
		pl.sent[a] += float64(prompt) // the full rule's shares
	}
	pl.inflight[a]++
	if remember {
		pl.remember(key, placement{addr: a, tokens: prompt, moved: moved})
	}
	return out, a
}

// done ends a request placed on addr (place's second result).
func (pl *placer) done(addr string) {
	pl.mu.Lock()
	defer pl.mu.Unlock()
	if pl.inflight[addr]--; pl.inflight[addr] <= 0 {
		delete(pl.inflight, addr)
	}
}

// keyLandingOn finds a key derived from key that lands on host on the
// table (with no load): a few tries for a host with a fair share of the
// table.
func keyLandingOn(t *ClassTable, key uint64, host int) (uint64, bool) {
	for i := uint64(1); i <= 256; i++ {
		k := mix(key ^ mix(i))
		if t.LB.Choose(envoylb.HeaderHash(hex16(k)), zeroLoad{}, nil, 0) == host {
			return k, true
		}
	}
	return 0, false
}

func (pl *placer) remember(key uint64, pc placement) {
	if _, ok := pl.last[key]; !ok {
		if len(pl.ring) < maxPlacements {
			pl.ring = append(pl.ring, key)
		} else {
			delete(pl.last, pl.ring[pl.next])
			pl.ring[pl.next] = key
			pl.next = (pl.next + 1) % maxPlacements
		}
	}
	pl.last[key] = pc
}
