package enginesim

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"strconv"
	"time"

	"github.com/inferlb/inferlb/internal/tokens"
	"github.com/inferlb/inferlb/tools/enginesim/model"
)

// responder renders one request's response bodies in vLLM's shapes.
type responder struct {
	chat    bool
	req     *parsedRequest
	id      string
	off     uint64 // word offset
	prefix  []byte // chunk JSON up to the choices array
	nPrompt int
	lagged  bool
}

func newResponder(s *Server, chat bool, req *parsedRequest, n uint64, prompt []uint64) *responder {
	h := fnv.New64a()
	h.Write([]byte(s.opts.ID))
	kind, object := "cmpl-", "text_completion"
	if chat {
		kind, object = "chatcmpl-", "chat.completion.chunk"
	}
	rw := &responder{
		chat:    chat,
		req:     req,
		id:      fmt.Sprintf("%s%016x%016x", kind, h.Sum64(), n),
		off:     prompt[0] % uint64(len(words)),
		nPrompt: len(prompt),
	}
	p := []byte(`data: {"id":"` + rw.id + `","object":"` + object + `","created":` +
		strconv.FormatInt(time.Now().Unix(), 10) + `,"model":`)
	p = append(p, mustJSON(req.model)...)
	rw.prefix = append(p, `,"choices":[`...)
	return rw
}

// first is the chat stream's opening chunk (the assistant role); none for
// completions.
func (rw *responder) first(buf []byte) []byte {
	if !rw.chat {
		return buf
	}
	buf = append(buf, rw.prefix...)
	return append(buf, `{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`+"\n\n"...)
}

// chatOutputTokens is the token ids of a chat answer of n tokens to prompt
// as the next turn's prompt repeats it: the assistant's role marker, then
// one id per word (each word is one token under the token rule). It must
// agree with the words the responder streams (same offset, same words).
func chatOutputTokens(prompt []uint64, n int) []uint64 {
	off := prompt[0] % uint64(len(words))
	ids := make([]uint64, 0, n+1)
	ids = append(ids, tokens.RoleMarkerID("assistant"))
	for i := range n {
		ids = tokens.Append(ids, word(off, i))
	}
	return ids
}

func (rw *responder) text(i int) string {
	if i == 0 {
		return word(rw.off, 0)
	}
	return " " + word(rw.off, i)
}

// token appends the SSE chunk of output token i.
func (rw *responder) token(buf []byte, i int, last bool, reason model.FinishReason) []byte {
	buf = append(buf, rw.prefix...)
	if rw.chat {
		buf = append(buf, `{"index":0,"delta":{"content":"`...)
		buf = append(buf, rw.text(i)...)
		buf = append(buf, `"},"logprobs":null,"finish_reason":`...)
	} else {
		buf = append(buf, `{"index":0,"text":"`...)
		buf = append(buf, rw.text(i)...)
		buf = append(buf, `","logprobs":null,"finish_reason":`...)
	}
	if last {
		buf = append(buf, `"`+reason.String()+`","stop_reason":null}]}`+"\n\n"...)
	} else if rw.chat {
		buf = append(buf, `null}]}`+"\n\n"...)
	} else {
		buf = append(buf, `null,"stop_reason":null}]}`+"\n\n"...)
	}
	return buf
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	TotalTokens         int `json:"total_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (rw *responder) usageOf(n, cached int) usage {
	u := usage{PromptTokens: rw.nPrompt, CompletionTokens: n, TotalTokens: rw.nPrompt + n}
	u.PromptTokensDetails.CachedTokens = cached
	return u
}

// usage appends the stream's usage chunk (stream_options.include_usage).
func (rw *responder) usage(buf []byte, n, cached int) []byte {
	buf = append(buf, rw.prefix...)
	buf = append(buf, `],"usage":`...)
	buf = append(buf, mustJSON(rw.usageOf(n, cached))...)
	return append(buf, "}\n\n"...)
}

// whole is the non-streaming response body.
func (rw *responder) whole(n, cached int, reason model.FinishReason) []byte {
	text := make([]byte, 0, 8*n)
	for i := 0; i < n; i++ {
		text = append(text, rw.text(i)...)
	}
	choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": reason.String(), "stop_reason": nil}
	object := "text_completion"
	if rw.chat {
		object = "chat.completion"
		choice["message"] = map[string]any{"role": "assistant", "content": string(text), "tool_calls": []any{}}
	} else {
		choice["text"] = string(text)
	}
	b, _ := json.Marshal(map[string]any{
		"id": rw.id, "object": object, "created": time.Now().Unix(), "model": rw.req.model,
		"choices": []any{choice}, "usage": rw.usageOf(n, cached),
	})
	return b
}
