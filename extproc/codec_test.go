package extproc

import (
	"bytes"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// split cuts b into buffers of at most n bytes, as the transport delivers a
// message in frames.
func split(b []byte, n int) mem.BufferSlice {
	var out mem.BufferSlice
	for len(b) > 0 {
		k := min(n, len(b))
		out = append(out, mem.SliceBuffer(bytes.Clone(b[:k])))
		b = b[k:]
	}
	return out
}

func codecSeeds(t testing.TB) [][]byte {
	msgs := []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{"model":"m"}`), EndOfStream: true}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: bytes.Repeat([]byte("x"), 40000)}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{EndOfStream: true}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{}}},
		// What Envoy sends: the body and an empty metadata_context.
		envoyBodyMessage([]byte(`{"model":"m"}`)),
		// Fields the fast path leaves to the standard codec.
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("b")}}, ObservabilityMode: true},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte("b")}},
			Attributes: map[string]*structpb.Struct{"a": {Fields: map[string]*structpb.Value{"k": structpb.NewStringValue("v")}}}},
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/v1/chat/completions")}}}}}},
		{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("r")}}},
	}
	var out [][]byte
	for _, m := range msgs {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
	}
	// Wire forms proto.Marshal never writes: a body field twice, the
	// request_body field twice, a truncated body, an overlong varint.
	body := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte("one"))
	body = protowire.AppendBytes(protowire.AppendTag(body, 1, protowire.BytesType), []byte("two"))
	twice := protowire.AppendBytes(protowire.AppendTag(nil, 4, protowire.BytesType), body)
	out = append(out, twice, append(bytes.Clone(twice), twice...), twice[:len(twice)-2],
		[]byte{tagRequestBody, 3, 0x10, 0x81, 0x00}, []byte{tagRequestBody})
	return out
}

// The fast path must decode exactly what the standard codec decodes, and
// fail exactly when it fails.
func FuzzCodec(f *testing.F) {
	for _, s := range codecSeeds(f) {
		f.Add(s, uint16(16384))
		f.Add(s, uint16(3))
	}
	f.Fuzz(func(t *testing.T, b []byte, chunk uint16) {
		n := max(int(chunk), 1)
		var got, want extprocv3.ProcessingRequest
		gerr := Codec{}.Unmarshal(split(b, n), &got)
		werr := proto.Unmarshal(b, &want)
		if (gerr == nil) != (werr == nil) {
			t.Fatalf("codec error %v, proto error %v", gerr, werr)
		}
		if gerr == nil && !proto.Equal(&got, &want) {
			t.Fatalf("codec decoded %v, proto %v", &got, &want)
		}
	})
}

func TestCodecBodyOwnsItsCopy(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789"), 30000) // 300 KB: many frames
	b, err := proto.Marshal(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}})
	if err != nil {
		t.Fatal(err)
	}
	in := split(b, 16384)
	var got extprocv3.ProcessingRequest
	if err := (Codec{}).Unmarshal(in, &got); err != nil {
		t.Fatal(err)
	}
	// The transport reuses its buffers once Unmarshal returns.
	for _, buf := range in {
		clear(buf.ReadOnlyData())
	}
	rb := got.GetRequestBody()
	if !bytes.Equal(rb.GetBody(), body) || !rb.GetEndOfStream() {
		t.Fatalf("body of %d bytes (eos %v) after the input buffers were reused, want the original %d bytes",
			len(rb.GetBody()), rb.GetEndOfStream(), len(body))
	}
}

func envoyBodyMessage(body []byte) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}, MetadataContext: &corev3.Metadata{}}
}

// Envoy 1.40 adds an empty metadata_context to every body message (seen on
// the wire); that shape must take the one-copy path.
func TestCodecFastPathTakesEnvoysBodyMessage(t *testing.T) {
	b, err := proto.Marshal(envoyBodyMessage([]byte("hello")))
	if err != nil {
		t.Fatal(err)
	}
	body, rest, ok := decodeRequestBody(b)
	if !ok || string(body.GetBody()) != "hello" || !body.GetEndOfStream() || !bytes.Equal(rest, []byte{0x42, 0}) {
		t.Fatalf("decodeRequestBody(%x) = %v, rest %x, ok %v", b, body, rest, ok)
	}
	var got extprocv3.ProcessingRequest
	if err := (Codec{}).Unmarshal(split(b, 4), &got); err != nil || !proto.Equal(&got, envoyBodyMessage([]byte("hello"))) {
		t.Fatalf("decoded %v, err %v", &got, err)
	}
}

func TestCodecOtherMessages(t *testing.T) {
	// Messages other than ProcessingRequest (the access-log service shares
	// the server) go through the standard codec both ways.
	in := &corev3.HeaderValue{Key: "k", RawValue: []byte("v")}
	data, err := Codec{}.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out corev3.HeaderValue
	if err := (Codec{}).Unmarshal(data, &out); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(in, &out) || (Codec{}).Name() != "proto" {
		t.Fatalf("round trip gave %v, name %q", &out, Codec{}.Name())
	}
}

// The constant answers are sent pre-encoded: they must decode to themselves,
// and mean what the server would otherwise have built.
func TestCodecConstantAnswers(t *testing.T) {
	for r := range constEncoded {
		data, err := Codec{}.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var got extprocv3.ProcessingResponse
		if err := proto.Unmarshal(data.Materialize(), &got); err != nil || !proto.Equal(&got, r) {
			t.Fatalf("pre-encoded %v decodes to %v (err %v)", r, &got, err)
		}
	}
	want := []string{"x-inferlb-upstream-host", "x-envoy-attempt-count"}
	if got := respObserved[3].GetResponseHeaders().GetResponse().GetHeaderMutation().GetRemoveHeaders(); len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("respObserved[3] removes %v, want %v", got, want)
	}
	if len(respObserved[0].GetResponseHeaders().GetResponse().GetHeaderMutation().GetRemoveHeaders()) != 0 {
		t.Fatal("respObserved[0] removes headers")
	}
}
