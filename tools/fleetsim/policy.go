package fleetsim

import (
	"fmt"
	"math"
	"slices"
	"strconv"

	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/internal/envoylb"
	"github.com/inferlb/inferlb/tools/enginesim/model"
)

// Policy decides where requests go. The simulator calls Admit once per
// request on arrival, Pick before every attempt (the first and each retry),
// Attempted when an attempt's response (or failure) reaches the frontend,
// Done once when the request ends, HealthChanged when Envoy's active health
// check flips an engine, and Event for the timers the policy scheduled
// itself (evScrape, evReport, evCycle) from Start.
type Policy interface {
	Start()
	Event(ev event)
	Admit(p *request) outcome
	Pick(p *request) int
	Attempted(p *request, failed bool)
	Done(p *request, out outcome)
	HealthChanged(engine int)
	// Weights is the policy's current shares for the first frontend's
	// first class (nil when it has none), for the weights-over-time chart
	// and the churn figure.
	Weights() map[string]float64
}

// Policy names.
const (
	PolicyRoundRobin = "round_robin"
	PolicyP2C        = "least_request"
	PolicyNearest    = "nearest"
	PolicySession    = "session_hash"
	PolicyOld        = "old_controller"
	PolicyLLMD       = "llm_d"
	PolicySGLang     = "sglang_cache_aware"
	PolicyDynamo     = "dynamo_kv"
	PolicyInferlb    = "inferlb"
	// PolicyRandomKey is inferlb with cache affinity off for every class
	// (the fleet spec's classes[].affinity.mode off): the same control
	// loop, shedding and retries, but every request a fresh random key.
	// The baseline for what affinity itself buys.
	PolicyRandomKey = "random_key"
)

// PolicyNames lists every policy, rivals first.
func PolicyNames() []string {
	return []string{PolicyRoundRobin, PolicyP2C, PolicyNearest, PolicySession, PolicyOld, PolicyLLMD, PolicyLLMDRegional, PolicySGLang, PolicySGLangRegional, PolicyDynamo, PolicyDynamoRegional, PolicyRandomKey, PolicyInferlb}
}

func newPolicy(name string, s *Sim) (Policy, error) {
	switch name {
	case PolicyRoundRobin:
		return &roundRobin{base: base{s: s}, next: make([]int, len(s.fronts)*len(s.classEngines))}, nil
	case PolicyP2C:
		return &leastRequest{base: base{s: s}}, nil
	case PolicyNearest:
		return newNearest(s), nil
	case PolicySession:
		return newSessionHash(s)
	case PolicyOld:
		return newOldController(s)
	case PolicyLLMD:
		return newLLMD(s), nil
	case PolicySGLang:
		return newSGLang(s), nil
	case PolicyDynamo:
		return &dynamo{base: base{s: s}}, nil
	case PolicyInferlb:
		return newInferlb(s, s.spec)
	case PolicyRandomKey:
		return newInferlb(s, affinityOff(s.spec))
	case PolicyLLMDRegional, PolicySGLangRegional, PolicyDynamoRegional:
		return newRegionalPolicy(name, s), nil
	}
	return nil, fmt.Errorf("fleetsim: unknown policy %q (known: %v)", name, PolicyNames())
}

// base holds what the simple policies share: nothing to start, admit
// everything, nothing to observe. A rival deployed per region has a scope
// (regional.go) that narrows its candidates to one region.
type base struct {
	s     *Sim
	scope *regionScope
}

func (base) Start()                      {}
func (base) Event(event)                 {}
func (base) Admit(*request) outcome      { return outcomeAdmitted }
func (base) Attempted(*request, bool)    {}
func (base) Done(*request, outcome)      {}
func (base) HealthChanged(int)           {}
func (base) Weights() map[string]float64 { return nil }

// candidates are the engines of the request's class that Envoy's health
// checks pass and this attempt has not tried (previous_hosts); if every
// healthy one was tried, the healthy ones. A regional router keeps those of
// one region (regionScope.restrict).
func (b base) candidates(p *request, buf []int) []int {
	buf = b.healthyCandidates(p, buf)
	if b.scope != nil {
		buf = b.scope.restrict(p.front.ix, buf)
	}
	return buf
}

func (b base) healthyCandidates(p *request, buf []int) []int {
	buf = buf[:0]
	for _, j := range b.s.classEngines[p.class] {
		if b.s.engines[j].healthy && !slices.Contains(p.tried, int32(j)) {
			buf = append(buf, j)
		}
	}
	if len(buf) == 0 {
		for _, j := range b.s.classEngines[p.class] {
			if b.s.engines[j].healthy {
				buf = append(buf, j)
			}
		}
	}
	return buf
}

