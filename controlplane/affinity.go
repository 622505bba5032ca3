package controlplane

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/xds/translate"
)

// The split table: each cycle, per class, the prefix view (the decayed
// heavy hitters of the prompts' prefix chains, merged from every ext_proc)
// becomes a small table of rules that every frontend and every ext_proc
// replica reads the same way (docs/control-plane.md, docs/extproc.md).
//
// A point's share is the larger of its share of the class's requests and
// of its tokens. With N engines in the class, one engine's share is 1/N. A
// point is hot when its share exceeds hot_share/N (and stays hot until it
// falls below hotHysteresis of that) and it is shared: it has at least
// minHotContinuations continuations (the requests through it go on to
// different next points, or many end there). One conversation's turns never
// make a point hot, however busy the conversation: they all continue alike.
//
//   - Every hot point gets a rule. Before the anchor, short prefixes are
//     DEEPER (every conversation keyed on its own point: the prefix ends up
//     cached on every engine, cheap for a short one) and those of at least
//     spread_min_prefix_tokens SPREAD over R keys (R engines cache it, each
//     conversation keeps one). A hot point at or past the anchor (few-shot
//     messages, identical prompts) is DEEPER, and so is every point between
//     it and the anchor, so that ext_proc's walk passes them all.
//   - A shared cold prefix before the anchor (a point with two
//     continuations or more, no cold shared point above it) keys its
//     conversations together: GROUP, if it is at least
//     group_min_prefix_tokens long. It is the divergence point: the deepest
//     prefix its conversations share.
//
//   - The shared-prefix depth: when different conversations (different
//     anchors) are seen to share a cold prefix of at least
//     group_min_prefix_tokens before their anchors, the table carries the
//     byte depth of the shallowest such point, and ext_proc keys every
//     request on its first point before the anchor that deep (no hot rule)
//     as a GROUP: requests sharing a prompt prefix, without message
//     boundaries to tell them apart (one long user message each), land
//     together from the first, not after a rule learned from two of them.
//     The depth stands while such a point is seen; it goes when none is.
//     Traffic without shared prefixes never has a point with two
//     conversations before their anchors, so its table has no depth and no
//     GROUP rule, and its keys are the conversations' own.
//
// With a shared-prefix depth, a point before the anchor at least that
// deep is also hot on its load alone, however many continuations it has
// (the inside of a busy preamble, identical prompts, one busy
// conversation): the walk must pass it rather than key every request
// through it as one group. Without a depth the table is what it would be
// without the rule.
//
// R is ceil(2·share/threshold), so each of its keys carries at most half
// the hot threshold; it changes only by more than rHysteresis (ext_proc
// picks a conversation's key with jump consistent hashing, so a change of
// R moves few conversations).

const (
	hotHysteresis = 0.7
	rHysteresis   = 0.25
	// minHotContinuations: a point with fewer (estimated) continuations is
	// not shared enough to be hot (3 bits of the bitmap give 3.07; one
	// conversation gives 1, or 2 counting its first turn's end).
	minHotContinuations = 2.5
	// minGroupContinuations: a point before the anchor with two
	// continuations is where conversations diverge (one conversation has
	// one there).
	minGroupContinuations = 1.5
	// minViewRequests: with fewer (decayed) requests the view says nothing
	// and the previous table stands.
	minViewRequests = 5
	// maxTableRules bounds a class's table.
	maxTableRules = 512
	maxSpread     = 1024
)

// PrefixRuleView is one rule of a split table, for the admin view.
type PrefixRuleView struct {
	Prefix        string  `json:"prefix"`
	Action        string  `json:"action"`
	Spread        uint32  `json:"spread,omitempty"`
	Share         float64 `json:"share"`
	DepthBytes    uint32  `json:"depth_bytes"`
	DepthTokens   uint32  `json:"depth_tokens"`
	Continuations float64 `json:"continuations"`
	Why           string  `json:"why"`
}

