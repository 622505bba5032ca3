package extproc_test

import (
	"io"
	"strings"
	"testing"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc/body"
	"github.com/inferlb/inferlb/internal/tokens"
	"github.com/inferlb/inferlb/internal/tokens/hf"
)

// TestContextLimitByRealTokens, through a real Envoy: two classes of one
// model, "llama" guaranteeing 200 tokens and "qwen" (engine qwen0)
// 100,000. A prompt of digits and commas is 32 tokens under the old word
// rule but about 240 under GPT-2's tokenizer: it must go to the large class
// (the small one's engines would reject it with 400), with the tokenizer
// loaded and without. A plain English prompt whose bytes exceed the small
// limit but whose tokens do not goes to the small class when ext_proc has
// the tokenizer (exact count), and to the large one on the bytes bound.
func TestContextLimitByRealTokens(t *testing.T) {
	tok, err := hf.Load("../internal/tokens/hf/testdata/gpt2.tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	policy := func(p *policyv1.RoutingPolicy) {
		for _, c := range p.Classes {
			c.Model = "llama-3-8b"
			c.TokenizerSha256, c.ChatTemplateTokens = tok.SHA256(), 8
		}
		p.Classes[0].MaxContextTokens = 200    // llama: the three engines
		p.Classes[1].MaxContextTokens = 100000 // qwen: qwen0
	}
	digits := chatMsgs("llama-3-8b", []msg{{"user", strings.Repeat("9,", 120)}}, map[string]any{"max_tokens": 1})
	english := chatMsgs("llama-3-8b", []msg{{"user", "The quick brown fox jumps over the lazy dog while the cat sleeps in the warm afternoon sun by the old river bank."}},
		map[string]any{"max_tokens": 1})

	// The premise: the word rule admits the digits to the small class, the
	// real tokenizer does not; the English prompt's bytes exceed the small
	// limit, its tokens do not.
	var br body.Request
	if err := body.Parse(digits, body.Chat, &br); err != nil {
		t.Fatal(err)
	}
	if naive, real := br.PromptTokens+1, tok.Count(strings.Repeat("9,", 120)); naive > 200 || real <= 200 {
		t.Fatalf("premise: word rule %d, GPT-2 %d tokens", naive, real)
	}
	if b := tokens.Bound(english); b+9 <= 200 {
		t.Fatalf("premise: the English request's bytes bound %d fits the small class", b)
	}

	for _, c := range []struct {
		name          string
		tokenizers    map[string]*hf.Tokenizer
		digits, words string // engine class expected: "qwen0" or "llama"
	}{
		{"with the tokenizer", map[string]*hf.Tokenizer{tok.SHA256(): tok}, "qwen0", "llama"},
		{"bytes bound only", nil, "qwen0", "qwen0"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := startRig(t, rigOptions{policy: policy, tokenizers: c.tokenizers})
			for _, req := range []struct {
				body []byte
				want string
			}{{digits, c.digits}, {english, c.words}} {
				res := r.post(req.body, nil)
				if res.status != 200 {
					t.Fatalf("status %d: %s", res.status, res.body)
				}
				got := "llama"
				if res.engine == "qwen0" {
					got = "qwen0"
				}
				if got != req.want || res.seen["x-inferlb-class"] != map[string]string{"qwen0": "qwen", "llama": "llama"}[req.want] {
					t.Errorf("%.40s…: served by %s (class header %q), want %s", req.body[40:], res.engine, res.seen["x-inferlb-class"], req.want)
				}
			}
		})
	}
}

// TestModelsThroughEnvoy: GET /v1/models answers with the fleet's models
// (from the policy's classes, with the longest context a class guarantees);
// GET /v1/models/{id} with one, or a 404 in OpenAI's format.
func TestModelsThroughEnvoy(t *testing.T) {
	r := startRig(t, rigOptions{policy: func(p *policyv1.RoutingPolicy) {
		p.Classes[0].MaxContextTokens = 8192
		p.Classes = append(p.Classes, &policyv1.ClassPolicy{Name: "llama-long", Cluster: "class-llama", Model: "llama-3-8b", MaxContextTokens: 131072})
	}})
	get := func(path string) (int, string, string) {
		resp, err := client.Get(r.url + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("content-type"), string(b)
	}
	code, ct, b := get("/v1/models")
	want := `{"object":"list","data":[{"id":"llama-3-8b","object":"model","created":0,"owned_by":"inferlb","max_model_len":131072},{"id":"qwen-2-7b","object":"model","created":0,"owned_by":"inferlb"}]}`
	if code != 200 || ct != "application/json" || b != want {
		t.Fatalf("GET /v1/models: %d %q %s", code, ct, b)
	}
	if code, _, b := get("/v1/models/qwen-2-7b"); code != 200 || !strings.Contains(b, `"id":"qwen-2-7b"`) {
		t.Fatalf("GET /v1/models/qwen-2-7b: %d %s", code, b)
	}
	code, _, b = get("/v1/models/gpt-7")
	if m, _, c := openAIError(t, b); code != 404 || c != "model_not_found" || !strings.Contains(m, `"gpt-7"`) {
		t.Fatalf("GET /v1/models/gpt-7: %d %s", code, b)
	}
}
