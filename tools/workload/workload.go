// Package workload produces the request streams inferlb is measured with:
// replays of public traces (Mooncake JSONL, Azure LLM inference CSV) and
// synthetic multi-turn conversations. It knows nothing about HTTP: the load
// generator (tools/loadgen) sends its requests to a live endpoint, and a
// fleet simulator can feed the same requests to modelled engines.
//
// Prompts are text built from words of 2–7 lowercase letters
// (internal/words), so under the project's token rule (internal/tokens) one
// word is one token, and a prompt's token count is known exactly before it
// is sent.
//
// A Source hands out new requests (trace rows, first turns of sessions). A
// source whose requests continue a conversation also implements FollowUper:
// after a turn completes, the caller passes the answer it got and receives
// the next turn, to be sent after the turn's think time.
package workload

import (
	"time"

	"github.com/inferlb/inferlb/internal/hashmix"
	"github.com/inferlb/inferlb/internal/tokens"
)

// Request is one inference request of a workload.
type Request struct {
	// Index numbers the requests a source returns from Next, from 0. Follow-up
	// turns share their session's first-turn Index.
	Index int
	// Offset is the request's arrival time after the start of the workload,
	// for sources with their own timestamps (Timed reports true); zero
	// otherwise.
	Offset time.Duration
	// Messages is the chat prompt (system, user, assistant, ...). Exactly one
	// of Messages and Prompt is set.
	Messages []tokens.Message
	// Prompt is a plain-text completion prompt (Format Completion).
	Prompt string
	// PromptTokens is the prompt's length under the token rule (role markers
	// included for a chat prompt).
	PromptTokens int
	// MaxTokens is the number of output tokens to ask for.
	MaxTokens int
	// SessionID identifies a conversation; empty for single-shot requests.
	SessionID string
	// Turn numbers the turns of a session from 1; 0 for single-shot requests.
	Turn int
	// Turns is the number of turns the session will have (0 if single-shot).
	Turns int
	// ThinkTime is how long the user waits, after this turn's answer, before
	// sending the next turn.
	ThinkTime time.Duration
	// Priority names the request's priority class; empty for none.
	Priority string
	// Region is the region the request comes from; empty for none.
	Region string
	// HashIDs are the Mooncake block ids of the prompt (Mooncake only).
	HashIDs []int

	seed uint64 // session seed, for deterministic follow-ups
}

// Source produces the new requests of a workload (trace rows, first turns of
// sessions). Next is called from one goroutine.
type Source interface {
	// Next returns the next request. at is the time since the start of the
	// run at which the caller is going to send it (sources with their own
	// timestamps ignore it; time-varying sources use it, e.g. for the region
	// mix). ok is false when the source is exhausted.
	Next(at time.Duration) (r Request, ok bool)
	// Timed reports whether requests carry their own arrival Offsets.
	Timed() bool
}

// FollowUper is implemented by sources whose requests continue: after prev
// completed with the assistant text answer, FollowUp returns the next turn.
// It is safe for concurrent use.
type FollowUper interface {
	FollowUp(prev Request, answer string) (next Request, ok bool)
}

// Format is how a prompt is expressed.
type Format int

const (
	// Chat prompts are one or more chat messages (/v1/chat/completions).
	Chat Format = iota
	// Completion prompts are plain text (/v1/completions).
	Completion
)

// ParseFormat parses "chat" or "completion".
func ParseFormat(s string) (Format, error) {
	switch s {
	case "chat":
		return Chat, nil
	case "completion", "completions":
		return Completion, nil
	}
	return 0, &FormatError{s}
}

// FormatError reports an unknown prompt format.
type FormatError struct{ Value string }

func (e *FormatError) Error() string {
	return "workload: unknown prompt format " + `"` + e.Value + `"` + ` (want "chat" or "completion")`
}

func (f Format) String() string {
	if f == Completion {
		return "completion"
	}
	return "chat"
}

// singlePrompt sets a one-message chat prompt or a completion prompt whose
// total length under the token rule is exactly n tokens (n ≥ 1), with words
// from gen. For chat, the role marker is one of the n tokens, so the content
// has n−1 words.
func singlePrompt(r *Request, f Format, n int, gen func(words int) string) {
	if f == Chat {
		r.Messages = []tokens.Message{{Role: "user", Content: gen(n - 1)}}
		r.PromptTokens = tokens.CountChat(r.Messages)
		return
	}
	r.Prompt = gen(n)
	r.PromptTokens = tokens.Count(r.Prompt)
}

// Slice returns the first n requests of src (all if it has fewer), calling
// Next with at = 0. Useful for traces and tests.
func Slice(src Source, n int) []Request {
	var out []Request
	for len(out) < n {
		r, ok := src.Next(0)
		if !ok {
			break
		}
		out = append(out, r)
	}
	return out
}

// mix64 is SplitMix64's finalizer: a cheap bijective hash for deriving seeds.
func mix64(x uint64) uint64 { return hashmix.SplitMix64(x + 0x9e3779b97f4a7c15) }
