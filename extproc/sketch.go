package extproc

import (
	"slices"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc/body"
)

// DefaultPrefixSketchSize is the number of chain points a class's sketch
// tracks per report interval: a point on more than 1/1024 of the points
// walked (with about ten points per request, 1% of the requests: a class of
// up to 50 engines at the default hot_share) is always kept.
const DefaultPrefixSketchSize = 1024

// prefixSketch is one class's heavy hitters among chain points over one
// report interval: SpaceSaving (Metwally et al.) with a min-heap, so a
// point carrying more than 1/size of the walked points is always tracked,
// and every count overestimates by at most its err (the count of the entry
// it replaced). Not safe for concurrent use (the Observer locks it).
type prefixSketch struct {
	size             int
	requests, tokens uint64
	idx              map[uint64]int // prefix → heap position
	heap             []*ssEntry     // min-heap by count
}

// ssEntry is one tracked point (PrefixCount's fields).
type ssEntry struct {
	prefix, parent       uint64
	depthBytes, depthTok uint32
	flags                uint8
	count, err, tokens   uint64
	cont                 uint64 // continuations bitmap
	convs                uint64 // conversations bitmap
}

func newPrefixSketch(size int) *prefixSketch {
	return &prefixSketch{size: size, idx: make(map[uint64]int, size)}
}

// add counts one request (of tokens tokens) through point pt, whose parent
// is the chain point before it; cont and conv are the linear-counting bits
// of the request's continuation after pt and of its conversation (its
// anchor).
func (s *prefixSketch) add(pt *body.Point, parent uint64, tokens uint64, cont, conv uint64) {
	if i, ok := s.idx[pt.Hash]; ok {
		e := s.heap[i]
		e.count++
		e.tokens += tokens
		e.cont |= cont
		e.convs |= conv
		s.down(i)
		return
	}
	var e *ssEntry
	if len(s.heap) < s.size {
		e = &ssEntry{count: 1, tokens: tokens}
		s.heap = append(s.heap, e)
		s.idx[pt.Hash] = len(s.heap) - 1
		defer s.up(len(s.heap) - 1)
	} else {
		// Replace the least counted entry; the newcomer inherits its
		// count (and tokens) as its error bound.
		e = s.heap[0]
		delete(s.idx, e.prefix)
		s.idx[pt.Hash] = 0
		e.err, e.count, e.tokens = e.count, e.count+1, e.tokens+tokens
		defer s.down(0)
	}
	e.prefix, e.parent = pt.Hash, parent
	e.depthBytes, e.depthTok, e.flags = pt.Depth, pt.Tokens, pt.Flags
	e.cont, e.convs = cont, conv
}

func (s *prefixSketch) less(i, j int) bool { return s.heap[i].count < s.heap[j].count }

func (s *prefixSketch) swap(i, j int) {
	h := s.heap
	h[i], h[j] = h[j], h[i]
	s.idx[h[i].prefix], s.idx[h[j].prefix] = i, j
}

func (s *prefixSketch) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			return
		}
		s.swap(i, p)
		i = p
	}
}

func (s *prefixSketch) down(i int) {
	n := len(s.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && s.less(r, l) {
			m = r
		}
		if !s.less(m, i) {
			return
		}
		s.swap(i, m)
		i = m
	}
}

// report is the interval's report for class, entries by decreasing count.
// An entry that one request put in place of an evicted one (count − error
// is 1) is left out: it says nothing but that the sketch was full.
func (s *prefixSketch) report(class string) *policyv1.PrefixReport {
	r := &policyv1.PrefixReport{Class: class, Requests: s.requests, Tokens: s.tokens}
	for _, e := range s.heap {
		if e.err > 0 && e.count-e.err <= 1 {
			continue
		}
		r.Counts = append(r.Counts, &policyv1.PrefixCount{Prefix: e.prefix, Parent: e.parent,
			DepthBytes: e.depthBytes, DepthTokens: e.depthTok, Flags: uint32(e.flags),
			Requests: e.count, RequestsError: e.err, Tokens: e.tokens, Continuations: e.cont, Conversations: e.convs})
	}
	slices.SortFunc(r.Counts, func(a, b *policyv1.PrefixCount) int {
		switch {
		case a.Requests != b.Requests:
			return cmpDesc(a.Requests, b.Requests)
		case a.DepthBytes != b.DepthBytes:
			return int(a.DepthBytes) - int(b.DepthBytes)
		}
		return cmpDesc(b.Prefix, a.Prefix)
	})
	return r
}

func cmpDesc(a, b uint64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// bitOf is a value's bit in a 64-bit linear-counting bitmap (its hash's
// top 6 bits).
func bitOf(v uint64) uint64 { return 1 << (mix(v) >> 58) }
