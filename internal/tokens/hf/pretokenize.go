package hf

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// preTokenizer cuts normalized text into pieces the model tokenizes one by
// one. start says the text begins at offset 0 of the input (Metaspace's
// "first" scheme needs it); fn receives each piece with the same flag and
// returns false to stop (a count past its limit), which split then returns.
type preTokenizer interface {
	split(s string, start bool, fn func(piece string, start bool) bool) bool
}

type whole struct{}

func (whole) split(s string, start bool, fn func(string, bool) bool) bool { return fn(s, start) }

type preSeq []preTokenizer

func (q preSeq) split(s string, start bool, fn func(string, bool) bool) bool {
	if len(q) == 0 {
		return fn(s, start)
	}
	return q[0].split(s, start, func(piece string, st bool) bool { return q[1:].split(piece, st, fn) })
}

// behavior is a tokenizers SplitDelimiterBehavior.
type behavior uint8

const (
	removed behavior = iota
	isolated
	mergedWithPrevious
	mergedWithNext
	contiguous
)

func parseBehavior(s, where string) (behavior, error) {
	switch s {
	case "Removed":
		return removed, nil
	case "Isolated", "":
		return isolated, nil
	case "MergedWithPrevious":
		return mergedWithPrevious, nil
	case "MergedWithNext":
		return mergedWithNext, nil
	case "Contiguous":
		return contiguous, nil
	}
	return 0, unsupported(where, "split behavior "+s)
}

// span is a part of the text: a delimiter (match) or what lies between.
type span struct {
	start, end int
	match      bool
}

// cut applies a behavior to the spans of s and calls fn with each piece, as
// the tokenizers library's NormalizedString::split does.
func cut(s string, spans []span, b behavior, start bool, fn func(string, bool) bool) bool {
	var out []span
	prev := false
	switch b {
	case removed:
		for _, sp := range spans {
			if !sp.match {
				out = append(out, sp)
			}
		}
	case isolated:
		out = spans
	case mergedWithPrevious:
		for _, sp := range spans {
			if sp.match && !prev && len(out) > 0 {
				out[len(out)-1].end = sp.end
			} else {
				out = append(out, sp)
			}
			prev = sp.match
		}
	case mergedWithNext:
		for i := len(spans) - 1; i >= 0; i-- {
			sp := spans[i]
			if sp.match && !prev && len(out) > 0 {
				out[len(out)-1].start = sp.start
			} else {
				out = append(out, sp)
			}
			prev = sp.match
		}
		for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
			out[i], out[j] = out[j], out[i]
		}
	case contiguous:
		for _, sp := range spans {
			if sp.match == prev && len(out) > 0 {
				out[len(out)-1].end = sp.end
			} else {
				out = append(out, sp)
			}
			prev = sp.match
		}
	}
	for _, sp := range out {
		if sp.end > sp.start && !fn(s[sp.start:sp.end], start && sp.start == 0) {
			return false
		}
	}
	return true
}

// regexSplit is the Split pre-tokenizer (and ByteLevel's regex).
type regexSplit struct {
	p      *pattern
	b      behavior
	invert bool
}

func (r regexSplit) split(s string, start bool, fn func(string, bool) bool) bool {
	if r.b == isolated && !r.invert {
		return isolate(s, r.p, start, fn)
	}
	return cut(s, matchSpans(s, r.p.each, r.invert), r.b, start, fn)
}

// isolate is cut with the Isolated behavior without building the spans
// (the common case, on the hot path of counting).
func isolate(s string, p *pattern, start bool, fn func(string, bool) bool) bool {
	last := 0
	ok := p.each(s, func(a, b int) bool {
		if a > last && !fn(s[last:a], start && last == 0) {
			return false
		}
		if b > a && !fn(s[a:b], start && a == 0) {
			return false
		}
		last = b
		return true
	})
	if ok && last < len(s) {
		return fn(s[last:], start && last == 0)
	}
	return ok
}

func matchSpans(s string, each func(string, func(int, int) bool) bool, invert bool) []span {
	var spans []span
	last := 0
	each(s, func(a, b int) bool {
		if a > last {
			spans = append(spans, span{last, a, invert})
		}
		spans = append(spans, span{a, b, !invert})
		last = b
		return true
	})
	if last < len(s) {
		spans = append(spans, span{last, len(s), invert})
	}
	return spans
}

// charSplit splits where a character predicate holds, each such character
// its own match.
type charSplit struct {
	is func(rune) bool
	b  behavior
}

func (c charSplit) split(s string, start bool, fn func(string, bool) bool) bool {
	return cut(s, matchSpans(s, func(s string, f func(int, int) bool) bool {
		for i, r := range s {
			if c.is(r) {
				f(i, i+utf8.RuneLen(r))
			}
		}
		return true
	}, false), c.b, start, fn)
}

// byteLevel is the ByteLevel pre-tokenizer: an optional prefix space and
// GPT-2's split; the byte-to-character mapping happens in the model, which
// works on bytes.
type byteLevel struct {
	prefixSpace bool
	re          *pattern // nil: no regex split
}

const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

func (bl byteLevel) split(s string, start bool, fn func(string, bool) bool) bool {
	if bl.prefixSpace && !strings.HasPrefix(s, " ") {
		s = " " + s
	}
	if bl.re == nil {
		return fn(s, start)
	}
	return isolate(s, bl.re, start, fn)
}

