// Package body reads what the routing decision needs from an OpenAI
// chat/completions or completions request body, in one pass over the bytes,
// without building a document tree and without decoding the body twice.
//
// It extracts: model, stream, max_completion_tokens / max_tokens,
// prompt_cache_key, user, the prompt's token count under the project's token
// rule (internal/tokens: one role marker per message plus the tokens of its
// text), and the prompt's prefix chain (chain.go).
// Every other value is validated as JSON and skipped. A body that is not a
// single valid JSON object gets a *SyntaxError naming the byte offset; a
// valid object with a missing or ill-typed field the decision needs gets a
// *FieldError naming the field. Invalid UTF-8 inside strings is accepted, as
// encoding/json does (the token rule works on bytes).
package body

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/cespare/xxhash/v2"
)

// Kind is the API a body is for.
type Kind uint8

const (
	// Chat is POST /v1/chat/completions: a "messages" array.
	Chat Kind = iota
	// Completion is POST /v1/completions: a "prompt" string (or array of strings).
	Completion
)

// Request is what the routing decision reads from a body.
type Request struct {
	Model  string
	Stream bool
	// MaxTokens is max_completion_tokens if present, else max_tokens, else -1.
	MaxTokens int
	// PromptCacheKey and User are OpenAI's optional fields ("" if absent).
	PromptCacheKey string
	User           string
	// PromptTokens is the prompt's length under internal/tokens (role
	// markers included for chat).
	PromptTokens int
	// Messages is the number of chat messages (0 for completions).
	Messages int
	// Chain is the prompt's prefix chain (see chain.go): hashes of the
	// canonical prompt stream at message ends and geometric depths.
	Chain Chain
	// PrefixHash is the hash of the chain's anchor, the conversation's
	// stable prefix: for chat, every message up to and including the
	// first user message (normally the system prompt and the first user
	// turn), whole; for completions, the first CompletionAnchorBytes of
	// the (first) prompt. HasPrefix is false when there is no anchor (no
	// user message, a prompt of token ids).
	PrefixHash uint64
	HasPrefix  bool
}

// SyntaxError is malformed JSON.
type SyntaxError struct {
	Offset int
	Msg    string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("invalid JSON at byte %d: %s", e.Offset, e.Msg)
}

// FieldError is valid JSON that lacks a needed field or has one of the wrong type.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return fmt.Sprintf("field %q: %s", e.Field, e.Msg) }

// Limits stop a parse at the first element that proves the request over a
// bound, without reading the rest of the body: a hostile body (a hundred
// thousand tiny messages) then costs what its first bytes do. Zero fields
// are no bound.
type Limits struct {
	// MaxMessages bounds the number of chat messages.
	MaxMessages int
	// MaxContext is the largest context, in tokens, any engine the
	// request may reach accepts. Every chat message costs at least one
	// token of the rendered prompt (a chat template's role header costs
	// 3–5), as does every token id of a completion prompt, so a request
	// with more of them than MaxContext cannot fit.
	MaxContext int
}

// LimitError is a request proved over one of the Limits.
type LimitError struct {
	Field string
	// Context: over Limits.MaxContext (else Limits.MaxMessages).
	Context bool
	Limit   int
}

func (e *LimitError) Error() string {
	if e.Context {
		return fmt.Sprintf("field %q: more than %d elements, each at least one token: the prompt exceeds the largest context served here (%d tokens)", e.Field, e.Limit, e.Limit)
	}
	return fmt.Sprintf("field %q: more than %d messages", e.Field, e.Limit)
}

// over returns the LimitError for n elements of field, nil if n is within
// the limits.
func (l *Limits) over(field string, n int, messages bool) error {
	switch {
	case messages && l.MaxMessages > 0 && n > l.MaxMessages:
		return &LimitError{Field: field, Limit: l.MaxMessages}
	case l.MaxContext > 0 && n > l.MaxContext:
		return &LimitError{Field: field, Context: true, Limit: l.MaxContext}
	}
	return nil
}

// IsSyntax reports whether err is a *SyntaxError.
func IsSyntax(err error) bool {
	var s *SyntaxError
	return errors.As(err, &s)
}