// AffinityView is one class's split table and what it was built from.
type AffinityView struct {
	Class   string `json:"class"`
	Mode    string `json:"mode"`
	Engines int    `json:"engines"`
	// HotShare is the share of the class's load above which a prefix is
	// hot (hot_share / engines).
	HotShare float64 `json:"hot_share_of_class"`
	// Requests is the view's decayed request total; Points how many chain
	// points it tracks.
	Requests float64          `json:"view_requests"`
	Points   int              `json:"view_points"`
	Held     bool             `json:"held,omitempty"`
	Rules    []PrefixRuleView `json:"rules"`
	// Changed counts the rules added or removed (or changed) this cycle.
	Changed int `json:"rules_changed"`
	// SharedDepthBytes is the table's shared-prefix depth (0: none), and
	// SharedWhy why.
	SharedDepthBytes uint32 `json:"shared_depth_bytes,omitempty"`
	SharedWhy        string `json:"shared_why,omitempty"`
	rules            []translate.PrefixRule
}

// splitTable computes a class's rules and shared-prefix depth from its
// prefix view, with n engines in the class and the previous rules and depth
// (for hysteresis).
func splitTable(cl fleet.Class, view signals.ClassPrefixes, n int, prev []translate.PrefixRule, prevDepth uint32) *AffinityView {
	a := cl.Affinity
	out := &AffinityView{Class: cl.Name, Mode: a.Mode, Engines: n, Requests: view.Requests, Points: len(view.Points)}
	if n < 1 || a.Mode == fleet.AffinityOff {
		return out
	}
	thr := a.HotShare / float64(n)
	out.HotShare = thr
	if view.Requests < minViewRequests {
		out.rules, out.Held, out.SharedDepthBytes = prev, true, prevDepth
		out.Rules = ruleViews(prev, "held: too little traffic to judge")
		return out
	}
	t := &tableBuild{a: a, view: view, n: n, thr: thr, prevDepth: prevDepth, before: map[uint64]translate.PrefixRule{},
		byHash: make(map[uint64]*signals.PrefixPoint, len(view.Points))}
	for _, r := range prev {
		t.before[r.Prefix] = r
	}
	for i := range view.Points {
		t.byHash[view.Points[i].Prefix] = &view.Points[i]
	}
	t.markHot()
	out.SharedDepthBytes, out.SharedWhy = t.sharedDepth()
	t.markHeavy(out.SharedDepthBytes)
	t.hotRules()
	t.groupRules()
	t.finish(out)
	return out
}

// splitTables is step 5: each class's split table, the same for every
// node, over the class's engines that are not down.
func (c *Controller) splitTables(prefixes map[string]signals.ClassPrefixes, eng engineStep) map[string]*AffinityView {
	f := &c.problem
	out := map[string]*AffinityView{}
	for _, cl := range f.classes {
		n := 0
		for _, j := range f.eligible[cl.Name] {
			if h := eng.health[f.engines[j].ID]; h != translate.Unhealthy {
				n++
			}
		}
		out[cl.Name] = splitTable(cl, prefixes[cl.Name], n, c.tables[cl.Name], c.depths[cl.Name])
	}
	return out
}

// tableBuild is one split-table computation (splitTable's steps).
type tableBuild struct {
	a    fleet.Affinity
	view signals.ClassPrefixes
	n    int
	thr  float64 // hot threshold: hot_share / n
	// prevDepth is the previous shared-prefix depth.
	prevDepth uint32
	before    map[uint64]translate.PrefixRule // the previous table by prefix
	byHash    map[uint64]*signals.PrefixPoint // the view's points by prefix
	hot       map[uint64]bool                 // markHot's verdicts
	cands     []ruleCand                      // candidate rules, with why
}

type ruleCand struct {
	rule translate.PrefixRule
	view PrefixRuleView
}

// share is a point's share of the class: the larger of its requests' and
// its tokens'.
func (t *tableBuild) share(p *signals.PrefixPoint) float64 {
	s := p.Requests / t.view.Requests
	if t.view.Tokens > 0 {
		s = math.Max(s, p.Tokens/t.view.Tokens)
	}
	return s
}

func preAnchor(p *signals.PrefixPoint) bool {
	return p.Flags&(signals.PointAnchor|signals.PointAfterAnchor) == 0
}

