// Package llmclienttest is a small OpenAI-compatible SSE server for the
// tests of the streaming client (internal/llmclient) and of what sends with
// it (the load generator).
package llmclienttest

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/inferlb/inferlb/internal/llmclient"
	"github.com/inferlb/inferlb/internal/tokens"
	"github.com/inferlb/inferlb/internal/words"
)

// Engine answers max_tokens words (internal/words, seeded by the prompt's
// length), one per chunk, after TTFT and then ITL apart, and reports usage
// with cached = prompt·CachedShare.
type Engine struct {
	TTFT, ITL   time.Duration
	CachedShare float64
	// Behave, if set, picks a misbehaviour for a request: "", "429", "500",
	// "hang", "cut", "errchunk", "multi" (all tokens in one chunk).
	Behave func(r *http.Request, body *llmclient.APIRequest) string
	// ConnState, if set, observes the server's connections.
	ConnState func(net.Conn, http.ConnState)

	// Server is the running server (Start); its URL is the engine's.
	Server *httptest.Server
	mu     sync.Mutex
	got    []Seen
}

// Seen is a request the engine received, and the text it answered.
type Seen struct {
	Header http.Header
	Body   llmclient.APIRequest
	Path   string
	Answer string
}

// Start serves f until the test ends and returns it.
func Start(t testing.TB, f *Engine) *Engine {
	f.Server = httptest.NewUnstartedServer(http.HandlerFunc(f.serve))
	f.Server.Config.ConnState = f.ConnState
	f.Server.Start()
	t.Cleanup(f.Server.Close)
	return f
}

// URL is the engine's base URL.
func (f *Engine) URL() string { return f.Server.URL }

// Requests are the requests received so far, in order.
func (f *Engine) Requests() []Seen {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]Seen(nil), f.got...)
}

func (f *Engine) serve(w http.ResponseWriter, r *http.Request) {
	var body llmclient.APIRequest
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	mode := ""
	if f.Behave != nil {
		mode = f.Behave(r, &body)
	}
	prompt := 0
	if body.Prompt != nil {
		prompt = tokens.Count(*body.Prompt)
	} else {
		msgs := make([]tokens.Message, len(body.Messages))
		for i, m := range body.Messages {
			msgs[i] = tokens.Message{Role: m.Role, Content: m.Content}
		}
		prompt = tokens.CountChat(msgs)
	}
	answer := words.Words(uint64(prompt), body.MaxTokens)
	f.mu.Lock()
	f.got = append(f.got, Seen{r.Header.Clone(), body, r.URL.Path, answer})
	f.mu.Unlock()
	switch mode {
	case "429":
		w.Header().Set("Retry-After", "1")
		http.Error(w, `{"error":"shed"}`, http.StatusTooManyRequests)
		return
	case "500":
		http.Error(w, `{"error":"boom"}`, http.StatusInternalServerError)
		return
	case "hang":
		<-r.Context().Done()
		return
	case "close":
		w.Header().Set("Connection", "close")
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	chunk := func(text string) {
		var b []byte
		if body.Prompt != nil {
			b, _ = json.Marshal(map[string]any{"choices": []any{map[string]any{"index": 0, "text": text}}})
		} else {
			b, _ = json.Marshal(map[string]any{"choices": []any{map[string]any{"index": 0, "delta": map[string]string{"content": text}}}})
		}
		fmt.Fprintf(w, "data: %s\n\n", b)
		fl.Flush()
	}
	wait := func(d time.Duration) bool {
		if d <= 0 {
			return true
		}
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-t.C:
			return true
		case <-r.Context().Done():
			return false
		}
	}
	// vLLM's first chat chunk carries the role and no text.
	if body.Prompt == nil {
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n")
		fl.Flush()
	}
	if !wait(f.TTFT) {
		return
	}
	answerWords := strings.Fields(answer)
	if mode == "multi" {
		chunk(answer)
	} else {
		for i, wd := range answerWords {
			if i > 0 {
				if !wait(f.ITL) {
					return
				}
				wd = " " + wd
			}
			chunk(wd)
			if mode == "cut" && i == 1 {
				return
			}
			if mode == "errchunk" && i == 0 {
				io.WriteString(w, "data: {\"error\":{\"message\":\"engine died\"}}\n\n")
				return
			}
		}
	}
	if body.StreamOptions.IncludeUsage {
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":%d,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n",
			prompt, len(answerWords), int(float64(prompt)*f.CachedShare))
	}
	io.WriteString(w, "data: [DONE]\n\n")
	fl.Flush()
}
