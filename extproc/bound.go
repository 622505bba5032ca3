package extproc

import (
	"github.com/inferlb/inferlb/extproc/body"
	"github.com/inferlb/inferlb/internal/tokens"
	"github.com/inferlb/inferlb/internal/tokens/hf"
)

// How a request's context need was bounded (the method label of
// inferlb_extproc_context_bounds_total).
const (
	boundShort     = "short"     // 11 × bytes fits the smallest class: no scan
	boundBytes     = "bytes"     // tokens.Bound decided
	boundTokenizer = "tokenizer" // the model's tokenizer counted the texts
)

// routeByContext picks the class for a request by the tokens it may need:
// prompt tokens plus max_tokens, the prompt bounded so that it never
// undercounts the model's real tokenizer (the engine would reject a request
// longer than its context, 400). Cheapest first, each step only when the
// previous one leaves the class open:
//
//  1. 11 × the body's bytes (tokens.MaxBoundFactor) + chat template tokens:
//     if even that fits the smallest class, route there without a scan;
//  2. tokens.Bound of the body (its bytes, plus what the few code points
//     growing under normalization add): one pass, 3 GB/s on ASCII;
//  3. with the model's tokenizer loaded (--tokenizer, matched by the
//     digest the policy names), the exact count of the prompt texts plus
//     the body's other bytes (keys, roles, tools, counted one token per
//     byte) — about 90 MB/s, and only for requests near a class limit.
//
// Without a tokenizer, step 2's bound decides: safe, and loose by the
// tokenizer's bytes per token (about 4 for English).
//
// It returns the class and how the bound was made (the method label).
func (p *Policy) routeByContext(model, residency string, b []byte, kind body.Kind, br *body.Request) (*Class, string, routeErr) {
	out := max(br.MaxTokens, 0)
	first, rerr := p.Route(model, residency, 0)
	if rerr != 0 {
		return nil, "", rerr
	}
	extra := first.TemplateTokens + out
	c, _ := p.Route(model, residency, tokens.MaxBoundFactor*len(b)+extra)
	if c == first {
		return c, boundShort, 0
	}
	c, _ = p.Route(model, residency, tokens.Bound(b)+extra)
	tok := first.tokenizer
	if c == first || tok == nil {
		return c, boundBytes, 0
	}
	// Counting matters only if the prompt might fit a smaller class than
	// the bound's: count up to the largest such limit, no further.
	below := p.smallerGuarantee(model, residency, c)
	if below <= extra {
		return c, boundBytes, 0
	}
	if n, ok := exactBound(tok, b, kind, below-extra); ok {
		c, _ = p.Route(model, residency, n+extra)
	}
	return c, boundTokenizer, 0
}

// exactBound is the prompt's tokens under tok: its texts counted exactly,
// every other byte of the body as one token (what a chat template renders
// from the JSON around the texts — roles, names, tool calls — costs at most
// that), and the post-processor's special tokens. It stops, returning false,
// as soon as the count is sure to exceed limit.
func exactBound(tok *hf.Tokenizer, b []byte, kind body.Kind, limit int) (int, bool) {
	raw := 0
	body.Texts(b, kind, func(_ string, rawLen int) { raw += rawLen })
	n := tok.SpecialTokens() + len(b) - raw
	body.Texts(b, kind, func(text string, _ int) {
		if n <= limit {
			n += tok.CountUpTo(text, limit-n)
		}
	})
	return n, n <= limit
}
