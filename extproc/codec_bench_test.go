package extproc

import (
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/mem"
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
