package body

import (
	"bytes"
	"encoding/binary"
	"math/bits"

	"github.com/cespare/xxhash/v2"
)

// tokenString reads a string at p.i, validating it and counting the tokens of
// its decoded text under the token rule, in one pass. It returns the raw span.
//
// The hot loop looks at 8 bytes at a time: a word without a quote, backslash
// or control byte is counted from its space mask with a few bit operations;
// other words go byte by byte up to the special byte.
func (p *parser) tokenString() (span [2]int, tokens int, err error) {
	if p.peek() != '"' {
		return span, 0, p.syntax("expected a string")
	}
	b := p.b
	start := p.i + 1
	n, run := 0, 0
	i := start
	for {
		for i+8 <= len(b) {
			w := binary.LittleEndian.Uint64(b[i:])
			if special := hasLess(w, 0x20) | hasZero(w^(lsb*'"')) | hasZero(w^(lsb*'\\')); special != 0 {
				// Bytes before the first special one are plain text or space.
				k := bits.TrailingZeros64(special) / 8
				for ; k > 0; k-- {
					if b[i] == ' ' {
						run = 0
					} else {
						if run == 0 {
							n++
						}
						run++
						if run == tokenRun {
							run = 0
						}
					}
					i++
				}
				break
			}
			sp := zeroMask(w ^ (lsb * ' '))
			if sp == 0 { // eight text bytes: one more token, run unchanged
				n++
				i += 8
				continue
			}
			lead := bits.TrailingZeros64(sp) / 8 // text bytes before the first space
			if lead > 0 {
				total := run + lead
				n += (total + tokenRun - 1) / tokenRun
				if run > 0 {
					n--
				}
			}
			text := ^sp & hi
			n += bits.OnesCount64(text & (sp << 8))
			run = bits.LeadingZeros64(sp) / 8 // text bytes after the last space
			i += 8
		}
		if i >= len(b) {
			break
		}
		c := b[i]
		switch {
		case c == '"':
			p.i = i + 1
			return [2]int{start, i}, n, nil
		case c < 0x20:
			p.i = i
			return span, 0, p.syntax("control character in string")
		case c == '\\':
			p.i = i
			k, err := p.escapeLen()
			if err != nil {
				return span, 0, err
			}
			// Decode the escape into 1–4 bytes and feed them to the rule.
			var buf [4]byte
			w := 1
			switch b[i+1] {
			case 'n', 'r', 't':
				buf[0] = ' '
			case 'u':
				r, used := decodeU(b[i:min(len(b), i+12)])
				if used == 12 {
					k = 12
				}
				w = encodeRune(buf[:], r)
			default:
				buf[0] = 'x' // '"', '\\', '/', 'b', 'f' are not whitespace
			}
			for j := 0; j < w; j++ {
				if c := buf[j]; c == ' ' || c == '\t' || c == '\n' || c == '\r' {
					run = 0
					continue
				}
				if run == 0 {
					n++
				}
				run++
				if run == tokenRun {
					run = 0
				}
			}
			i += k
		case c == ' ':
			run = 0
			i++
		default:
			if run == 0 {
				n++
			}
			run++
			if run == tokenRun {
				run = 0
			}
			i++
		}
	}
	p.i = len(b)
	return span, 0, p.syntax("unterminated string")
}

const (
	lsb = 0x0101010101010101
	hi  = 0x8080808080808080
	lo7 = 0x7f7f7f7f7f7f7f7f
)

// hasZero is non-zero iff some byte of x is zero; its lowest set bit marks
// the first zero byte exactly (higher bits may be false positives).
func hasZero(x uint64) uint64 { return (x - lsb) &^ x & hi }

// hasLess is non-zero iff some byte of x is below n (n <= 128), with the
// same exactness for the lowest set bit.
func hasLess(x, n uint64) uint64 { return (x - lsb*n) &^ x & hi }

// zeroMask sets the high bit of exactly the zero bytes of x.
func zeroMask(x uint64) uint64 { return ^((x&lo7 + lo7) | x | lo7) }

// msgRec remembers a stable-prefix message until its role is known.
type msgRec struct {
	role    string
	content [2]int // raw span of the content value (string with quotes, or array)
	has     bool
}

