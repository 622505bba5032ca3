package extproc

import (
	"context"
	"io"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"

	"github.com/inferlb/inferlb/api/headers"
)

// BenchmarkCodecUnmarshal decodes Envoy's request-headers message (the
// headers ext_proc's forward rules let through) with Codec and with the
// standard codec.
func BenchmarkCodecUnmarshal(b *testing.B) {
	msg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
			{Key: "content-length", RawValue: []byte("8192")}, {Key: "x-session-id", RawValue: []byte("w12-345")},
			{Key: "x-priority", RawValue: []byte("interactive")}, {Key: "x-envoy-expected-rq-timeout-ms", RawValue: []byte("15000")}}}}},
		MetadataContext: &corev3.Metadata{}}
	wire := envoyOrder(b, msg)
	for _, c := range []struct {
		name  string
		codec interface {
			Unmarshal(mem.BufferSlice, any) error
		}
	}{{"inferlb", Codec{}}, {"standard", protoCodec}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			data := mem.BufferSlice{mem.SliceBuffer(wire)}
			for b.Loop() {
				var m extprocv3.ProcessingRequest
				if err := c.codec.Unmarshal(data, &m); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkCodecRequest is one request's exchange with the service over
// loopback gRPC (request headers, then the body; the decision back), with
// Codec and with the standard codec, side by side. cpu-ns/op is the
// process's CPU time (client and server) per request; the client's share is
// the same in both.
func BenchmarkCodecRequest(b *testing.B) {
	for _, size := range []int{8 << 10, 220 << 10} {
		body := benchBody(size)
		for _, c := range []struct {
			name  string
			codec encoding.CodecV2
		}{{"inferlb", Codec{}}, {"standard", protoCodec}} {
			b.Run(strconv.Itoa(size>>10)+"KB/"+c.name, func(b *testing.B) {
				benchCodecRequest(b, c.codec, body)
			})
		}
	}
}

func benchCodecRequest(b *testing.B, codec encoding.CodecV2, body []byte) {
	benchCodecRequestWith(b, codec, body, false)
}

// benchCodecRequestWith is benchCodecRequest; rejected: the body is
// answered with an error (an ImmediateResponse) instead of a decision.
func benchCodecRequestWith(b *testing.B, codec encoding.CodecV2, body []byte, rejected bool) {
	s := benchServer(b)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	g := grpc.NewServer(grpc.ForceServerCodecV2(codec), grpc.MaxRecvMsgSize(4<<20),
		grpc.InitialWindowSize(4<<20), grpc.InitialConnWindowSize(64<<20))
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(4<<20), grpc.WithInitialConnWindowSize(64<<20))
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	client := extprocv3.NewExternalProcessorClient(conn)
	hdr := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
			{Key: "content-length", RawValue: []byte(strconv.Itoa(len(body)))}, {Key: "x-session-id", RawValue: []byte("s1")},
		}}}}}
	msg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}
	ctx := context.Background()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	cpu0 := processCPU(b)
	for b.Loop() {
		st, err := client.Process(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := st.Send(hdr); err != nil {
			b.Fatal(err)
		}
		if _, err := st.Recv(); err != nil {
			b.Fatal(err)
		}
		if err := st.Send(msg); err != nil {
			b.Fatal(err)
		}
		r, err := st.Recv()
		if err != nil || (r.GetRequestBody() == nil) != rejected {
			b.Fatal(err, r)
		}
		if _, err := st.Recv(); err != io.EOF {
			b.Fatalf("stream not ended after the decision: %v", err)
		}
		// No access log will end the request: free its slot.
		for _, h := range r.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
			if h.GetHeader().GetKey() == headers.RequestID {
				s.abandon(string(h.GetHeader().GetRawValue()))
			}
		}
	}
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// processCPU is the process's user and system CPU time so far.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkCodecUnmarshalBody decodes Envoy's request-body message with
// Codec and with the standard codec, the message in the 16 KB frames the
// transport delivers (a single buffer would let the standard codec skip its
// first copy).
func BenchmarkCodecUnmarshalBody(b *testing.B) {
	for _, size := range []int{8 << 10, 220 << 10} {
		wire := envoyOrder(b, envoyBodyMessage(benchBody(size)))
		for _, c := range []struct {
			name  string
			codec encoding.CodecV2
		}{{"inferlb", Codec{}}, {"standard", protoCodec}} {
			b.Run(strconv.Itoa(size>>10)+"KB/"+c.name, func(b *testing.B) {
				// Neither codec writes to or frees the frames (the caller
				// does): one set serves every iteration.
				data := split(wire, 16<<10)
				b.SetBytes(int64(len(wire)))
				b.ReportAllocs()
				for b.Loop() {
					var m extprocv3.ProcessingRequest
					if err := c.codec.Unmarshal(data, &m); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
