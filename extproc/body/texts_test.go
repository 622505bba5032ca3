package body

import (
	"strings"
	"testing"
)

func TestTexts(t *testing.T) {
	cases := []struct {
		name string
		kind Kind
		body string
		want []string
	}{
		{"chat strings", Chat, `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi \"there\"\n"}]}`,
			[]string{"be brief", "hi \"there\"\n"}},
		{"parts and null", Chat, `{"messages":[{"content":null,"role":"assistant","tool_calls":[{"function":{"arguments":"{\"content\":\"x\"}"}}]},{"role":"user","content":[{"type":"text","text":"a\u00e9"},{"type":"image_url","image_url":{"url":"u"}},{"text":"b","type":"text"}]}],"model":"m"}`,
			[]string{"aé", "b"}},
		{"content key escaped", Chat, `{"model":"m","messages":[{"role":"user","c\u006fntent":"x"}]}`, []string{"x"}},
		{"prompt string", Completion, `{"model":"m","prompt":"once upon","messages":[{"role":"user","content":"not this"}]}`, []string{"once upon"}},
		{"prompt batch and ids", Completion, `{"model":"m","prompt":["a","b",[1,2]]}`, []string{"a", "b"}},
		{"prompt ids", Completion, `{"model":"m","prompt":[1,2,3]}`, nil},
		{"chat ignores prompt", Chat, `{"model":"m","prompt":"p","messages":[{"role":"user","content":"c"}]}`, []string{"c"}},
	}
	for _, c := range cases {
		var r Request
		if err := Parse([]byte(c.body), c.kind, &r); err != nil {
			t.Fatalf("%s: Parse: %v", c.name, err)
		}
		var got []string
		raw := 0
		Texts([]byte(c.body), c.kind, func(s string, n int) { got = append(got, s); raw += n })
		if strings.Join(got, "|") != strings.Join(c.want, "|") {
			t.Errorf("%s: texts %q, want %q", c.name, got, c.want)
		}
		if raw > len(c.body) {
			t.Errorf("%s: raw lengths %d exceed the body's %d bytes", c.name, raw, len(c.body))
		}
	}
}

// FuzzTexts: for any body Parse accepts, Texts ends, and the raw lengths
// it reports fit in the body and are at least the decoded lengths (JSON
// escapes only shorten text) — ext_proc's bound relies on both.
func FuzzTexts(f *testing.F) {
	f.Add([]byte(`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a\u00e9"}]}]}`), false)
	f.Add([]byte(`{"model":"m","prompt":["a\n",[1]]}`), true)
	f.Fuzz(func(t *testing.T, b []byte, completion bool) {
		kind := Chat
		if completion {
			kind = Completion
		}
		var r Request
		if Parse(b, kind, &r) != nil {
			return
		}
		raw := 0
		Texts(b, kind, func(s string, n int) {
			if len(s) > n {
				t.Fatalf("decoded %d bytes from %d raw", len(s), n)
			}
			raw += n
		})
		if raw > len(b) {
			t.Fatalf("raw %d > body %d", raw, len(b))
		}
	})
}
