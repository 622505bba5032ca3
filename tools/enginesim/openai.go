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
	maxTokens    int  // 0: not given
	idsGiven     bool // the prompt came as token ids (/v1/completions)
	stream       bool
	includeUsage bool
}

// parseRequest decodes and validates a body; chat selects the endpoint.
func parseRequest(body []byte, chat bool) (*parsedRequest, *apiError) {
	return parseBody(body, chat, true)
}

// parseBody is parseRequest; requireModel false lets the model field be
// absent (vLLM's render and tokenize requests default it to the served
// model), leaving parsedRequest.model empty.
func parseBody(body []byte, chat, requireModel bool) (*parsedRequest, *apiError) {
	var req completionRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&req); err != nil {
		return nil, badRequest("invalid JSON body: %v", err)
	}
	if dec.More() {
		return nil, badRequest("invalid JSON body: data after the top-level value")
	}
	p := &parsedRequest{model: req.Model, stream: req.Stream}
	if req.Model == "" && requireModel {
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
		p.idsGiven = err == nil && isTokenIDs(req.Prompt)
	}
	if err != nil {
		return nil, badRequest("%v", err)
	}
	return p, nil
}

// chatMsg is one chat message as the token rule reads it: its role and its
// text parts, in order (each part is tokenized on its own).
type chatMsg struct {
	role  string
	parts []string
}

// parseMessages validates a messages array.
func parseMessages(raw json.RawMessage) ([]chatMsg, error) {
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
	out := make([]chatMsg, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return nil, fmt.Errorf("messages[%d].role: field required", i)
		}
		out[i].role = m.Role
		c := m.Content
		if len(c) == 0 || string(c) == "null" {
			continue
		}
		if c[0] == '"' {
			var s string
			if err := json.Unmarshal(c, &s); err != nil {
				return nil, fmt.Errorf("messages[%d].content: %w", i, err)
			}
			out[i].parts = []string{s}
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
			out[i].parts = append(out[i].parts, *part.Text)
		}
	}
	return out, nil
}

// chatTokens is the token ids of a chat prompt (package tokens' rule: a
// role marker per message, then the tokens of its parts).
func chatTokens(msgs []chatMsg) []uint64 {
	toks := make([]uint64, 0, 64)
	for _, m := range msgs {
		toks = append(toks, tokens.RoleMarkerID(m.role))
		for _, p := range m.parts {
			toks = tokens.Append(toks, p)
		}
	}
	return toks
}

func chatPrompt(raw json.RawMessage) ([]uint64, error) {
	msgs, err := parseMessages(raw)
	if err != nil {
		return nil, err
	}
	return chatTokens(msgs), nil
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

// isTokenIDs reports whether a valid prompt is an array of token ids.
func isTokenIDs(raw json.RawMessage) bool {
	raw = bytes.TrimLeft(raw, " \t\r\n")
	if len(raw) == 0 || raw[0] != '[' {
		return false
	}
	var ids []int64
	return json.Unmarshal(raw, &ids) == nil
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}
