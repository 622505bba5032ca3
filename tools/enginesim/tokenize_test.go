package enginesim

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/inferlb/inferlb/internal/tokens"
	"github.com/lni/goutils/leaktest"
)

// errorBody decodes engine-sim's (vLLM's) error JSON.
type errorBody struct {
	Error struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    int     `json:"code"`
	} `json:"error"`
}

// postJSON posts body to path and returns the status and the raw answer.
func postJSON(t *testing.T, s *Server, path, body string) (int, []byte) {
	t.Helper()
	resp, _ := post(t, context.Background(), s.URL()+path, []byte(body), nil)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: content type %q", path, ct)
	}
	return resp.StatusCode, b
}

// ids are the ids the API reports for text under the token rule.
func ids(text string) []uint64 { return apiTokenIDs(tokens.Append(nil, text)) }

// chatIDs are the ids the API reports for a system and a user message.
func chatIDs(system, user string) []uint64 {
	return apiTokenIDs(chatTokens([]chatMsg{{"system", []string{system}}, {"user", []string{user}}}))
}

func TestTokenize(t *testing.T) {
	defer leaktest.AfterTest(t)()
	s := start(t, Options{TimeScale: 0.2})
	defer s.Close()
	cases := []struct {
		name, body string
		tokens     []uint64
		strs       []string
	}{
		{"prompt", `{"model":"m","prompt":"hello there  general\tkenobi"}`, ids("hello there general kenobi"), nil},
		{"model omitted", `{"prompt":"hello there"}`, ids("hello there"), nil},
		{"empty prompt", `{"prompt":""}`, []uint64{}, nil},
		{"prompt in a list", `{"prompt":["a b"]}`, ids("a b"), nil},
		{"token ids as given", `{"prompt":[7,99999999,3]}`, []uint64{7, 99999999, 3}, nil},
		{"long word cut", `{"prompt":"abcdefghijk x","return_token_strs":true}`, ids("abcdefgh ijk x"), []string{"abcdefgh", "ijk", "x"}},
		{"messages", `{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi there"}],"add_generation_prompt":true}`,
			chatIDs("be brief", "hi there"), nil},
		{"messages with strings", `{"messages":[{"role":"user","content":[{"type":"text","text":"a b"},{"type":"text","text":"c"}]}],"return_token_strs":true}`,
			apiTokenIDs([]uint64{tokens.RoleMarkerID("user"), tokens.Append(nil, "a")[0], tokens.Append(nil, "b")[0], tokens.Append(nil, "c")[0]}),
			[]string{"<|user|>", "a", "b", "c"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, b := postJSON(t, s, "/tokenize", c.body)
			if code != 200 {
				t.Fatalf("status %d: %s", code, b)
			}
			var got struct {
				Count       int       `json:"count"`
				MaxModelLen int       `json:"max_model_len"`
				Tokens      []uint64  `json:"tokens"`
				TokenStrs   *[]string `json:"token_strs"`
			}
			if err := json.Unmarshal(b, &got); err != nil {
				t.Fatal(err)
			}
			if got.Count != len(c.tokens) || !slices.Equal(got.Tokens, c.tokens) || got.MaxModelLen != 4096 {
				t.Errorf("got %s, want tokens %v", b, c.tokens)
			}
			if c.strs == nil {
				if got.TokenStrs != nil || !strings.Contains(string(b), `"token_strs":null`) {
					t.Errorf("token_strs without return_token_strs: %s", b)
				}
				return
			}
			if got.TokenStrs == nil || !slices.Equal(*got.TokenStrs, c.strs) {
				t.Fatalf("token_strs %v, want %v", got.TokenStrs, c.strs)
			}
			for i, str := range *got.TokenStrs {
				if id := apiTokenIDs(tokens.Append(nil, str)); !strings.HasPrefix(str, "<|") && (len(id) != 1 || id[0] != got.Tokens[i]) {
					t.Errorf("token %d: %q tokenizes to %v, reported id %d", i, str, id, got.Tokens[i])
				}
			}
		})
	}
}

