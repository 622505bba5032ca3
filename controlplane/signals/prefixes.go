package signals

import (
	"cmp"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"
	"time"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
)

// Prefix intake: the ext_proc services report, per class and interval, the
// heavy hitters among the prefix-chain points of their prefix-keyed
// requests (a SpaceSaving sketch each). Prefixes merges them across
// frontends and instances into one decayed view per class: every count
// decays with a half-life, so a point's count over the class's total is
// its recent share of the class's requests, whatever the report rate.
// The control plane reads the view to learn which prefixes are hot
// (controlplane/affinity.go).

// PrefixOptions configure a Prefixes.
type PrefixOptions struct {
	// HalfLife of the counts (default 30 s): how fast the view forgets.
	HalfLife time.Duration
	// Capacity is the number of points kept per class (default 4096); the
	// least counted go first.
	Capacity int
}

// DefaultPrefixHalfLife and DefaultPrefixCapacity are PrefixOptions'
// defaults.
const (
	DefaultPrefixHalfLife = 30 * time.Second
	DefaultPrefixCapacity = 4096
)

// maxReportedCounts bounds the counts of one class in one report.
const maxReportedCounts = 4096

// Prefixes is the decayed prefix view per class. Safe for concurrent use.
type Prefixes struct {
	opt PrefixOptions // read-only after NewPrefixes

	mu      sync.Mutex // guards classes
	classes map[string]*classPrefixes
}

type classPrefixes struct {
	at    time.Time // counts are as of at
	epoch time.Time // start of the conversation bitmaps' current epoch
	// Decayed totals of the class's requests and tokens.
	requests, tokens float64
	points           map[uint64]*pointStat
}

type pointStat struct {
	p PrefixPoint
	// Continuation bitmaps of the current and the previous epoch (an epoch
	// is a half-life), and conversation bitmaps alike.
	conv, convPrev   uint64
	convs, convsPrev uint64
}

// PrefixPoint is one chain point's recent traffic.
type PrefixPoint struct {
	Prefix, Parent          uint64
	DepthBytes, DepthTokens uint32
	// Flags are the point's body flags (1 message end, 2 anchor, 4 past
	// the anchor).
	Flags uint32
	// Requests and Tokens are decayed lower bounds (the sketches' counts
	// minus their error bounds); Upper is the decayed count itself.
	Requests, Upper, Tokens float64
	// Continuations estimates the point's distinct continuations (the
	// next chain points of the requests through it, or the requests ending
	// at it) in the last one to two half-lives: 1 or 2 for one
	// conversation's turns, more where conversations diverge.
	Continuations float64
	// Conversations estimates the distinct conversations (anchors) through
	// the point over the same span: 1 for one conversation's turns, 2 or
	// more for a prefix that different conversations share, however they
	// continue. 0 from ext_proc versions that do not report it.
	Conversations float64
}

// Point flags (extproc/body).
const (
	PointMessageEnd  = 1
	PointAnchor      = 2
	PointAfterAnchor = 4
)

// ClassPrefixes is one class's view at an instant.
type ClassPrefixes struct {
	// Requests and Tokens are the class's decayed totals, the base of every
	// point's share.
	Requests, Tokens float64
	// Points by decreasing Requests.
	Points []PrefixPoint
}

// NewPrefixes returns an empty view.
func NewPrefixes(opt PrefixOptions) (*Prefixes, error) {
	if opt.HalfLife < 0 || opt.Capacity < 0 {
		return nil, fmt.Errorf("prefixes: half-life %v and capacity %d must not be negative", opt.HalfLife, opt.Capacity)
	}
	if opt.HalfLife == 0 {
		opt.HalfLife = DefaultPrefixHalfLife
	}
	if opt.Capacity == 0 {
		opt.Capacity = DefaultPrefixCapacity
	}
	return &Prefixes{opt: opt, classes: map[string]*classPrefixes{}}, nil
}

// validatePrefixes checks a report's prefix reports: known classes, once
// each, bounded, and error bounds within counts.
func validatePrefixes(r *policyv1.ReportRequest, classes map[string]bool) []error {
	var errs []error
	seen := map[string]bool{}
	for i, pr := range r.Prefixes {
		where := fmt.Sprintf("prefixes[%d] (class %q)", i, pr.Class)
		switch {
		case !classes[pr.Class]:
			errs = append(errs, fmt.Errorf("prefixes[%d].class %q is not a class of the fleet", i, pr.Class))
			continue
		case seen[pr.Class]:
			errs = append(errs, fmt.Errorf("%s: the class is reported twice", where))
		case len(pr.Counts) > maxReportedCounts:
			errs = append(errs, fmt.Errorf("%s: %d counts, at most %d", where, len(pr.Counts), maxReportedCounts))
			continue
		}
		seen[pr.Class] = true
		for j, c := range pr.Counts {
			if c.RequestsError > c.Requests {
				errs = append(errs, fmt.Errorf("%s: counts[%d] (%016x): requests_error %d > requests %d", where, j, c.Prefix, c.RequestsError, c.Requests))
			} else if c.Requests-c.RequestsError > pr.Requests {
				errs = append(errs, fmt.Errorf("%s: counts[%d] (%016x): %d requests beyond the error bound, more than the class's %d", where, j, c.Prefix, c.Requests-c.RequestsError, pr.Requests))
			}
		}
	}
	return errs
}

// decay brings a class's counts to now.
func (x *Prefixes) decay(c *classPrefixes, now time.Time) {
	if now.After(c.at) {
		f := math.Exp2(-now.Sub(c.at).Seconds() / x.opt.HalfLife.Seconds())
		c.requests *= f
		c.tokens *= f
		for _, p := range c.points {
			p.p.Requests *= f
			p.p.Upper *= f
			p.p.Tokens *= f
		}
		c.at = now
	}
	if now.Sub(c.epoch) >= x.opt.HalfLife {
		for _, p := range c.points {
			p.convPrev, p.conv = p.conv, 0
			p.convsPrev, p.convs = p.convs, 0
		}
		c.epoch = now
	}
}

