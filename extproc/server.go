// Package extproc is inferlb's Envoy external processor: it sits in each
// frontend Envoy's request path and decides, from local state only, which
// eligibility class (Envoy cluster) serves a request, the cache-affinity key
// the route hashes on, whether the request is admitted or shed, and how many
// retries it may use. It is not in the response path: once the decision is
// sent it ends its stream, and learns from Envoy's access logs which engine
// served, the status and the timing; it reports that evidence and the demand
// it saw to the control plane. See docs/extproc.md.
//
// The hot path reads an immutable Policy through an atomic pointer; a new
// RoutingPolicy from the control plane (package extproc/cpclient)
// replaces it whole.
package extproc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	accesslogv3 "github.com/envoyproxy/go-control-plane/envoy/service/accesslog/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/inferlb/inferlb/api/headers"
	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc/body"
	"github.com/inferlb/inferlb/internal/tokens/hf"
)

// DefaultBodyLimit is the largest request body accepted (and the value the
// bootstrap gives Envoy's buffer limits): 4 MiB, room for a ~1M-character
// prompt. Larger bodies get 413.
const DefaultBodyLimit = 4 << 20

// Options configure a Server.
type Options struct {
	// BodyLimit is the largest request body in bytes (default DefaultBodyLimit).
	BodyLimit int
	// Logger (default slog.Default()).
	Logger *slog.Logger
	// Registry receives the server's metrics (default: a new registry).
	Registry *prometheus.Registry
	// Now is the clock (default time.Now).
	Now func() time.Time
	// MaxRequestAge bounds how long an admitted request holds its in-flight
	// slot without Envoy's access log reporting its end (default
	// DefaultMaxRequestAge).
	MaxRequestAge time.Duration
	// ClientPriorities, if set, limits the priorities each client may use.
	ClientPriorities *ClientPriorities
	// Tokenizers are the models' tokenizers by SHA-256 (the policy names a
	// class's by digest); a class whose tokenizer is not here is bounded by
	// bytes alone.
	Tokenizers map[string]*hf.Tokenizer
	// Admission tunes local admission and the retry budget (nil:
	// DefaultAdmission); New does not validate it (Admission.Validate).
	Admission *Admission
	// MaxMessages bounds a chat request's messages (0: DefaultMaxMessages;
	// negative: no bound but the context's).
	MaxMessages int
	// MaxBodyMemory bounds the bytes of request bodies in flight (declared
	// by content-length from the request headers on, else from the body's
	// arrival, until the decision): a request that would take them past it
	// is answered 503 at once (default DefaultMaxBodyMemory).
	MaxBodyMemory int64
	// PrefillPlacement routes a request by its key to the engine of its
	// home's region where its first token is predicted soonest, when that
	// saves more than PlacementSlack (placement.go).
	PrefillPlacement bool
	// IdlePlacement routes a request by its key to an engine of its
	// home's region with none of this service's requests in flight, or a
	// faster one with fewer, when its first token is predicted sooner there
	// by more than PlacementSlack (placement.go). `inferlb extproc` turns
	// it on by default; the zero Options route by the key alone.
	IdlePlacement bool
	// CachePlacement places each request on the engine of the plan where
	// its first token is predicted soonest, its cached prefix there
	// counted, within each engine's budget of the plan's shares
	// (cacheplace.go); it supersedes the other two.
	CachePlacement bool
	// UploadTimeout is how long a streamed request body (Envoy's STREAMED
	// body mode, sent without waiting for the headers' answer) may take to
	// arrive: one not whole after UploadGrace has Envoy's message timer
	// extended to UploadTimeout (override_message_timeout; Envoy honours it
	// up to its max_message_timeout). Default DefaultUploadTimeout.
	UploadTimeout time.Duration
	// LargeBodyLane is the bytes of large request bodies (declared
	// content-length at least LargeBody) that Envoy may be sending to the
	// service, or the service parsing, at once, when Envoy buffers them
	// (BUFFERED body mode: it sends a body only after the headers'
	// answer), while small requests come beside them (one in the last
	// SmallRecent). A large body's headers are then answered when it fits
	// (one body always does), or after LaneWait at the latest; with no
	// small request to protect they are answered at once. Small bodies
	// never wait. `inferlb extproc` sets DefaultLargeBodyLane; 0: no lane.
	LargeBodyLane int64
	// OnBodyBurst, if set, is called when the request-body bytes in
	// flight rise to BodyBurst (not again until they have fallen below
	// it): the service's adaptive-procs controller leaves one P at once.
	// It must not block.
	OnBodyBurst func()
}

