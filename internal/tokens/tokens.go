// Package tokens is inferlb's text→token rule, shared by the engine
// simulator and the load generator (and ext_proc's demand reports), so that
// they count the same prompt the same way; and Bound, an upper bound on the
// count of any real model's tokenizer, which ext_proc's context-limit
// decisions use (bound.go; internal/tokens/hf counts exactly with a
// tokenizer.json).
//
// The rule: a token is a run of non-whitespace bytes of at most MaxTokenBytes
// bytes. Longer runs are cut every MaxTokenBytes bytes. Whitespace (space,
// tab, newline, carriage return) separates tokens and is not a token itself.
// A token's id is the 64-bit FNV-1a hash of its bytes, so equal text gives
// equal ids and equal prefixes give equal prefix-cache blocks.
//
// A chat prompt is tokenized as, for each message in order, one marker token
// for the role ("<|role|>") followed by the tokens of its content. This stands
// in for a chat template: it is stable, cheap, and makes a conversation's
// prompt a prefix of its next turn's prompt.
//
// The load generator writes words of 2–7 letters, so for its text one word is
// one token, and a prompt of N words is N tokens (plus role markers).
package tokens

// MaxTokenBytes is the longest token, in bytes.
const MaxTokenBytes = 8

func isSpace(b byte) bool { return b == ' ' || b == '\t' || b == '\n' || b == '\r' }

// Count returns the number of tokens in s without allocating.
func Count(s string) int {
	n, run := 0, 0
	for i := 0; i < len(s); i++ {
		if isSpace(s[i]) {
			run = 0
			continue
		}
		if run == 0 {
			n++
		}
		run++
		if run == MaxTokenBytes {
			run = 0
		}
	}
	return n
}

// Append appends the ids of the tokens of s to dst and returns it.
func Append(dst []uint64, s string) []uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h, run := uint64(offset), 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if isSpace(c) {
			if run > 0 {
				dst = append(dst, h)
			}
			h, run = offset, 0
			continue
		}
		h = (h ^ uint64(c)) * prime
		run++
		if run == MaxTokenBytes {
			dst = append(dst, h)
			h, run = offset, 0
		}
	}
	if run > 0 {
		dst = append(dst, h)
	}
	return dst
}

// RoleMarker is the text of the marker token that starts a chat message.
func RoleMarker(role string) string { return "<|" + role + "|>" }

// RoleMarkerID returns the token id of the role marker. Role markers longer
// than MaxTokenBytes hash as one token anyway: they are not text.
func RoleMarkerID(role string) uint64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	m := RoleMarker(role)
	for i := 0; i < len(m); i++ {
		h = (h ^ uint64(m[i])) * prime
	}
	return h
}

// Message is one chat message, as far as tokenization cares.
type Message struct {
	Role    string
	Content string
}

// AppendChat appends the token ids of a chat prompt to dst.
func AppendChat(dst []uint64, msgs []Message) []uint64 {
	for _, m := range msgs {
		dst = append(dst, RoleMarkerID(m.Role))
		dst = Append(dst, m.Content)
	}
	return dst
}

// CountChat returns the number of tokens in a chat prompt.
func CountChat(msgs []Message) int {
	n := 0
	for _, m := range msgs {
		n += 1 + Count(m.Content)
	}
	return n
}
