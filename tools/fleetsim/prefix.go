package fleetsim

import (
	"container/list"
	"math"

	"github.com/inferlb/inferlb/tools/enginesim/model"
)

var chainHashes = model.ChainHashes

// prefixIndex is a router's approximate view of one engine's cache: the
// chained block hashes of the prompts it routed there, least recently used
// dropped beyond a capacity. Matching a prompt walks its chain from the
// start, so the match is a prefix, as in a radix tree of block ids.
type prefixIndex struct {
	cap int
	m   map[uint64]*list.Element
	l   list.List
}

// indexGrid is one prefix index per (frontend, engine): a router in each
// frontend keeps its own view of every engine's cache, as llm-d's and
// SGLang's routers do, each of capacity blocks.
func indexGrid(s *Sim, capacity int) [][]*prefixIndex {
	grid := make([][]*prefixIndex, len(s.fronts))
	for i := range grid {
		grid[i] = make([]*prefixIndex, len(s.engines))
		for j := range grid[i] {
			grid[i][j] = newPrefixIndex(capacity)
		}
	}
	return grid
}

func newPrefixIndex(capacity int) *prefixIndex {
	return &prefixIndex{cap: capacity, m: map[uint64]*list.Element{}}
}

// match returns how many leading hashes the index holds (every step-th,
// for coarser blocks).
func (x *prefixIndex) match(hs []uint64, step int) int {
	n := 0
	for i := step - 1; i < len(hs); i += step {
		if _, ok := x.m[hs[i]]; !ok {
			break
		}
		n++
	}
	return n
}

// insert records hs (every step-th) as cached, most recent.
func (x *prefixIndex) insert(hs []uint64, step int) {
	for i := step - 1; i < len(hs); i += step {
		if el, ok := x.m[hs[i]]; ok {
			x.l.MoveToFront(el)
			continue
		}
		x.m[hs[i]] = x.l.PushFront(hs[i])
	}
	for x.l.Len() > x.cap {
		el := x.l.Back()
		delete(x.m, el.Value.(uint64))
		x.l.Remove(el)
	}
}

// llmd: llm-d's default endpoint picker (gateway-api-inference-extension
// EPP, default scheduling profile): queue-scorer ×2 (waiting requests,
// min-max normalized, fewer is better), kv-cache-utilization-scorer ×2
// (1 − KV usage) and prefix-cache-scorer ×3 (the approximate prefix index:
// share of the prompt's 64-token blocks, at most 256, found in the index of
// prompts this picker routed to the pod, LRU of 31,250 blocks per pod),
// then max-score-picker (ties at random). Each frontend runs its own
// picker over every eligible engine; engine metrics are read live (the
// EPP refreshes them every 50 ms).
type llmd struct {
	base
	idx [][]*prefixIndex // frontend → engine → index
	buf []int
}

// llm-d prefix-cache-scorer parameters (defaults).
const (
	llmdBlockTokens = 64
	llmdMaxBlocks   = 256
	llmdLRUBlocks   = 31250
)

func newLLMD(s *Sim) *llmd {
	return &llmd{base: base{s: s}, idx: indexGrid(s, llmdLRUBlocks)}
}

func (l *llmd) Pick(p *request) int {
	c := l.candidates(p, l.buf)
	l.buf = c
	if len(c) == 0 {
		return -1
	}
	step := max(llmdBlockTokens/l.s.blockSize(), 1)
	hs := l.s.blockHashes(p)
	if lim := llmdMaxBlocks * step; len(hs) > lim {
		hs = hs[:lim]
	}
	total := len(hs) / step
	minQ, maxQ := math.MaxInt, -1
	for _, j := range c {
		q := l.s.engines[j].reps.Stats().Waiting
		minQ, maxQ = min(minQ, q), max(maxQ, q)
	}
	best, bestScore, ties := -1, math.Inf(-1), 0
	for _, j := range c {
		st := l.s.engines[j].reps.Stats()
		qs := 1.0
		if maxQ > minQ {
			qs = float64(maxQ-st.Waiting) / float64(maxQ-minQ)
		}
		kv := 1 - st.KVUsage
		ps := 0.0
		if total > 0 {
			ps = float64(l.idx[p.front.ix][j].match(hs, step)) / float64(total)
		}
		score := 2*qs + 2*kv + 3*ps
		switch {
		case score > bestScore:
			best, bestScore, ties = j, score, 1
		case score == bestScore:
			ties++
			if l.s.rng.IntN(ties) == 0 {
				best = j
			}
		}
	}
	l.idx[p.front.ix][best].insert(hs, step)
	return best
}

// sglang: the cache_aware policy of SGLang's router as smg 1.13.0 and
// sglang-router 0.3.2 run it (sgl-model-gateway policies/cache_aware.rs, the
// HTTP path; vllm-router's cache_aware is its fork and runs the same rule).
// When the load is imbalanced — max − min > balance_abs_threshold (64) and
// max > balance_rel_threshold (1.5) × min, loads being the router's own
// in-flight counts — the least-loaded worker. Otherwise the worker whose
// tree (the prompts this router sent it) matches the longest prefix, if the
// match covers more than cache_threshold (0.3) of the prompt; else the
// least-loaded worker (the first of equals, as Rust's min_by_key). The
// chosen worker's tree learns the prompt either way. Those are the
// routers' defaults as they log them at start. The real tree matches the
// characters of the messages' contents joined by spaces; here 16-token
// blocks of the prompt (chat markers included), with the trailing partial
// block left out. Eviction keeps max_tree_size characters per worker
// (2²⁶; here ≈ 1M blocks), far beyond what a bench run routes.
type sglang struct {
	base
	trees [][]*prefixIndex // frontend → engine
	buf   []int
}

// SGLang cache_aware defaults (smg 1.13.0 and sglang-router 0.3.2 log
// "cache_threshold: 0.3, balance_abs_threshold: 64, balance_rel_threshold:
// 1.5" at start; vllm-router 0.1.17's router_args.py has the same).
const (
	sglBalanceAbs  = 64
	sglBalanceRel  = 1.5
	sglThreshold   = 0.3
	sglTreeBlocks  = 1 << 20
	sglMatchSample = 1
)

func newSGLang(s *Sim) *sglang {
	return &sglang{base: base{s: s}, trees: indexGrid(s, sglTreeBlocks)}
}

func (g *sglang) Pick(p *request) int {
	c := g.candidates(p, g.buf)
	g.buf = c
	if len(c) == 0 {
		return -1
	}
	act := p.front.active
	lo, hi := math.MaxInt, -1
	least := c[0]
	for _, j := range c {
		if act[j] < lo {
			lo, least = act[j], j
		}
		hi = max(hi, act[j])
	}
	hs := g.s.blockHashes(p)
	tree := g.trees[p.front.ix]
	pick := least
	if !(hi-lo > sglBalanceAbs && float64(hi) > sglBalanceRel*float64(lo)) {
		bestMatch, bestJ := -1, c[0]
		for _, j := range c {
			if m := tree[j].match(hs, sglMatchSample); m > bestMatch {
				bestMatch, bestJ = m, j
			}
		}
		if len(hs) > 0 && float64(bestMatch)/float64(len(hs)) > sglThreshold {
			pick = bestJ
		}
	}
	tree[pick].insert(hs, sglMatchSample)
	return pick
}