// metaspace replaces spaces with a marker (▁), may prepend one, and may
// split before each marker.
type metaspace struct {
	rep     string
	prepend string // "always", "first", "never"
	splitAt bool
}

func (m metaspace) split(s string, start bool, fn func(string, bool) bool) bool {
	s = strings.ReplaceAll(s, " ", m.rep)
	if !strings.HasPrefix(s, m.rep) && (m.prepend == "always" || (m.prepend == "first" && start)) {
		s = m.rep + s
	}
	if !m.splitAt {
		return fn(s, start)
	}
	return cut(s, matchSpans(s, func(s string, f func(int, int) bool) bool {
		for i := 0; i < len(s); {
			j := strings.Index(s[i:], m.rep)
			if j < 0 {
				return true
			}
			f(i+j, i+j+len(m.rep))
			i += j + len(m.rep)
		}
		return true
	}, false), mergedWithNext, start, fn)
}

func isBertPunct(r rune) bool {
	if r < 0x80 {
		return r >= 33 && r <= 47 || r >= 58 && r <= 64 || r >= 91 && r <= 96 || r >= 123 && r <= 126
	}
	return unicode.IsPunct(r)
}

func isNumeric(r rune) bool { return unicode.In(r, unicode.Nd, unicode.Nl, unicode.No) }

func parsePreTokenizer(raw json.RawMessage, where string) (preTokenizer, bool, error) {
	typ, err := typeOf(raw, where)
	if err != nil {
		return nil, false, err
	}
	if typ == "" {
		return whole{}, false, nil
	}
	var d struct {
		PreTokenizers    []json.RawMessage `json:"pretokenizers"`
		Pattern          patternDoc        `json:"pattern"`
		Behavior         string            `json:"behavior"`
		Invert           bool              `json:"invert"`
		AddPrefixSpace   *bool             `json:"add_prefix_space"`
		UseRegex         *bool             `json:"use_regex"`
		Replacement      string            `json:"replacement"`
		PrependScheme    string            `json:"prepend_scheme"`
		Split            *bool             `json:"split"`
		IndividualDigits bool              `json:"individual_digits"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		return nil, false, fmt.Errorf("tokenizer: %s: %w", where, err)
	}
	switch typ {
	case "Sequence":
		var q preSeq
		anyByte := false
		for i, r := range d.PreTokenizers {
			p, bl, err := parsePreTokenizer(r, fmt.Sprintf("%s.pretokenizers[%d]", where, i))
			if err != nil {
				return nil, false, err
			}
			anyByte = anyByte || bl
			// ByteLevel without regex or prefix space only marks the
			// model byte-level: drop it (a stage per piece costs).
			if b, ok := p.(byteLevel); ok && b.re == nil && !b.prefixSpace {
				continue
			}
			q = append(q, p)
		}
		if len(q) == 1 {
			return q[0], anyByte, nil
		}
		return q, anyByte, nil
	case "ByteLevel":
		bl := byteLevel{prefixSpace: d.AddPrefixSpace == nil || *d.AddPrefixSpace}
		if d.UseRegex == nil || *d.UseRegex {
			p, err := compilePattern(gpt2Pattern, where)
			if err != nil {
				return nil, false, err
			}
			bl.re = p
		}
		return bl, true, nil
	case "Split":
		b, err := parseBehavior(d.Behavior, where+".behavior")
		if err != nil {
			return nil, false, err
		}
		var p *pattern
		switch {
		case d.Pattern.String != nil:
			p = literalPattern(*d.Pattern.String)
		case d.Pattern.Regex != nil:
			if p, err = compilePattern(*d.Pattern.Regex, where+".pattern"); err != nil {
				return nil, false, err
			}
		default:
			return nil, false, fmt.Errorf("tokenizer: %s: Split without a pattern", where)
		}
		return regexSplit{p: p, b: b, invert: d.Invert}, false, nil
	case "Whitespace":
		p, err := compilePattern(`\w+|[^\w\s]+`, where)
		if err != nil {
			return nil, false, err
		}
		return regexSplit{p: p, b: removed, invert: true}, false, nil
	case "WhitespaceSplit":
		return charSplit{is: unicode.IsSpace, b: removed}, false, nil
	case "BertPreTokenizer":
		return preSeq{charSplit{is: unicode.IsSpace, b: removed}, charSplit{is: isBertPunct, b: isolated}}, false, nil
	case "Punctuation":
		b, err := parseBehavior(d.Behavior, where+".behavior")
		if err != nil {
			return nil, false, err
		}
		return charSplit{is: isBertPunct, b: b}, false, nil
	case "Digits":
		b := contiguous
		if d.IndividualDigits {
			b = isolated
		}
		return charSplit{is: isNumeric, b: b}, false, nil
	case "Metaspace":
		m := metaspace{rep: d.Replacement, prepend: d.PrependScheme, splitAt: d.Split == nil || *d.Split}
		if m.rep == "" {
			m.rep = "▁"
		}
		if m.prepend == "" {
			m.prepend = "always"
			if d.AddPrefixSpace != nil && !*d.AddPrefixSpace {
				m.prepend = "never"
			}
		}
		switch m.prepend {
		case "always", "first", "never":
		default:
			return nil, false, unsupported(where, "prepend_scheme "+m.prepend)
		}
		return m, false, nil
	}
	return nil, false, unsupported(where, "pre-tokenizer "+typ)
}