// UploadGrace is how long a streamed request body may take to arrive
// within Envoy's message_timeout (which then times the whole upload, the
// headers' answer waiting for the body's end). Envoy sends a body a few
// microseconds after its headers when the client has sent it; a body not
// whole by then is a slow client's, and its upload is handed to
// UploadTimeout. Envoy's message_timeout must be longer than this.
const UploadGrace = 100 * time.Millisecond

// DefaultUploadTimeout is the default Options.UploadTimeout: the
// bootstrap's request_timeout (15 s, by which Envoy itself answers 408
// to a request not received) plus 5 s, so that Envoy's 408 comes first.
// The bootstrap's max_message_timeout is the same.
const DefaultUploadTimeout = 20 * time.Second

// BodyBurst is the request-body bytes in flight (held or declared) that
// make a burst: more than one request at a time brings (8–220 KB each),
// and 3 ms or more of one P's parsing (hostile bodies of tiny messages
// parse at about 330 MB/s).
const BodyBurst = 1 << 20

// LargeBody is the declared size from which a buffered request body takes
// the large-body lane (Options.LargeBodyLane): 64 KiB, a prompt of about
// 16,000 tokens, above the common chat request (a few KB).
const LargeBody = 64 << 10

// DefaultLargeBodyLane is `inferlb extproc`'s --large-body-lane: four
// bodies of 256 KiB, about 60,000 tokens of prompt each.
const DefaultLargeBodyLane = 1 << 20

// SmallRecent is how long after a small request's headers (declared
// content-length under LargeBody) large bodies keep to the lane: a small
// request is exposed to a wave of large ones from its headers to its
// first token, which at the rates worth protecting (one a second or
// more) this covers; with none in that time, large bodies are all there
// is, and the lane would cost their throughput for no one.
const SmallRecent = time.Second

// LaneWait is the longest a large body's headers wait for the lane: well
// under Envoy's message_timeout (the bootstrap's default 1 s), which times
// the headers' answer. A body that waited this long goes on without it.
const LaneWait = 250 * time.Millisecond

// DefaultMaxBodyMemory is the default bound on request-body bytes in
// flight: 128 bodies of the default limit. Well above what a frontend
// holds in normal load (150 concurrent 220 KB bodies are 33 MB), it caps
// what a flood of large bodies can make the process hold.
const DefaultMaxBodyMemory = 512 << 20

// Server is the ext_proc gRPC service.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	opt Options
	log *slog.Logger
	m   *metrics
	// dec makes the per-request decisions (decide.go); the server adds the
	// ext_proc protocol, the header mutations and the metrics.
	dec *Decider
	// reqs holds the admitted requests until Envoy's request log reports
	// their end (requests.go).
	reqs *requestTable
	// bodyMem is the bytes of request bodies in flight (MaxBodyMemory).
	bodyMem atomic.Int64
	// extendUpload asks Envoy to wait UploadTimeout for a slow upload.
	extendUpload *extprocv3.ProcessingResponse
	// lane admits large buffered bodies a few at a time (LargeBodyLane;
	// nil: no lane).
	lane *semaphore.Weighted
	// lastSmall is when the latest small request's headers came
	// (SmallRecent): nanoseconds since epoch, the service's start, on
	// the monotonic clock (a step of the wall clock does not move it);
	// -SmallRecent before the first.
	lastSmall atomic.Int64
	epoch     time.Time
	// laneWait is LaneWait (tests lengthen it).
	laneWait time.Duration
}

// extendTimeout is the answer that restarts Envoy's message timer with d.
func extendTimeout(d time.Duration) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{OverrideMessageTimeout: durationpb.New(d)}
}

// RunMemoryTrim returns memory to the OS after bursts (MemoryTrim) until
// ctx ends: resident memory above idle plus twice the body bytes in flight
// is given back (idle 0: never).
func (s *Server) RunMemoryTrim(ctx context.Context, idle int64) {
	t := &MemoryTrim{Idle: idle, InFlight: s.BodyBytesInFlight, OnTrim: func(before, after int64) {
		s.m.memoryTrims.Inc()
		s.log.Debug("memory returned to the OS", "rss_before", before, "rss_after", after)
	}}
	t.Run(ctx)
}

// BodyBytesInFlight is the bytes of request bodies the server holds or has
// been promised (content-length) and not yet decided on.
func (s *Server) BodyBytesInFlight() int64 { return s.bodyMem.Load() }

