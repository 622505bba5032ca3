package body

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/cespare/xxhash/v2"

	"github.com/inferlb/inferlb/internal/tokens"
)

// refCanon is the canonical form of a decoded string (chain.go), the
// obvious way.
func refCanon(s string) []byte {
	var out []byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			out = append(out, '\\', c)
		case c == '\b':
			out = append(out, `\b`...)
		case c == '\f':
			out = append(out, `\f`...)
		case c == '\n':
			out = append(out, `\n`...)
		case c == '\r':
			out = append(out, `\r`...)
		case c == '\t':
			out = append(out, `\t`...)
		case c < 0x20:
			out = append(out, fmt.Sprintf(`\u%04x`, c)...)
		default:
			out = append(out, c)
		}
	}
	return out
}

type refPoint struct {
	hash  uint64
	depth int
	end   bool
	// tokens is the exact token count at message ends (-1 elsewhere).
	tokens int
}

// refChain builds a body's chain from encoding/json's decoding: the
// canonical stream, hashed whole at every point. ok is false if the body
// is not something the reference understands (then nothing is compared).
func refChain(b []byte, kind Kind) (pts []refPoint, anchor int, ok bool) {
	var top map[string]json.RawMessage
	if json.Unmarshal(b, &top) != nil {
		return nil, -1, false
	}
	var stream []byte
	anchor = -1
	next := FirstPointBytes
	emit := func(end bool, tok int) {
		if n := len(pts); n > 0 && pts[n-1].depth == len(stream) {
			// A message ending at a geometric depth: one point.
			pts[n-1].end, pts[n-1].tokens = pts[n-1].end || end, tok
			return
		}
		pts = append(pts, refPoint{hash: xxhash.Sum64(stream), depth: len(stream), end: end, tokens: tok})
	}
	write := func(bs []byte) {
		for _, c := range bs {
			stream = append(stream, c)
			if len(stream) == next {
				emit(false, -1)
				next *= 2
			}
		}
	}
	toks := 0
	if kind == Chat {
		var msgs []map[string]json.RawMessage
		if json.Unmarshal(top["messages"], &msgs) != nil {
			return nil, -1, false
		}
		for _, m := range msgs {
			var role string
			if json.Unmarshal(m["role"], &role) != nil {
				return nil, -1, false
			}
			write([]byte(role))
			write([]byte{0})
			var s *string
			var parts []map[string]json.RawMessage
			var texts []string
			switch {
			case json.Unmarshal(m["content"], &s) == nil:
				if s != nil {
					texts = append(texts, *s)
				}
			case json.Unmarshal(m["content"], &parts) == nil:
				for _, p := range parts {
					var txt string
					if raw, has := p["text"]; has && json.Unmarshal(raw, &txt) == nil {
						texts = append(texts, txt)
					}
				}
			default:
				return nil, -1, false
			}
			toks++
			for _, t := range texts {
				write(refCanon(t))
				write([]byte{0x1f})
				toks += tokens.Count(t)
			}
			write([]byte{0x1e})
			emit(true, toks)
			if anchor < 0 && role == "user" {
				anchor = len(pts) - 1
			}
		}
	} else {
		var s string
		var arr []json.RawMessage
		switch {
		case json.Unmarshal(top["prompt"], &s) == nil:
		case json.Unmarshal(top["prompt"], &arr) == nil && len(arr) > 0 && json.Unmarshal(arr[0], &s) == nil:
		default:
			return nil, -1, true // token ids: no chain
		}
		write(refCanon(s))
		write([]byte{0x1f})
		emit(true, tokens.Count(s))
		anchor = len(pts) - 1
		for i, p := range pts {
			if p.depth == CompletionAnchorBytes {
				anchor = i
				break
			}
		}
	}
	if len(pts) > MaxPoints {
		if anchor >= MaxPoints-1 {
			pts = append(pts[:MaxPoints-1], pts[anchor])
			anchor = MaxPoints - 1
		} else {
			pts = pts[:MaxPoints]
		}
	}
	if raw, has := top["tools"]; has && string(raw) != "null" && string(raw) != "[]" {
		th := xxhash.Sum64(raw)
		for i := range pts {
			h := pts[i].hash ^ th
			h ^= h >> 33
			h *= 0xff51afd7ed558ccd
			h ^= h >> 33
			pts[i].hash = h
		}
	}
	return pts, anchor, true
}