// roundRobin: Envoy's ROUND_ROBIN over the class's healthy engines, equal
// weights, one rotation per (frontend, class).
type roundRobin struct {
	base
	next []int
	buf  []int
}

func (r *roundRobin) Pick(p *request) int {
	c := r.candidates(p, r.buf)
	r.buf = c
	if len(c) == 0 {
		return -1
	}
	k := p.front.ix*len(r.s.classEngines) + p.class
	j := c[r.next[k]%len(c)]
	r.next[k]++
	return j
}

// leastRequest: Envoy's LEAST_REQUEST with choice_count 2 (power of two
// choices) on the frontend's own in-flight counts, equal weights.
type leastRequest struct {
	base
	buf []int
}

func (l *leastRequest) Pick(p *request) int {
	c := l.candidates(p, l.buf)
	l.buf = c
	return p2c(l.s, p, c)
}

func p2c(s *Sim, p *request, c []int) int {
	switch len(c) {
	case 0:
		return -1
	case 1:
		return c[0]
	}
	a := c[s.rng.IntN(len(c))]
	b := c[s.rng.IntN(len(c))]
	if p.front.active[b] < p.front.active[a] {
		return b
	}
	return a
}

// nearest: region-local routing. The frontend's own region's engines
// (least request among them); when none is eligible and healthy, the
// nearest region that has one.
type nearest struct {
	base
	byRTT [][]int // frontend → engines in order of round trip
	buf   []int
}

func newNearest(s *Sim) *nearest {
	n := &nearest{base: base{s: s}}
	for _, f := range s.fronts {
		order := make([]int, len(s.engines))
		for j := range order {
			order[j] = j
		}
		slices.SortStableFunc(order, func(a, b int) int {
			return int(f.owd[a] - f.owd[b])
		})
		n.byRTT = append(n.byRTT, order)
	}
	return n
}

func (n *nearest) Pick(p *request) int {
	c := n.candidates(p, n.buf)
	n.buf = c
	if len(c) == 0 {
		return -1
	}
	best := p.front.owd[c[0]]
	for _, j := range c {
		best = min(best, p.front.owd[j])
	}
	local := c[:0:0]
	for _, j := range c {
		if p.front.owd[j] == best {
			local = append(local, j)
		}
	}
	return p2c(n.s, p, local)
}

// lbCluster is one Envoy cluster at one frontend: its EDS hosts and the
// host selection envoylb builds from them, rebuilt when the assignment or a
// host's health check verdict changes; it counts its hosts' active
// requests for bounded loads.
type lbCluster struct {
	cfg      envoylb.Config
	engineOf []int // host → engine
	hostOf   map[int]int
	weight   []uint32
	prio     []uint32
	edsOK    []bool
	lb       *envoylb.LB
	active   []int
	total    int
}

func (c *lbCluster) Active(i int) int { return c.active[i] }
func (c *lbCluster) Total() int       { return c.total }

// set replaces the assignment (hosts in EDS order).
func (c *lbCluster) set(s *Sim, engines []int, weight, prio []uint32, edsOK []bool) error {
	old := map[int]int{}
	for h, j := range c.engineOf {
		old[j] = c.active[h]
	}
	c.engineOf, c.weight, c.prio, c.edsOK = engines, weight, prio, edsOK
	c.hostOf = map[int]int{}
	c.active = make([]int, len(engines))
	for h, j := range engines {
		c.hostOf[j] = h
		c.active[h] = old[j] // requests in flight stay counted on their host
	}
	return c.rebuild(s)
}

func (c *lbCluster) rebuild(s *Sim) error {
	hosts := make([]envoylb.Host, len(c.engineOf))
	for h, j := range c.engineOf {
		e := s.engines[j]
		hosts[h] = envoylb.Host{Key: e.spec.Address, Weight: c.weight[h], Priority: c.prio[h], Healthy: c.edsOK[h] && e.healthy}
	}
	lb, err := envoylb.New(c.cfg, hosts)
	if err != nil {
		return err
	}
	c.lb = lb
	return nil
}