// New returns a Server without a policy: until SetPolicy succeeds every
// request is answered 503.
func New(opt Options) *Server {
	if opt.BodyLimit <= 0 {
		opt.BodyLimit = DefaultBodyLimit
	}
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.Registry == nil {
		opt.Registry = prometheus.NewRegistry()
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.MaxBodyMemory <= 0 {
		opt.MaxBodyMemory = DefaultMaxBodyMemory
	}
	if opt.UploadTimeout <= 0 {
		opt.UploadTimeout = DefaultUploadTimeout
	}
	s := &Server{opt: opt, log: opt.Logger, m: newMetrics(opt.Registry), dec: NewDecider(opt.Now()),
		reqs: newRequestTable(opt.MaxRequestAge, opt.Now()), extendUpload: extendTimeout(opt.UploadTimeout)}
	opt.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "inferlb_extproc_body_bytes_in_flight",
		Help: "Request-body bytes held or promised (content-length) and not yet decided on; --max-body-memory bounds it."},
		func() float64 { return float64(s.bodyMem.Load()) }))
	if opt.LargeBodyLane > 0 {
		s.lane = semaphore.NewWeighted(opt.LargeBodyLane)
		s.epoch, s.laneWait = opt.Now(), LaneWait
		s.lastSmall.Store(-int64(SmallRecent))
	}
	s.dec.SetClientPriorities(opt.ClientPriorities)
	if opt.MaxMessages != 0 {
		s.dec.SetMaxMessages(opt.MaxMessages)
	}
	s.dec.SetTokenizers(opt.Tokenizers)
	s.dec.SetPrefillPlacement(opt.PrefillPlacement)
	s.dec.SetIdlePlacement(opt.IdlePlacement)
	s.dec.SetCachePlacement(opt.CachePlacement)
	if opt.Admission != nil {
		s.dec.SetAdmission(*opt.Admission)
	}
	return s
}

// Register adds the ext_proc service and the access-log service (Envoy's
// upstream log of failed attempts and its request log) to a gRPC server.
func (s *Server) Register(g *grpc.Server) {
	extprocv3.RegisterExternalProcessorServer(g, s)
	accesslogv3.RegisterAccessLogServiceServer(g, attemptLog{s: s})
}

// Registry returns the metrics registry.
func (s *Server) Registry() *prometheus.Registry { return s.opt.Registry }

// Observer returns the demand and evidence accumulator (the reports client
// flushes it).
func (s *Server) Observer() *Observer { return s.dec.Observer() }

// Decider returns the server's decision logic.
func (s *Server) Decider() *Decider { return s.dec }

// Policy returns the policy in force (nil before the first).
func (s *Server) Policy() *Policy { return s.dec.Policy() }

// SetPolicy compiles and installs a RoutingPolicy. On error the old policy
// stays in force.
func (s *Server) SetPolicy(rp *policyv1.RoutingPolicy) error {
	p, _, err := s.dec.SetPolicy(rp)
	if err != nil {
		s.m.policyUpdates.WithLabelValues("rejected").Inc()
		return err
	}
	s.m.policyUpdates.WithLabelValues("applied").Inc()
	s.m.policyVersion.Set(VersionHash(p.Version))
	if cp := s.dec.clients.Load(); cp != nil {
		var unknown []string
		for _, n := range cp.Names() {
			if _, ok := p.priorities[n]; !ok {
				unknown = append(unknown, n)
			}
		}
		if len(unknown) > 0 {
			s.log.Warn("the client priorities name priorities this policy does not have", "unknown", unknown, "known", p.priorityNames())
		}
	}
	s.log.Info("routing policy applied", "version", p.Version, "classes", len(p.classes), "node", p.NodeID)
	for _, c := range p.classes {
		if c.TokenizerSHA256 != "" && c.tokenizer == nil {
			s.log.Warn("class's tokenizer not loaded: its context limit is judged by the bytes bound (load the model's tokenizer.json with --tokenizer)",
				"class", c.Name, "model", c.Model, "sha256", c.TokenizerSHA256)
		}
	}
	return nil
}

// phase is where a request is in its ext_proc stream.
type phase uint8

const (
	phaseRequestHeaders phase = iota // waiting for request headers
	phaseRequestBody                 // headers seen, waiting for the body (buffered, or its streamed chunks)
	phaseRouted                      // decision sent; the stream ends
	phaseObserved                    // response headers seen (only if Envoy sends them)
	phaseAnswered                    // an ImmediateResponse ended the request
)

func (p phase) String() string {
	return [...]string{"request_headers", "request_body", "routed", "observed", "answered"}[p]
}

