package extproc

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/lni/goutils/leaktest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
)

// lanePolicy is one class of the benchmark's model.
var lanePolicy = &policyv1.RoutingPolicy{NodeId: "n", Version: "1",
	Priorities: []*policyv1.Priority{{Name: "p", Level: 0}}, DefaultPriority: "p",
	Classes: []*policyv1.ClassPolicy{{Name: "llama", Cluster: "c", Model: "llama-3-8b"}}}

// laneStream opens an ext_proc stream and sends a buffered chat request's
// headers declaring n body bytes; the headers' answer comes on the returned
// channel.
func laneStream(ctx context.Context, t *testing.T, c extprocv3.ExternalProcessorClient, n int) (extprocv3.ExternalProcessor_ProcessClient, <-chan *extprocv3.ProcessingResponse) {
	t.Helper()
	st, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")},
			{Key: ":path", RawValue: []byte("/v1/chat/completions")}, {Key: "content-length", RawValue: []byte(strconv.Itoa(n))}}}}}}); err != nil {
		t.Fatal(err)
	}
	ch := make(chan *extprocv3.ProcessingResponse, 1)
	go func() {
		r, _ := st.Recv()
		ch <- r
	}()
	return st, ch
}

// Large buffered bodies get their headers answered (Envoy then sends the
// body) a lane's worth at a time while small requests come beside them:
// one that does not fit waits until one before it is decided on, or the
// lane's wait at the latest (LaneWait; lengthened here, so that only the
// decision can let the third body in). With no small request in the last
// SmallRecent they go at once; small bodies never wait, and without a
// lane nothing does.
func TestLargeBodyLane(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reg := prometheus.NewRegistry()
	// The service's clock stands still but for skew: SmallRecent does not
	// pass while the test runs, however slow the machine.
	var skew atomic.Int64
	base := time.Now()
	s := New(Options{Registry: reg, LargeBodyLane: 150 << 10, Now: func() time.Time { return base.Add(time.Duration(skew.Load())) }})
	if err := s.SetPolicy(lanePolicy); err != nil {
		t.Fatal(err)
	}
	// Long enough that the third body below is let in by the first's
	// decision, not by its wait ending, on a slow machine.
	s.laneWait = 2 * time.Second
	c := serveOnLoopback(t, s)
	answered := func(ch <-chan *extprocv3.ProcessingResponse, within time.Duration) bool {
		select {
		case r := <-ch:
			if r.GetRequestHeaders() == nil {
				t.Fatalf("headers' answer %v", r)
			}
			return true
		case <-time.After(within):
			return false
		}
	}
	body := benchBody(100 << 10)
	first, ch1 := laneStream(ctx, t, c, len(body))
	if !answered(ch1, 5*time.Second) {
		t.Fatal("the first large body waited with the lane empty")
	}
	// No small request yet: nothing to protect, the lane's throughput
	// would be lost for no one.
	_, ch2 := laneStream(ctx, t, c, len(body))
	if !answered(ch2, 5*time.Second) {
		t.Fatal("a second large body waited for the lane with no small request beside it")
	}
	if got := testutil.ToFloat64(s.m.laneBypassed); got != 1 {
		t.Fatalf("large bodies past the full lane %v, want 1", got)
	}
	_, small := laneStream(ctx, t, c, 8<<10)
	if !answered(small, 5*time.Second) {
		t.Fatal("a small body waited for the large-body lane")
	}
	// A small request came: the next large body waits for room.
	_, ch3 := laneStream(ctx, t, c, len(body))
	if answered(ch3, 100*time.Millisecond) {
		t.Fatal("a large body was let in beside the first, a small request beside them (200 KB in a 150 KB lane)")
	}
	// The first body's decision makes room.
	if err := first.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	if !answered(ch3, 5*time.Second) {
		t.Fatal("the third large body still waits after the first was decided on")
	}
	if got := testutil.ToFloat64(s.m.laneTimeouts); got != 0 {
		t.Fatalf("lane timeouts %v, want 0", got)
	}
	// A body whose predecessor never comes goes on after the lane's wait.
	_, ch4 := laneStream(ctx, t, c, len(body))
	t0 := time.Now()
	if !answered(ch4, 5*time.Second) {
		t.Fatal("a large body waited past the lane's wait")
	}
	if el := time.Since(t0); el < s.laneWait-10*time.Millisecond {
		t.Fatalf("answered after %v with the lane full, want about the lane's wait (%v)", el, s.laneWait)
	}
	if got := testutil.ToFloat64(s.m.laneTimeouts); got != 1 {
		t.Fatalf("lane timeouts %v, want 1", got)
	}
	// SmallRecent after the small request, the lane is open again.
	skew.Store(int64(SmallRecent))
	_, ch5 := laneStream(ctx, t, c, len(body))
	if !answered(ch5, 5*time.Second) {
		t.Fatalf("a large body waited for the lane %v after the last small request", SmallRecent)
	}
	if got := testutil.ToFloat64(s.m.laneBypassed); got != 2 {
		t.Fatalf("large bodies past the full lane %v, want 2", got)
	}

	// Without a lane, two large bodies are answered at once.
	n := New(Options{Registry: prometheus.NewRegistry()})
	if err := n.SetPolicy(lanePolicy); err != nil {
		t.Fatal(err)
	}
	nc := serveOnLoopback(t, n)
	_, a := laneStream(ctx, t, nc, len(body))
	_, b := laneStream(ctx, t, nc, len(body))
	if !answered(a, 5*time.Second) || !answered(b, 5*time.Second) {
		t.Fatal("without a lane a large body waited")
	}
	cancel()
}
