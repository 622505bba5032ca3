package extproc

import (
	"fmt"
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/inferlb/inferlb/api/headers"
	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc/body"
)

// The hooks the endpoint-picker mode (extproc/picker) uses: it speaks
// another ext_proc dialect to the gateway's Envoy, and makes the same
// decisions with the same Decider, the same error answers and the same
// metrics as the Server.

// Source is the RoutingPolicy the policy was compiled from (read-only).
func (p *Policy) Source() *policyv1.RoutingPolicy { return p.src }

// RegisterAccessLog adds only the access-log service (Envoy's upstream
// log of failed attempts and its request log) to a gRPC server: the
// endpoint picker serves ext_proc itself.
func (s *Server) RegisterAccessLog(g *grpc.Server) {
	accesslogv3.RegisterAccessLogServiceServer(g, attemptLog{s: s})
}

// BodyLimit is the largest request body accepted, in bytes.
func (s *Server) BodyLimit() int { return s.opt.BodyLimit }

// RejectResponse is the ImmediateResponse that answers a rejected request
// (its status, OpenAI-format error and Retry-After), counted in the
// server's rejection metrics.
func (s *Server) RejectResponse(r *Rejection) *extprocv3.ProcessingResponse {
	return s.reject(&stream{}, r.e)
}

// Unavailable is the 503 of a request that has no endpoint to go to, with
// the reason label metrics count it under.
func (s *Server) Unavailable(reason, message string) *extprocv3.ProcessingResponse {
	return s.reject(&stream{}, &apiError{status: 503, typ: "service_unavailable", code: reason, message: message, retryAfter: 1, reason: reason})
}

// CountDecision counts an admitted or shed decision in the server's
// metrics, as the Server's own mode does.
func (s *Server) CountDecision(dc *Decision) {
	s.m.decisions.WithLabelValues(dc.Class.Name, dc.Priority, dc.Outcome.String()).Inc()
	s.m.keys.WithLabelValues(dc.Class.Name, dc.Key.label()).Inc()
}

// RequestHead is what a request's headers say, read as the Server reads
// them.
type RequestHead struct {
	Method, Path string
	Kind         body.Kind
	// ContentLength is -1 when absent.
	ContentLength int
	// In holds the headers' part of the decision's input (Body unset).
	In Input
	// Remove are client-supplied headers only inferlb or Envoy may set.
	Remove []string
}

// ReadHead reads the request headers. When the request is not a
// completion (another path or method, or a body over the limit), answer is
// the ImmediateResponse that ends it (GET /v1/models is answered from the
// policy, as in the Server's mode).
func (s *Server) ReadHead(h *extprocv3.HttpHeaders) (head RequestHead, answer *extprocv3.ProcessingResponse) {
	return s.readHead(&stream{}, h)
}

// readHead is ReadHead for both modes: the ext_proc service's stream st
// records the answer (the endpoint picker passes a stream of its own).
func (s *Server) readHead(st *stream, h *extprocv3.HttpHeaders) (head RequestHead, answer *extprocv3.ProcessingResponse) {
	head.ContentLength = -1
	clientHdr := s.dec.ClientHeader()
	for _, hv := range h.GetHeaders().GetHeaders() {
		k := hv.Key
		switch {
		case clientHdr != "" && k == clientHdr:
			head.In.Client = headerValue(hv)
		case k == ":method":
			head.Method = headerValue(hv)
		case k == ":path":
			head.Path = headerValue(hv)
		case k == "content-length":
			if n, err := strconv.Atoi(headerValue(hv)); err == nil {
				head.ContentLength = n
			}
		case k == headers.SessionID:
			head.In.Session = headerValue(hv)
		case k == headers.Priority:
			head.In.Priority = headerValue(hv)
		case k == headers.Residency:
			head.In.Residency = headerValue(hv)
		case isUntrusted(k):
			head.Remove = append(head.Remove, k)
		}
	}
	path := head.Path
	if q := strings.IndexByte(path, '?'); q >= 0 {
		path = path[:q]
	}
	switch path {
	case "/v1/chat/completions":
		head.Kind = body.Chat
	case "/v1/completions":
		head.Kind = body.Completion
	default:
		if path == modelsPath || strings.HasPrefix(path, modelsPath+"/") {
			return head, s.onModels(st, head.Method, path)
		}
		if what, ok := unrouted[path]; ok {
			return head, s.reject(st, unroutedError(head.Method, path, what))
		}
		return head, s.reject(st, &apiError{status: 404, typ: "invalid_request_error", code: "unknown_url",
			message: fmt.Sprintf("Unknown request URL: %s %s. inferlb routes POST /v1/chat/completions and POST /v1/completions, and answers GET /v1/models.", head.Method, path), reason: "unknown_path"})
	}
	head.In.Kind = head.Kind
	if head.Method != "POST" {
		return head, s.reject(st, &apiError{status: 405, typ: "invalid_request_error", code: "method_not_allowed",
			message: fmt.Sprintf("Method %s not allowed for %s; use POST.", head.Method, path), reason: "method"})
	}
	if head.ContentLength > s.opt.BodyLimit {
		return head, s.reject(st, tooLarge(head.ContentLength, s.opt.BodyLimit))
	}
	if h.GetEndOfStream() {
		return head, s.reject(st, badRequest("missing_body", "", "The request has no body; expected a JSON object."))
	}
	return head, nil
}

// TooLarge is the 413 of a body of n bytes over the limit.
func (s *Server) TooLarge(n int) *extprocv3.ProcessingResponse {
	return s.reject(&stream{}, tooLarge(n, s.opt.BodyLimit))
}

// SetHeader is a header mutation that sets k to v (overwriting a client's).
func SetHeader(k, v string) *corev3.HeaderValueOption { return setHeader(k, v) }
