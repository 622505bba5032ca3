package body

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/inferlb/inferlb/internal/tokens"
)

func TestTokenRunMatchesTokenRule(t *testing.T) {
	if tokenRun != tokens.MaxTokenBytes {
		t.Fatalf("tokenRun %d != tokens.MaxTokenBytes %d", tokenRun, tokens.MaxTokenBytes)
	}
}

func TestParseChat(t *testing.T) {
	b := []byte(`{"model":"llama-3-8b","stream":true,"max_tokens":64,"max_completion_tokens":32,
	  "user":"alice","prompt_cache_key":"pck","temperature":0.7,"tools":[{"type":"function","function":{"name":"f","parameters":{}}}],
	  "messages":[{"role":"system","content":"You are terse."},
	              {"content":"hello   world\nsupercalifragilistic","role":"user","name":"bob"},
	              {"role":"assistant","content":null},
	              {"role":"user","content":[{"type":"text","text":"look"},{"type":"image_url","image_url":{"url":"http://x"}}]}]}`)
	var r Request
	if err := Parse(b, Chat, &r); err != nil {
		t.Fatal(err)
	}
	want := tokens.CountChat([]tokens.Message{
		{Role: "system", Content: "You are terse."},
		{Role: "user", Content: "hello   world\nsupercalifragilistic"},
		{Role: "assistant", Content: ""},
		{Role: "user", Content: "look"},
	})
	if r.Model != "llama-3-8b" || !r.Stream || r.MaxTokens != 32 || r.User != "alice" || r.PromptCacheKey != "pck" || r.Messages != 4 {
		t.Fatalf("got %+v", r)
	}
	if r.PromptTokens != want {
		t.Fatalf("PromptTokens %d, want %d", r.PromptTokens, want)
	}
	if !r.HasPrefix {
		t.Fatal("no prefix")
	}
}

// TestEscapedMessageKeys: a message's keys are matched after their escapes
// are decoded, as any JSON reader does ("r\u006fle" is "role").
func TestEscapedMessageKeys(t *testing.T) {
	plain := []byte(`{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello there"}]}`)
	escaped := []byte(`{"model":"m","messages":[{"r\u006fle":"system","c\u006Fntent":"be brief"},{"\u0072ole":"user","content\u0000":"x","content":"hello there"}]}`)
	var a, b Request
	if err := Parse(plain, Chat, &a); err != nil {
		t.Fatal(err)
	}
	if err := Parse(escaped, Chat, &b); err != nil {
		t.Fatal(err)
	}
	if b.Messages != 2 || b.PromptTokens != a.PromptTokens || b.PrefixHash != a.PrefixHash {
		t.Fatalf("escaped keys: %d messages, %d tokens, prefix %x; want %d, %d, %x", b.Messages, b.PromptTokens, b.PrefixHash, a.Messages, a.PromptTokens, a.PrefixHash)
	}
}