const (
	// maxDepth bounds nesting of skipped values (a stack-exhaustion guard).
	maxDepth = 128
	// tokenRun is internal/tokens.MaxTokenBytes (kept equal by a test).
	tokenRun = 8
)

// Parse reads a body of the given kind into r (which it resets first).
func Parse(b []byte, kind Kind, r *Request) error { return ParseWithin(b, kind, Limits{}, r) }

// ParseWithin is Parse that stops with a *LimitError at the first message
// (or token id) that proves the request over lim.
func ParseWithin(b []byte, kind Kind, lim Limits, r *Request) error {
	*r = Request{MaxTokens: -1}
	var cw chainWriter
	cw.reset(&r.Chain)
	p := parser{b: b, chain: &cw, lim: lim}
	if err := p.top(kind, r); err != nil {
		return err
	}
	if t := b[p.tools[0]:p.tools[1]]; len(t) > 0 && string(t) != "null" && string(t) != "[]" {
		r.Chain.mixTools(xxhash.Sum64(t))
	}
	if a := r.Chain.Anchor; a >= 0 {
		r.PrefixHash, r.HasPrefix = r.Chain.Points[a].Hash, true
	}
	return nil
}

type parser struct {
	b   []byte
	i   int
	err error
	// chain receives the messages (or the prompt) as they are read;
	// partsChain, on the sub-parser that re-reads an array of content
	// parts for it, their text.
	chain, partsChain *chainWriter
	// esc: the last string tokenString read held a \u or \/ escape (so
	// its raw bytes are not its canonical form).
	esc bool
	// tools is the raw span of the "tools" value, if any.
	tools           [2]int
	lim             Limits
	maxTok, maxComp int
	hasMaxTok       bool
	hasMaxComp      bool
}

func (p *parser) syntax(msg string) error {
	if p.i >= len(p.b) {
		return &SyntaxError{Offset: len(p.b), Msg: "unexpected end of input" + msgSuffix(msg)}
	}
	return &SyntaxError{Offset: p.i, Msg: msg}
}

func msgSuffix(msg string) string {
	if msg == "" {
		return ""
	}
	return " (" + msg + ")"
}