// TestTokenIDsFollowPrefixes: prompts that share a prefix get token ids
// that share it, in /tokenize and both renders alike, ids a 32-bit router
// keeps as they are; /tokenize's count of a chat prompt is the prompt_tokens
// its completion reports.
func TestTokenIDsFollowPrefixes(t *testing.T) {
	defer leaktest.AfterTest(t)()
	s := start(t, Options{TimeScale: 0.2})
	defer s.Close()
	system := text("sys", 300)
	tok := func(user string) []uint64 {
		body, _ := json.Marshal(map[string]any{"model": "m", "messages": []map[string]string{
			{"role": "system", "content": system}, {"role": "user", "content": user}}})
		code, b := postJSON(t, s, "/tokenize", string(body))
		var got struct {
			Count  int      `json:"count"`
			Tokens []uint64 `json:"tokens"`
		}
		if code != 200 || json.Unmarshal(b, &got) != nil || got.Count != len(got.Tokens) {
			t.Fatalf("tokenize: %d %s", code, b)
		}
		return got.Tokens
	}
	a, b := tok("first question here"), tok("another one")
	shared := 1 + 300 + 1 // system marker, its words, the user marker
	if len(a) != shared+3 || len(b) != shared+2 || !slices.Equal(a[:shared], b[:shared]) || a[shared] == b[shared] {
		t.Fatalf("ids do not share exactly the common prefix: %d and %d ids", len(a), len(b))
	}
	for _, id := range a {
		if id >= VocabSize {
			t.Fatalf("id %d outside the vocabulary", id)
		}
	}
	if !slices.Equal(a, chatIDs(system, "first question here")) {
		t.Error("ids differ from the token rule's")
	}

	code, raw := postJSON(t, s, "/v1/chat/completions/render", string(chatBody("m", system, "first question here", 5, false)))
	var g generateRequest
	if code != 200 || json.Unmarshal(raw, &g) != nil || !slices.Equal(g.TokenIDs, a) {
		t.Errorf("chat render %d, ids differ from /tokenize: %.300s", code, raw)
	}
	code, raw = postJSON(t, s, "/v1/completions/render", `{"model":"m","prompt":"`+system+` tail"}`)
	var gs []generateRequest
	if code != 200 || json.Unmarshal(raw, &gs) != nil || len(gs) != 1 || !slices.Equal(gs[0].TokenIDs, ids(system+" tail")) ||
		!slices.Equal(gs[0].TokenIDs[:300], a[1:301]) {
		t.Errorf("completions render %d: %.300s", code, raw)
	}

	// The count is what the completion reports as its prompt.
	resp, _ := post(t, context.Background(), s.URL()+"/v1/chat/completions", chatBody("m", system, "first question here", 2, false), nil)
	var done struct {
		Usage struct {
			PromptTokens int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	decode(t, resp, 200, &done)
	if done.Usage.PromptTokens != len(a) {
		t.Errorf("completion's prompt_tokens %d, /tokenize count %d", done.Usage.PromptTokens, len(a))
	}
}

func TestRender(t *testing.T) {
	defer leaktest.AfterTest(t)()
	s := start(t, Options{TimeScale: 0.2, DefaultMaxTokens: 50})
	defer s.Close()
	t.Run("chat", func(t *testing.T) {
		code, b := postJSON(t, s, "/v1/chat/completions/render",
			`{"model":"m","messages":[{"role":"user","content":"a b c"}],"max_completion_tokens":7,"temperature":0.5,"stop":"END",`+
				`"seed":3,"stream":true,"stream_options":{"include_usage":true},"cache_salt":"salt","priority":2}`)
		if code != 200 {
			t.Fatalf("status %d: %s", code, b)
		}
		var g map[string]any
		if err := json.Unmarshal(b, &g); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"request_id", "token_ids", "features", "sampling_params", "model", "stream", "stream_options", "cache_salt", "priority", "kv_transfer_params"} {
			if _, ok := g[k]; !ok {
				t.Errorf("no %s in %s", k, b)
			}
		}
		sp := g["sampling_params"].(map[string]any)
		if !strings.HasPrefix(g["request_id"].(string), "chatcmpl-") || g["model"] != "m" || g["stream"] != true ||
			g["cache_salt"] != "salt" || g["priority"] != 2.0 || g["features"] != nil ||
			g["stream_options"].(map[string]any)["include_usage"] != true ||
			sp["max_tokens"] != 7.0 || sp["temperature"] != 0.5 || sp["top_p"] != 1.0 || sp["seed"] != 3.0 || sp["n"] != 1.0 ||
			len(sp["stop"].([]any)) != 1 || sp["stop"].([]any)[0] != "END" {
			t.Errorf("render %s", b)
		}
		if got := len(g["token_ids"].([]any)); got != 4 {
			t.Errorf("%d token ids, want 4", got)
		}
	})
	t.Run("completions", func(t *testing.T) {
		code, b := postJSON(t, s, "/v1/completions/render", `{"prompt":[5,6,7]}`)
		var gs []generateRequest
		if code != 200 || json.Unmarshal(b, &gs) != nil || len(gs) != 1 {
			t.Fatalf("status %d: %s", code, b)
		}
		g := gs[0]
		// No max_tokens: the engine's default output (finish "stop");
		// no model: null, as vLLM echoes the request's.
		if !slices.Equal(g.TokenIDs, []uint64{5, 6, 7}) || g.SamplingParams.MaxTokens != 50 || g.Model != nil ||
			!strings.HasPrefix(g.RequestID, "cmpl-") || g.Stream || string(g.StreamOptions) != "null" || len(g.SamplingParams.Stop) != 0 {
			t.Errorf("render %s", b)
		}
	})
}

// TestTokenizeAndRenderErrors: bad input gets a 400 in vLLM's error JSON,
// an unknown model vLLM's 404, a prompt over the context limit the
// completion's 400.
func TestTokenizeAndRenderErrors(t *testing.T) {
	defer leaktest.AfterTest(t)()
	s := start(t, Options{TimeScale: 0.2, MaxBodyBytes: 64 << 10})
	defer s.Close()
	long := text("w", 5000)
	cases := []struct {
		name, path, body string
		status           int
		typ, param, msg  string
	}{
		{"tokenize malformed", "/tokenize", `{"prompt":`, 400, "BadRequestError", "", "invalid JSON body"},
		{"tokenize trailing data", "/tokenize", `{"prompt":"a"} {}`, 400, "BadRequestError", "", "data after the top-level value"},
		{"tokenize nothing", "/tokenize", `{"model":"m"}`, 400, "BadRequestError", "", "prompt or messages: field required"},
		{"tokenize both", "/tokenize", `{"prompt":"a","messages":[{"role":"user","content":"a"}]}`, 400, "BadRequestError", "", "either prompt or messages"},
		{"tokenize bad prompt", "/tokenize", `{"prompt":{"a":1}}`, 400, "BadRequestError", "prompt", "must be a string"},
		{"tokenize negative id", "/tokenize", `{"prompt":[1,-2]}`, 400, "BadRequestError", "prompt", "non-negative"},
		{"tokenize empty messages", "/tokenize", `{"messages":[]}`, 400, "BadRequestError", "messages", "must not be empty"},
		{"tokenize no role", "/tokenize", `{"messages":[{"content":"a"}]}`, 400, "BadRequestError", "messages", "role: field required"},
		{"tokenize both prompts flags", "/tokenize", `{"messages":[{"role":"user","content":"a"}],"add_generation_prompt":true,"continue_final_message":true}`,
			400, "BadRequestError", "", "Cannot set both"},
		{"tokenize strs of ids", "/tokenize", `{"prompt":[1,2],"return_token_strs":true}`, 400, "BadRequestError", "return_token_strs", "cannot decode"},
		{"tokenize unknown model", "/tokenize", `{"model":"gpt-9","prompt":"a"}`, 404, "NotFoundError", "model", "The model `gpt-9` does not exist."},
		{"tokenize too large", "/tokenize", `{"prompt":"` + long + long + long + `"}`, 413, "RequestEntityTooLarge", "", "larger than 65536 bytes"},
		{"render unknown model", "/v1/chat/completions/render", string(chatBody("gpt-9", "a", "b", 3, false)), 404, "NotFoundError", "model", "The model `gpt-9` does not exist."},
		{"render malformed", "/v1/completions/render", `[1,2]`, 400, "BadRequestError", "", "invalid JSON body"},
		{"render no messages", "/v1/chat/completions/render", `{"model":"m"}`, 400, "BadRequestError", "", "messages: field required"},
		{"render too long", "/v1/chat/completions/render", string(chatBody("m", "a", text("w", 4000), 200, false)), 400, "BadRequestError", "messages", "maximum context length is 4096 tokens"},
		{"render bad stop", "/v1/completions/render", `{"prompt":"a","stop":7}`, 400, "BadRequestError", "stop", "string or an array"},
		{"render bad temperature", "/v1/completions/render", `{"prompt":"a","temperature":"hot"}`, 400, "BadRequestError", "", "invalid JSON body"},
		{"render stream_options alone", "/v1/completions/render", `{"prompt":"a","stream_options":{"include_usage":true}}`, 400, "BadRequestError", "stream_options", "only allowed when stream is true"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			code, b := postJSON(t, s, c.path, c.body)
			var e errorBody
			if err := json.Unmarshal(b, &e); err != nil {
				t.Fatalf("%v: %s", err, b)
			}
			param := ""
			if e.Error.Param != nil {
				param = *e.Error.Param
			}
			if code != c.status || e.Error.Code != c.status || e.Error.Type != c.typ || param != c.param || !strings.Contains(e.Error.Message, c.msg) {
				t.Errorf("%d %.300s, want %d %s param %q containing %q", code, b, c.status, c.typ, c.param, c.msg)
			}
		})
	}
	// Wrong methods are not routes.
	resp, err := http.Get(s.URL() + "/tokenize")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 && resp.StatusCode != 405 {
		t.Errorf("GET /tokenize: %d", resp.StatusCode)
	}
}

func TestAppendTokenStrsMatchesTheRule(t *testing.T) {
	for _, s := range []string{"", "  ", "a", "hello world", "abcdefghijklmnopq r", " lead\ttab\nnew\rline ", "ünïcödé wörds here", "12345678 123456789"} {
		strs := appendTokenStrs(nil, s)
		var got []uint64
		for _, x := range strs {
			got = tokens.Append(got, x)
		}
		if want := tokens.Append(nil, s); !slices.Equal(got, want) || len(strs) != tokens.Count(s) {
			t.Errorf("%q: strings %q", s, strs)
		}
	}
}
