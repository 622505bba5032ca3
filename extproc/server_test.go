package extproc

import (
	"context"
	"net"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/lni/goutils/leaktest"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// Messages out of order end the stream with FailedPrecondition instead of a
// guess; before any policy, requests get 503.
func TestStateMachine(t *testing.T) {
	defer leaktest.AfterTest(t)()
	s := New(Options{Registry: prometheus.NewRegistry()})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	c := extprocv3.NewExternalProcessorClient(conn)
	ctx := context.Background()

	st, _ := c.Process(ctx)
	_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("{}"), EndOfStream: true}}})
	if _, err := st.Recv(); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("body before headers: %v", err)
	}

	hdrs := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions?x=1")}}}}}}
	st, _ = c.Process(ctx)
	_ = st.Send(hdrs)
	if _, err := st.Recv(); err != nil {
		t.Fatal(err)
	}
	_ = st.Send(hdrs)
	if _, err := st.Recv(); status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("headers twice: %v", err)
	}

	st, _ = c.Process(ctx)
	_ = st.Send(hdrs)
	_, _ = st.Recv()
	_ = st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{
		Body: []byte(`{"model":"m","messages":[{"role":"user","content":"x"}]}`), EndOfStream: true}}})
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	if got := r.GetImmediateResponse().GetStatus().GetCode(); got != 503 {
		t.Fatalf("no policy: status %v", got)
	}
	_ = st.CloseSend()
}
