// Package llmclient is a streaming client of OpenAI-compatible inference
// servers (Envoy in front of engines, an engine, a real vLLM or SGLang): it
// sends one chat or completion request, reads its SSE stream and measures it
// the way inference-perf defines its metrics (TTFT, inter-token latencies,
// end to end, tokens from the usage block). The load generator
// (tools/loadgen) sends its workloads with it, and `inferlb profile` its
// load sweep.
package llmclient

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/inferlb/inferlb/internal/tokens"
)

// Request is one inference request as the client sends it.
type Request struct {
	// Messages is the chat prompt (/v1/chat/completions). Exactly one of
	// Messages and Prompt is set.
	Messages []tokens.Message
	// Prompt is a plain-text completion prompt (/v1/completions).
	Prompt string
	// MaxTokens is the number of output tokens to ask for (0: the server's
	// default).
	MaxTokens int
	// SessionID, Priority and Region go in the headers Client.Headers name
	// (empty: no header).
	SessionID, Priority, Region string
}

// HeaderNames are the request headers the client sets from a request's
// session, priority and region. An empty name sends no header.
type HeaderNames struct {
	Session  string
	Priority string
	// Region carries the request's source region. Set it only when the
	// target is an engine (or engine simulator) directly: behind inferlb the
	// region is the frontend's, and ext_proc strips client-sent x-inferlb-*
	// headers.
	Region string
}

// Client sends requests to an OpenAI-compatible server and streams their
// answers.
type Client struct {
	// HTTP is the client for https targets, and for http targets when
	// NetHTTP is set; NewHTTPClient's by default.
	HTTP *http.Client
	// NetHTTP sends plain-http requests through HTTP too. By default they
	// take a direct HTTP/1.1 path (keep-alive connections, up to MaxIdleConns
	// idle per host) on which the requesting goroutine itself writes the
	// request and reads the stream: no goroutine hand-offs inside the
	// measured time, so a lower floor on a busy machine.
	NetHTTP bool
	// MaxIdleConns bounds the direct path's idle connections per host
	// (default 4096).
	MaxIdleConns int
	// BaseURL is the server's base URL (e.g. http://127.0.0.1:8000); the
	// client appends /v1/chat/completions or /v1/completions.
	BaseURL string
	// RegionURLs route requests of a source region to that region's frontend
	// (optional; BaseURL serves the rest).
	RegionURLs map[string]string
	// Model is the request's "model".
	Model string
	// Headers name the session, priority and region headers.
	Headers HeaderNames
	// ExtraHeaders are sent on every request.
	ExtraHeaders http.Header
	// IgnoreEOS asks vLLM to generate exactly max_tokens ("ignore_eos": true),
	// so output lengths are the requests'.
	IgnoreEOS bool
	// Timeout bounds one request from send to the end of its stream (0: none).
	Timeout time.Duration

	rawOnce sync.Once
	raw     *rawPool
}

func (c *Client) rawPool() *rawPool {
	c.rawOnce.Do(func() { c.raw = newRawPool(c.MaxIdleConns) })
	return c.raw
}

// CloseIdleConnections closes the client's idle keep-alive connections.
func (c *Client) CloseIdleConnections() {
	c.rawPool().CloseIdle()
	if c.HTTP != nil {
		c.HTTP.CloseIdleConnections()
	}
}

// NewHTTPClient returns an HTTP/1.1 client tuned for load generation: plenty
// of idle keep-alive connections per host (so a high request rate reuses
// connections instead of opening new ones), no compression (a gzipped SSE
// stream would be buffered), no overall timeout (streams are bounded per
// request by Client.Timeout).
func NewHTTPClient(maxConns int) *http.Client {
	if maxConns <= 0 {
		maxConns = 4096
	}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          maxConns,
		MaxIdleConnsPerHost:   maxConns,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
		ResponseHeaderTimeout: 0,
		WriteBufferSize:       64 << 10,
		ReadBufferSize:        64 << 10,
	}
	return &http.Client{Transport: tr}
}

// Outcome classifies a finished request.
type Outcome int

const (
	// OK: a complete stream ending in [DONE].
	OK Outcome = iota
	// Rejected: HTTP 429 (load shedding).
	Rejected
	// Timeout: the request's own deadline passed.
	Timeout
	// Failed: any other error (status, transport, malformed or cut stream).
	Failed
	// Cancelled: the run ended (or was interrupted) while it was in flight.
	Cancelled
)