func (p *parser) ws() {
	// Most values follow their separator directly: one comparison then.
	if p.i < len(p.b) && p.b[p.i] > ' ' {
		return
	}
	for p.i < len(p.b) {
		switch p.b[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

func (p *parser) peek() byte {
	if p.i < len(p.b) {
		return p.b[p.i]
	}
	return 0
}

func (p *parser) top(kind Kind, r *Request) error {
	p.ws()
	if p.peek() != '{' {
		if p.i >= len(p.b) {
			return p.syntax("expected a JSON object")
		}
		return p.syntax("expected a JSON object, found " + strconv.QuoteRune(rune(p.b[p.i])))
	}
	p.i++
	seenModel, seenBody := false, false
	first := true
	for {
		p.ws()
		if p.peek() == '}' && first {
			p.i++
			break
		}
		first = false
		key, esc, err := p.stringSpan()
		if err != nil {
			return err
		}
		var name string
		if esc {
			name = decodeString(p.b[key[0]:key[1]])
		} else {
			name = string(p.b[key[0]:key[1]]) // small; compiler avoids the copy in switch
		}
		p.ws()
		if p.peek() != ':' {
			return p.syntax("expected ':' after object key")
		}
		p.i++
		p.ws()
		model, body, err := p.member(name, kind, r)
		if err != nil {
			return err
		}
		seenModel, seenBody = seenModel || model, seenBody || body
		if more, err := p.sep('}'); err != nil {
			return err
		} else if more {
			continue
		}
		break
	}
	p.ws()
	if p.i != len(p.b) {
		return p.syntax("unexpected data after the JSON object")
	}
	if !seenModel {
		return &FieldError{Field: "model", Msg: "missing"}
	}
	if r.Model == "" {
		return &FieldError{Field: "model", Msg: "must not be empty"}
	}
	if !seenBody {
		if kind == Chat {
			return &FieldError{Field: "messages", Msg: "missing"}
		}
		return &FieldError{Field: "prompt", Msg: "missing"}
	}
	switch {
	case p.hasMaxComp:
		r.MaxTokens = p.maxComp
	case p.hasMaxTok:
		r.MaxTokens = p.maxTok
	}
	return nil
}

// member reads the value of the top-level member name into r (or skips
// it), reporting whether it was the model or the request's text (messages
// for chat, prompt for completions).
func (p *parser) member(name string, kind Kind, r *Request) (model, body bool, err error) {
	switch name {
	case "model":
		s, err := p.stringField("model")
		if err != nil {
			return false, false, err
		}
		r.Model, model = s, true
	case "stream":
		v, err := p.boolField("stream")
		if err != nil {
			return false, false, err
		}
		r.Stream = v
	case "max_tokens":
		n, null, err := p.intField("max_tokens")
		if err != nil {
			return false, false, err
		}
		p.maxTok, p.hasMaxTok = n, !null
	case "max_completion_tokens":
		n, null, err := p.intField("max_completion_tokens")
		if err != nil {
			return false, false, err
		}
		p.maxComp, p.hasMaxComp = n, !null
	case "prompt_cache_key":
		s, err := p.optStringField("prompt_cache_key")
		if err != nil {
			return false, false, err
		}
		r.PromptCacheKey = s
	case "user":
		s, err := p.optStringField("user")
		if err != nil {
			return false, false, err
		}
		r.User = s
	case "messages":
		if kind != Chat {
			if err := p.skip(0); err != nil {
				return false, false, err
			}
			break
		}
		if err := p.messages(r); err != nil {
			return false, false, err
		}
		body = true
	case "tools":
		start := p.i
		if err := p.skip(0); err != nil {
			return false, false, err
		}
		p.tools = [2]int{start, p.i}
	case "prompt":
		if kind != Completion {
			if err := p.skip(0); err != nil {
				return false, false, err
			}
			break
		}
		if err := p.prompt(r); err != nil {
			return false, false, err
		}
		body = true
	default:
		if err := p.skip(0); err != nil {
			return false, false, err
		}
	}
	return model, body, nil
}

// sep reads what follows a member or an element: ',' (more follows:
// true) or the closing byte ('}' or ']': false), each consumed; anything
// else is a syntax error, nothing consumed.
func (p *parser) sep(closing byte) (more bool, err error) {
	p.ws()
	switch p.peek() {
	case ',':
		p.i++
		return true, nil
	case closing:
		p.i++
		return false, nil
	}
	if closing == '}' {
		return false, p.syntax("expected ',' or '}' in object")
	}
	return false, p.syntax("expected ',' or ']' in array")
}

// stringSpan reads a string at p.i and returns the span of its raw contents
// (between the quotes) and whether it holds escapes.
func (p *parser) stringSpan() (span [2]int, esc bool, err error) {
	if p.peek() != '"' {
		return span, false, p.syntax("expected a string")
	}
	p.i++
	start := p.i
	b := p.b
	for i := p.i; i < len(b); i++ {
		c := b[i]
		if !strSpecial[c] {
			continue
		}
		if c == '"' {
			p.i = i + 1
			return [2]int{start, i}, esc, nil
		}
		if c == '\\' {
			esc = true
			p.i = i
			n, err := p.escapeLen()
			if err != nil {
				return span, false, err
			}
			i += n - 1
			continue
		}
		if c < 0x20 {
			p.i = i
			return span, false, p.syntax("control character in string")
		}
	}
	p.i = len(b)
	return span, false, p.syntax("unterminated string")
}

// strSpecial marks the bytes a string's scan stops at: its closing quote,
// an escape, and the control characters JSON forbids in strings.
var strSpecial = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// escapeLen validates the escape at p.i (a backslash) and returns its length.
func (p *parser) escapeLen() (int, error) {
	b := p.b
	if p.i+1 >= len(b) {
		p.i = len(b)
		return 0, p.syntax("unterminated escape")
	}
	switch b[p.i+1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2, nil
	case 'u':
		if p.i+6 > len(b) {
			p.i = len(b)
			return 0, p.syntax("short \\u escape")
		}
		for k := 2; k < 6; k++ {
			if hexVal(b[p.i+k]) < 0 {
				p.i += k
				return 0, p.syntax("invalid hex digit in \\u escape")
			}
		}
		return 6, nil
	}
	p.i++
	return 0, p.syntax("invalid escape character")
}

func hexVal(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

func (p *parser) stringField(field string) (string, error) {
	if p.peek() != '"' {
		if isValueStart(p.peek()) {
			if err := p.skip(0); err != nil {
				return "", err
			}
			return "", &FieldError{Field: field, Msg: "must be a string"}
		}
		return "", p.syntax("expected a value")
	}
	span, esc, err := p.stringSpan()
	if err != nil {
		return "", err
	}
	if esc {
		return decodeString(p.b[span[0]:span[1]]), nil
	}
	return string(p.b[span[0]:span[1]]), nil
}

func (p *parser) optStringField(field string) (string, error) {
	if p.isNull() {
		return "", nil
	}
	return p.stringField(field)
}

func (p *parser) isNull() bool {
	if len(p.b)-p.i >= 4 && string(p.b[p.i:p.i+4]) == "null" {
		p.i += 4
		return true
	}
	return false
}

func isValueStart(c byte) bool {
	switch c {
	case '{', '[', '"', 't', 'f', 'n', '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return true
	}
	return false
}

func (p *parser) boolField(field string) (bool, error) {
	switch {
	case len(p.b)-p.i >= 4 && string(p.b[p.i:p.i+4]) == "true":
		p.i += 4
		return true, nil
	case len(p.b)-p.i >= 5 && string(p.b[p.i:p.i+5]) == "false":
		p.i += 5
		return false, nil
	case p.isNull():
		return false, nil
	}
	if isValueStart(p.peek()) {
		if err := p.skip(0); err != nil {
			return false, err
		}
		return false, &FieldError{Field: field, Msg: "must be a boolean"}
	}
	return false, p.syntax("expected a value")
}

// intField reads a non-negative integer (or null).
func (p *parser) intField(field string) (n int, null bool, err error) {
	if p.isNull() {
		return 0, true, nil
	}
	c := p.peek()
	if c != '-' && (c < '0' || c > '9') {
		if isValueStart(c) {
			if err := p.skip(0); err != nil {
				return 0, false, err
			}
			return 0, false, &FieldError{Field: field, Msg: "must be an integer"}
		}
		return 0, false, p.syntax("expected a value")
	}
	start := p.i
	if err := p.number(); err != nil {
		return 0, false, err
	}
	v, perr := strconv.ParseInt(string(p.b[start:p.i]), 10, 32)
	if perr != nil {
		// A float like 16.0 is valid JSON but not an integer count.
		return 0, false, &FieldError{Field: field, Msg: "must be an integer between 0 and 2147483647, got " + string(p.b[start:p.i])}
	}
	if v < 0 {
		return 0, false, &FieldError{Field: field, Msg: "must not be negative, got " + string(p.b[start:p.i])}
	}
	return int(v), false, nil
}

// number validates a JSON number at p.i.
func (p *parser) number() error {
	b := p.b
	i := p.i
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	default:
		p.i = i
		return p.syntax("invalid number")
	}
	if i < len(b) && b[i] == '.' {
		i++
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			p.i = i
			return p.syntax("invalid number: digit expected after '.'")
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if i >= len(b) || b[i] < '0' || b[i] > '9' {
			p.i = i
			return p.syntax("invalid number: digit expected in exponent")
		}
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			i++
		}
	}
	p.i = i
	return nil
}

// skip validates and skips any JSON value at p.i.
func (p *parser) skip(depth int) error {
	if depth > maxDepth {
		return p.syntax("nesting deeper than 128 levels")
	}
	switch c := p.peek(); c {
	case '"':
		_, _, err := p.stringSpan()
		return err
	case '{':
		p.i++
		p.ws()
		if p.peek() == '}' {
			p.i++
			return nil
		}
		for {
			p.ws()
			if _, _, err := p.stringSpan(); err != nil {
				return err
			}
			p.ws()
			if p.peek() != ':' {
				return p.syntax("expected ':' after object key")
			}
			p.i++
			p.ws()
			if err := p.skip(depth + 1); err != nil {
				return err
			}
			if more, err := p.sep('}'); !more {
				return err
			}
		}
	case '[':
		p.i++
		p.ws()
		if p.peek() == ']' {
			p.i++
			return nil
		}
		for {
			p.ws()
			if err := p.skip(depth + 1); err != nil {
				return err
			}
			if more, err := p.sep(']'); !more {
				return err
			}
		}
	case 't':
		return p.literal("true")
	case 'f':
		return p.literal("false")
	case 'n':
		return p.literal("null")
	default:
		if c == '-' || (c >= '0' && c <= '9') {
			return p.number()
		}
		return p.syntax("expected a value")
	}
}

func (p *parser) literal(lit string) error {
	if len(p.b)-p.i >= len(lit) && string(p.b[p.i:p.i+len(lit)]) == lit {
		p.i += len(lit)
		return nil
	}
	return p.syntax("invalid literal")
}

// decodeString decodes the raw contents of a JSON string with escapes.
func decodeString(raw []byte) string {
	out := make([]byte, 0, len(raw))
	walkString(raw, func(c byte) bool { out = append(out, c); return true })
	return string(out)
}

// walkString calls f with every decoded byte of a validated raw JSON string
// until f returns false. Lone or invalid surrogates decode to U+FFFD, as
// encoding/json does.
func walkString(raw []byte, f func(byte) bool) {
	for i := 0; i < len(raw); i++ {
		c := raw[i]
		if c != '\\' {
			if !f(c) {
				return
			}
			continue
		}
		i++
		switch raw[i] {
		case 'b':
			if !f('\b') {
				return
			}
		case 'f':
			if !f('\f') {
				return
			}
		case 'n':
			if !f('\n') {
				return
			}
		case 'r':
			if !f('\r') {
				return
			}
		case 't':
			if !f('\t') {
				return
			}
		case 'u':
			r, n := decodeU(raw[i-1:])
			i += n - 2
			var buf [4]byte
			k := encodeRune(buf[:], r)
			for j := 0; j < k; j++ {
				if !f(buf[j]) {
					return
				}
			}
		default: // '"', '\\', '/'
			if !f(raw[i]) {
				return
			}
		}
	}
}

// decodeU decodes a \uXXXX escape (with a following low surrogate if the
// first is a high one) at raw[0] and returns the rune and bytes consumed.
func decodeU(raw []byte) (rune, int) {
	r := hex4(raw[2:6])
	if r >= 0xD800 && r < 0xDC00 {
		if len(raw) >= 12 && raw[6] == '\\' && raw[7] == 'u' {
			r2 := hex4(raw[8:12])
			if r2 >= 0xDC00 && r2 < 0xE000 {
				return (r-0xD800)<<10 + (r2 - 0xDC00) + 0x10000, 12
			}
		}
		return 0xFFFD, 6
	}
	if r >= 0xDC00 && r < 0xE000 {
		return 0xFFFD, 6
	}
	return r, 6
}

func hex4(b []byte) rune {
	return rune(hexVal(b[0])<<12 | hexVal(b[1])<<8 | hexVal(b[2])<<4 | hexVal(b[3]))
}

func encodeRune(p []byte, r rune) int {
	switch {
	case r < 0x80:
		p[0] = byte(r)
		return 1
	case r < 0x800:
		p[0] = 0xC0 | byte(r>>6)
		p[1] = 0x80 | byte(r)&0x3F
		return 2
	case r < 0x10000:
		p[0] = 0xE0 | byte(r>>12)
		p[1] = 0x80 | byte(r>>6)&0x3F
		p[2] = 0x80 | byte(r)&0x3F
		return 3
	default:
		p[0] = 0xF0 | byte(r>>18)
		p[1] = 0x80 | byte(r>>12)&0x3F
		p[2] = 0x80 | byte(r>>6)&0x3F
		p[3] = 0x80 | byte(r)&0x3F
		return 4
	}
}