// stream is one HTTP request's state.
type stream struct {
	phase   phase
	start   time.Time
	kind    body.Kind
	remove  []string // client-supplied headers to strip
	session string
	prioHdr string
	resid   string
	client  string
	// dc is the decision; id the request's id once it was admitted (its
	// entry in the request table holds the decision from then on).
	dc Decision
	id string
	// bodyMem is what the stream counts in Server.bodyMem.
	bodyMem int64
	// answer is the decision's answer once made: sent as a *decision, so
	// that Codec encodes it directly.
	answer *decision

	// A streamed body (Envoy's STREAMED mode with
	// send_body_without_waiting_for_header_response) comes in chunks right
	// after the headers, whose answer waits for the body's end: it carries
	// the decision, the route (Envoy has not routed the request yet), and
	// each chunk's answer follows it.
	streamed bool
	// chunks is the streamed body's chunks received (each answered after
	// the decision); held its bytes so far, from the buffer pools (nil
	// until a chunk that does not end the body); declared the
	// content-length (0: none); trailers that the body ended with trailers
	// (answered last).
	chunks   int
	held     *[]byte
	declared int
	trailers bool
	// proveAt is the held size at which the prefix is next parsed for a
	// limit it proves, a doubling of proveFrom (0: proveFrom itself).
	proveAt int
	// upload extends Envoy's message timer for a slow upload
	// (UploadGrace); it stays with the pooled stream, armed only while a
	// streamed body arrives.
	upload *uploadTimer
}

// uploadTimer sends, from its own goroutine, the message that extends
// Envoy's timer for a streamed body not whole after UploadGrace. A gRPC
// stream takes one sender at a time: mu serializes it with the stream's
// own answers.
type uploadTimer struct {
	t     *time.Timer
	armed bool // the stream's goroutine only
	mu    sync.Mutex
	// Guarded by mu.
	srv   grpc.ServerStream
	msg   *extprocv3.ProcessingResponse
	count prometheus.Counter // slow uploads
	off   bool               // the stream answered (or ended): the timer must not send
}

func (u *uploadTimer) fire() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.off {
		return
	}
	u.off = true
	u.count.Inc()
	// An error ends the stream's Recv too; nothing to do here.
	_ = u.srv.SendMsg(u.msg)
}

// armUpload starts the timer for the streamed body of a request on srv.
func (st *stream) armUpload(srv grpc.ServerStream, msg *extprocv3.ProcessingResponse, count prometheus.Counter) {
	u := st.upload
	if u == nil {
		u = &uploadTimer{}
		st.upload = u
	}
	// Set before the timer starts (a stopped timer's goroutine no longer
	// runs: disarmUpload drops any other).
	u.mu.Lock()
	u.srv, u.msg, u.count, u.off = srv, msg, count, false
	u.mu.Unlock()
	u.armed = true
	if u.t == nil {
		u.t = time.AfterFunc(UploadGrace, u.fire)
	} else {
		u.t.Reset(UploadGrace)
	}
}

// disarmUpload stops the upload timer before the stream's goroutine sends
// (or ends). A timer that fired stays with no stream: its goroutine may
// still be about to run.
func (st *stream) disarmUpload() {
	u := st.upload
	if u == nil || !u.armed {
		return
	}
	u.armed = false
	stopped := u.t.Stop()
	u.mu.Lock()
	u.off, u.srv = true, nil
	u.mu.Unlock()
	if !stopped {
		st.upload = nil
	}
}

// streams recycles the per-request state: about 1.7 KB (the decision
// holds the prefix chain), allocated per request otherwise.
var streams = sync.Pool{New: func() any { return &stream{} }}