// markHot: a point is hot over the threshold (or, if it was hot, over
// hotHysteresis of it) with enough continuations to be shared.
func (t *tableBuild) markHot() {
	t.hot = map[uint64]bool{}
	for i := range t.view.Points {
		p := &t.view.Points[i]
		r, was := t.before[p.Prefix]
		wasHot := was && r.Action != translate.Group
		if s := t.share(p); (s > t.thr || (wasHot && s > hotHysteresis*t.thr)) && p.Continuations >= minHotContinuations {
			t.hot[p.Prefix] = true
		}
	}
	// A hot point past the anchor makes the points between it and the
	// anchor hot too: the walk must pass them.
	for i := range t.view.Points {
		p := &t.view.Points[i]
		if !t.hot[p.Prefix] || preAnchor(p) {
			continue
		}
		for q := parentOf(t.byHash, p); q != nil && !preAnchor(q) && !t.hot[q.Prefix]; q = parentOf(t.byHash, q) {
			t.hot[q.Prefix] = true
		}
	}
}

// markHeavy: with a shared-prefix depth, a point before the anchor at
// least that deep is hot on its load alone (over the threshold, or over
// hotHysteresis of it if it was hot).
func (t *tableBuild) markHeavy(depth uint32) {
	if depth == 0 {
		return
	}
	for i := range t.view.Points {
		p := &t.view.Points[i]
		if t.hot[p.Prefix] || !preAnchor(p) || p.DepthBytes < depth {
			continue
		}
		r, was := t.before[p.Prefix]
		wasHot := was && r.Action != translate.Group
		if s := t.share(p); s > t.thr || (wasHot && s > hotHysteresis*t.thr) {
			t.hot[p.Prefix] = true
		}
	}
}

func (t *tableBuild) add(p *signals.PrefixPoint, r translate.PrefixRule, why string) {
	t.cands = append(t.cands, ruleCand{r, PrefixRuleView{Prefix: fmt.Sprintf("%016x", p.Prefix), Action: r.Action.String(), Spread: r.Spread,
		Share: t.share(p), DepthBytes: p.DepthBytes, DepthTokens: p.DepthTokens, Continuations: p.Continuations, Why: why}})
}

// hotRules: every hot point is SPREAD (before the anchor and long) or
// DEEPER.
func (t *tableBuild) hotRules() {
	for i := range t.view.Points {
		p := &t.view.Points[i]
		if !t.hot[p.Prefix] {
			continue
		}
		s := t.share(p)
		r := translate.PrefixRule{Prefix: p.Prefix, Action: translate.Deeper, Spread: spreadFor(s, t.thr, t.before[p.Prefix].Spread)}
		why := fmt.Sprintf("hot: %.1f%% of the class, over %.1f%% (%.2f of one engine's share), %.0f continuations", 100*s, 100*t.thr, s*float64(t.n), p.Continuations)
		switch {
		case preAnchor(p) && int(p.DepthTokens) >= t.a.SpreadMinPrefixTokens:
			r.Action = translate.Spread
			why += fmt.Sprintf("; %d tokens ≥ spread_min_prefix_tokens %d: spread over %d keys", p.DepthTokens, t.a.SpreadMinPrefixTokens, r.Spread)
		case preAnchor(p):
			why += "; keyed deeper, on each conversation"
		default:
			why += "; at or past the anchor: keyed deeper"
		}
		t.add(p, r, why)
	}
}

// groupRules: a cold point before the anchor, long enough, is a GROUP
// where conversations sharing it diverge (the shallowest cold shared
// point of its chain), and stays one while it is seen and cold.
func (t *tableBuild) groupRules() {
	for i := range t.view.Points {
		p := &t.view.Points[i]
		if t.hot[p.Prefix] || !preAnchor(p) || int(p.DepthTokens) < t.a.GroupMinPrefixTokens {
			continue
		}
		if t.before[p.Prefix].Action == translate.Group {
			// A group stands while it is seen and cold: its conversations
			// keep their key when the group thins out.
			t.add(p, translate.PrefixRule{Prefix: p.Prefix, Action: translate.Group},
				fmt.Sprintf("a group: %.0f continuations, %.1f%% of the class (under %.1f%%)", p.Continuations, 100*t.share(p), 100*t.thr))
			continue
		}
		if p.Continuations < minGroupContinuations {
			continue
		}
		// The shallowest cold shared point of its chain (under the hot
		// ones): a cold shared point above it groups these conversations
		// and more.
		shallowest := true
		for q := parentOf(t.byHash, p); q != nil && !t.hot[q.Prefix]; q = parentOf(t.byHash, q) {
			if q.Continuations >= minGroupContinuations {
				shallowest = false
				break
			}
		}
		if !shallowest {
			continue
		}
		t.add(p, translate.PrefixRule{Prefix: p.Prefix, Action: translate.Group},
			fmt.Sprintf("shared: %.0f continuations, %.1f%% of the class (under %.1f%%): the conversations that diverge here keyed together", p.Continuations, 100*t.share(p), 100*t.thr))
	}
}