// checkChain compares a parsed chain with the reference.
func checkChain(t *testing.T, b []byte, kind Kind, r *Request) {
	t.Helper()
	want, anchor, ok := refChain(b, kind)
	if !ok {
		return
	}
	got := r.Chain.At()
	if len(got) != len(want) || r.Chain.Anchor != anchor {
		t.Fatalf("%d points (anchor %d), reference %d (anchor %d): %q", len(got), r.Chain.Anchor, len(want), anchor, b)
	}
	for i, w := range want {
		g := got[i]
		if i > 0 && (g.Depth <= got[i-1].Depth || g.Hash == got[i-1].Hash) {
			t.Fatalf("point %d: %+v after %+v: a prefix would be counted twice: %q", i, g, got[i-1], b)
		}
		if g.Hash != w.hash || int(g.Depth) != w.depth || (g.Flags&PointMessageEnd != 0) != w.end {
			t.Fatalf("point %d: %+v, reference %+v: %q", i, g, w, b)
		}
		if w.end && kind == Chat && int(g.Tokens) != w.tokens {
			t.Fatalf("point %d: %d tokens, reference %d: %q", i, g.Tokens, w.tokens, b)
		}
		if (g.Flags&PointAnchor != 0) != (i == anchor) || (g.Flags&PointAfterAnchor != 0) != (anchor >= 0 && i > anchor) {
			t.Fatalf("point %d: flags %b with anchor %d: %q", i, g.Flags, anchor, b)
		}
	}
	if r.HasPrefix != (anchor >= 0) || (anchor >= 0 && r.PrefixHash != got[anchor].Hash) {
		t.Fatalf("PrefixHash %x (has %v) is not the anchor's", r.PrefixHash, r.HasPrefix)
	}
}

func TestChainMatchesReference(t *testing.T) {
	long := strings.Repeat("lorem ipsum dolor sit amet ", 200) // 5,400 bytes
	esc := strings.Repeat(`line\nwith \"quotes\" and \\ and \u00e9\u0001\/ `, 60)
	bodies := []struct {
		kind Kind
		body string
	}{
		{Chat, `{"model":"m","messages":[{"role":"user","content":"hi"}]}`},
		{Chat, `{"model":"m","messages":[{"role":"system","content":"` + long + `"},{"role":"user","content":"q"},{"role":"assistant","content":null},{"role":"user","content":"` + long + `"}]}`},
		{Chat, `{"model":"m","messages":[{"role":"user","content":"` + esc + `"}]}`},
		{Chat, `{"model":"m","messages":[{"role":"system","content":"s"},{"content":[{"type":"text","text":"` + long + `"},{"type":"image_url","image_url":{"url":"x"}},{"text":"` + esc + `"}],"role":"user"}]}`},
		{Chat, `{"model":"m","tools":[{"type":"function","function":{"name":"f"}}],"messages":[{"role":"user","content":"x"}]}`},
		{Chat, `{"model":"m","messages":[{"role":"system","content":"only a system prompt"}]}`},
		{Chat, `{"model":"m","messages":[` + strings.Repeat(`{"role":"user","content":"turn"},{"role":"assistant","content":"answer"},`, 40) + `{"role":"user","content":"last"}]}`},
		{Completion, `{"model":"m","prompt":"` + long + `"}`},
		{Completion, `{"model":"m","prompt":["short", "second"]}`},
		{Completion, `{"model":"m","prompt":"` + esc + `"}`},
		{Completion, `{"model":"m","prompt":[1,2,3]}`},
	}
	for i, c := range bodies {
		t.Run(fmt.Sprint(i), func(t *testing.T) {
			var r Request
			if err := Parse([]byte(c.body), c.kind, &r); err != nil {
				t.Fatal(err)
			}
			checkChain(t, []byte(c.body), c.kind, &r)
		})
	}
}

