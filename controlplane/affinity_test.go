package controlplane

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/xds/translate"
)

// pt is a view point: prefix, parent, depth in tokens, flags, requests
// (of 1000), continuations.
func pt(prefix, parent uint64, tokens uint32, flags uint32, req, cont float64) signals.PrefixPoint {
	return signals.PrefixPoint{Prefix: prefix, Parent: parent, DepthBytes: tokens * 5, DepthTokens: tokens, Flags: flags,
		Requests: req, Upper: req, Tokens: req * 100, Continuations: cont}
}

func prefixView(points ...signals.PrefixPoint) signals.ClassPrefixes {
	return signals.ClassPrefixes{Requests: 1000, Tokens: 100000, Points: points}
}

// preambleView: every request shares points 1→2→3 (a 4k-token preamble
// inside the first user message; each continues to the next, the last to
// 100 conversations' anchors), then the anchors (each one conversation:
// its first turn ends there, its later turns continue alike).
func preambleView(depth uint32) signals.ClassPrefixes {
	pts := []signals.PrefixPoint{pt(1, 0, 100, 0, 1000, 1), pt(2, 1, depth/2, 0, 1000, 1), pt(3, 2, depth, 0, 1000, 150)}
	for i := uint64(0); i < 100; i++ {
		pts = append(pts, pt(100+i, 3, depth+50, signals.PointMessageEnd|signals.PointAnchor, 10, 2))
	}
	return prefixView(pts...)
}

func rulesOf(av *AffinityView) map[uint64]translate.PrefixRule {
	out := map[uint64]translate.PrefixRule{}
	for _, r := range av.rules {
		out[r.Prefix] = r
	}
	return out
}

func TestSplitTableSharedPreamble(t *testing.T) {
	cl := testFleet(t).Classes[0] // 4 engines: hot above 0.5/4 = 12.5% of the class
	av := splitTable(cl, preambleView(4000), 4, nil, 0)
	rs := rulesOf(av)
	// Only the divergence point gets a rule: the conversations' anchors
	// are cold (1% each) and keep keying every conversation apart.
	if len(rs) != 1 || rs[3].Action != translate.Deeper || rs[3].Spread != 16 || av.HotShare != 0.125 {
		t.Fatalf("rules %+v (view %+v)", av.rules, av.Rules)
	}
	if !strings.Contains(av.Rules[0].Why, "keyed deeper") {
		t.Fatalf("why: %s", av.Rules[0].Why)
	}
	// A preamble longer than spread_min_prefix_tokens (45,000: a tenth of
	// the 450,000-token KV cache) is spread over R keys instead.
	av = splitTable(cl, preambleView(60000), 4, nil, 0)
	if rs := rulesOf(av); len(rs) != 1 || rs[3].Action != translate.Spread || rs[3].Spread != 16 {
		t.Fatalf("long preamble: %+v", av.rules)
	}
}

// Few-shot prompts: the first user message, the anchor, is shared by
// everyone, and so is the example after it; conversations diverge after
// that. The divergence point is hot, and so is every point between it and
// the anchor (ext_proc's walk must pass each); the system prompt before the
// anchor needs no rule.
func TestSplitTableHotAnchor(t *testing.T) {
	cl := testFleet(t).Classes[0]
	pts := []signals.PrefixPoint{
		pt(1, 0, 50, signals.PointMessageEnd, 1000, 1),
		pt(2, 1, 80, signals.PointMessageEnd|signals.PointAnchor, 1000, 1),
		pt(3, 2, 110, signals.PointMessageEnd|signals.PointAfterAnchor, 1000, 50),
	}
	for i := uint64(0); i < 50; i++ {
		pts = append(pts, pt(10+i, 3, 150, signals.PointMessageEnd|signals.PointAfterAnchor, 20, 2))
	}
	rs := rulesOf(splitTable(cl, prefixView(pts...), 4, nil, 0))
	if len(rs) != 2 || rs[2].Action != translate.Deeper || rs[3].Action != translate.Deeper {
		t.Fatalf("rules %+v", rs)
	}
	// One busy conversation (a fifth of the class) never makes its own
	// points hot: all its turns continue alike.
	busy := prefixView(pt(1, 0, 50, signals.PointMessageEnd|signals.PointAnchor, 200, 2), pt(2, 1, 90, signals.PointMessageEnd|signals.PointAfterAnchor, 190, 1))
	if av := splitTable(cl, busy, 4, nil, 0); len(av.rules) != 0 {
		t.Fatalf("one conversation split: %+v", av.Rules)
	}
	// Identical prompts: many requests end at the anchor.
	same := prefixView(pt(1, 0, 50, signals.PointMessageEnd|signals.PointAnchor, 600, 40))
	if rs := rulesOf(splitTable(cl, same, 4, nil, 0)); len(rs) != 1 || rs[1].Action != translate.Deeper || rs[1].Spread != 10 {
		t.Fatalf("identical prompts: %+v", rs)
	}
}

