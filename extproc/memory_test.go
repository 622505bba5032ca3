package extproc

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"runtime/debug"
	rtmetrics "runtime/metrics"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/lni/goutils/leaktest"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/inferlb/inferlb/api/headers"
	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/internal/envoytest"
)

// heapHeld is what the Go runtime holds from the OS: mapped and not
// released (the heap, its free spans and garbage, stacks, metadata).
func heapHeld() int64 {
	s := []rtmetrics.Sample{{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	rtmetrics.Read(s)
	return int64(s[0].Value.Uint64() - s[1].Value.Uint64())
}

// memoryServer serves s over loopback gRPC as the service does (Codec,
// large windows) and returns a client.
func memoryServer(t *testing.T, s *Server) extprocv3.ExternalProcessorClient {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.ForceServerCodecV2(Codec{}), grpc.MaxRecvMsgSize(8<<20),
		grpc.InitialWindowSize(4<<20), grpc.InitialConnWindowSize(64<<20))
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(4<<20), grpc.WithInitialConnWindowSize(64<<20),
		grpc.WithDefaultCallOptions(grpc.MaxCallSendMsgSize(8<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return extprocv3.NewExternalProcessorClient(conn)
}

// exchange plays Envoy for one request: headers (with content-length),
// then the body; it returns the answer to the body, or to the headers if
// they were answered at once.
func exchange(ctx context.Context, c extprocv3.ExternalProcessorClient, body []byte) (*extprocv3.ProcessingResponse, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	st, err := c.Process(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
			{Key: "content-length", RawValue: []byte(strconv.Itoa(len(body)))}}}}}}); err != nil {
		return nil, err
	}
	r, err := st.Recv()
	if err != nil || r.GetImmediateResponse() != nil {
		return r, err
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
		return nil, err
	}
	return st.Recv()
}

func memoryTestServer(t *testing.T, o Options) *Server {
	o.Registry = prometheus.NewRegistry()
	o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	s := New(o)
	if err := s.SetPolicy(&policyv1.RoutingPolicy{NodeId: "n", Region: "r", Version: "1",
		Priorities: []*policyv1.Priority{{Name: "p", Level: 0}}, DefaultPriority: "p",
		Classes: []*policyv1.ClassPolicy{{Name: "llama", Cluster: "c", Model: "llama-3-8b"}}}); err != nil {
		t.Fatal(err)
	}
	return s
}

// After a burst of 220 KB bodies at concurrency 150, what the process holds
// from the OS returns within 30 s to at most DefaultIdleMemory plus twice
// the body bytes in flight (none by then), at the collector setting the
// service runs with (GOGC 400). Without RunMemoryTrim it stays at the
// burst's heap goal (several times the bodies in flight) for minutes.
func TestMemoryReturnsAfterBurst(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	defer debug.SetGCPercent(debug.SetGCPercent(400))
	s := memoryTestServer(t, Options{})
	c := memoryServer(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	trimDone := make(chan struct{})
	go func() { defer close(trimDone); s.RunMemoryTrim(ctx, DefaultIdleMemory) }()
	defer func() { cancel(); <-trimDone }()

	body := benchBody(220 << 10)
	const conc, perWorker = 150, 4
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		fail error
		peak int64
	)
	stopSampling := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopSampling:
				return
			case <-tick.C:
				mu.Lock()
				peak = max(peak, heapHeld())
				mu.Unlock()
			}
		}
	}()
	for w := 0; w < conc; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWorker; i++ {
				r, err := exchange(ctx, c, body)
				if err == nil && r.GetRequestBody().GetResponse().GetHeaderMutation() == nil {
					err = errNoDecision(r)
				}
				if err != nil {
					mu.Lock()
					fail = err
					mu.Unlock()
					return
				}
				for _, h := range r.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
					if h.GetHeader().GetKey() == headers.RequestID {
						s.abandon(string(h.GetHeader().GetRawValue()))
					}
				}
			}
		}()
	}
	wg.Wait()
	close(stopSampling)
	<-sampled
	if fail != nil {
		t.Fatalf("burst: %v", fail)
	}
	bound := func() int64 { return DefaultIdleMemory + 2*s.BodyBytesInFlight() }
	t.Logf("peak held during the burst: %d MB", peak>>20)
	if peak <= bound() {
		t.Fatalf("the burst held at most %d MB, not above the %d MB bound: it tests nothing", peak>>20, bound()>>20)
	}
	start := time.Now()
	err := envoytest.Poll(context.Background(), 30*time.Second, 100*time.Millisecond, func() error {
		if held := heapHeld(); held > bound() {
			return fmt.Errorf("the runtime holds %d MB, above %d MB (idle) + 2 × %d B in flight", held>>20, DefaultIdleMemory>>20, s.BodyBytesInFlight())
		}
		return nil
	})
	if err != nil {
		t.Fatalf("30 s after the burst: %v", err)
	}
	t.Logf("held %d MB after %v", heapHeld()>>20, time.Since(start))
}

type noDecision struct{ r *extprocv3.ProcessingResponse }

func (e noDecision) Error() string { return "no routing decision: " + e.r.String() }

func errNoDecision(r *extprocv3.ProcessingResponse) error { return noDecision{r} }