func TestMaxTokensFallback(t *testing.T) {
	var r Request
	if err := Parse([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":7}`), Chat, &r); err != nil {
		t.Fatal(err)
	}
	if r.MaxTokens != 7 {
		t.Fatalf("MaxTokens %d", r.MaxTokens)
	}
	if err := Parse([]byte(`{"model":"m","messages":[{"role":"user","content":"x"}]}`), Chat, &r); err != nil {
		t.Fatal(err)
	}
	if r.MaxTokens != -1 {
		t.Fatalf("MaxTokens %d, want -1 when absent", r.MaxTokens)
	}
}

// The stable prefix is the same for every turn of a conversation and differs
// between conversations; escapes and key order do not change it.
func TestPrefixHashStableAcrossTurns(t *testing.T) {
	turn1 := `{"model":"m","messages":[{"role":"system","content":"S\u00e9"},{"role":"user","content":"first question"}]}`
	turn2 := `{"messages":[{"content":"Sé","role":"system"},{"role":"user","content":[{"type":"text","text":"first question"}]},{"role":"assistant","content":"answer"},{"role":"user","content":"second"}],"model":"m"}`
	other := `{"model":"m","messages":[{"role":"system","content":"Sé"},{"role":"user","content":"another question"}]}`
	h := func(s string) uint64 {
		var r Request
		if err := Parse([]byte(s), Chat, &r); err != nil {
			t.Fatal(err)
		}
		return r.PrefixHash
	}
	if h(turn1) != h(turn2) {
		t.Fatalf("prefix hash differs across turns")
	}
	if h(turn1) == h(other) {
		t.Fatalf("prefix hash equal for different conversations")
	}
}

func TestCompletion(t *testing.T) {
	var r Request
	if err := Parse([]byte(`{"model":"m","prompt":"a b  ccccccccc","max_tokens":3}`), Completion, &r); err != nil {
		t.Fatal(err)
	}
	if r.PromptTokens != tokens.Count("a b  ccccccccc") || !r.HasPrefix || r.MaxTokens != 3 {
		t.Fatalf("got %+v", r)
	}
}

func TestErrors(t *testing.T) {
	cases := []struct {
		body, want string
		syntax     bool
	}{
		{``, "invalid JSON at byte 0: unexpected end of input", true},
		{`[1]`, "invalid JSON at byte 0: expected a JSON object", true},
		{`{"model":"m",}`, "invalid JSON at byte 13: expected a string", true},
		{`{"model":"m","messages":[{"role":"user","content":"x"}]} x`, "unexpected data after the JSON object", true},
		{`{"model":"m","messages":[{"role":"user","content":"a\qb"}]}`, "invalid escape character", true},
		{"{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"a\nb\"}]}", "control character in string", true},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"temperature":01}`, "expected ',' or '}' in object", true},
		{`{"model":"m","messages":[{"role":"user","content":"x"`, "unexpected end of input", true},
		{`{"messages":[{"role":"user","content":"x"}]}`, `field "model": missing`, false},
		{`{"model":3,"messages":[]}`, `field "model": must be a string`, false},
		{`{"model":"m"}`, `field "messages": missing`, false},
		{`{"model":"m","messages":[]}`, `field "messages": must not be empty`, false},
		{`{"model":"m","messages":{}}`, `field "messages": must be an array`, false},
		{`{"model":"m","messages":[{"content":"x"}]}`, `field "messages[0].role": missing`, false},
		{`{"model":"m","messages":[{"role":"user","content":1}]}`, `field "messages[0].content": must be a string`, false},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":-1}`, `field "max_tokens": must not be negative`, false},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1.5}`, `field "max_tokens": must be an integer`, false},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"yes"}`, `field "stream": must be a boolean`, false},
		{`{"model":"m","messages":[{"role":"user","content":"x"}],"x":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`, "nesting deeper than 128", true},
	}
	for _, c := range cases {
		var r Request
		err := Parse([]byte(c.body), Chat, &r)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse(%q) = %v, want error containing %q", c.body, err, c.want)
			continue
		}
		if IsSyntax(err) != c.syntax {
			t.Errorf("Parse(%q): IsSyntax = %v, want %v (%v)", c.body, IsSyntax(err), c.syntax, err)
		}
	}
}

// reference decodes with encoding/json and applies the token rule.
// (Maps, not structs: encoding/json matches struct fields case-insensitively,
// OpenAI's server does not.)
type refReq struct {
	Messages []map[string]json.RawMessage `json:"messages"`
}

func refTokens(t *testing.T, b []byte) (int, bool) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(b, &top); err != nil {
		return 0, false
	}
	var msgs []map[string]json.RawMessage
	if err := json.Unmarshal(top["messages"], &msgs); err != nil {
		return 0, false
	}
	n := 0
	for _, m := range msgs {
		n++
		var s string
		if err := json.Unmarshal(m["content"], &s); err == nil {
			n += tokens.Count(s)
			continue
		}
		var parts []map[string]any
		if err := json.Unmarshal(m["content"], &parts); err == nil {
			for _, p := range parts {
				if txt, ok := p["text"].(string); ok {
					n += tokens.Count(txt)
				}
			}
		}
	}
	return n, true
}

