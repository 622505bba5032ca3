package extproc

import (
	"fmt"
	"strings"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc/body"
)

// KeyExplanation says which affinity key a request body gets under a
// policy, and why (`inferlb explain-key`).
type KeyExplanation struct {
	Class string `json:"class"`
	// Sources is the class's key order; Off its switch.
	Sources []string `json:"sources"`
	Off     bool     `json:"off"`
	// TableVersion and TableRules describe the class's split table.
	TableVersion string `json:"table_version,omitempty"`
	TableRules   int    `json:"table_rules"`
	// SharedDepthBytes is the table's shared-prefix depth (0: none);
	// Shared says the key is the group point it chose.
	SharedDepthBytes uint32 `json:"shared_depth_bytes,omitempty"`
	Shared           bool   `json:"shared,omitempty"`
	// Header is the x-inferlb-affinity-key value ("" when it is fresh per
	// request: affinity off, or nothing to key on).
	Header string `json:"header"`
	// Source and Kind as in KeyDecision; Point and Hot index Points.
	Source string `json:"source"`
	Kind   string `json:"kind,omitempty"`
	Point  int    `json:"point"`
	Hot    int    `json:"hot"`
	Spread uint32 `json:"spread,omitempty"`
	// Points is the prompt's prefix chain with each point's rule.
	Points []ExplainedPoint `json:"points"`
	// Why is the decision in words.
	Why string `json:"why"`
}

// ExplainedPoint is one chain point.
type ExplainedPoint struct {
	Hash        string `json:"hash"`
	DepthBytes  uint32 `json:"depth_bytes"`
	DepthTokens uint32 `json:"depth_tokens"`
	MessageEnd  bool   `json:"message_end,omitempty"`
	Anchor      bool   `json:"anchor,omitempty"`
	AfterAnchor bool   `json:"after_anchor,omitempty"`
	// Rule is the split table's rule for the point ("" for none).
	Rule string `json:"rule,omitempty"`
}

// ExplainKey parses a request body (of the API at path) as ext_proc would,
// picks its class, and explains its affinity key. session and residency
// are the x-session-id and x-data-residency headers ("" if absent).
func (p *Policy) ExplainKey(path, session, residency string, b []byte) (*KeyExplanation, error) {
	kind := body.Chat
	switch path {
	case "/v1/chat/completions":
	case "/v1/completions":
		kind = body.Completion
	default:
		return nil, fmt.Errorf("path %q: inferlb routes /v1/chat/completions and /v1/completions", path)
	}
	var br body.Request
	if err := body.Parse(b, kind, &br); err != nil {
		return nil, fmt.Errorf("body: %w", err)
	}
	c, rerr := p.Route(br.Model, residency, br.PromptTokens+max(br.MaxTokens, 0))
	switch rerr {
	case errUnknownModel:
		return nil, fmt.Errorf("model %q: no class of the policy serves it", br.Model)
	case errResidency:
		return nil, fmt.Errorf("model %q: no class in residency %q", br.Model, residency)
	}
	a := &c.aff
	d := a.key(session, &br, nil)
	x := &KeyExplanation{Class: c.Name, Off: a.off, TableVersion: a.version, TableRules: len(a.table),
		Source: d.Source, Kind: d.Kind, Point: d.Point, Hot: d.Hot, Spread: d.Spread,
		SharedDepthBytes: a.sharedDepth, Shared: d.Shared}
	for _, s := range a.sources {
		x.Sources = append(x.Sources, s.String())
	}
	if d.Key != 0 {
		x.Header = hex16(d.Key)
	}
	for _, pt := range br.Chain.At() {
		e := ExplainedPoint{Hash: fmt.Sprintf("%016x", pt.Hash), DepthBytes: pt.Depth, DepthTokens: pt.Tokens,
			MessageEnd: pt.Flags&body.PointMessageEnd != 0, Anchor: pt.Flags&body.PointAnchor != 0,
			AfterAnchor: pt.Flags&body.PointAfterAnchor != 0}
		if r, ok := a.table[pt.Hash]; ok {
			e.Rule = ruleName(r)
		}
		x.Points = append(x.Points, e)
	}
	x.Why = explainWhy(x, session, &br)
	return x, nil
}

func ruleName(r prefixRule) string {
	switch r.action {
	case policyv1.PrefixRule_ACTION_DEEPER:
		return fmt.Sprintf("deeper (hot; spread %d if nothing deeper)", r.spread)
	case policyv1.PrefixRule_ACTION_SPREAD:
		return fmt.Sprintf("spread over %d", r.spread)
	case policyv1.PrefixRule_ACTION_GROUP:
		return "group"
	}
	return r.action.String()
}

func explainWhy(x *KeyExplanation, session string, br *body.Request) string {
	var why []string
	absent := map[string]bool{"session": session == "", "prompt_cache_key": br.PromptCacheKey == "", "user": br.User == "", "prefix": !br.HasPrefix}
	for _, s := range x.Sources {
		if s == x.Source {
			break
		}
		what := map[string]string{"session": "no x-session-id header", "prompt_cache_key": "no prompt_cache_key",
			"user": "no user", "prefix": "no prefix to key on (no user message, or a prompt of token ids)"}[s]
		if absent[s] {
			why = append(why, what)
		}
	}
	point := func(i int) string {
		p := x.Points[i]
		return fmt.Sprintf("point %d (%d bytes, ~%d tokens)", i, p.DepthBytes, p.DepthTokens)
	}
	switch {
	case x.Source == "":
		why = append(why, "nothing to key on: a fresh key per request")
	case x.Source != "prefix":
		why = append(why, "keyed on the "+x.Source)
	case x.Kind == "group" && x.Shared:
		why = append(why, fmt.Sprintf("the class's conversations share prefixes inside their first message (shared-prefix depth %d bytes): %s, the first point before the anchor that deep, is the key, with every request that shares the prompt up to it", x.SharedDepthBytes, point(x.Point)))
	case x.Kind == "group":
		why = append(why, point(x.Point)+" is a shared prefix whose load one engine can serve: keyed on it, with every conversation that shares it")
	case x.Kind == "spread" && x.Point >= 0:
		why = append(why, fmt.Sprintf("%s is hot and spread: keyed on it and this conversation's slot among %d (the conversation is %s)", point(x.Hot), x.Spread, point(x.Point)))
	case x.Kind == "spread":
		why = append(why, fmt.Sprintf("every point from the anchor on is hot (identical prompts): keyed on %s and a fresh slot among %d per request", point(x.Hot), x.Spread))
	default:
		s := ""
		if x.Hot >= 0 {
			s = point(x.Hot) + " is hot, so the key goes deeper; "
		}
		if x.Points[x.Point].Anchor {
			s += point(x.Point) + ", the anchor (the end of the first user message, which every later turn repeats), keys the conversation"
		} else {
			s += point(x.Point) + ", the first point past the hot ones, keys the conversation"
		}
		why = append(why, s)
	}
	if x.Off {
		why = append(why, "affinity is off for the class: the request is sent with a fresh random key (shedding still uses this one)")
		x.Header = ""
	}
	return strings.Join(why, "; ")
}