func (o Outcome) String() string {
	return [...]string{"ok", "rejected", "timeout", "failed", "cancelled"}[o]
}

// Result is what one request measured. Durations are from Sent.
type Result struct {
	Outcome Outcome
	Status  int   // HTTP status (0 if none)
	Err     error // for Failed, Timeout, Rejected
	Sent    time.Time
	// TTFT is the time to the first chunk with non-empty text (0 if none).
	TTFT time.Duration
	// E2E is the time to the end of the stream.
	E2E time.Duration
	// ITLs are the gaps between consecutive text chunks, one per token: a
	// chunk carrying k tokens contributes k gaps of (gap/k).
	ITLs []time.Duration
	// OutputTokens from usage, else counted from the text by the token rule.
	OutputTokens int
	// PromptTokens and CachedTokens from usage (HasUsage); CachedTokens from
	// usage.prompt_tokens_details.cached_tokens.
	PromptTokens, CachedTokens int
	HasUsage                   bool
	// Text is the streamed answer (kept only when asked for).
	Text string
}

// TPOT is (E2E − TTFT)/(OutputTokens − 1), and ok is false for fewer than two
// output tokens.
func (r *Result) TPOT() (time.Duration, bool) {
	if r.OutputTokens < 2 || r.TTFT <= 0 {
		return 0, false
	}
	return (r.E2E - r.TTFT) / time.Duration(r.OutputTokens-1), true
}

// ChatMessage is one message of a chat request's body.
type ChatMessage struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// StreamOptions asks for the usage block at the end of the stream.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// APIRequest is the JSON body the client sends (and a test server reads).
type APIRequest struct {
	Model         string        `json:"model"`
	Messages      []ChatMessage `json:"messages,omitempty"`
	Prompt        *string       `json:"prompt,omitempty"`
	MaxTokens     int           `json:"max_tokens,omitempty"`
	Stream        bool          `json:"stream"`
	StreamOptions StreamOptions `json:"stream_options"`
	IgnoreEOS     bool          `json:"ignore_eos,omitempty"`
}