// Add merges a validated report's prefix reports, as of now.
func (x *Prefixes) Add(now time.Time, r *policyv1.ReportRequest) {
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, pr := range r.Prefixes {
		c := x.classes[pr.Class]
		if c == nil {
			c = &classPrefixes{at: now, epoch: now, points: map[uint64]*pointStat{}}
			x.classes[pr.Class] = c
		}
		x.decay(c, now)
		c.requests += float64(pr.Requests)
		c.tokens += float64(pr.Tokens)
		for _, pc := range pr.Counts {
			p := c.points[pc.Prefix]
			if p == nil {
				p = &pointStat{p: PrefixPoint{Prefix: pc.Prefix, Parent: pc.Parent, DepthBytes: pc.DepthBytes,
					DepthTokens: pc.DepthTokens, Flags: pc.Flags}}
				c.points[pc.Prefix] = p
			}
			lb := float64(pc.Requests - pc.RequestsError)
			p.p.Requests += lb
			p.p.Upper += float64(pc.Requests)
			if pc.Requests > 0 {
				p.p.Tokens += float64(pc.Tokens) * lb / float64(pc.Requests)
			}
			p.conv |= pc.Continuations
			p.convs |= pc.Conversations
		}
		if len(c.points) > x.opt.Capacity+x.opt.Capacity/4 {
			x.prune(c)
		}
	}
}

// prefixesBeyond is what report m's prefix counts add to old's, the
// report it replaces (m holds old's counts plus a later interval's): per
// class and point the difference, none below zero (a merged report may
// have dropped a light point).
func prefixesBeyond(m, old []*policyv1.PrefixReport) []*policyv1.PrefixReport {
	sub := func(a, b uint64) uint64 { return a - min(a, b) }
	var out []*policyv1.PrefixReport
	for _, pr := range m {
		var o *policyv1.PrefixReport
		for _, x := range old {
			if x.Class == pr.Class {
				o = x
			}
		}
		if o == nil {
			out = append(out, pr)
			continue
		}
		was := map[uint64]*policyv1.PrefixCount{}
		for _, c := range o.Counts {
			was[c.Prefix] = c
		}
		d := &policyv1.PrefixReport{Class: pr.Class, Requests: sub(pr.Requests, o.Requests), Tokens: sub(pr.Tokens, o.Tokens)}
		for _, c := range pr.Counts {
			w := was[c.Prefix]
			if w == nil {
				d.Counts = append(d.Counts, c)
				continue
			}
			x := &policyv1.PrefixCount{Prefix: c.Prefix, Parent: c.Parent, DepthBytes: c.DepthBytes, DepthTokens: c.DepthTokens, Flags: c.Flags,
				Requests: sub(c.Requests, w.Requests), Tokens: sub(c.Tokens, w.Tokens), Continuations: c.Continuations,
				Conversations: c.Conversations}
			x.RequestsError = min(sub(c.RequestsError, w.RequestsError), x.Requests)
			if x.Requests > 0 || x.Continuations != w.Continuations || x.Conversations != w.Conversations {
				d.Counts = append(d.Counts, x)
			}
		}
		out = append(out, d)
	}
	return out
}

// prune keeps the Capacity most counted points.
func (x *Prefixes) prune(c *classPrefixes) {
	all := make([]*pointStat, 0, len(c.points))
	for _, p := range c.points {
		all = append(all, p)
	}
	// Ties by hash, not map order: which points stay must not vary from
	// run to run (the fleet simulator's determinism caught it).
	slices.SortFunc(all, func(a, b *pointStat) int {
		return cmp.Or(cmp.Compare(b.p.Upper, a.p.Upper), cmp.Compare(a.p.Prefix, b.p.Prefix))
	})
	for _, p := range all[x.opt.Capacity:] {
		delete(c.points, p.p.Prefix)
	}
}

// minUpper: a point whose decayed count fell below it is forgotten.
const minUpper = 0.01

// Snapshot returns every class's view as of now.
func (x *Prefixes) Snapshot(now time.Time) map[string]ClassPrefixes {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make(map[string]ClassPrefixes, len(x.classes))
	for name, c := range x.classes {
		x.decay(c, now)
		cp := ClassPrefixes{Requests: c.requests, Tokens: c.tokens, Points: make([]PrefixPoint, 0, len(c.points))}
		for h, p := range c.points {
			if p.p.Upper < minUpper {
				delete(c.points, h)
				continue
			}
			pp := p.p
			pp.Continuations = LinearCount(p.conv | p.convPrev)
			if b := p.convs | p.convsPrev; b != 0 {
				pp.Conversations = LinearCount(b)
			}
			cp.Points = append(cp.Points, pp)
		}
		slices.SortFunc(cp.Points, func(a, b PrefixPoint) int {
			return cmp.Or(cmp.Compare(b.Requests, a.Requests), cmp.Compare(a.DepthBytes, b.DepthBytes), cmp.Compare(a.Prefix, b.Prefix))
		})
		out[name] = cp
	}
	return out
}

// LinearCount estimates the distinct values a 64-bit linear-counting bitmap
// saw (each value sets one bit): 64·ln(64/zero bits), about 266 when every
// bit is set.
func LinearCount(bitmap uint64) float64 {
	z := 64 - bits.OnesCount64(bitmap)
	if z == 0 { // saturated
		return 64 * math.Log(64)
	}
	return 64 * math.Log(64/float64(z))
}