// fuzzSeeds seed FuzzParse (and TestChainFuzzSeedsMatchReference).
var fuzzSeeds = []string{
	`{"model":"m","messages":[{"role":"user","content":"hi there"}]}`,
	`{"model":"m","messages":[{"role":"system","content":"a\"b\\c\/d\b\f\n\r\t\u0041\ud83d\ude00\udc00"},{"role":"user","content":[{"type":"text","text":"x y"}]}],"max_tokens":5,"stream":false,"user":null}`,
	`{"model":"m","prompt":["a b","c"],"max_completion_tokens":0}`,
	`{"model":"m","prompt":[1,2,3]}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"n":-0.5e+3,"a":[true,false,null,{}]}`,
	`{"model":"m","messages":[{"role":"user","content":"x\u00"}]}`,
	`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("word ", 100) + `"}]}`,
	`{"model":"m","tools":[{"type":"function"}],"messages":[{"role":"system","content":"` + strings.Repeat("w\u00e9 ", 200) + `"},{"role":"user","content":"q"}]}`,
	`{}`, `{"model":"m"`, `nul`, `"x"`,
}

func FuzzParse(f *testing.F) {
	seeds := fuzzSeeds
	for _, s := range seeds {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, b []byte, chat bool) {
		kind := Chat
		if !chat {
			kind = Completion
		}
		var r Request
		err := Parse(b, kind, &r)
		valid := json.Valid(b) && bytes.HasPrefix(bytes.TrimLeft(b, " \t\r\n"), []byte("{"))
		deep := bytes.Count(b, []byte("["))+bytes.Count(b, []byte("{")) > 100
		if err != nil {
			var se *SyntaxError
			var fe *FieldError
			if !errors.As(err, &se) && !errors.As(err, &fe) {
				t.Fatalf("unexpected error type %T: %v", err, err)
			}
			if se != nil && valid && !deep {
				t.Fatalf("valid JSON rejected: %v\n%q", err, b)
			}
			if se != nil && (se.Offset < 0 || se.Offset > len(b)) {
				t.Fatalf("offset %d out of range", se.Offset)
			}
			return
		}
		if !valid {
			t.Fatalf("invalid JSON accepted: %q", b)
		}
		var m map[string]any
		if json.Unmarshal(b, &m) != nil {
			t.Fatalf("accepted but encoding/json fails")
		}
		if utf8.ValidString(r.Model) && r.Model != m["model"] {
			t.Fatalf("model %q vs %v", r.Model, m["model"])
		}
		// Invalid UTF-8 counts as bytes here; encoding/json substitutes
		// U+FFFD (3 bytes), which can change a run's length: not compared.
		if kind == Chat && utf8.Valid(b) {
			if want, ok := refTokens(t, b); ok && want != r.PromptTokens {
				t.Fatalf("tokens %d, reference %d: %q", r.PromptTokens, want, b)
			}
		}
		if utf8.Valid(b) {
			checkChain(t, b, kind, &r)
		}
	})
}

func chatBody(size int) []byte {
	var sb strings.Builder
	words := []string{"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"}
	i := 0
	for sb.Len() < size-300 {
		sb.WriteString(words[i%len(words)])
		if i%13 == 12 {
			sb.WriteString(`\n`)
		} else {
			sb.WriteByte(' ')
		}
		i++
	}
	return []byte(fmt.Sprintf(`{"model":"llama-3-8b","stream":true,"max_tokens":256,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"%s"}]}`, sb.String()))
}

// plainBody is a chat body whose user message is plain English-like text:
// words of 3–7 letters, picked pseudo-randomly, separated by single spaces,
// with no escapes.
func plainBody(size int) []byte {
	var sb strings.Builder
	words := []string{"the", "quick", "brown", "foxes", "jump", "over", "lazy", "dogs", "while", "ten", "happy", "birds", "sing", "softly", "outside", "and"}
	x := uint32(2463534242)
	for sb.Len() < size-300 {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		sb.WriteString(words[x%uint32(len(words))])
		sb.WriteByte(' ')
	}
	return []byte(fmt.Sprintf(`{"model":"llama-3-8b","stream":true,"max_tokens":256,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"%s"}]}`, sb.String()))
}

