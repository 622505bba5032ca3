package body

import (
	"github.com/cespare/xxhash/v2"
)

// The prefix chain.
//
// Engines cache a prompt's KV by chained block hashes: a block's hash covers
// every token before it, so two prompts share cached blocks exactly as far
// as they share a prefix. The chain is the request path's version of that:
// the prompt is written as one canonical byte stream (the chat template's
// messages in order, see below) and hashed with one running XXH64; at chosen
// depths, the points, the hash of the stream so far is recorded. Two
// requests have equal point hashes at a depth exactly when their streams
// are equal up to it (up to hash collisions), so a point names a prefix.
//
// Points are taken at every message end (message boundaries are where
// conversations diverge: a shared system prompt, a shared first turn) and
// at the geometric depths FirstPointBytes·2^k inside messages (a shared
// preamble at the top of a long user message), at most MaxPoints. One
// running hash costs the same as hashing the prompt once, a few µs per
// 100 KB; a point costs a hash finalization (a few ns).
//
// The canonical stream, for chat: for each message, its role, a 0x00 byte,
// then each text part of its content (a string content is one part, null
// none, an array its "text" parts) followed by 0x1f, then 0x1e. A part's
// text is the decoded JSON string re-encoded minimally: '"' and '\' and
// the control characters \b \f \n \r \t with their two-byte escapes, other
// control characters as \u00xx, everything else as its UTF-8 bytes (a lone
// surrogate as U+FFFD). A raw JSON string without \u or \/ escapes is
// already canonical, so in the usual case the raw bytes are hashed as they
// are; "é" and "\u00e9" hash alike. For completions: the (first) prompt
// string, then 0x1f.
//
// If the request has a "tools" list (which chat templates render at the top
// of the prompt), every point's hash is finally mixed with the XXH64 of its
// raw JSON, so agents with different tool lists never share a prefix.
//
// The anchor is the conversation's own point: for chat, the end of the
// first user message (the system prompt and the first turn, which every
// later turn repeats); for completions, the point at CompletionAnchorBytes,
// or the end of a shorter prompt.

// FirstPointBytes is the depth of the first geometric point; the others are
// at its powers-of-two multiples.
const FirstPointBytes = 512

// MaxPoints bounds the points of one chain.
const MaxPoints = 48

// CompletionAnchorBytes is the depth of a completion prompt's anchor.
const CompletionAnchorBytes = 2048

// Point flags.
const (
	// PointMessageEnd: the point ends a message (or a completion prompt).
	PointMessageEnd uint8 = 1 << iota
	// PointAnchor: the point is the chain's anchor.
	PointAnchor
	// PointAfterAnchor: the point is deeper than the anchor.
	PointAfterAnchor
)

// Point is one point of the chain.
type Point struct {
	// Hash names the canonical stream's prefix up to Depth.
	Hash uint64
	// Depth is the prefix's length in canonical bytes.
	Depth uint32
	// Tokens estimates the prefix's length in tokens under the token rule
	// (exact at message ends, interpolated inside a message).
	Tokens uint32
	Flags  uint8
}

// Chain is a request's prefix chain, points in increasing depth.
type Chain struct {
	Points [MaxPoints]Point
	N      int
	// Anchor is the index of the anchor point, -1 if there is none (a
	// chat without a user message, a prompt of token ids).
	Anchor int
}

// At returns the chain's points.
func (c *Chain) At() []Point { return c.Points[:c.N] }

// chainWriter feeds the canonical stream into the running hash and records
// the points.
type chainWriter struct {
	c     *Chain
	d     xxhash.Digest
	depth uint64
	next  uint64 // depth of the next geometric point
	done  bool   // the anchor is recorded (points after it are flagged)
	// Token estimate of the current message's content: tokens before
	// it, its token count, its start depth and its raw length.
	tokBase, tokMsg  int
	msgStart, msgLen uint64
}

func (w *chainWriter) reset(c *Chain) {
	w.c = c
	c.N, c.Anchor = 0, -1
	w.d.Reset()
	w.depth, w.next, w.done = 0, FirstPointBytes, false
	w.tokBase, w.tokMsg, w.msgStart, w.msgLen = 0, 0, 0, 0
}

// point records a point at the current depth. A point at the depth of the
// last one (a message ending exactly at a geometric depth) is that point:
// its flags are merged. Two points of one chain never share a hash, so a
// request counts each prefix once (the control plane refuses prefix counts
// above the requests reported).
func (w *chainWriter) point(flags uint8, tokens int) {
	c := w.c
	if c.N > 0 && uint64(c.Points[c.N-1].Depth) == min(w.depth, 1<<32-1) {
		// Same depth, same stream, same hash: the point is after the
		// anchor exactly when it already was.
		last := &c.Points[c.N-1]
		last.Flags |= flags &^ PointAfterAnchor
		last.Tokens = uint32(max(tokens, 0))
		if flags&PointAnchor != 0 {
			c.Anchor, w.done = c.N-1, true
		}
		return
	}
	if w.done {
		flags |= PointAfterAnchor
	}
	if c.N == MaxPoints {
		if flags&PointAnchor == 0 {
			return
		}
		c.N-- // the anchor replaces the last point
	}
	c.Points[c.N] = Point{Hash: w.d.Sum64(), Depth: uint32(min(w.depth, 1<<32-1)), Tokens: uint32(max(tokens, 0)), Flags: flags}
	if flags&PointAnchor != 0 {
		c.Anchor, w.done = c.N, true
	}
	c.N++
}

