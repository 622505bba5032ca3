package enginesim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/inferlb/inferlb/internal/tokens"
)

// apiError is an error answered in vLLM's (and OpenAI's) error JSON:
// {"error": {"message", "type", "param", "code"}}.
type apiError struct {
	status  int
	typ     string
	message string
	param   string
}

func (e *apiError) Error() string { return e.message }

func badRequest(format string, a ...any) *apiError {
	return &apiError{status: 400, typ: "BadRequestError", message: fmt.Sprintf(format, a...)}
}

func (e *apiError) body() []byte {
	var param any
	if e.param != "" {
		param = e.param
	}
	b, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": e.message, "type": e.typ, "param": param, "code": e.status,
	}})
	return b
}

// completionRequest holds the fields of /v1/chat/completions and
// /v1/completions bodies the simulator reads; others are accepted and ignored.
type completionRequest struct {
	Model               string          `json:"model"`
	Messages            json.RawMessage `json:"messages"`
	Prompt              json.RawMessage `json:"prompt"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	N                   *int            `json:"n"`
	Stream              bool            `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// parsedRequest is a validated request.
type parsedRequest struct {
	model        string
	prompt       []uint64
	maxTokens    int // 0: not given
	stream       bool
	includeUsage bool
}

// parseRequest decodes and validates a body; chat selects the endpoint.
func parseRequest(body []byte, chat bool) (*parsedRequest, *apiError) {
	var req completionRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&req); err != nil {
		return nil, badRequest("invalid JSON body: %v", err)
	}
	if dec.More() {
		return nil, badRequest("invalid JSON body: data after the top-level value")
	}
	p := &parsedRequest{model: req.Model, stream: req.Stream}
	if req.Model == "" {
		return nil, &apiError{status: 400, typ: "BadRequestError", message: "model: field required", param: "model"}
	}
	if req.StreamOptions != nil {
		if !req.Stream {
			return nil, &apiError{status: 400, typ: "BadRequestError", param: "stream_options",
				message: "stream_options: only allowed when stream is true"}
		}
		p.includeUsage = req.StreamOptions.IncludeUsage
	}
	if req.N != nil && *req.N != 1 {
		return nil, &apiError{status: 400, typ: "BadRequestError", param: "n",
			message: fmt.Sprintf("n: the simulator generates one choice, got n=%d", *req.N)}
	}
	mt := req.MaxTokens
	name := "max_tokens"
	if req.MaxCompletionTokens != nil {
		mt, name = req.MaxCompletionTokens, "max_completion_tokens"
	}
	if mt != nil {
		if *mt < 1 {
			return nil, &apiError{status: 400, typ: "BadRequestError", param: name,
				message: fmt.Sprintf("%s: must be at least 1, got %d", name, *mt)}
		}
		p.maxTokens = *mt
	}
	var err error
	if chat {
		p.prompt, err = chatPrompt(req.Messages)
	} else {
		p.prompt, err = completionPrompt(req.Prompt)
	}
	if err != nil {
		return nil, badRequest("%v", err)
	}
	return p, nil
}

func chatPrompt(raw json.RawMessage) ([]uint64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errors.New("messages: field required")
	}
	var msgs []chatMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, fmt.Errorf("messages: must be an array of messages: %w", err)
	}
	if len(msgs) == 0 {
		return nil, errors.New("messages: must not be empty")
	}
	toks := make([]uint64, 0, 64)
	for i, m := range msgs {
		if m.Role == "" {
			return nil, fmt.Errorf("messages[%d].role: field required", i)
		}
		toks = append(toks, tokens.RoleMarkerID(m.Role))
		c := m.Content
		if len(c) == 0 || string(c) == "null" {
			continue
		}
		var s string
		if c[0] == '"' {
			if err := json.Unmarshal(c, &s); err != nil {
				return nil, fmt.Errorf("messages[%d].content: %w", i, err)
			}
			toks = tokens.Append(toks, s)
			continue
		}
		var parts []struct {
			Type string  `json:"type"`
			Text *string `json:"text"`
		}
		if err := json.Unmarshal(c, &parts); err != nil {
			return nil, fmt.Errorf("messages[%d].content: must be a string or an array of content parts", i)
		}
		for j, part := range parts {
			if part.Type != "text" || part.Text == nil {
				return nil, fmt.Errorf("messages[%d].content[%d]: only text parts are supported, got type %q", i, j, part.Type)
			}
			toks = tokens.Append(toks, *part.Text)
		}
	}
	return toks, nil
}

func completionPrompt(raw json.RawMessage) ([]uint64, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, errors.New("prompt: field required")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		t := tokens.Append(nil, s)
		if len(t) == 0 {
			return nil, errors.New("prompt: must contain at least one token")
		}
		return t, nil
	}
	var ss []string
	if err := json.Unmarshal(raw, &ss); err == nil {
		if len(ss) != 1 {
			return nil, fmt.Errorf("prompt: the simulator takes one prompt per request, got %d", len(ss))
		}
		return completionPrompt(json.RawMessage(mustJSON(ss[0])))
	}
	var ids []int64
	if err := json.Unmarshal(raw, &ids); err == nil {
		if len(ids) == 0 {
			return nil, errors.New("prompt: must contain at least one token")
		}
		t := make([]uint64, len(ids))
		for i, id := range ids {
			if id < 0 {
				return nil, fmt.Errorf("prompt[%d]: token ids must be non-negative, got %d", i, id)
			}
			t[i] = uint64(id)
		}
		return t, nil
	}
	return nil, errors.New("prompt: must be a string, an array of one string, or an array of token ids")
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
