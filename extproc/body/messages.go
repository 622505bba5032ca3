package body

import (
	"encoding/binary"
	"math/bits"
)

// tokenString reads a string at p.i, validating it and counting the tokens of
// its decoded text under the token rule, in one pass. It returns the raw span.
//
// plainTokens counts the text up to the next special byte (quote, backslash
// or control) 16 bytes at a time; the special byte itself (an escape, the
// closing quote or an error) is handled here, as are the last few bytes of
// the body, byte by byte.
//
// Between bytes, run is the length of the current text run modulo tokenRun,
// as in the byte-at-a-time rule (0: the next text byte starts a token).
func (p *parser) tokenString() (span [2]int, tokens int, err error) {
	if p.peek() != '"' {
		return span, 0, p.syntax("expected a string")
	}
	b := p.b
	start := p.i + 1
	n, run := 0, 0
	i := start
	p.esc = false
	for {
		t, k, r := plainTokens(b[i:], run)
		n, run, i = n+t, r, i+k
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
			case '/':
				p.esc = true
				buf[0] = 'x'
			case 'u':
				p.esc = true
				r, used := decodeU(b[i:min(len(b), i+12)])
				if used == 12 {
					k = 12
				}
				w = encodeRune(buf[:], r)
			default:
				buf[0] = 'x' // '"', '\\', 'b', 'f' are not whitespace
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

// plainTokens counts the tokens in b up to its first special byte (quote,
// backslash or control), starting with the run state run, 16 bytes (two
// words) at a time. It returns the count, the number of bytes counted and
// the run state after them. It stops short of the special byte only when
// fewer than 16 bytes remain. It is a separate function so that its loop
// gets the registers to itself, and it uses no bit scans (BSF/BSR are slow
// on some CPUs, and GOAMD64=v1 has no TZCNT/LZCNT).
//
// In natural text no run is longer than 8 bytes, and then a token starts
// exactly at every text byte after a space: the fast path counts those.
// Blocks where a run crossing into a word may be longer go word by word
// through wordStarts, which tracks the run exactly.
func plainTokens(b []byte, run int) (n, used, runOut int) {
	// m is the exact run state, the high bit of byte -run mod 8: where in
	// the next word the current run, if it reaches that byte, starts a new
	// token. The fast path does not keep it up to date; it sets m to 0,
	// and stateAfter recovers it from the last word's spaces.
	m := uint64(0x80) << (uint(-run) & 7 * 8)
	// spPrev holds the high bits of the spaces of the previous word. With
	// a run pending, 0 (no space) sends the first block the slow way.
	spPrev := uint64(0)
	if run == 0 {
		spPrev = 0x80 << 56 // as after a space
	}
	i := 0
	for ; i <= len(b)-16; i += 16 {
		w0 := binary.LittleEndian.Uint64(b[i:])
		w1 := binary.LittleEndian.Uint64(b[i+8:])
		if (anySpecial(w0)|anySpecial(w1))&hi != 0 {
			break
		}
		t0, t1 := textMask(w0), textMask(w1)
		sp0, sp1 := t0^hi, t1^hi
		// lead>>8 has the high bits of all but the last of the text
		// bytes before the first space. A run crossing into the word is
		// at most 8 bytes long if the previous word has a space outside
		// them.
		lead0, lead1 := (sp0&-sp0)-1, (sp1&-sp1)-1
		if spPrev&^(lead0>>8) == 0 || sp0&^(lead1>>8) == 0 {
			if m == 0 {
				m = stateAfter(spPrev, 0x80)
			}
			var s0, s1 uint64
			s0, m = wordStarts(w0, hi, m)
			s1, m = wordStarts(w1, hi, m)
			n += int((s0>>7 + s1>>7) * lsb >> 56)
		} else {
			// Text bytes after a space, the previous word's last byte
			// included. At most 8 per word: the byte sums fit a byte.
			s0 := t0 & (sp0<<8 | spPrev>>56)
			s1 := t1 & (sp1<<8 | sp0>>56)
			n += int((s0>>7 + s1>>7) * lsb >> 56)
			m = 0
		}
		spPrev = sp1
	}
	if m == 0 {
		// After the fast path the run started after the last space; in a
		// word of all text (which the fast path takes only after a space)
		// it was exactly one token.
		m = stateAfter(spPrev, 0x80)
	}
	k := uint64(0) // bytes counted in the last block
	if i <= len(b)-16 {
		// The block at i has a special byte: count the bytes before the
		// first one, without branching on which word holds it.
		w0 := binary.LittleEndian.Uint64(b[i:])
		w1 := binary.LittleEndian.Uint64(b[i+8:])
		x0, x1 := specialMask(w0), specialMask(w1)
		below0 := (x0 & -x0) - 1 // all ones if w0 has none
		v0 := below0 & hi
		v1 := ((x1 & -x1) - 1) & hi & uint64(int64(below0)>>63)
		var s0, s1 uint64
		s0, m = wordStarts(w0, v0, m)
		s1, m = wordStarts(w1, v1, m)
		n += int((s0>>7 + s1>>7) * lsb >> 56)
		k = (v0>>7 + v1>>7) * lsb >> 56
		i += int(k)
	}
	// m marks where, mod 8, the current run started (or last split).
	split := (m >> 7) * 0x0001020304050607 >> 56 // index of m's byte
	return n, i, int((k - split) & 7)
}

// specialMask has the high bit of the first control, quote or backslash
// byte of w set, and no lower bit (higher bits may be set too); it is 0 if
// there is none.
func specialMask(w uint64) uint64 {
	return hasLess(w, 0x20) | hasZero(w^(lsb*'"')) | hasZero(w^(lsb*'\\'))
}

// anySpecial has a high bit set iff some byte of w is a control byte, a
// quote or a backslash. Flipping bit 1 maps the control bytes to themselves
// and the quote (0x22) to 0x20, the only other byte below 0x21, so it is
// hasLess(w^0x02…, 0x21) | hasZero(w^'\\'…) before the final mask with hi.
func anySpecial(w uint64) uint64 {
	q, bs := w^(lsb*0x02), w^(lsb*'\\')
	return (q-lsb*0x21)&^q | (bs-lsb)&^bs
}

// textMask has the high bits of the bytes of w that are not spaces, given
// that w has no control bytes (the text bytes are those >= 0x21).
func textMask(w uint64) uint64 { return (w&lo7 + lsb*(0x80-0x21) | w) & hi }

// wordStarts returns the high bits of the bytes of w at which a token
// starts, counting only the bytes whose high bits are in valid (a prefix of
// the word: text and spaces), given the run state mask m (see
// plainTokens), and the state after those bytes.
//
// A token starts at a text byte after a space, or at byte m if the bytes
// up to it are all text (the lead); a run after a space in w is at most 7
// bytes long, so it splits nowhere in w.
func wordStarts(w, valid, m uint64) (starts, next uint64) {
	sp := zeroMask(w^(lsb*' ')) & valid
	spv := sp | hi&^valid // bytes past the valid ones count as spaces
	text := hi &^ spv
	lead := (spv & -spv) - 1 // bits below the first space; all if none
	return text&(spv<<8) | m&lead, stateAfter(sp, m)
}

// stateAfter returns the run state mask (see plainTokens) after a word with
// spaces sp (high bits) and state m before it: the next run starts after
// the last space, at the next byte mod 8; without a space it is m.
func stateAfter(sp, m uint64) uint64 {
	// Smear the spaces down and keep the highest.
	d := sp | sp>>8
	d |= d >> 16
	d |= d >> 32
	noSpace := uint64(int64((sp&-sp)-1) >> 63) // all ones iff sp == 0
	return bits.RotateLeft64(d&^(d>>8), 8) | m&noSpace
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

// msgRec is a message read: its role and the raw span of its content
// value (a string with its quotes, an array, or null).
type msgRec struct {
	role    string
	content [2]int
	has     bool
	// canon: a string content is canonical as it is (see chain.go).
	canon bool
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
	firstUser := true
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
		if err := p.lim.over("messages", r.Messages, true); err != nil {
			return err
		}
		r.PromptTokens += 1 + tok
		anchor := firstUser && m.role == "user"
		firstUser = firstUser && !anchor
		p.chain.message(p, &m, tok, anchor)
		if more, err := p.sep(']'); err != nil {
			return err
		} else if more {
			continue
		}
		break
	}
	return nil
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
		// The key is compared in place (no string made of it): this runs
		// twice per message, and a hostile body has thousands of them.
		raw := p.b[key[0]:key[1]]
		if esc {
			raw = []byte(decodeString(raw))
		}
		p.ws()
		if p.peek() != ':' {
			return m, 0, p.syntax("expected ':' after object key")
		}
		p.i++
		p.ws()
		switch string(raw) {
		case "role":
			s, err := p.roleField(idx)
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
			m.content, m.has, m.canon = [2]int{start, p.i}, true, !p.esc
		default:
			if err := p.skip(1); err != nil {
				return m, 0, err
			}
		}
		if more, err := p.sep('}'); err != nil {
			return m, 0, err
		} else if more {
			continue
		}
		break
	}
	if !seenRole {
		return m, 0, &FieldError{Field: fieldIdx(idx, "role"), Msg: "missing"}
	}
	return m, tokens, nil
}

// roleField reads a message's role; the usual roles are not allocated per
// message (a body of many tiny messages would allocate once each).
func (p *parser) roleField(idx int) (string, error) {
	if p.peek() == '"' {
		start := p.i
		span, esc, err := p.stringSpan()
		if err != nil {
			return "", err
		}
		if !esc {
			switch raw := p.b[span[0]:span[1]]; string(raw) {
			case "user":
				return "user", nil
			case "assistant":
				return "assistant", nil
			case "system":
				return "system", nil
			case "tool":
				return "tool", nil
			case "developer":
				return "developer", nil
			}
		}
		p.i = start
	}
	return p.stringField(fieldIdx(idx, "role"))
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
		return p.parts()
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
// "text" string. With p.parts non-nil it also feeds the text parts to that
// chain.
func (p *parser) parts() (int, error) {
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
						if p.partsChain != nil {
							p.partsChain.text(p.b[span[0]:span[1]], !p.esc)
						}
					} else if err := p.skip(3); err != nil {
						return 0, err
					}
					if more, err := p.sep('}'); err != nil {
						return 0, err
					} else if more {
						continue
					}
					break
				}
			}
		}
		if more, err := p.sep(']'); err != nil {
			return 0, err
		} else if more {
			continue
		}
		return total, nil
	}
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
		p.chain.completion(p.b[span[0]:span[1]], !p.esc, n)
		return nil
	case '[':
		p.i++
		p.ws()
		if p.peek() == ']' {
			p.i++
			return &FieldError{Field: "prompt", Msg: "must not be empty"}
		}
		ids := 0 // token ids: one token each
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
					p.chain.completion(p.b[span[0]:span[1]], !p.esc, n)
				}
			case c == '-' || c >= '0' && c <= '9':
				if err := p.number(); err != nil {
					return err
				}
				r.PromptTokens++
				ids++
				if err := p.lim.over("prompt", ids, false); err != nil {
					return err
				}
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
			if more, err := p.sep(']'); err != nil {
				return err
			} else if more {
				continue
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