// A conversation's later turns repeat its anchor and every point before
// it; conversations that share a long preamble at the top of the first
// user message share its geometric points and nothing after them.
func TestChainTurnsAndSharedPreamble(t *testing.T) {
	preamble := strings.Repeat("shared instructions for every request ", 120) // 4,560 bytes
	chat := func(msgs ...string) *Request {
		var sb strings.Builder
		sb.WriteString(`{"model":"m","messages":[`)
		for i, m := range msgs {
			role := "user"
			if i%2 == 1 {
				role = "assistant"
			}
			if i > 0 {
				sb.WriteByte(',')
			}
			fmt.Fprintf(&sb, `{"role":%q,"content":%q}`, role, m)
		}
		sb.WriteString(`]}`)
		var r Request
		if err := Parse([]byte(sb.String()), Chat, &r); err != nil {
			t.Fatal(err)
		}
		return &r
	}
	a1 := chat(preamble + "question A")
	a3 := chat(preamble+"question A", "answer", "more", "answer", "again")
	b1 := chat(preamble + "question B")
	if a1.PrefixHash != a3.PrefixHash || a1.Chain.Anchor != a3.Chain.Anchor {
		t.Fatalf("the anchor moved between turns")
	}
	for i := 0; i <= a1.Chain.Anchor; i++ {
		if a1.Chain.Points[i] != a3.Chain.Points[i] {
			t.Fatalf("point %d differs between turns: %+v vs %+v", i, a1.Chain.Points[i], a3.Chain.Points[i])
		}
	}
	if a1.PrefixHash == b1.PrefixHash {
		t.Fatalf("two conversations share an anchor")
	}
	shared := 0
	for i := 0; i < a1.Chain.Anchor; i++ {
		if a1.Chain.Points[i].Hash != b1.Chain.Points[i].Hash {
			break
		}
		shared++
	}
	// 512, 1K, 2K and 4K bytes lie inside the 4,560-byte preamble.
	if shared != 4 {
		t.Fatalf("%d shared points, want 4: %+v", shared, a1.Chain.At())
	}
	if len(a3.Chain.At()) <= len(a1.Chain.At()) || a3.Chain.Points[a3.Chain.N-1].Flags&PointAfterAnchor == 0 {
		t.Fatalf("later turn's points: %+v", a3.Chain.At())
	}
}

// A message that ends exactly at a geometric depth, or a completion prompt
// whose end is at its anchor depth, gives one point there, not two with
// the same hash (a request would count the prefix twice in its report,
// and the control plane refuses counts above the class's requests).
func TestChainPointAtMessageEnd(t *testing.T) {
	// "system\x00" + text + 0x1f + 0x1e: 9 bytes around the text.
	sys := strings.Repeat("s", FirstPointBytes-9)
	b := chatMsgsBody([][2]string{{"system", sys}, {"user", "hello"}})
	var r Request
	if err := Parse(b, Chat, &r); err != nil {
		t.Fatal(err)
	}
	pts := r.Chain.At()
	if len(pts) != 2 || pts[0].Depth != FirstPointBytes || pts[0].Flags&PointMessageEnd == 0 || r.Chain.Anchor != 1 {
		t.Fatalf("points %+v (anchor %d), want the system message's end at %d and the anchor after it", pts, r.Chain.Anchor, FirstPointBytes)
	}
	checkChain(t, b, Chat, &r)
	// The completion's prompt plus 0x1f ends at the anchor depth.
	c := []byte(fmt.Sprintf(`{"model":"m","prompt":%q}`, strings.Repeat("p", CompletionAnchorBytes-1)))
	if err := Parse(c, Completion, &r); err != nil {
		t.Fatal(err)
	}
	pts = r.Chain.At()
	last := pts[len(pts)-1]
	if last.Depth != CompletionAnchorBytes || last.Flags&(PointAnchor|PointMessageEnd) != PointAnchor|PointMessageEnd || r.Chain.Anchor != len(pts)-1 {
		t.Fatalf("completion points %+v (anchor %d)", pts, r.Chain.Anchor)
	}
	checkChain(t, c, Completion, &r)
}

func chatMsgsBody(msgs [][2]string) []byte {
	type m struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var ms []m
	for _, x := range msgs {
		ms = append(ms, m{x[0], x[1]})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": ms})
	return b
}

func TestChainFuzzSeedsMatchReference(t *testing.T) {
	for _, s := range fuzzSeeds {
		for _, kind := range []Kind{Chat, Completion} {
			var r Request
			if Parse([]byte(s), kind, &r) == nil && utf8.ValidString(s) {
				checkChain(t, []byte(s), kind, &r)
			}
		}
	}
}