// Process serves one ext_proc stream: one HTTP request's decision.
//
// Once the decision is sent (the request routed, or answered with an error)
// the stream ends with status OK: Envoy then goes on without ext_proc, so
// nothing that happens to this process afterwards (a crash, a restart) can
// touch the request, in either failure mode. How the request ended comes
// from Envoy's request access log (requestTable).
func (s *Server) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	s.m.streams.Inc()
	defer s.m.streams.Dec()
	st := streams.Get().(*stream)
	defer func() {
		// Nothing holds the stream once Process returns: the answers that
		// alias it (its strip list) were encoded by Send.
		st.disarmUpload()
		st.releaseHeld()
		rm, up := st.remove[:0], st.upload
		*st = stream{remove: rm, upload: up}
		streams.Put(st)
	}()
	// One message at a time, its bytes from the codec's pools (received),
	// given back once its step is done: nothing a step keeps aliases them.
	var laneHeld int64 // bytes of the large-body lane this stream holds
	defer func() {
		if laneHeld > 0 {
			s.lane.Release(laneHeld)
		}
	}()
	in := &received{}
	defer in.release()
	defer s.holdBody(st, 0)
	for {
		in.release()
		if err := srv.RecvMsg(in); err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		}
		resp, err := s.step(st, &in.ProcessingRequest)
		if err != nil {
			s.log.Warn("ext_proc protocol error", "phase", st.phase.String(), "err", err)
			return status.Error(codes.FailedPrecondition, err.Error())
		}
		if st.streamed && st.phase == phaseRequestBody && (st.upload == nil || !st.upload.armed) {
			st.armUpload(srv, s.extendUpload, s.m.slowUploads)
		}
		if resp == nil { // no answer yet (a streamed body's chunk, observability mode)
			continue
		}
		st.disarmUpload()
		var msg any = resp
		if st.answer != nil && resp == &st.answer.ProcessingResponse {
			msg = st.answer
		}
		if resp == respContinueHeaders && s.lane != nil && st.declared >= LargeBody {
			// Envoy sends a buffered body on this answer: a large one
			// waits for room, so that a wave of them reaches the service
			// a few at a time instead of taking both CPUs from the small
			// requests beside it (docs/extproc.md).
			laneHeld = s.enterLane(srv.Context(), int64(st.declared))
		}
		if err := srv.SendMsg(msg); err != nil {
			// Envoy never got the decision (and fails or bypasses the
			// request): it will not log it as ours.
			s.abandon(st.id)
			return err
		}
		if st.phase == phaseRouted && st.streamed {
			// The streamed body's chunks, answered in order after the
			// headers (grpc-go writes the answers queued together in one
			// write).
			for ; st.chunks > 0; st.chunks-- {
				if err := srv.SendMsg(respContinueBody); err != nil {
					return err
				}
			}
			if st.trailers {
				if err := srv.SendMsg(respContinueTrailers); err != nil {
					return err
				}
			}
		}
		if st.phase == phaseRouted || st.phase == phaseAnswered {
			return nil
		}
	}
}

// enterLane waits until n bytes (at most the lane's size) fit in the
// large-body lane, ctx ends, or LaneWait passes, and returns the bytes it
// holds (0: it goes on without the lane). With no small request in the
// last SmallRecent it does not wait: a body that does not fit goes on
// beside the lane (counted in laneBypassed).
func (s *Server) enterLane(ctx context.Context, n int64) int64 {
	n = min(n, s.opt.LargeBodyLane)
	if s.lane.TryAcquire(n) {
		s.m.laneWaits.Observe(0)
		return n
	}
	if !s.smallRecent() {
		s.m.laneBypassed.Inc()
		return 0
	}
	t0 := time.Now()
	ctx, cancel := context.WithTimeout(ctx, s.laneWait)
	defer cancel()
	err := s.lane.Acquire(ctx, n)
	s.m.laneWaits.Observe(time.Since(t0).Seconds())
	if err != nil {
		s.m.laneTimeouts.Inc()
		return 0
	}
	return n
}

// smallRecent says whether a small request's headers came in the last
// SmallRecent.
func (s *Server) smallRecent() bool {
	return int64(s.opt.Now().Sub(s.epoch))-s.lastSmall.Load() < int64(SmallRecent)
}

// abandon forgets an admitted request whose end will not be logged.
func (s *Server) abandon(id string) {
	if r := s.reqs.take(id, s.opt.Now()); r != nil {
		s.release(r)
	}
}

// release gives back what an admitted request held.
func (s *Server) release(r *tracked) {
	s.dec.Release(&r.dc)
	s.m.inflight.WithLabelValues(r.dc.Class.Name).Dec()
}

// step advances the state machine by one message.
func (s *Server) step(st *stream, req *extprocv3.ProcessingRequest) (*extprocv3.ProcessingResponse, error) {
	if req.GetObservabilityMode() {
		return nil, nil
	}
	switch v := req.Request.(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		if st.phase != phaseRequestHeaders {
			return nil, fmt.Errorf("request headers in phase %s", st.phase)
		}
		if pc := req.GetProtocolConfig(); pc != nil {
			switch pc.GetRequestBodyMode() {
			case extprocfilterv3.ProcessingMode_BUFFERED:
			case extprocfilterv3.ProcessingMode_STREAMED:
				if !pc.GetSendBodyWithoutWaitingForHeaderResponse() {
					return nil, errors.New(errBodyModes + " (STREAMED without send_body_without_waiting_for_header_response: the headers' answer, which carries the route, would have to go before the body)")
				}
				st.streamed = true
			default:
				return nil, fmt.Errorf("%s (request_body_mode %s)", errBodyModes, pc.GetRequestBodyMode())
			}
		}
		return s.onRequestHeaders(st, v.RequestHeaders), nil
	case *extprocv3.ProcessingRequest_RequestBody:
		if st.phase != phaseRequestBody {
			return nil, fmt.Errorf("request body in phase %s", st.phase)
		}
		if st.streamed {
			return s.onBodyChunk(st, v.RequestBody.GetBody(), v.RequestBody.GetEndOfStream()), nil
		}
		if !v.RequestBody.GetEndOfStream() {
			return nil, errors.New("request body arrived in chunks: " + errBodyModes)
		}
		return s.onRequestBody(st, v.RequestBody.GetBody()), nil
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		// In any phase: Envoy's own local replies (its 413, its 431 for
		// oversized headers) pass through the filter before any request
		// message did. Refusing them made Envoy reset the connection
		// instead of answering.
		return s.onResponseHeaders(st, v.ResponseHeaders), nil
	case *extprocv3.ProcessingRequest_RequestTrailers:
		if st.streamed && st.phase == phaseRequestBody {
			// The body ended without a chunk that says so: the trailers'
			// answer goes after the chunks'.
			st.trailers = true
			return s.onBodyChunk(st, nil, true), nil
		}
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}}, nil
	case *extprocv3.ProcessingRequest_ResponseBody:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: &extprocv3.BodyResponse{}}}, nil
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{ResponseTrailers: &extprocv3.TrailersResponse{}}}, nil
	}
	return nil, fmt.Errorf("unexpected message %T", req.Request)
}