// sharedDepth is the class's shared-prefix depth: the depth of the
// shallowest cold point (under the hot threshold, whatever its
// continuations) before the anchors that two conversations or more share
// and that is at least group_min_prefix_tokens long; the previous depth
// stands while there is one.
func (t *tableBuild) sharedDepth() (uint32, string) {
	var best *signals.PrefixPoint
	n := 0
	for i := range t.view.Points {
		p := &t.view.Points[i]
		if t.hot[p.Prefix] || !preAnchor(p) || int(p.DepthTokens) < t.a.GroupMinPrefixTokens || p.Conversations < minGroupContinuations ||
			t.share(p) > t.thr {
			continue
		}
		n++
		if best == nil || p.DepthBytes < best.DepthBytes {
			best = p
		}
	}
	switch {
	case best == nil:
		return 0, ""
	case t.prevDepth > 0:
		return t.prevDepth, fmt.Sprintf("%d cold points before the anchors shared by two conversations or more: the depth stands", n)
	}
	return best.DepthBytes, fmt.Sprintf("%d cold points before the anchors shared by two conversations or more; the shallowest is %d bytes (~%d tokens, %.0f conversations)",
		n, best.DepthBytes, best.DepthTokens, best.Conversations)
}

// finish keeps the maxTableRules candidates of the largest share, one rule
// per prefix, and counts the rules that changed from the previous table.
func (t *tableBuild) finish(out *AffinityView) {
	cands := t.cands
	slices.SortFunc(cands, func(x, y ruleCand) int {
		return cmp.Or(cmp.Compare(y.view.Share, x.view.Share), cmp.Compare(x.rule.Prefix, y.rule.Prefix))
	})
	if len(cands) > maxTableRules {
		cands = cands[:maxTableRules]
	}
	seen := map[uint64]bool{}
	for _, c := range cands {
		if seen[c.rule.Prefix] {
			continue
		}
		seen[c.rule.Prefix] = true
		out.rules = append(out.rules, c.rule)
		out.Rules = append(out.Rules, c.view)
		if t.before[c.rule.Prefix] != c.rule {
			out.Changed++
		}
	}
	for h := range t.before {
		if !seen[h] {
			out.Changed++
		}
	}
}

// parentOf is p's parent in the view, nil if it is not there (or, after a
// hash collision, not shallower: the walk up always ends).
func parentOf(byHash map[uint64]*signals.PrefixPoint, p *signals.PrefixPoint) *signals.PrefixPoint {
	q := byHash[p.Parent]
	if p.Parent == 0 || q == nil || q.DepthBytes >= p.DepthBytes {
		return nil
	}
	return q
}

// spreadFor is R for a hot point of share s over threshold thr: about
// 2·s/thr keys, each well under the threshold; the previous R stands while
// within rHysteresis.
func spreadFor(s, thr float64, prev uint32) uint32 {
	r := uint32(min(maxSpread, max(2, math.Ceil(2*s/thr))))
	if prev > 0 && math.Abs(float64(r)-float64(prev)) <= rHysteresis*float64(prev) {
		return prev
	}
	return r
}

// ruleViews describes rules without a view (held tables).
func ruleViews(rules []translate.PrefixRule, why string) []PrefixRuleView {
	var out []PrefixRuleView
	for _, r := range rules {
		out = append(out, PrefixRuleView{Prefix: fmt.Sprintf("%016x", r.Prefix), Action: r.Action.String(), Spread: r.Spread, Why: why})
	}
	return out
}
