package enginesim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"

	"github.com/inferlb/inferlb/internal/tokens"
)

// VocabSize bounds the token ids the tokenize and render endpoints report:
// a text token's id there is its id under package tokens' rule (a 64-bit
// FNV-1a hash of its bytes) modulo VocabSize, Llama 3's vocabulary size.
// Routers parse prompt token ids as 32-bit integers, and a real model's ids
// are below its vocabulary size. Equal words give equal ids, so prompts that
// share a prefix get token id lists that share the same prefix, as with a
// real tokenizer (two different words may also share an id, as two
// different texts can end in the same token of a real vocabulary).
const VocabSize = 128256

// apiTokenIDs maps prompt ids under package tokens' rule to the ids the API
// reports. Ids a request gave as ids (a /v1/completions prompt of token ids)
// are reported as given instead.
func apiTokenIDs(toks []uint64) []uint64 {
	out := make([]uint64, len(toks))
	for i, t := range toks {
		out[i] = t % VocabSize
	}
	return out
}

// appendTokenStrs appends the text of each token of s under package tokens'
// rule (tokens.Append's cuts: runs of non-whitespace bytes, cut every
// tokens.MaxTokenBytes bytes), so that tokens.Append of each string gives
// the matching id.
func appendTokenStrs(dst []string, s string) []string {
	start, run := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case ' ', '\t', '\n', '\r':
			if run > 0 {
				dst = append(dst, s[start:i])
			}
			run = 0
			continue
		}
		if run == 0 {
			start = i
		}
		run++
		if run == tokens.MaxTokenBytes {
			dst = append(dst, s[start:i+1])
			run = 0
		}
	}
	if run > 0 {
		dst = append(dst, s[start:])
	}
	return dst
}