// errBodyModes says which of Envoy's body modes the service works with.
const errBodyModes = "configure the ext_proc filter's request_body_mode BUFFERED, or STREAMED with send_body_without_waiting_for_header_response: true"

// onBodyChunk takes a chunk of a streamed body; at its end (the last
// chunk, or trailers) it decides. Nothing is answered before then: the
// headers' answer goes first, with the decision.
func (s *Server) onBodyChunk(st *stream, b []byte, end bool) *extprocv3.ProcessingResponse {
	if !st.trailers {
		st.chunks++
	}
	n := len(b)
	if st.held != nil {
		n += len(*st.held)
	}
	// The body is whole at its end, or when it has the content-length
	// declared: Envoy's last chunk (often empty) need not be waited for,
	// and a body that ends with trailers, which Envoy 1.40 holds until the
	// headers are answered, is not stuck.
	whole := end || (st.declared > 0 && n >= st.declared)
	if whole && st.held == nil {
		return s.onRequestBody(st, b) // the whole body in one chunk
	}
	if n > s.opt.BodyLimit {
		// Before Envoy's buffer (its limit is the body limit) fills with
		// chunks waiting for the headers' answer.
		return s.reject(st, tooLarge(n, s.opt.BodyLimit))
	}
	if int64(n) > st.bodyMem && !s.holdBody(st, int64(n)) {
		return s.reject(st, errBodyMemory)
	}
	st.appendHeld(b)
	if !whole {
		// A body too big to take whole (the bootstrap streams the large
		// ones) is refused as soon as its first bytes prove it over a
		// limit, before Envoy has read the rest: a hundred thousand tiny
		// messages cost what the first of them over the largest context
		// do. Checked when the bytes held cross proveFrom and each of its
		// doublings, so the prefixes read add up to about twice the body
		// (under three times whatever the chunks), and a body smaller
		// than proveFrom is read once. The sizes are fixed, not doublings
		// of the size first checked: a chunk that crossed 256 KB by much
		// must not put the next check past 512 KB (what a client that
		// waits for the answer after 640 KB relies on).
		if at := max(st.proveAt, proveFrom); n >= at {
			for at <= n {
				at *= 2
			}
			st.proveAt = at
			if e := s.dec.provedOver(*st.held, st.kind); e != nil {
				s.m.bodiesCut.Inc()
				return s.reject(st, e)
			}
		}
		return nil
	}
	resp := s.onRequestBody(st, *st.held)
	st.releaseHeld() // the decision keeps nothing of the body
	return resp
}

// proveFrom is the size from which a streamed body's prefix is parsed for
// a limit it proves (onBodyChunk): below it, the whole body costs little
// more than its proof would.
const proveFrom = 256 << 10

// appendHeld adds a streamed body's chunk to the bytes held, in a pooled
// buffer of the declared content-length when there is one.
func (st *stream) appendHeld(b []byte) {
	if st.held == nil {
		st.held = getBuf(max(st.declared, len(b)))
		*st.held = (*st.held)[:0]
	}
	h := *st.held
	if len(h)+len(b) > cap(h) {
		nb := getBuf(2 * (len(h) + len(b)))
		*nb = append((*nb)[:0], h...)
		putBuf(st.held)
		st.held = nb
	}
	*st.held = append(*st.held, b...)
}

func (st *stream) releaseHeld() {
	if st.held != nil {
		putBuf(st.held)
		st.held = nil
	}
}

func headerValue(h *corev3.HeaderValue) string {
	if len(h.RawValue) > 0 {
		return string(h.RawValue)
	}
	return h.Value
}

