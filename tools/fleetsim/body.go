package fleetsim

import (
	"encoding/binary"
	"strconv"
	"unicode/utf8"
	"unsafe"
)

// chatBody returns the request's /v1/chat/completions body (OpenAI JSON:
// model, messages, max_tokens, stream): what the frontend Envoy buffers
// and ext_proc parses. A follow-up turn's messages start with the previous
// turn's, so their JSON is kept (p.bodyPre) and only the new messages are
// encoded.
func chatBody(p *request) []byte {
	b, from := p.bodyBase, p.bodyMsgs
	// Words average under 7 bytes: room for this turn and the next; the
	// array doubles when a turn outgrows it, so a conversation copies its
	// history a few times, not at every turn.
	room := 8*(p.w.PromptTokens+p.w.MaxTokens) + 4096
	if b == nil {
		b = append(p.s().spareBody(room), `{"model":`...)
		b = appendJSONString(b, p.s().sc.Workload.Model)
		b = append(b, `,"messages":[`...)
		from = 0
	} else {
		b = growTo(b, room)
	}
	for i, m := range p.w.Messages[from:] {
		if from+i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"role":`...)
		b = appendJSONString(b, m.Role)
		b = append(b, `,"content":`...)
		b = appendJSONString(b, m.Content)
		b = append(b, '}')
	}
	p.bodyPre = b
	b = append(b, `],"max_tokens":`...)
	b = strconv.AppendInt(b, int64(max(p.w.MaxTokens, 1)), 10)
	return append(b, `,"stream":true}`...)
}

// growTo returns s with a capacity of at least n, doubling it when it
// must grow.
func growTo[E any](s []E, n int) []E {
	if cap(s) >= n {
		return s
	}
	out := make([]E, len(s), max(n, 2*cap(s)))
	copy(out, s)
	return out
}

// jsonSafe marks the bytes a JSON string holds as they are.
var jsonSafe = func() (t [256]bool) {
	for c := 0x20; c < utf8.RuneSelf; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// plain8 reports whether none of the 8 bytes of x needs escaping.
func plain8(x uint64) bool {
	const lo, hi = 0x0101010101010101, 0x8080808080808080
	zero := func(v uint64) uint64 { return (v - lo) &^ v & hi }
	return (x&hi)|((x-0x20*lo)&^x&hi)|zero(x^('"'*lo))|zero(x^('\\'*lo)) == 0
}

// appendJSONString appends s as a JSON string.
func appendJSONString(b []byte, s string) []byte {
	const hex = "0123456789abcdef"
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		// Eight plain bytes at a time (no quote, backslash, control or
		// non-ASCII byte among them).
		for i+8 <= len(s) && plain8(binary.LittleEndian.Uint64(unsafe.Slice(unsafe.StringData(s[i:]), 8))) {
			i += 8
		}
		if i >= len(s) {
			break
		}
		c := s[i]
		if jsonSafe[c] {
			i++
			continue
		}
		if c >= utf8.RuneSelf {
			r, n := utf8.DecodeRuneInString(s[i:])
			if r == utf8.RuneError && n == 1 {
				b = append(b, s[start:i]...)
				b = append(b, `\ufffd`...)
				i += n
				start = i
				continue
			}
			i += n
			continue
		}
		b = append(b, s[start:i]...)
		switch c {
		case '"', '\\':
			b = append(b, '\\', c)
		case '\n':
			b = append(b, '\\', 'n')
		case '\t':
			b = append(b, '\\', 't')
		case '\r':
			b = append(b, '\\', 'r')
		default:
			b = append(b, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		}
		i++
		start = i
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
