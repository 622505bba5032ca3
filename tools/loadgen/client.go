// Package loadgen is inferlb's LLM-aware load generator: it sends the requests
// of a workload (package workload) to an OpenAI-compatible streaming endpoint
// (Envoy, an engine, a real vLLM) under an arrival process, and measures them
// the way inference-perf defines its metrics.
package loadgen

import (
	"context"
	"net/http"

	"github.com/inferlb/inferlb/api/headers"
	"github.com/inferlb/inferlb/internal/llmclient"
	"github.com/inferlb/inferlb/tools/workload"
)

// The load generator sends with the streaming client of internal/llmclient
// (which `inferlb profile` uses too); these are its names here, so that a
// run's configuration and results read as the load generator's.
type (
	// Client sends requests and streams their answers.
	Client = llmclient.Client
	// Result is what one request measured.
	Result = llmclient.Result
	// Outcome classifies a finished request.
	Outcome = llmclient.Outcome
	// HeaderNames are the headers a request's session, priority and region
	// go in.
	HeaderNames = llmclient.HeaderNames
)

// The outcomes of a request.
const (
	OK        = llmclient.OK
	Rejected  = llmclient.Rejected
	Timeout   = llmclient.Timeout
	Failed    = llmclient.Failed
	Cancelled = llmclient.Cancelled
)

// DefaultHeaderNames are inferlb's client-facing names; no region header.
func DefaultHeaderNames() HeaderNames {
	return HeaderNames{Session: headers.SessionID, Priority: headers.Priority}
}

// NewHTTPClient returns an HTTP/1.1 client tuned for load generation
// (llmclient.NewHTTPClient).
func NewHTTPClient(maxConns int) *http.Client { return llmclient.NewHTTPClient(maxConns) }

// do sends the workload request r with c and streams its answer; keepText
// keeps the answer's text in the result (a conversation's next turn repeats
// it).
func do(ctx context.Context, c *Client, r *workload.Request, keepText bool) Result {
	return c.Do(ctx, &llmclient.Request{Messages: r.Messages, Prompt: r.Prompt, MaxTokens: r.MaxTokens,
		SessionID: r.SessionID, Priority: r.Priority, Region: r.Region}, keepText)
}