// Cold shared documents: each shared by a few conversations, small enough
// for one engine. The long ones group their conversations on their
// divergence point; the short one does not (under group_min_prefix_tokens).
func TestSplitTableGroups(t *testing.T) {
	cl := testFleet(t).Classes[0]
	var pts []signals.PrefixPoint
	for d := uint64(0); d < 5; d++ {
		base := 1000 * (d + 1)
		depth := uint32(3000)
		if d == 4 {
			depth = 600 // short
		}
		// doc d: base → base+1 (the divergence point) → 6 conversations
		pts = append(pts, pt(base, 0, depth/2, 0, 60, 1), pt(base+1, base, depth, 0, 60, 6))
		for c := uint64(0); c < 6; c++ {
			pts = append(pts, pt(base+10+c, base+1, depth+100, signals.PointMessageEnd|signals.PointAnchor, 10, 2))
		}
	}
	av := splitTable(cl, prefixView(pts...), 4, nil, 0)
	rs := rulesOf(av)
	if len(rs) != 4 {
		t.Fatalf("rules %+v", av.Rules)
	}
	for d := uint64(0); d < 4; d++ {
		if r := rs[1000*(d+1)+1]; r.Action != translate.Group {
			t.Fatalf("document %d: rule %+v, want GROUP on its divergence point", d, r)
		}
	}
	// A group stands while seen and cold, even when its conversations thin
	// out to one (they keep their key).
	thin := prefixView(pt(1001, 1000, 3000, 0, 20, 1), pt(1000, 0, 1500, 0, 20, 1))
	if rs := rulesOf(splitTable(cl, thin, 4, av.rules, 0)); len(rs) != 1 || rs[1001].Action != translate.Group {
		t.Fatalf("thinned group: %+v", rs)
	}
	// A single conversation's own prefix (one continuation) is not a group.
	av = splitTable(cl, prefixView(pt(1, 0, 2000, 0, 60, 1), pt(2, 1, 2100, signals.PointAnchor, 60, 2)), 4, nil, 0)
	if len(av.rules) != 0 {
		t.Fatalf("one conversation grouped: %+v", av.Rules)
	}
}