// tokenizeRequest is vLLM's TokenizeCompletionRequest or TokenizeChatRequest
// (one of prompt and messages), as far as the simulator reads them.
type tokenizeRequest struct {
	Model                string          `json:"model"`
	Prompt               json.RawMessage `json:"prompt"`
	Messages             json.RawMessage `json:"messages"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage *bool           `json:"continue_final_message"`
	ReturnTokenStrs      bool            `json:"return_token_strs"`
}

// tokenizeResponse is vLLM's TokenizeResponse.
type tokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint64 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

// parseTokenize decodes and validates a /tokenize body. A chat prompt is
// tokenized as /v1/chat/completions tokenizes it (a role marker per
// message, no generation prompt: the engine counts the assistant's marker
// with the answer), so count is the completion's usage.prompt_tokens.
func parseTokenize(body []byte) (*tokenizeRequest, *tokenizeResponse, *apiError) {
	var req tokenizeRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&req); err != nil {
		return nil, nil, badRequest("invalid JSON body: %v", err)
	}
	if dec.More() {
		return nil, nil, badRequest("invalid JSON body: data after the top-level value")
	}
	hasPrompt := len(req.Prompt) > 0 && string(req.Prompt) != "null"
	hasMessages := len(req.Messages) > 0 && string(req.Messages) != "null"
	switch {
	case hasPrompt && hasMessages:
		return nil, nil, badRequest("give either prompt or messages, not both")
	case !hasPrompt && !hasMessages:
		return nil, nil, badRequest("prompt or messages: field required")
	}
	if req.AddGenerationPrompt != nil && *req.AddGenerationPrompt &&
		req.ContinueFinalMessage != nil && *req.ContinueFinalMessage {
		return nil, nil, badRequest("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	out := &tokenizeResponse{}
	if hasMessages {
		msgs, err := parseMessages(req.Messages)
		if err != nil {
			return nil, nil, &apiError{status: 400, typ: "BadRequestError", param: "messages", message: err.Error()}
		}
		out.Tokens = apiTokenIDs(chatTokens(msgs))
		if req.ReturnTokenStrs {
			out.TokenStrs = make([]string, 0, len(out.Tokens))
			for _, m := range msgs {
				out.TokenStrs = append(out.TokenStrs, tokens.RoleMarker(m.role))
				for _, p := range m.parts {
					out.TokenStrs = appendTokenStrs(out.TokenStrs, p)
				}
			}
		}
	} else {
		text, ids, err := tokenizePrompt(req.Prompt)
		if err != nil {
			return nil, nil, &apiError{status: 400, typ: "BadRequestError", param: "prompt", message: err.Error()}
		}
		if ids != nil {
			if req.ReturnTokenStrs {
				return nil, nil, &apiError{status: 400, typ: "BadRequestError", param: "return_token_strs",
					message: "return_token_strs: the simulator cannot decode a prompt given as token ids"}
			}
			out.Tokens = ids
		} else {
			out.Tokens = apiTokenIDs(tokens.Append(nil, text))
			if req.ReturnTokenStrs {
				out.TokenStrs = appendTokenStrs(make([]string, 0, len(out.Tokens)), text)
			}
		}
	}
	out.Count = len(out.Tokens)
	return &req, out, nil
}

// tokenizePrompt reads a /tokenize prompt: a string (which may hold no
// token), an array of one string, or token ids (returned in ids).
func tokenizePrompt(raw json.RawMessage) (text string, ids []uint64, err error) {
	if json.Unmarshal(raw, &text) == nil {
		return text, nil, nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		if len(ss) != 1 {
			return "", nil, fmt.Errorf("prompt: the simulator takes one prompt per request, got %d", len(ss))
		}
		return ss[0], nil, nil
	}
	ids, err = completionPrompt(raw)
	return "", ids, err
}

// tokenize serves POST /tokenize as vLLM does.
func (s *Server) tokenize(w http.ResponseWriter, hr *http.Request) {
	body, ok := s.readLoaded(w, hr)
	if !ok {
		return
	}
	req, out, aerr := parseTokenize(body)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if aerr := s.checkModel(req.Model); aerr != nil {
		writeError(w, aerr)
		return
	}
	out.MaxModelLen = s.maxCtx
	writeJSON(w, http.StatusOK, out)
}

// samplingFields are the request fields vLLM's render copies into its
// sampling parameters, as far as the simulator reports them, with
// cache_salt, priority and stream_options, which the render echoes.
type samplingFields struct {
	Temperature                *float64        `json:"temperature"`
	TopP                       *float64        `json:"top_p"`
	TopK                       *int            `json:"top_k"`
	MinP                       *float64        `json:"min_p"`
	PresencePenalty            *float64        `json:"presence_penalty"`
	FrequencyPenalty           *float64        `json:"frequency_penalty"`
	RepetitionPenalty          *float64        `json:"repetition_penalty"`
	Seed                       *int64          `json:"seed"`
	Stop                       json.RawMessage `json:"stop"`
	StopTokenIDs               []int64         `json:"stop_token_ids"`
	IgnoreEOS                  *bool           `json:"ignore_eos"`
	MinTokens                  *int            `json:"min_tokens"`
	SkipSpecialTokens          *bool           `json:"skip_special_tokens"`
	SpacesBetweenSpecialTokens *bool           `json:"spaces_between_special_tokens"`
	IncludeStopStrInOutput     *bool           `json:"include_stop_str_in_output"`
	CacheSalt                  *string         `json:"cache_salt"`
	Priority                   *int64          `json:"priority"`
	StreamOptions              json.RawMessage `json:"stream_options"`
}

// samplingParams is the part of vLLM's SamplingParams a render reports:
// vLLM's defaults, the request's values where it gives them, and the
// output length the simulator will generate (max_tokens, resolved as for
// the completion itself).
type samplingParams struct {
	N                          int      `json:"n"`
	PresencePenalty            float64  `json:"presence_penalty"`
	FrequencyPenalty           float64  `json:"frequency_penalty"`
	RepetitionPenalty          float64  `json:"repetition_penalty"`
	Temperature                float64  `json:"temperature"`
	TopP                       float64  `json:"top_p"`
	TopK                       int      `json:"top_k"`
	MinP                       float64  `json:"min_p"`
	Seed                       *int64   `json:"seed"`
	Stop                       []string `json:"stop"`
	StopTokenIDs               []int64  `json:"stop_token_ids"`
	IgnoreEOS                  bool     `json:"ignore_eos"`
	MaxTokens                  int      `json:"max_tokens"`
	MinTokens                  int      `json:"min_tokens"`
	Logprobs                   *int     `json:"logprobs"`
	PromptLogprobs             *int     `json:"prompt_logprobs"`
	SkipSpecialTokens          bool     `json:"skip_special_tokens"`
	SpacesBetweenSpecialTokens bool     `json:"spaces_between_special_tokens"`
	IncludeStopStrInOutput     bool     `json:"include_stop_str_in_output"`
}

// generateRequest is vLLM's GenerateRequest, what its render endpoints
// return: the prompt's token ids and the resolved sampling parameters.
type generateRequest struct {
	RequestID           string          `json:"request_id"`
	TokenIDs            []uint64        `json:"token_ids"`
	AssistantTokensMask []int           `json:"assistant_tokens_mask"`
	TokenOffsets        [][2]int        `json:"token_offsets"`
	Features            any             `json:"features"`
	SamplingParams      samplingParams  `json:"sampling_params"`
	Model               *string         `json:"model"`
	Stream              bool            `json:"stream"`
	StreamOptions       json.RawMessage `json:"stream_options"`
	CacheSalt           *string         `json:"cache_salt"`
	Priority            int64           `json:"priority"`
	KVTransferParams    any             `json:"kv_transfer_params"`
}

// render serves POST /v1/chat/completions/render (chat) and
// /v1/completions/render as vLLM does: the request is validated as its
// completion would be (same 400s and 404s) and comes back as the token ids
// the engine prefills, with the sampling parameters it would run. The chat
// render is one object; the completions render a list with one per prompt
// (the simulator takes one prompt).
func (s *Server) render(w http.ResponseWriter, hr *http.Request, chat bool) {
	body, ok := s.readLoaded(w, hr)
	if !ok {
		return
	}
	req, aerr := parseBody(body, chat, false)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	if aerr := s.checkModel(req.model); aerr != nil {
		writeError(w, aerr)
		return
	}
	maxTok, _, aerr := s.outputLen(req, chat)
	if aerr != nil {
		writeError(w, aerr)
		return
	}
	var f samplingFields
	if err := json.Unmarshal(body, &f); err != nil {
		writeError(w, badRequest("invalid JSON body: %v", err))
		return
	}
	stop, err := stopStrings(f.Stop)
	if err != nil {
		writeError(w, &apiError{status: 400, typ: "BadRequestError", param: "stop", message: err.Error()})
		return
	}
	sp := samplingParams{
		N: 1, RepetitionPenalty: 1, Temperature: 1, TopP: 1, MaxTokens: maxTok,
		Stop: stop, StopTokenIDs: f.StopTokenIDs, Seed: f.Seed,
		SkipSpecialTokens: true, SpacesBetweenSpecialTokens: true,
	}
	if sp.StopTokenIDs == nil {
		sp.StopTokenIDs = []int64{}
	}
	setIf(&sp.Temperature, f.Temperature)
	setIf(&sp.TopP, f.TopP)
	setIf(&sp.TopK, f.TopK)
	setIf(&sp.MinP, f.MinP)
	setIf(&sp.PresencePenalty, f.PresencePenalty)
	setIf(&sp.FrequencyPenalty, f.FrequencyPenalty)
	setIf(&sp.RepetitionPenalty, f.RepetitionPenalty)
	setIf(&sp.IgnoreEOS, f.IgnoreEOS)
	setIf(&sp.MinTokens, f.MinTokens)
	setIf(&sp.SkipSpecialTokens, f.SkipSpecialTokens)
	setIf(&sp.SpacesBetweenSpecialTokens, f.SpacesBetweenSpecialTokens)
	setIf(&sp.IncludeStopStrInOutput, f.IncludeStopStrInOutput)
	ids := req.prompt
	if !req.idsGiven {
		ids = apiTokenIDs(req.prompt)
	}
	kind := "cmpl-"
	if chat {
		kind = "chatcmpl-"
	}
	g := generateRequest{
		RequestID:      fmt.Sprintf("%s%016x%016x", kind, rand.Uint64(), rand.Uint64()),
		TokenIDs:       ids,
		SamplingParams: sp,
		Stream:         req.stream,
		CacheSalt:      f.CacheSalt,
	}
	if req.model != "" {
		g.Model = &req.model
	}
	if req.stream && len(f.StreamOptions) > 0 {
		g.StreamOptions = f.StreamOptions
	}
	if f.Priority != nil {
		g.Priority = *f.Priority
	}
	if chat {
		writeJSON(w, http.StatusOK, g)
		return
	}
	writeJSON(w, http.StatusOK, []generateRequest{g})
}

func setIf[T any](dst *T, v *T) {
	if v != nil {
		*dst = *v
	}
}

// stopStrings normalizes a request's stop field as vLLM does: absent or
// null is none, a string is a list of one.
func stopStrings(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return []string{}, nil
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return []string{s}, nil
	}
	var ss []string
	if json.Unmarshal(raw, &ss) == nil {
		return ss, nil
	}
	return nil, errors.New("stop: must be a string or an array of strings")
}