// tokensAt estimates the tokens up to the current depth inside a message.
func (w *chainWriter) tokensAt() int {
	if w.msgLen == 0 {
		return w.tokBase
	}
	in := min(w.depth-w.msgStart, w.msgLen)
	return w.tokBase + int(uint64(w.tokMsg)*in/w.msgLen)
}

// write feeds canonical bytes, recording the geometric points they cross.
func (w *chainWriter) write(b []byte) {
	for len(b) > 0 {
		room := w.next - w.depth
		if uint64(len(b)) < room {
			_, _ = w.d.Write(b)
			w.depth += uint64(len(b))
			return
		}
		_, _ = w.d.Write(b[:room])
		w.depth = w.next
		w.next *= 2
		b = b[room:]
		w.point(0, w.tokensAt())
	}
}

func (w *chainWriter) writeByte(c byte) {
	buf := [1]byte{c}
	w.write(buf[:])
}

// text feeds one text part: raw is a validated JSON string's contents,
// canon whether it is canonical as it is (no \u or \/ escape).
func (w *chainWriter) text(raw []byte, canon bool) {
	if canon {
		w.write(raw)
	} else {
		w.writeCanon(raw)
	}
	w.writeByte(0x1f)
}

// writeCanon feeds the canonical form of a validated raw JSON string that
// holds \u or \/ escapes: plain runs go through as they are, escapes are
// decoded and re-encoded minimally, through a small buffer.
func (w *chainWriter) writeCanon(raw []byte) {
	var buf [256]byte
	n := 0
	put := func(bs ...byte) {
		if n+len(bs) > len(buf) {
			w.write(buf[:n])
			n = 0
		}
		n += copy(buf[n:], bs)
	}
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' {
			put(c)
			continue
		}
		i++
		switch raw[i] {
		case '/':
			put('/')
		case 'u':
			r, used := decodeU(raw[i-1:])
			i += used - 2
			var e [4]byte
			switch {
			case r == '"' || r == '\\':
				put('\\', byte(r))
			case r < 0x20:
				put(canonControl(byte(r))...)
			default:
				k := encodeRune(e[:], r)
				put(e[:k]...)
			}
		default: // the two-byte escapes are canonical
			put('\\', raw[i])
		}
	}
	w.write(buf[:n])
}

// canonControl is the canonical escape of a control character.
func canonControl(c byte) []byte {
	switch c {
	case '\b':
		return []byte(`\b`)
	case '\f':
		return []byte(`\f`)
	case '\n':
		return []byte(`\n`)
	case '\r':
		return []byte(`\r`)
	case '\t':
		return []byte(`\t`)
	}
	const hex = "0123456789abcdef"
	return []byte{'\\', 'u', '0', '0', hex[c>>4], hex[c&15]}
}

// message feeds one chat message whose content value spans content (a
// string with its quotes, an array, or null; has false if absent) in p.b;
// tokens is its token count under the token rule (role marker excluded).
func (w *chainWriter) message(p *parser, m *msgRec, tokens int, anchor bool) {
	if w.done && w.c.N == MaxPoints {
		// The chain is full and has its anchor: no later byte can change
		// a point (point drops them all), so the hash need not see them.
		// A body of thousands of tiny messages costs its parse alone.
		w.tokBase += 1 + tokens
		return
	}
	w.write([]byte(m.role))
	w.writeByte(0)
	w.tokBase++ // the role marker
	w.tokMsg, w.msgStart = tokens, w.depth
	w.msgLen = 0
	if m.has {
		raw := p.b[m.content[0]:m.content[1]]
		w.msgLen = uint64(len(raw))
		switch raw[0] {
		case '"':
			w.text(raw[1:len(raw)-1], m.canon)
		case '[':
			sub := parser{b: raw, partsChain: w}
			_, _ = sub.parts() // validated already
		}
	}
	w.tokBase += tokens
	w.msgLen = 0
	w.writeByte(0x1e)
	flags := PointMessageEnd
	if anchor {
		flags |= PointAnchor
	}
	w.point(flags, w.tokBase)
}

// completion feeds a completion prompt (a validated JSON string's
// contents, canonical as it is or not) and its end, marking the anchor.
func (w *chainWriter) completion(raw []byte, canon bool, tokens int) {
	w.tokMsg, w.msgStart, w.msgLen = tokens, 0, uint64(len(raw))
	if canon {
		w.write(raw)
	} else {
		w.writeCanon(raw)
	}
	w.finishCompletion()
}

func (w *chainWriter) finishCompletion() {
	w.writeByte(0x1f)
	c := w.c
	// The geometric point at CompletionAnchorBytes, if the prompt reached
	// it, is the anchor; else the prompt's end.
	for i := 0; i < c.N; i++ {
		if c.Points[i].Depth == CompletionAnchorBytes {
			c.Points[i].Flags |= PointAnchor
			c.Anchor, w.done = i, true
			for j := i + 1; j < c.N; j++ {
				c.Points[j].Flags |= PointAfterAnchor
			}
			break
		}
	}
	w.tokBase = w.tokMsg
	w.msgLen = 0
	flags := PointMessageEnd
	if c.Anchor < 0 {
		flags |= PointAnchor
	}
	w.point(flags, w.tokBase)
}

// mixTools mixes the tools list's hash into every point.
func (c *Chain) mixTools(tools uint64) {
	for i := 0; i < c.N; i++ {
		h := c.Points[i].Hash ^ tools
		h ^= h >> 33
		h *= 0xff51afd7ed558ccd
		h ^= h >> 33
		c.Points[i].Hash = h
	}
}
