package llamacpp

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

var apiClient = &http.Client{Timeout: 30 * time.Second}

// post sends a JSON body to one of the server's own endpoints and decodes
// the answer; non-2xx is an error with the body.
func (s *Server) post(ctx context.Context, path string, in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("content-type", "application/json")
	resp, err := apiClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %s: %.300s", path, resp.Status, body)
	}
	return json.Unmarshal(body, out)
}

// Message is a chat message.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// PromptTokens is the number of tokens the server's own tokenizer makes of
// the chat messages after its chat template (POST /apply-template, then
// POST /tokenize with the special tokens parsed): what the server counts
// against its context for the request's prompt.
func (s *Server) PromptTokens(ctx context.Context, msgs []Message) (int, error) {
	var tpl struct {
		Prompt string `json:"prompt"`
	}
	if err := s.post(ctx, "/apply-template", map[string]any{"messages": msgs}, &tpl); err != nil {
		return 0, err
	}
	return s.Tokens(ctx, tpl.Prompt)
}

// Tokens is the number of tokens the server's tokenizer makes of text
// (POST /tokenize, special tokens parsed as the server does for prompts).
func (s *Server) Tokens(ctx context.Context, text string) (int, error) {
	var tok struct {
		Tokens []json.RawMessage `json:"tokens"`
	}
	if err := s.post(ctx, "/tokenize", map[string]any{"content": text, "add_special": true, "parse_special": true}, &tok); err != nil {
		return 0, err
	}
	return len(tok.Tokens), nil
}

// Timings are the server's own account of one request (the "timings"
// object of its responses): prompt tokens reused from the slot's cache,
// prompt tokens evaluated and the time that took, tokens generated.
type Timings struct {
	CacheN      int     `json:"cache_n"`
	PromptN     int     `json:"prompt_n"`
	PromptMs    float64 `json:"prompt_ms"`
	PredictedN  int     `json:"predicted_n"`
	PredictedMs float64 `json:"predicted_ms"`
}

// ChatResponse is the part of a non-streamed chat completion the tests
// read.
type ChatResponse struct {
	Choices []struct {
		Message      Message `json:"message"`
		FinishReason string  `json:"finish_reason"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Timings Timings `json:"timings"`
}