func (p *parser) messages(r *Request) error {
	if p.peek() != '[' {
		if isValueStart(p.peek()) {
			if err := p.skip(0); err != nil {
				return err
			}
			return &FieldError{Field: "messages", Msg: "must be an array"}
		}
		return p.syntax("expected a value")
	}
	p.i++
	var recBuf [8]msgRec
	rec := recBuf[:0]
	prefixDone := false
	p.ws()
	if p.peek() == ']' {
		p.i++
		return &FieldError{Field: "messages", Msg: "must not be empty"}
	}
	for idx := 0; ; idx++ {
		p.ws()
		m, tok, err := p.message(idx)
		if err != nil {
			return err
		}
		r.Messages++
		r.PromptTokens += 1 + tok
		if !prefixDone {
			rec = append(rec, m)
			if m.role == "user" {
				prefixDone = true
			}
		}
		p.ws()
		switch p.peek() {
		case ',':
			p.i++
			continue
		case ']':
			p.i++
		default:
			return p.syntax("expected ',' or ']' in array")
		}
		break
	}
	if prefixDone {
		h := uint64(fnvOffset)
		for _, m := range rec {
			h = hashBytes(h, m.role)
			h = (h ^ 0) * fnvPrime
			if m.has {
				h = p.hashContent(h, m.content)
			}
			h = (h ^ 0xff) * fnvPrime
		}
		r.PrefixHash, r.HasPrefix = h, true
	}
	return nil
}

func hashBytes(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * fnvPrime
	}
	return h
}

// message reads one message object and returns its role, content span and
// the token count of its text.
func (p *parser) message(idx int) (m msgRec, tokens int, err error) {
	if p.peek() != '{' {
		if isValueStart(p.peek()) {
			return m, 0, &FieldError{Field: "messages", Msg: "every element must be an object"}
		}
		return m, 0, p.syntax("expected a value")
	}
	p.i++
	seenRole := false
	p.ws()
	if p.peek() == '}' {
		p.i++
		return m, 0, &FieldError{Field: fieldIdx(idx, "role"), Msg: "missing"}
	}
	for {
		p.ws()
		key, esc, err := p.stringSpan()
		if err != nil {
			return m, 0, err
		}
		var name string
		if esc {
			name = decodeString(p.b[key[0]:key[1]])
		} else {
			name = string(p.b[key[0]:key[1]])
		}
		p.ws()
		if p.peek() != ':' {
			return m, 0, p.syntax("expected ':' after object key")
		}
		p.i++
		p.ws()
		switch name {
		case "role":
			s, err := p.stringField(fieldIdx(idx, "role"))
			if err != nil {
				return m, 0, err
			}
			m.role, seenRole = s, true
		case "content":
			start := p.i
			t, err := p.content(idx)
			if err != nil {
				return m, 0, err
			}
			tokens = t
			m.content, m.has = [2]int{start, p.i}, true
		default:
			if err := p.skip(1); err != nil {
				return m, 0, err
			}
		}
		p.ws()
		switch p.peek() {
		case ',':
			p.i++
			continue
		case '}':
			p.i++
		default:
			return m, 0, p.syntax("expected ',' or '}' in object")
		}
		break
	}
	if !seenRole {
		return m, 0, &FieldError{Field: fieldIdx(idx, "role"), Msg: "missing"}
	}
	return m, tokens, nil
}

func fieldIdx(idx int, f string) string {
	return "messages[" + itoa(idx) + "]." + f
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b [20]byte
	i := len(b)
	for n > 0 {
		i--
		b[i] = byte('0' + n%10)
		n /= 10
	}
	return string(b[i:])
}

// content reads a message's content: a string, null, or an array of parts
// whose "text" fields count.
func (p *parser) content(idx int) (int, error) {
	switch p.peek() {
	case '"':
		_, n, err := p.tokenString()
		return n, err
	case 'n':
		return 0, p.literal("null")
	case '[':
		return p.parts(idx, nil)
	}
	if isValueStart(p.peek()) {
		if err := p.skip(1); err != nil {
			return 0, err
		}
		return 0, &FieldError{Field: fieldIdx(idx, "content"), Msg: "must be a string, an array of content parts or null"}
	}
	return 0, p.syntax("expected a value")
}

// parts reads an array of content parts, counting the tokens of every
// "text" string. With h non-nil it also hashes the decoded text.
func (p *parser) parts(idx int, h *uint64) (int, error) {
	p.i++ // '['
	p.ws()
	if p.peek() == ']' {
		p.i++
		return 0, nil
	}
	total := 0
	for {
		p.ws()
		if p.peek() != '{' {
			if err := p.skip(2); err != nil {
				return 0, err
			}
		} else {
			p.i++
			p.ws()
			if p.peek() == '}' {
				p.i++
			} else {
				for {
					p.ws()
					key, esc, err := p.stringSpan()
					if err != nil {
						return 0, err
					}
					isText := !esc && string(p.b[key[0]:key[1]]) == "text" || esc && decodeString(p.b[key[0]:key[1]]) == "text"
					p.ws()
					if p.peek() != ':' {
						return 0, p.syntax("expected ':' after object key")
					}
					p.i++
					p.ws()
					if isText && p.peek() == '"' {
						span, n, err := p.tokenString()
						if err != nil {
							return 0, err
						}
						total += n
						if h != nil {
							*h = (hashText(*h, p.b[span[0]:span[1]]) ^ 0xfe) * fnvPrime
						}
					} else if err := p.skip(3); err != nil {
						return 0, err
					}
					p.ws()
					switch p.peek() {
					case ',':
						p.i++
						continue
					case '}':
						p.i++
					default:
						return 0, p.syntax("expected ',' or '}' in object")
					}
					break
				}
			}
		}
		p.ws()
		switch p.peek() {
		case ',':
			p.i++
			continue
		case ']':
			p.i++
		default:
			return 0, p.syntax("expected ',' or ']' in array")
		}
		return total, nil
	}
}