// Hysteresis: a hot prefix stays hot until its share falls under 0.7 of
// the threshold; its R holds within 25%; a group stays where it was.
func TestSplitTableHysteresis(t *testing.T) {
	cl := testFleet(t).Classes[0]
	at := func(share float64) signals.ClassPrefixes {
		return prefixView(pt(1, 0, 100, 0, 1000*share, 50), pt(2, 1, 200, signals.PointAnchor, 5, 2))
	}
	av := splitTable(cl, at(0.2), 4, nil, 0) // 0.2 > 0.125: hot, R = ceil(2·0.2/0.125) = 4
	if rs := rulesOf(av); rs[1].Action != translate.Deeper || rs[1].Spread != 4 {
		t.Fatalf("hot: %+v", av.rules)
	}
	prev := av.rules
	av = splitTable(cl, at(0.1), 4, prev, 0) // under the threshold but over 0.7 of it: still hot
	if rs := rulesOf(av); rs[1].Action != translate.Deeper {
		t.Fatalf("within hysteresis: %+v", av.rules)
	}
	av = splitTable(cl, at(0.22), 4, prev, 0) // R would be 4 (ceil 3.52): same
	if rs := rulesOf(av); rs[1].Spread != 4 || av.Changed != 0 {
		t.Fatalf("R moved within hysteresis: %+v (changed %d)", av.rules, av.Changed)
	}
	av = splitTable(cl, at(0.08), 4, prev, 0)
	if len(av.rules) != 0 || av.Changed != 1 {
		t.Fatalf("below 0.7 of the threshold: %+v (changed %d)", av.rules, av.Changed)
	}
	// Too little traffic: the previous table stands.
	quiet := at(0.2)
	quiet.Requests = 2
	if av := splitTable(cl, quiet, 4, prev, 0); !av.Held || len(av.rules) != 1 {
		t.Fatalf("quiet view: %+v", av)
	}
	// Affinity off: no table.
	off := cl
	off.Affinity.Mode = "off"
	if av := splitTable(off, at(0.5), 4, nil, 0); len(av.rules) != 0 {
		t.Fatalf("off: %+v", av.rules)
	}
}

// Through the cycle: the class's key order and its table reach every
// node's RoutingPolicy, identical at both frontends.
func TestCyclePublishesTheSplitTable(t *testing.T) {
	c, err := NewController(testFleet(t), DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	r, err := c.Step(context.Background(), Inputs{Now: now, Engines: engines(now, nil), Demand: demand(40, 20),
		Prefixes: map[string]signals.ClassPrefixes{"chat": preambleView(4000)}})
	if err != nil {
		t.Fatal(err)
	}
	var version string
	for _, node := range []string{"fe-east", "fe-west"} {
		a := r.Nodes[node].Resources.Policy.GetClasses()[0].GetAffinity()
		if len(a.GetKeys()) != 4 || a.GetKeys()[3] != policyv1.KeySource_KEY_SOURCE_PREFIX || a.GetOff() {
			t.Fatalf("%s: affinity %v", node, a)
		}
		rules := a.GetTable().GetRules()
		if len(rules) != 1 || rules[0].GetPrefix() != 3 || rules[0].GetAction() != policyv1.PrefixRule_ACTION_DEEPER {
			t.Fatalf("%s: rules %v", node, rules)
		}
		if version != "" && a.GetTable().GetVersion() != version {
			t.Fatalf("table versions differ between nodes: %s, %s", version, a.GetTable().GetVersion())
		}
		version = a.GetTable().GetVersion()
	}
	if av := r.Affinity["chat"]; av == nil || av.Engines != 4 || len(av.Rules) != 1 {
		t.Fatalf("admin view %+v", av)
	}
	// The next cycle, the same view: nothing to publish.
	now = now.Add(5 * time.Second)
	r, err = c.Step(context.Background(), Inputs{Now: now, Engines: engines(now, nil), Demand: demand(40, 20),
		Prefixes: map[string]signals.ClassPrefixes{"chat": preambleView(4000)}})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Publish) != 0 {
		t.Fatalf("an unchanged table was republished: %s", fmt.Sprint(r.Affinity["chat"].Rules))
	}
}

// conv sets a view point's conversations.
func conv(p signals.PrefixPoint, n float64) signals.PrefixPoint {
	p.Conversations = n
	return p
}