func BenchmarkParse(b *testing.B) {
	bench := func(name string, body []byte) {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			var r Request
			for b.Loop() {
				if err := Parse(body, Chat, &r); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	for _, size := range []int{8 << 10, 220 << 10} {
		bench(fmt.Sprintf("%dKB", size>>10), chatBody(size))
	}
	for _, size := range []int{8 << 10, 220 << 10} {
		bench(fmt.Sprintf("plain%dKB", size>>10), plainBody(size))
	}
}

func BenchmarkEncodingJSON(b *testing.B) {
	for _, size := range []int{8 << 10, 220 << 10} {
		body := chatBody(size)
		b.Run(fmt.Sprintf("%dKB", size>>10), func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				var rr refReq
				if err := json.Unmarshal(body, &rr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// refString scans the JSON string whose opening quote is b[i] the slow,
// obvious way and returns the index of its closing quote, or ok false if it
// is not a valid JSON string.
func refString(b []byte, i int) (end int, ok bool) {
	for j := i + 1; j < len(b); j++ {
		switch c := b[j]; {
		case c == '"':
			return j, true
		case c < 0x20:
			return 0, false
		case c == '\\':
			if j+1 >= len(b) {
				return 0, false
			}
			switch b[j+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				j++
			case 'u':
				if j+6 > len(b) {
					return 0, false
				}
				for _, h := range b[j+2 : j+6] {
					if !strings.ContainsRune("0123456789abcdefABCDEF", rune(h)) {
						return 0, false
					}
				}
				j += 5
			default:
				return 0, false
			}
		}
	}
	return 0, false
}

// checkTokenString runs tokenString on the string at b[i] and compares its
// verdict, span and count with refString and tokens.Count of the text as
// encoding/json decodes it.
func checkTokenString(t *testing.T, b []byte, i int) {
	t.Helper()
	p := parser{b: b, i: i}
	span, n, err := p.tokenString()
	end, ok := refString(b, i)
	if ok != (err == nil) {
		t.Fatalf("tokenString(%q) error %v, reference valid %v", b[i:], err, ok)
	}
	if !ok {
		if !IsSyntax(err) {
			t.Fatalf("tokenString(%q): error %v is not a syntax error", b[i:], err)
		}
		return
	}
	if span != [2]int{i + 1, end} || p.i != end+1 {
		t.Fatalf("tokenString(%q): span %v, p.i %d; want [%d %d], %d", b[i:], span, p.i, i+1, end, end+1)
	}
	raw := b[i : end+1]
	var s string
	if utf8.Valid(raw) {
		if err := json.Unmarshal(raw, &s); err != nil {
			t.Fatalf("encoding/json rejects %q: %v", raw, err)
		}
	} else {
		// encoding/json would substitute U+FFFD for invalid bytes,
		// changing run lengths; the token rule counts bytes.
		s = decodeString(raw[1 : len(raw)-1])
	}
	if want := tokens.Count(s); n != want {
		t.Fatalf("tokenString(%q) = %d tokens, tokens.Count(%q) = %d", raw, n, s, want)
	}
}

// tokenPieces are the raw JSON pieces randomStringBody strings together.
var tokenPieces = []string{
	" ", " ", " ", "  ", "a", "é", "😀", `\n`, `\t`, `\r`, `\"`, `\\`, `\/`,
	`\b`, `\f`, `\u00e9`, `\u0020`, `\u0041`, `\ud83d\ude00`, `\ud83d`,
	`\udc00`, `\ud83dx`, `\uD83D\uDE00`,
}

// randomStringBody writes a raw JSON string body (no quotes) of words of
// 1–40 bytes (runs longer than 8 and 16), spaces and escapes.
func randomStringBody(rnd *rand.Rand, sb *strings.Builder, pieces int) {
	for range pieces {
		switch rnd.IntN(4) {
		case 0, 1:
			l := 1 + rnd.IntN(8)
			if rnd.IntN(4) == 0 {
				l = 1 + rnd.IntN(40)
			}
			for range l {
				sb.WriteByte("abcdefghijklmnopqrstuvwxyz"[rnd.IntN(26)])
			}
		case 2:
			sb.WriteByte(' ')
		default:
			sb.WriteString(tokenPieces[rnd.IntN(len(tokenPieces))])
		}
	}
}

// The string's start and end fall at every alignment relative to the 8- and
// 16-byte words, and the string is followed by 0–20 more bytes.
func TestTokenStringMatchesTokenRule(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	var sb strings.Builder
	for iter := range 20000 {
		sb.Reset()
		pad := iter % 17
		sb.WriteString(strings.Repeat("x", pad))
		sb.WriteByte('"')
		randomStringBody(rnd, &sb, rnd.IntN(1+iter%60))
		sb.WriteByte('"')
		sb.WriteString(`,"y":1}   `[:rnd.IntN(11)])
		b := []byte(sb.String())
		checkTokenString(t, b, pad)
		// Every truncation is an unterminated (or cut-escape) string.
		if iter%10 == 0 {
			for end := pad; end < len(b); end++ {
				checkTokenString(t, b[:end:end], pad)
			}
		}
	}
	// Special bytes at every position of a word.
	for _, c := range []string{`\n`, `\u00e9`, "\x01", `\q`, `"`} {
		for pos := range 40 {
			s := `"` + strings.Repeat("abcdefg ", 6)[:pos] + c + ` word"`
			checkTokenString(t, []byte(s), 0)
		}
	}
}

func FuzzTokenString(f *testing.F) {
	rnd := rand.New(rand.NewPCG(3, 4))
	var sb strings.Builder
	for pad := range 16 {
		sb.Reset()
		randomStringBody(rnd, &sb, 30)
		f.Add([]byte(sb.String()+`"`), uint8(pad))
	}
	f.Add([]byte(`abcdefghijklmnopqrstuvwxyz abcdefghi \u00e9\u00e9\u00e9\u00e9 x"`), uint8(3))
	f.Add([]byte("a\x1fb\""), uint8(0))
	f.Fuzz(func(t *testing.T, raw []byte, pad uint8) {
		b := append(bytes.Repeat([]byte{'x'}, int(pad%16)), '"')
		b = append(b, raw...)
		checkTokenString(t, b, int(pad%16))
	})
}

// ParseWithin stops at the first message (or token id) past its limits
// without reading further: a body whose tail is garbage after its
// 1,001st message gets the LimitError, not a SyntaxError, in about the time
// of its first thousand messages.
func TestParseWithinStopsAtTheLimit(t *testing.T) {
	var b bytes.Buffer
	b.WriteString(`{"model":"m","messages":[`)
	for i := 0; i < 100_000; i++ {
		b.WriteString(`{"role":"user","content":"a"},`)
	}
	garbage := append(b.Bytes()[:len(b.Bytes()):len(b.Bytes())], "\x00not json"...)
	valid := append(b.Bytes()[:b.Len()-1:b.Len()-1], "]}"...)
	for _, c := range []struct {
		lim     Limits
		context bool
		limit   int
	}{
		{Limits{MaxMessages: 1000}, false, 1000},
		{Limits{MaxContext: 1000}, true, 1000},
		{Limits{MaxMessages: 5000, MaxContext: 1000}, true, 1000},
		{Limits{MaxMessages: 1000, MaxContext: 5000}, false, 1000},
	} {
		for _, body := range [][]byte{garbage, valid} {
			var r Request
			err := ParseWithin(body, Chat, c.lim, &r)
			var le *LimitError
			if !errors.As(err, &le) || le.Context != c.context || le.Limit != c.limit || le.Field != "messages" {
				t.Fatalf("%+v: got %v, want a LimitError at %d (context %v)", c.lim, err, c.limit, c.context)
			}
		}
	}
	var r Request
	if err := ParseWithin(valid, Chat, Limits{MaxMessages: 100_000, MaxContext: 100_000}, &r); err != nil || r.Messages != 100_000 {
		t.Fatalf("at the limits: %v, %d messages", err, r.Messages)
	}
	// Token ids of a completion prompt count against the context.
	ids := []byte(`{"model":"m","prompt":[1,2,3,4,5,6]}`)
	if err := ParseWithin(ids, Completion, Limits{MaxContext: 5}, &r); !errors.As(err, new(*LimitError)) {
		t.Fatalf("6 token ids, context 5: %v", err)
	}
	if err := ParseWithin(ids, Completion, Limits{MaxContext: 6, MaxMessages: 1}, &r); err != nil {
		t.Fatalf("6 token ids, context 6: %v", err)
	}
}

// BenchmarkParseHostile is a body of 100,000 tiny messages, read whole and
// stopped at a 16,384-message limit.
func BenchmarkParseHostile(b *testing.B) {
	var buf bytes.Buffer
	buf.WriteString(`{"model":"m","messages":[`)
	for i := 0; i < 100_000; i++ {
		buf.WriteString(`{"role":"user","content":"a"},`)
	}
	body := append(buf.Bytes()[:buf.Len()-1], "]}"...)
	for _, lim := range []Limits{{}, {MaxMessages: 16384}} {
		b.Run(fmt.Sprintf("max%d", lim.MaxMessages), func(b *testing.B) {
			b.ReportAllocs()
			var r Request
			for b.Loop() {
				_ = ParseWithin(body, Chat, lim, &r)
			}
		})
	}
}

// FuzzParseWithin holds the limits to what they promise: a body within
// them parses exactly as without them, and a LimitError names a bound the
// body really exceeds (more messages, or token ids, than the limit) or a
// body Parse refuses too (the limit was met before the fault).
func FuzzParseWithin(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s), true, uint8(1), uint8(2))
		f.Add([]byte(s), false, uint8(0), uint8(1))
	}
	f.Add([]byte(`{"model":"m","prompt":[1,2,3]}`), false, uint8(0), uint8(2))
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"b"},{"role":"user","content":"c"}]}`), true, uint8(2), uint8(0))
	f.Fuzz(func(t *testing.T, b []byte, chat bool, maxMsgs, maxCtx uint8) {
		kind := Chat
		if !chat {
			kind = Completion
		}
		lim := Limits{MaxMessages: int(maxMsgs), MaxContext: int(maxCtx)}
		var free, limited Request
		errFree := Parse(b, kind, &free)
		errLim := ParseWithin(b, kind, lim, &limited)
		// n: the elements the limits count (messages, or token ids).
		n := 0
		if errFree == nil {
			var m map[string]any
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatalf("accepted but encoding/json fails: %v", err)
			}
			if chat {
				n = free.Messages
			} else if arr, ok := m["prompt"].([]any); ok {
				for _, v := range arr {
					if _, ok := v.(float64); ok {
						n++
					}
				}
			}
		}
		var le *LimitError
		if !errors.As(errLim, &le) {
			if (errFree == nil) != (errLim == nil) || errFree != nil && errFree.Error() != errLim.Error() {
				t.Fatalf("limits %+v changed the outcome: %v, without %v", lim, errLim, errFree)
			}
			if errFree == nil && !reflect.DeepEqual(free, limited) {
				t.Fatalf("limits %+v changed the result:\n%+v\n%+v", lim, limited, free)
			}
			if errFree == nil && (lim.MaxContext > 0 && n > lim.MaxContext || chat && lim.MaxMessages > 0 && n > lim.MaxMessages) {
				t.Fatalf("%d elements passed the limits %+v", n, lim)
			}
			return
		}
		if errFree != nil {
			return // the limit came first in a body refused anyway
		}
		if n <= le.Limit || le.Context && le.Limit != lim.MaxContext || !le.Context && le.Limit != lim.MaxMessages {
			t.Fatalf("LimitError %v for %d elements under %+v", le, n, lim)
		}
	})
}