// hashContent folds the decoded text of an already validated content value
// (span) into h: at most PrefixBytes bytes of it, so the stable prefix costs
// little however long the first turn is (and conversations that share their
// first PrefixBytes bytes share their KV-cache prefix too).
func (p *parser) hashContent(h uint64, span [2]int) uint64 {
	raw := p.b[span[0]:span[1]]
	switch raw[0] {
	case '"':
		h = hashText(h, raw[1:len(raw)-1])
		// A string hashes like a one-part array of text.
		return (h ^ 0xfe) * fnvPrime
	case '[':
		sub := parser{b: raw}
		_, _ = sub.parts(0, &h) // validated already
		return h
	}
	return h // null
}

// prompt reads a completion prompt: a string or an array of strings (a batch;
// arrays of token ids count one token per id).
func (p *parser) prompt(r *Request) error {
	switch p.peek() {
	case '"':
		span, n, err := p.tokenString()
		if err != nil {
			return err
		}
		r.PromptTokens = n
		r.PrefixHash, r.HasPrefix = hashPrefix(p.b[span[0]:span[1]]), true
		return nil
	case '[':
		p.i++
		p.ws()
		if p.peek() == ']' {
			p.i++
			return &FieldError{Field: "prompt", Msg: "must not be empty"}
		}
		for first := true; ; first = false {
			p.ws()
			switch c := p.peek(); {
			case c == '"':
				span, n, err := p.tokenString()
				if err != nil {
					return err
				}
				r.PromptTokens += n
				if first {
					r.PrefixHash, r.HasPrefix = hashPrefix(p.b[span[0]:span[1]]), true
				}
			case c == '-' || c >= '0' && c <= '9':
				if err := p.number(); err != nil {
					return err
				}
				r.PromptTokens++
			case c == '[':
				if err := p.skip(1); err != nil {
					return err
				}
			default:
				if isValueStart(c) {
					if err := p.skip(1); err != nil {
						return err
					}
					return &FieldError{Field: "prompt", Msg: "array elements must be strings or token ids"}
				}
				return p.syntax("expected a value")
			}
			p.ws()
			switch p.peek() {
			case ',':
				p.i++
				continue
			case ']':
				p.i++
			default:
				return p.syntax("expected ',' or ']' in array")
			}
			return nil
		}
	}
	if isValueStart(p.peek()) {
		if err := p.skip(0); err != nil {
			return err
		}
		return &FieldError{Field: "prompt", Msg: "must be a string or an array"}
	}
	return p.syntax("expected a value")
}

// hashText folds the first PrefixBytes decoded bytes of a validated raw JSON
// string into h. The text is hashed with XXH64 (fixed seed, so every ext_proc
// replica derives the same key) and folded in with one FNV step; escapes are
// decoded first, so "\u00e9" and "é" hash alike.
func hashText(h uint64, raw []byte) uint64 {
	head := raw[:min(len(raw), PrefixBytes)]
	if bytes.IndexByte(head, '\\') < 0 {
		// Plain text (the usual case): the raw bytes are the decoded ones.
		return (h ^ xxhash.Sum64(head)) * fnvPrime
	}
	return (h ^ hashEscaped(raw)) * fnvPrime
}

// hashEscaped is XXH64 of the first PrefixBytes decoded bytes of raw. Kept
// out of hashText so the common path has no 2 KB stack frame.
//
//go:noinline
func hashEscaped(raw []byte) uint64 {
	var buf [PrefixBytes]byte
	n := 0
	walkString(raw, func(c byte) bool {
		buf[n] = c
		n++
		return n < PrefixBytes
	})
	return xxhash.Sum64(buf[:n])
}

// hashPrefix is the stable-prefix hash of a completion prompt.
func hashPrefix(raw []byte) uint64 { return hashText(fnvOffset, raw) }