// The shared-prefix depth: two conversations through a cold point before
// their anchors, at least group_min_prefix_tokens deep, set it (the
// shallowest such point's depth); one conversation's turns, a shorter
// shared point, or a point over the hot threshold do not. With a depth, a
// heavy point that deep becomes DEEPER (the walk must pass it); without,
// the table is what it was. The depth stands while a shared point is seen
// and goes when none is.
func TestSplitTableSharedDepth(t *testing.T) {
	cl := testFleet(t).Classes[0]
	anchor := uint32(signals.PointMessageEnd | signals.PointAnchor)
	// Single-message prompts: rows 1 and 2 share points 10 (600 tokens)
	// and 11 (1,500 tokens) and 12 (3,000 tokens), then end at their own
	// anchors; row 3 is alone.
	shared := []signals.PrefixPoint{
		conv(pt(10, 0, 600, 0, 2, 1), 2), conv(pt(11, 10, 1500, 0, 2, 1), 2), conv(pt(12, 11, 3000, 0, 2, 2), 2),
		conv(pt(13, 12, 3500, anchor, 1, 1), 1), conv(pt(14, 12, 4000, anchor, 1, 1), 1),
	}
	alone := []signals.PrefixPoint{conv(pt(20, 0, 600, 0, 1, 1), 1), conv(pt(21, 20, 1500, 0, 1, 1), 1), conv(pt(22, 21, 2000, anchor, 1, 1), 1)}
	// A busy conversation's long first message: many turns, one anchor.
	busy := []signals.PrefixPoint{conv(pt(30, 0, 1500, 0, 300, 1), 1), conv(pt(31, 30, 2000, anchor, 300, 2), 1)}

	av := splitTable(cl, prefixView(append(slices.Clone(alone), busy...)...), 4, nil, 0)
	if av.SharedDepthBytes != 0 || len(av.rules) != 0 {
		t.Fatalf("no shared prefix: depth %d, rules %+v", av.SharedDepthBytes, av.Rules)
	}
	av = splitTable(cl, prefixView(append(append(slices.Clone(shared), alone...), busy...)...), 4, nil, 0)
	if av.SharedDepthBytes != 1500*5 {
		t.Fatalf("depth %d (%s), want point 11's %d bytes", av.SharedDepthBytes, av.SharedWhy, 1500*5)
	}
	// The busy conversation's point that deep is over the threshold: DEEPER,
	// so its requests keep their conversation key.
	if rs := rulesOf(av); rs[30].Action != translate.Deeper || len(rs) != 2 || rs[12].Action != translate.Group {
		t.Fatalf("rules with a depth: %+v", av.Rules)
	}
	// A point over the threshold never sets the depth.
	heavyShared := []signals.PrefixPoint{conv(pt(40, 0, 1500, 0, 400, 1), 5), conv(pt(41, 40, 2000, anchor, 400, 2), 5)}
	if av := splitTable(cl, prefixView(heavyShared...), 4, nil, 0); av.SharedDepthBytes != 0 {
		t.Fatalf("a heavy shared point set depth %d", av.SharedDepthBytes)
	}
	// The depth stands while a shared point is seen, even a deeper one.
	deeper := []signals.PrefixPoint{conv(pt(50, 0, 3000, 0, 2, 1), 2), conv(pt(51, 50, 3500, anchor, 1, 1), 1)}
	if av := splitTable(cl, prefixView(deeper...), 4, nil, 7500); av.SharedDepthBytes != 7500 {
		t.Fatalf("depth %d, want 7500 to stand", av.SharedDepthBytes)
	}
	if av := splitTable(cl, prefixView(alone...), 4, nil, 7500); av.SharedDepthBytes != 0 {
		t.Fatalf("depth %d with no shared point, want 0", av.SharedDepthBytes)
	}
	if av := splitTable(cl, signals.ClassPrefixes{Requests: 1}, 4, nil, 7500); !av.Held || av.SharedDepthBytes != 7500 {
		t.Fatalf("held view: %+v", av)
	}
	// An old ext_proc reports no conversations: no depth.
	old := slices.Clone(shared)
	for i := range old {
		old[i].Conversations = 0
	}
	if av := splitTable(cl, prefixView(old...), 4, nil, 0); av.SharedDepthBytes != 0 {
		t.Fatalf("depth %d from a view without conversations", av.SharedDepthBytes)
	}
}