type apiChunk struct {
	Choices []struct {
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
		Text string `json:"text"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// Body returns the JSON body the client sends for r.
func (c *Client) Body(r *Request) ([]byte, string, error) {
	ar := APIRequest{Model: c.Model, MaxTokens: r.MaxTokens, Stream: true, StreamOptions: StreamOptions{true}, IgnoreEOS: c.IgnoreEOS}
	path := "/v1/chat/completions"
	if r.Messages != nil {
		ar.Messages = make([]ChatMessage, len(r.Messages))
		for i, m := range r.Messages {
			ar.Messages[i] = ChatMessage{m.Role, m.Content}
		}
	} else {
		p := r.Prompt
		ar.Prompt = &p
		path = "/v1/completions"
	}
	b, err := json.Marshal(&ar)
	return b, path, err
}

// Do sends r and streams its answer; keepText keeps the answer's text in the
// result. Do never returns an error: failures are classified in the result.
// A cancelled ctx gives Outcome Cancelled.
func (c *Client) Do(ctx context.Context, r *Request, keepText bool) Result {
	body, path, err := c.Body(r)
	if err != nil {
		return Result{Outcome: Failed, Err: err, Sent: time.Now()}
	}
	base := c.BaseURL
	if u, ok := c.RegionURLs[r.Region]; ok && r.Region != "" {
		base = u
	}
	rctx := ctx
	if c.Timeout > 0 {
		var cancel context.CancelFunc
		rctx, cancel = context.WithTimeout(ctx, c.Timeout)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, strings.TrimRight(base, "/")+path, bytes.NewReader(body))
	if err != nil {
		return Result{Outcome: Failed, Err: err, Sent: time.Now()}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	for k, vs := range c.ExtraHeaders {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	setHeader(req, c.Headers.Session, r.SessionID)
	setHeader(req, c.Headers.Priority, r.Priority)
	setHeader(req, c.Headers.Region, r.Region)
	hc := c.HTTP
	if hc == nil {
		hc = http.DefaultClient
	}
	direct := !c.NetHTTP && req.URL.Scheme == "http"
	pool := c.rawPool()

	res := Result{Sent: time.Now()}
	var resp *http.Response
	if direct {
		resp, err = pool.do(req, body)
	} else {
		resp, err = hc.Do(req)
	}
	if err != nil {
		return c.fail(ctx, rctx, res, err)
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
		res.E2E = time.Since(res.Sent)
		res.Err = fmt.Errorf("HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
		res.Outcome = Failed
		if resp.StatusCode == http.StatusTooManyRequests {
			res.Outcome = Rejected
		}
		return res
	}
	err = c.stream(resp.Body, &res, keepText)
	res.E2E = time.Since(res.Sent)
	if err != nil {
		return c.fail(ctx, rctx, res, err)
	}
	// Read to the end of the body (past [DONE], the chunked terminator), or
	// the transport closes the connection instead of reusing it.
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<20))
	return res
}

func setHeader(req *http.Request, name, value string) {
	if name != "" && value != "" {
		req.Header.Set(name, value)
	}
}

func (c *Client) fail(ctx, rctx context.Context, res Result, err error) Result {
	if res.E2E == 0 {
		res.E2E = time.Since(res.Sent)
	}
	res.Err = err
	switch {
	case ctx.Err() != nil:
		res.Outcome = Cancelled
	case rctx.Err() != nil || errors.Is(err, context.DeadlineExceeded):
		res.Outcome = Timeout
		res.Err = fmt.Errorf("timeout after %v: %w", c.Timeout, err)
	default:
		res.Outcome = Failed
	}
	return res
}

var (
	dataPrefix = []byte("data:")
	doneMarker = []byte("[DONE]")
)

// sseReaders recycles the 64 KB line buffers of stream: allocating one per
// request was nearly all of the generator's garbage (64 KB of 72 KB per
// request), and the garbage collector it drove was the largest part of the
// generator's own TTFT tail at high request rates.
var sseReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 64<<10) }}

// stream reads an SSE body until data: [DONE].
func (c *Client) stream(body io.Reader, res *Result, keepText bool) error {
	br := sseReaders.Get().(*bufio.Reader)
	br.Reset(body)
	defer func() {
		br.Reset(nil) // drop the body before pooling
		sseReaders.Put(br)
	}()
	var text strings.Builder
	var last time.Time
	counted := 0
	for {
		line, err := br.ReadSlice('\n')
		now := time.Now()
		if err == bufio.ErrBufferFull {
			// A chunk longer than the buffer: gather it whole.
			long := append([]byte(nil), line...)
			for err == bufio.ErrBufferFull {
				line, err = br.ReadSlice('\n')
				long = append(long, line...)
			}
			line = long
		}
		if err != nil {
			if err == io.EOF {
				return errors.New("stream ended before data: [DONE]")
			}
			return err
		}
		line = bytes.TrimRight(line, "\r\n")
		if !bytes.HasPrefix(line, dataPrefix) {
			continue // blank separators, comments, event: lines
		}
		data := bytes.TrimSpace(line[len(dataPrefix):])
		if bytes.Equal(data, doneMarker) {
			break
		}
		var ch apiChunk
		if err := json.Unmarshal(data, &ch); err != nil {
			return fmt.Errorf("malformed SSE chunk %.80q: %w", data, err)
		}
		if len(ch.Error) > 0 && string(ch.Error) != "null" {
			return fmt.Errorf("error in stream: %s", ch.Error)
		}
		var delta string
		for _, choice := range ch.Choices {
			delta += choice.Delta.Content + choice.Text
		}
		if delta != "" {
			k := max(tokens.Count(delta), 1)
			counted += k
			if res.TTFT == 0 {
				res.TTFT = max(now.Sub(res.Sent), 1)
			} else {
				gap := now.Sub(last) / time.Duration(k)
				for range k {
					res.ITLs = append(res.ITLs, gap)
				}
			}
			last = now
			if keepText {
				text.WriteString(delta)
			}
		}
		if u := ch.Usage; u != nil {
			res.HasUsage = true
			res.PromptTokens = u.PromptTokens
			res.OutputTokens = u.CompletionTokens
			if u.PromptTokensDetails != nil {
				res.CachedTokens = u.PromptTokensDetails.CachedTokens
			}
		}
	}
	if !res.HasUsage {
		res.OutputTokens = counted
	}
	res.Text = text.String()
	return nil
}
