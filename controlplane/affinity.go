package controlplane

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/xds/signals"
	"github.com/inferlb/inferlb/xds/translate"
)

// The split table: each cycle, per class, the prefix view (the decayed
// heavy hitters of the prompts' prefix chains, merged from every ext_proc)
// becomes a small table of rules that every frontend and every ext_proc
// replica reads the same way (docs/control-plane.md, docs/extproc.md).
//
// A point's share is the larger of its share of the class's requests and
// of its tokens. With N engines in the class, one engine's share is 1/N; a
// point is hot when its share exceeds hot_share/N (and stays hot until it
// falls below hotHysteresis of that), so no key carries more load than a
// fraction of what one engine can take.
//
//   - A hot point at or past a conversation's anchor gets a rule (DEEPER),
//     so ext_proc's walk passes it and keys deeper.
//   - A hot point before the anchor gets a rule only if it is the deepest
//     hot point of its chain (no hot child): the divergence point. Short
//     prefixes are DEEPER (every conversation keyed on its own point: the
//     prefix ends up cached on every engine, cheap for a short one); those
//     of at least spread_min_prefix_tokens are SPREAD over R keys (R
//     engines cache it, each conversation keeps one).
//   - A shared cold prefix before the anchor (two conversations or more,
//     its parent hot or absent) keys its conversations together: GROUP on
//     its deepest point that still carries nine tenths of its traffic (the
//     next divergence point), if that is at least group_min_prefix_tokens
//     long.
//
// R is ceil(2·share/threshold), so each of its keys carries at most half
// the hot threshold; it changes only by more than rHysteresis (ext_proc
// picks a conversation's key with jump consistent hashing, so a change of
// R moves few conversations).

const (
	hotHysteresis = 0.7
	rHysteresis   = 0.25
	// groupFollow: a group's point descends to a child carrying at least
	// this share of its requests.
	groupFollow = 0.9
	// minConversations: a point seen by fewer (estimated) conversations is
	// not shared (two bits of the bitmap give 2.03).
	minConversations = 1.5
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
	Conversations float64 `json:"conversations"`
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
	rules   []translate.PrefixRule
}

// splitTable computes a class's rules from its prefix view, with n engines
// in the class and the previous rules (for hysteresis).
func splitTable(cl fleet.Class, view signals.ClassPrefixes, n int, prev []translate.PrefixRule) *AffinityView {
	a := cl.Affinity
	out := &AffinityView{Class: cl.Name, Mode: a.Mode, Engines: n, Requests: view.Requests, Points: len(view.Points)}
	if n < 1 || a.Mode == fleet.AffinityOff {
		return out
	}
	thr := a.HotShare / float64(n)
	out.HotShare = thr
	if view.Requests < minViewRequests {
		out.rules, out.Held = prev, true
		out.Rules = ruleViews(prev, "held: too little traffic to judge")
		return out
	}
	before := map[uint64]translate.PrefixRule{}
	for _, r := range prev {
		before[r.Prefix] = r
	}
	share := func(p *signals.PrefixPoint) float64 {
		s := p.Requests / view.Requests
		if view.Tokens > 0 {
			s = math.Max(s, p.Tokens/view.Tokens)
		}
		return s
	}
	byHash := make(map[uint64]*signals.PrefixPoint, len(view.Points))
	children := map[uint64][]*signals.PrefixPoint{}
	for i := range view.Points {
		p := &view.Points[i]
		byHash[p.Prefix] = p
		if p.Parent != 0 {
			children[p.Parent] = append(children[p.Parent], p)
		}
	}
	hot := map[uint64]bool{}
	for i := range view.Points {
		p := &view.Points[i]
		r, was := before[p.Prefix]
		wasHot := was && r.Action != translate.Group
		if s := share(p); s > thr || (wasHot && s > hotHysteresis*thr) {
			hot[p.Prefix] = true
		}
	}
	preAnchor := func(p *signals.PrefixPoint) bool { return p.Flags&(signals.PointAnchor|signals.PointAfterAnchor) == 0 }
	type cand struct {
		rule translate.PrefixRule
		view PrefixRuleView
	}
	var cands []cand
	add := func(p *signals.PrefixPoint, r translate.PrefixRule, why string) {
		cands = append(cands, cand{r, PrefixRuleView{Prefix: fmt.Sprintf("%016x", p.Prefix), Action: r.Action.String(), Spread: r.Spread,
			Share: share(p), DepthBytes: p.DepthBytes, DepthTokens: p.DepthTokens, Conversations: p.Conversations, Why: why}})
	}
	for i := range view.Points {
		p := &view.Points[i]
		if !hot[p.Prefix] {
			continue
		}
		deepest := !slices.ContainsFunc(children[p.Prefix], func(c *signals.PrefixPoint) bool { return hot[c.Prefix] && preAnchor(c) })
		if preAnchor(p) && !deepest {
			continue // a deeper point of the chain is hot too: its rule decides
		}
		s := share(p)
		r := translate.PrefixRule{Prefix: p.Prefix, Action: translate.Deeper, Spread: spreadFor(s, thr, before[p.Prefix].Spread)}
		why := fmt.Sprintf("hot: %.1f%% of the class, over %.1f%% (%.2f of one engine's share)", 100*s, 100*thr, s*float64(n))
		if preAnchor(p) && int(p.DepthTokens) >= a.SpreadMinPrefixTokens {
			r.Action = translate.Spread
			why += fmt.Sprintf("; %d tokens ≥ spread_min_prefix_tokens %d: spread over %d keys", p.DepthTokens, a.SpreadMinPrefixTokens, r.Spread)
		} else {
			why += "; keyed deeper, on each conversation"
		}
		add(p, r, why)
	}
	for i := range view.Points {
		p := &view.Points[i]
		if hot[p.Prefix] || !preAnchor(p) || p.Conversations < minConversations {
			continue
		}
		if parent, ok := byHash[p.Parent]; ok && !hot[parent.Prefix] {
			continue // its parent is cold (and shared by as many): the group starts higher
		}
		// Descend to the divergence point: while exactly one child carries
		// nearly all of the point's requests. A group published before
		// stays where it is (and is followed down with some slack).
		d := p
		for before[d.Prefix].Action != translate.Group {
			var next *signals.PrefixPoint
			n := 0
			for _, c := range children[d.Prefix] {
				follow := groupFollow
				if before[c.Prefix].Action == translate.Group {
					follow = hotHysteresis
				}
				if preAnchor(c) && !hot[c.Prefix] && c.Conversations >= minConversations && c.Requests >= follow*d.Requests {
					next, n = c, n+1
				}
			}
			if n != 1 {
				break
			}
			d = next
		}
		if int(d.DepthTokens) < a.GroupMinPrefixTokens {
			continue
		}
		add(d, translate.PrefixRule{Prefix: d.Prefix, Action: translate.Group},
			fmt.Sprintf("shared by about %.0f conversations, %.1f%% of the class (under %.1f%%): its conversations keyed together", d.Conversations, 100*share(d), 100*thr))
	}
	slices.SortFunc(cands, func(x, y cand) int {
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
		if before[c.rule.Prefix] != c.rule {
			out.Changed++
		}
	}
	for h := range before {
		if !seen[h] {
			out.Changed++
		}
	}
	return out
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