// pick chooses the host for p (retries exclude the hosts tried, with the
// frontend bootstrap's host_selection_retry_max_attempts), counts it active
// and returns its engine.
func (c *lbCluster) pick(p *request) int {
	if c == nil || c.lb == nil {
		return -1
	}
	var reject func(int) bool
	if len(p.tried) > 0 {
		reject = func(h int) bool { return slices.Contains(p.tried, int32(c.engineOf[h])) }
	}
	h := c.lb.Choose(p.key, c, reject, envoyconfigs.HostSelectionRetryMaxAttempts)
	if h < 0 {
		return -1
	}
	c.active[h]++
	c.total++
	p.host = h
	return c.engineOf[h]
}

// release ends p's attempt on this cluster.
func (c *lbCluster) release(p *request) {
	if c == nil || p.host < 0 {
		return
	}
	if h, ok := c.hostOf[p.engine]; ok && c.active[h] > 0 {
		c.active[h]--
	}
	if c.total > 0 {
		c.total--
	}
	p.host = -1
}

// sessionHash: consistent hashing on the session (Envoy Maglev with equal
// weights over the class's engines, hashed on the conversation id the
// client sends), no bounded loads: session affinity.
type sessionHash struct {
	base
	clusters []*lbCluster // frontend × class
}

func newSessionHash(s *Sim) (*sessionHash, error) {
	sh := &sessionHash{base: base{s: s}}
	for range s.fronts {
		for c := range s.classEngines {
			cl := &lbCluster{cfg: envoylb.Config{Policy: envoylb.Maglev}}
			js := s.classEngines[c]
			w, pr, ok := make([]uint32, len(js)), make([]uint32, len(js)), make([]bool, len(js))
			for i := range js {
				w[i], ok[i] = 1, true
			}
			if err := cl.set(s, js, w, pr, ok); err != nil {
				return nil, err
			}
			sh.clusters = append(sh.clusters, cl)
		}
	}
	return sh, nil
}

func (sh *sessionHash) cluster(p *request) *lbCluster {
	return sh.clusters[p.front.ix*len(sh.s.classEngines)+p.class]
}

func (sh *sessionHash) Pick(p *request) int {
	id := p.w.SessionID
	if id == "" {
		id = "conv-" + strconv.Itoa(int(p.conv))
	}
	p.key = envoylb.HeaderHash(id)
	return sh.cluster(p).pick(p)
}

func (sh *sessionHash) Attempted(p *request, _ bool) { sh.cluster(p).release(p) }

func (sh *sessionHash) HealthChanged(int) {
	for _, c := range sh.clusters {
		_ = c.rebuild(sh.s)
	}
}

// blockHashes returns p's chained prompt block hashes at the engines'
// block size (computed once).
// A follow-up turn extends its previous turn's chain (the previous prompt
// is a prefix of this one), so only the new tokens are hashed.
func (s *Sim) blockHashes(p *request) []uint64 {
	if p.hashes == nil {
		bs := s.blockSize()
		if p.baseHashes != nil && len(p.baseHashes)*bs <= len(p.prompt) {
			p.hashes = model.ExtendChain(p.baseHashes, p.prompt, bs)
		} else {
			p.hashes = model.ExtendChain(s.spareTokens(len(p.prompt)/bs+64), p.prompt, bs)
		}
	}
	return p.hashes
}

func (s *Sim) blockSize() int { return s.engines[0].cfg.BlockSize }

// dynamo: NVIDIA Dynamo's KV router (components/router, cost function of
// KvScheduler): for each worker, logit = overlap_score_weight (1) ×
// prefill blocks (the request's blocks not cached there) + decode blocks
// (the worker's active KV blocks plus the request's); the lowest logit wins
// (router temperature 0). Cache overlap comes from the workers' KV events,
// i.e. their actual prefix caches.
type dynamo struct {
	base
	buf []int
}

func (d *dynamo) Pick(p *request) int {
	c := d.candidates(p, d.buf)
	d.buf = c
	if len(c) == 0 {
		return -1
	}
	hs := d.s.blockHashes(p)
	reqBlocks := float64(len(p.prompt)+p.w.MaxTokens+d.s.blockSize()-1) / float64(d.s.blockSize())
	best, bestCost := -1, math.Inf(1)
	for _, j := range c {
		e := d.s.engines[j]
		overlap := 0
		if !e.down {
			overlap = e.reps.CachedBlocks(hs)
		}
		st := e.reps.Stats()
		active := st.KVUsage * float64(st.KVBlocks)
		cost := 1.0*(reqBlocks-float64(overlap)) + active + reqBlocks
		if cost < bestCost {
			best, bestCost = j, cost
		}
	}
	return best
}