// isUntrusted reports whether a client-supplied request header must go:
// inferlb's internal headers and Envoy's x-envoy-* request controls
// (retries, timeouts), which only inferlb may set.
func isUntrusted(k string) bool {
	return strings.HasPrefix(k, headers.InternalPrefix) || strings.HasPrefix(k, "x-envoy-")
}

func (s *Server) onRequestHeaders(st *stream, h *extprocv3.HttpHeaders) *extprocv3.ProcessingResponse {
	st.start = s.opt.Now()
	head, answer := s.readHead(st, h)
	st.client, st.session, st.prioHdr, st.resid = head.In.Client, head.In.Session, head.In.Priority, head.In.Residency
	st.remove, st.kind = head.Remove, head.Kind
	if answer != nil {
		return answer
	}
	contentLength := head.ContentLength
	if s.lane != nil && contentLength < LargeBody {
		// Marked before the body memory's check: a small request refused
		// 503 because large bodies hold the memory is one to protect. A
		// body without a content-length counts as small (the lane and
		// the bootstrap's streamed route only know declared sizes).
		s.lastSmall.Store(int64(s.opt.Now().Sub(s.epoch)))
	}
	// The body's bytes are counted from here, before Envoy sends them.
	if contentLength > 0 && !s.holdBody(st, int64(contentLength)) {
		return s.reject(st, errBodyMemory)
	}
	st.declared = max(contentLength, 0)
	st.phase = phaseRequestBody
	if st.streamed {
		return nil // the answer waits for the body, and carries the decision
	}
	// Nothing to change yet: the decision needs the body, and goes with the
	// body response (allowed for BUFFERED bodies), headers included.
	return respContinueHeaders
}

// errBodyMemory answers a request whose body would take the bodies in
// flight past Options.MaxBodyMemory.
var errBodyMemory = &apiError{status: 503, typ: "service_unavailable", code: "overloaded",
	message: "The load balancer holds too many request bytes right now; retry after the indicated delay.", retryAfter: 1, reason: "body_memory"}

// holdBody makes the bytes of the stream's body counted in flight n (0:
// none, which always succeeds). It refuses, counting nothing more, if
// growing to n would take the server past MaxBodyMemory.
func (s *Server) holdBody(st *stream, n int64) bool {
	d := n - st.bodyMem
	if d == 0 {
		return true
	}
	if d > 0 {
		n := s.bodyMem.Add(d)
		if n > s.opt.MaxBodyMemory {
			s.bodyMem.Add(-d)
			return false
		}
		if n >= BodyBurst && n-d < BodyBurst && s.opt.OnBodyBurst != nil {
			s.opt.OnBodyBurst()
		}
	}
	if d < 0 {
		s.bodyMem.Add(d)
	}
	st.bodyMem = n
	return true
}

func tooLarge(n, limit int) *apiError {
	return &apiError{status: 413, typ: "invalid_request_error", code: "request_too_large",
		message: fmt.Sprintf("Request body of %d bytes exceeds the limit of %d bytes.", n, limit), reason: "too_large"}
}

func (s *Server) onRequestBody(st *stream, b []byte) *extprocv3.ProcessingResponse {
	t0 := time.Now()
	defer func() { s.m.decisionTime.Observe(time.Since(t0).Seconds()) }()
	s.m.bodyBytes.Observe(float64(len(b)))
	if st.streamed {
		s.m.bodiesStreamed.Inc()
		s.m.bodyChunks.Observe(float64(st.chunks))
	} else {
		s.m.bodiesBuffered.Inc()
	}
	if len(b) > s.opt.BodyLimit {
		return s.reject(st, tooLarge(len(b), s.opt.BodyLimit))
	}
	if int64(len(b)) > st.bodyMem && !s.holdBody(st, int64(len(b))) {
		return s.reject(st, errBodyMemory)
	}
	// Decided on here: the body's bytes are not held past this message.
	defer s.holdBody(st, 0)
	dc := &st.dc
	rej := s.dec.Decide(Input{Kind: st.kind, Session: st.session, Priority: st.prioHdr, Residency: st.resid, Client: st.client, Body: b, Now: st.start}, dc)
	if dc.Bound != "" {
		s.m.contextBounds.WithLabelValues(dc.Bound).Inc()
	}
	if rej != nil {
		if rej.Shed() {
			s.m.decisions.WithLabelValues(dc.Class.Name, dc.Priority, dc.Outcome.String()).Inc()
			s.m.keys.WithLabelValues(dc.Class.Name, dc.Key.label()).Inc()
		}
		return s.reject(st, rej.e)
	}
	c, level := dc.Class, dc.Level
	s.m.decisions.WithLabelValues(c.Name, dc.Priority, dc.Outcome.String()).Inc()
	s.m.keys.WithLabelValues(c.Name, dc.Key.label()).Inc()
	s.m.inflight.WithLabelValues(c.Name).Inc()
	if dc.Retries > 0 {
		s.m.retriesGranted.WithLabelValues(c.Name).Add(float64(dc.Retries))
	}
	st.phase = phaseRouted
	id, expired := s.reqs.add(&tracked{dc: dc.Held, start: st.start}, st.start)
	st.id = id
	for _, r := range expired {
		s.release(r)
		s.m.requestsExpired.Inc()
	}
	p := dc.Policy

	// Only the affinity key and the request id are new per request; the
	// other headers are built once and shared.
	set := make([]*corev3.HeaderValueOption, 0, 7)
	set = append(set, c.clusterHdr, setHeader(headers.AffinityKey, dc.AffinityHeader()), setHeader(headers.RequestID, id), c.classHdr,
		smallIntHeader(&levelHdrs, headers.PriorityLevel, int(level)), smallIntHeader(&retryHdrs, headers.EnvoyMaxRetries, dc.Retries))
	if p.regionHdr != nil {
		set = append(set, p.regionHdr)
	}
	st.answer = &decision{}
	cr := &extprocv3.CommonResponse{
		HeaderMutation:  &extprocv3.HeaderMutation{SetHeaders: set, RemoveHeaders: removeUnset(st.remove)},
		ClearRouteCache: true,
	}
	if st.streamed {
		// The headers' answer, which waited for the body: the request is
		// routed when Envoy gets it.
		st.answer.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: cr}}
	} else {
		st.answer.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: cr}}
	}
	return &st.answer.ProcessingResponse
}

