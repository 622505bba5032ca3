package enginesim

import (
	"strings"
	"testing"
)

// FuzzParseRequest: any body either parses into a non-empty prompt or gets a
// 400, never a panic.
func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],"max_completion_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","prompt":"a b c","max_tokens":5}`,
		`{"model":"m","prompt":["a b c"]}`,
		`{"model":"m","prompt":[1,2,3]}`,
		`{"model":"m","prompt":[-1]}`,
		`{"model":"m","messages":[{"role":"assistant","content":null}]}`,
		`{"model":"m","messages":[]}`,
		`{"model":"","prompt":"x"}`,
		`{"model":"m","prompt":"x","n":2}`,
		`{} {}`,
		`[`,
		``,
	} {
		f.Add([]byte(s), true)
		f.Add([]byte(s), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		p, err := parseRequest(body, chat)
		if err != nil {
			if err.status != 400 || err.message == "" {
				t.Fatalf("error %+v", err)
			}
			return
		}
		if p.model == "" || p.maxTokens < 0 {
			t.Fatalf("parsed %+v", p)
		}
		if !chat && len(p.prompt) == 0 {
			t.Fatal("empty completion prompt accepted")
		}
		if chat && len(p.prompt) == 0 {
			t.Fatal("chat prompt without role markers")
		}
	})
}

func TestParseRequestFields(t *testing.T) {
	p, err := parseRequest([]byte(`{"model":"m","messages":[{"role":"system","content":"a b"},{"role":"user","content":[{"type":"text","text":"c d e"}]}],"max_tokens":9,"max_completion_tokens":4,"stream":true,"stream_options":{"include_usage":true}}`), true)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.prompt) != 7 || p.maxTokens != 4 || !p.stream || !p.includeUsage {
		t.Errorf("%+v", p)
	}
	_, err = parseRequest([]byte(`{"model":"m","prompt":"x","stream_options":{"include_usage":true}}`), false)
	if err == nil || !strings.Contains(err.message, "stream_options") {
		t.Errorf("stream_options without stream: %v", err)
	}
}

// FuzzParseFaults: an admin body either gives valid faults or an error.
func FuzzParseFaults(f *testing.F) {
	for _, s := range []string{`{}`, `{"error_rate":0.5}`, `{"slowdown":3,"hang":true}`, `{"crash":true,"restart_after_s":2}`,
		`{"health_fail":true}`, `{"slowdown":0}`, `{"error_rate":-1}`, `{"bogus":1}`, `{"restart_after_s":1}`, `{} {}`, `null`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		fl, err := parseFaults(body)
		if err != nil {
			return
		}
		if fl.validate() != nil {
			t.Fatalf("invalid faults accepted: %+v", fl)
		}
	})
}