// A request whose declared body would take the bodies in flight past
// MaxBodyMemory is answered 503 at its headers, before Envoy sends the
// body; once the bodies in flight are decided on, the same request passes.
func TestMaxBodyMemorySheds(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	body := benchBody(100 << 10)
	s := memoryTestServer(t, Options{MaxBodyMemory: int64(len(body)) * 3 / 2})
	c := memoryServer(t, s)
	ctx := context.Background()

	// A stream that has sent its headers holds its declared body.
	st := openDeclaring(t, c, len(body))
	if got := s.BodyBytesInFlight(); got != int64(len(body)) {
		t.Fatalf("in flight after the headers: %d bytes, want %d", got, len(body))
	}
	r, err := exchange(ctx, c, body)
	if err != nil {
		t.Fatal(err)
	}
	if got := r.GetImmediateResponse().GetStatus().GetCode(); got != 503 || r.GetImmediateResponse().GetDetails() != "inferlb_body_memory" {
		t.Fatalf("second body beyond the bound: %v, want 503 inferlb_body_memory", r)
	}
	// The first body is decided on: its bytes are no longer counted.
	_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}})
	if r, err := st.Recv(); err != nil || r.GetRequestBody() == nil {
		t.Fatalf("first body: %v %v", r, err)
	}
	if got := s.BodyBytesInFlight(); got != 0 {
		t.Fatalf("in flight after the decision: %d bytes, want 0", got)
	}
	if r, err := exchange(ctx, c, body); err != nil || r.GetRequestBody() == nil {
		t.Fatalf("after the first was decided: %v %v", r, err)
	}
	_ = st.CloseSend()
}

// BenchmarkHostileRequest is one request's exchange over loopback gRPC
// (client and server in this process) whose body is 30,000 tiny messages:
// a context far above the policy's, refused at the first message past it.
func BenchmarkHostileRequest(b *testing.B) {
	var buf []byte
	buf = append(buf, `{"model":"llama-3-8b","messages":[`...)
	for i := 0; i < 30_000; i++ {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = append(buf, `{"role":"user","content":"a"}`...)
	}
	buf = append(buf, "]}"...)
	benchCodecRequestWith(b, Codec{}, buf, true)
}

// What the service keeps of a request between its decision and the end
// Envoy's request log reports (at most --max-request-age when the log never
// comes) is its Held part, not the whole Decision: the decision's prefix
// chain alone is 1.2 KB. 4,000 decisions left in flight may grow the live
// heap by at most 512 bytes each; keeping the whole Decision grew it by
// about 1.8 KB each (120 MB after a 3-s cell of the protocol benchmark).
func TestInFlightRequestsHoldLittle(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	s := memoryTestServer(t, Options{})
	c := memoryServer(t, s)
	ctx := context.Background()
	body := benchBody(8 << 10)
	live := func() uint64 {
		runtime.GC()
		var m runtime.MemStats
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	// Warm up: gRPC's and the pools' buffers are allocated once.
	for i := 0; i < 200; i++ {
		if _, err := exchange(ctx, c, body); err != nil {
			t.Fatal(err)
		}
	}
	const n = 4000
	before := live()
	for i := 0; i < n; i++ {
		r, err := exchange(ctx, c, body)
		if err == nil && r.GetRequestBody().GetResponse().GetHeaderMutation() == nil {
			err = errNoDecision(r)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	after := live()
	per := (int64(after) - int64(before)) / n
	t.Logf("live heap %d → %d KB over %d requests in flight: %d B each", before>>10, after>>10, n, per)
	if per > 512 {
		t.Errorf("each request in flight holds %d B of heap, want at most 512 (the Decision's prefix chain kept?)", per)
	}
	s.reqs.mu.Lock()
	got := len(s.reqs.byID)
	s.reqs.mu.Unlock()
	if got < n {
		t.Fatalf("%d requests tracked, want at least %d in flight (the test measures nothing)", got, n)
	}
}

// OnBodyBurst is called when the body bytes in flight rise to BodyBurst,
// once per crossing: not again while they stay above it, and again after
// they have fallen below it and risen once more.
func TestOnBodyBurst(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	var calls atomic.Int32
	s := memoryTestServer(t, Options{OnBodyBurst: func() { calls.Add(1) }})
	c := memoryServer(t, s)
	body := benchBody(BodyBurst * 2 / 5) // two are under the burst, three over it
	open := func() extprocv3.ExternalProcessor_ProcessClient { return openDeclaring(t, c, len(body)) }
	decide := func(st extprocv3.ExternalProcessor_ProcessClient) {
		_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}})
		if r, err := st.Recv(); err != nil || r.GetRequestBody() == nil {
			t.Fatalf("decision: %v %v", r, err)
		}
		_ = st.CloseSend()
	}
	a, b := open(), open()
	if n := calls.Load(); n != 0 {
		t.Fatalf("%d calls with %d bytes in flight, under BodyBurst", n, s.BodyBytesInFlight())
	}
	cc := open()
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d calls with %d bytes in flight, want 1 (over BodyBurst)", n, s.BodyBytesInFlight())
	}
	d := open() // still above: no new call
	decide(a)
	decide(b)
	decide(cc) // one body left in flight: below
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d calls, want still 1", n)
	}
	e, f := open(), open() // over again
	if n := calls.Load(); n != 2 {
		t.Fatalf("%d calls after rising over BodyBurst a second time, want 2", n)
	}
	for _, st := range []extprocv3.ExternalProcessor_ProcessClient{d, e, f} {
		decide(st)
	}
}

// openDeclaring opens an ext_proc stream, sends request headers declaring
// a body of n bytes and reads their answer: the stream then holds its
// declared body until the body's decision.
func openDeclaring(t *testing.T, c extprocv3.ExternalProcessorClient, n int) extprocv3.ExternalProcessor_ProcessClient {
	t.Helper()
	st, err := c.Process(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
			{Key: "content-length", RawValue: []byte(strconv.Itoa(n))}}}}}})
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	return st
}