// removeUnset drops from the strip list the headers the decision sets
// anyway (set overwrites them), so one mutation never both sets and removes.
func removeUnset(rm []string) []string {
	out := rm[:0]
	for _, k := range rm {
		switch k {
		case headers.Cluster, headers.AffinityKey, headers.RequestID, headers.Class, headers.PriorityLevel, headers.EnvoyMaxRetries, headers.SourceRegion:
			continue
		}
		out = append(out, k)
	}
	return out
}

func (p *Policy) priorityNames() []string {
	var out []string
	for _, n := range p.levelNames {
		if n != "" {
			out = append(out, n)
		}
	}
	return out
}

func hex16(v uint64) string {
	const digits = "0123456789abcdef"
	var b [16]byte
	for i := 15; i >= 0; i-- {
		b[i] = digits[v&15]
		v >>= 4
	}
	return string(b[:])
}

// levelHdrs and retryHdrs hold the priority-level and retry-allowance
// headers for small values, built once and shared read-only.
var levelHdrs, retryHdrs = smallIntHeaders(headers.PriorityLevel), smallIntHeaders(headers.EnvoyMaxRetries)

func smallIntHeaders(k string) (h [16]*corev3.HeaderValueOption) {
	for i := range h {
		h[i] = setHeader(k, strconv.Itoa(i))
	}
	return h
}

// smallIntHeader is header k set to v, from cache when v is small.
func smallIntHeader(cache *[16]*corev3.HeaderValueOption, k string, v int) *corev3.HeaderValueOption {
	if v >= 0 && v < len(cache) {
		return cache[v]
	}
	return setHeader(k, strconv.Itoa(v))
}

func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// reject ends the request with an OpenAI-format error.
func (s *Server) reject(st *stream, e *apiError) *extprocv3.ProcessingResponse {
	st.phase = phaseAnswered
	s.m.rejected.WithLabelValues(e.statusText(), e.reason).Inc()
	set := []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}
	if e.retryAfter > 0 {
		set = append(set, setHeader("retry-after", strconv.Itoa(e.retryAfter)))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{ImmediateResponse: &extprocv3.ImmediateResponse{
		Status:  &typev3.HttpStatus{Code: typev3.StatusCode(e.status)},
		Headers: &extprocv3.HeaderMutation{SetHeaders: set},
		Body:    e.body(),
		Details: "inferlb_" + e.reason,
	}}}
}

// onResponseHeaders answers "continue": the bootstrap does not send
// response headers (ext_proc has left the stream by then), but a
// configuration that does gets a harmless answer. Evidence comes from
// Envoy's access logs (attemptlog.go).
func (s *Server) onResponseHeaders(st *stream, _ *extprocv3.HttpHeaders) *extprocv3.ProcessingResponse {
	if st.phase == phaseRouted {
		st.phase = phaseObserved
	}
	return respContinueResponseHeaders
}

func codeClass(code int) string {
	switch {
	case code >= 500:
		return "5xx"
	case code >= 400:
		return "4xx"
	case code >= 200 && code < 400:
		return "2xx"
	}
	return "other"
}
