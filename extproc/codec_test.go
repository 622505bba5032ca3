package extproc

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
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
		// Headers as Envoy sends them: raw values, an empty metadata_context.
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
				{Key: "x-session-id", RawValue: []byte("s-1")}, {Key: "k", Value: "v"}, {Key: "", RawValue: nil}}}}},
			MetadataContext: &corev3.Metadata{}},
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}, EndOfStream: true}},
			MetadataContext: &corev3.Metadata{}},
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{}}}},
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{EndOfStream: true}}},
		// A request's first message as Envoy sends it: with its protocol
		// configuration (BUFFERED; STREAMED without waiting; the default).
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":path", RawValue: []byte("/v1/chat/completions")}}}}},
			MetadataContext: &corev3.Metadata{}, ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED}},
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}},
			MetadataContext: &corev3.Metadata{}, ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: extprocfilterv3.ProcessingMode_STREAMED,
				ResponseBodyMode: extprocfilterv3.ProcessingMode_NONE, SendBodyWithoutWaitingForHeaderResponse: true}},
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}, ProtocolConfig: &extprocv3.ProtocolConfiguration{}},
		// Beside other fields, left to the standard codec.
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}}, ObservabilityMode: true,
			ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED}},
	}
	var out [][]byte
	for _, m := range msgs {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b, envoyOrder(t, m))
	}
	// Wire forms proto.Marshal never writes: a body field twice, the
	// request_body field twice, a truncated body, an overlong varint.
	body := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte("one"))
	body = protowire.AppendBytes(protowire.AppendTag(body, 1, protowire.BytesType), []byte("two"))
	twice := protowire.AppendBytes(protowire.AppendTag(nil, 4, protowire.BytesType), body)
	out = append(out, twice, append(bytes.Clone(twice), twice...), twice[:len(twice)-2],
		[]byte{0x22, 3, 0x10, 0x81, 0x00}, []byte{0x22})
	// Headers: a key that is not UTF-8, a header value with an overlong
	// length prefix, a key given twice, request headers twice.
	hv := func(fields ...[]byte) []byte {
		var v []byte
		for _, f := range fields {
			v = append(v, f...)
		}
		m := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), v) // HeaderMap.headers
		h := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), m) // HttpHeaders.headers
		return protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), h)
	}
	key := func(k string) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType), []byte(k))
	}
	overlong := append(protowire.AppendTag(nil, 1, protowire.BytesType), 0x83, 0x80, 0x00, 'a', 'b', 'c')
	out = append(out, hv(key("\xff")), hv(overlong, protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), []byte("x"))),
		hv(key("a"), key("b")), append(hv(key("a")), hv(key("b"))...))
	// Protocol configurations proto.Marshal never writes: a mode given
	// twice, a bool of 2, a mode past the shared table, the message twice.
	pc := func(fields ...uint64) []byte {
		var v []byte
		for i := 0; i+1 < len(fields); i += 2 {
			v = protowire.AppendVarint(protowire.AppendTag(v, protowire.Number(fields[i]), protowire.VarintType), fields[i+1])
		}
		return protowire.AppendBytes(protowire.AppendTag(hv(key("k")), 11, protowire.BytesType), v)
	}
	out = append(out, pc(1, 2, 1, 1), pc(3, 2), pc(1, 9), pc(2, 4, 3, 1), append(pc(1, 1), pc(3, 1)[len(hv(key("k"))):]...))
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
	// The body message as Envoy sends it.
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}, MetadataContext: &corev3.Metadata{}}
}

// envoyOrder encodes m as Envoy (C++ protobuf) does, fields in number order:
// the request oneof first, metadata_context after; Go's encoder writes the
// oneof last.
func envoyOrder(t testing.TB, m *extprocv3.ProcessingRequest) []byte {
	t.Helper()
	md := m.MetadataContext
	m = proto.CloneOf(m)
	m.MetadataContext = nil
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if md != nil {
		mb, err := proto.Marshal(md)
		if err != nil {
			t.Fatal(err)
		}
		b = protowire.AppendBytes(protowire.AppendTag(b, 8, protowire.BytesType), mb)
	}
	return b
}

// Envoy 1.40 adds an empty metadata_context to every message (seen on the
// wire). The messages Envoy sends on every request take the fast path in
// either field order and decode to what proto.Unmarshal gives, bodies,
// keys and values intact after the transport reuses its buffers.
func TestCodecFastPathTakesEnvoysMessages(t *testing.T) {
	msgs := []*extprocv3.ProcessingRequest{
		envoyBodyMessage([]byte("hello")),
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
				{Key: ":path", RawValue: []byte("/v1/chat/completions")}, {Key: "x-priority", RawValue: []byte("batch")}}}}},
			MetadataContext: &corev3.Metadata{}},
		{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}}},
			MetadataContext: &corev3.Metadata{}},
	}
	for _, want := range msgs {
		goOrder, err := proto.Marshal(want)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range [][]byte{envoyOrder(t, want), goOrder} {
			var fast extprocv3.ProcessingRequest
			if !decodeFast(bytes.Clone(b), &fast) {
				t.Fatalf("%x missed the fast path", b)
			}
			in := split(b, 7)
			var got extprocv3.ProcessingRequest
			if err := (Codec{}).Unmarshal(in, &got); err != nil {
				t.Fatal(err)
			}
			for _, buf := range in {
				clear(buf.ReadOnlyData())
			}
			if !proto.Equal(&got, want) {
				t.Fatalf("decoded %v, want %v", &got, want)
			}
		}
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

// The constant answers are sent pre-encoded: they must decode to themselves.
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
}

// Codec's encoding of a decision is byte for byte the generic
// marshaller's: for the answers the server builds (with headers to strip
// and without) and for random header mutations of the same shape.
func TestEncodeDecisionMatchesProto(t *testing.T) {
	check := func(d *decision) {
		t.Helper()
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(&d.ProcessingResponse)
		if err != nil {
			t.Fatal(err)
		}
		bs, err := Codec{}.Marshal(d)
		if err != nil {
			t.Fatal(err)
		}
		if got := bs.Materialize(); !bytes.Equal(got, want) {
			t.Fatalf("Codec encodes\n%x\nproto.Marshal\n%x\nfor %v", got, want, &d.ProcessingResponse)
		}
	}
	s := benchServer(t)
	for _, extra := range [][]*corev3.HeaderValue{nil, {{Key: "x-envoy-max-retries", RawValue: []byte("9")}, {Key: "x-inferlb-foo", RawValue: []byte("1")}}} {
		st := &stream{}
		hdrs := []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")}, {Key: "x-session-id", RawValue: []byte("s")}}
		if _, err := s.step(st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: &corev3.HeaderMap{Headers: append(hdrs, extra...)}}}}); err != nil {
			t.Fatal(err)
		}
		r, err := s.step(st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: benchBody(1000), EndOfStream: true}}})
		if err != nil || st.answer == nil || r != &st.answer.ProcessingResponse {
			t.Fatalf("no decision: %v %v", r, err)
		}
		if len(extra) > 0 && len(r.GetRequestBody().GetResponse().GetHeaderMutation().GetRemoveHeaders()) == 0 {
			t.Fatalf("no headers to strip in %v", r)
		}
		check(st.answer)
		s.abandon(st.id)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	str := func() string { return strings.Repeat("k", rng.IntN(3)*rng.IntN(200)) }
	for i := 0; i < 500; i++ {
		d := &decision{}
		cr := &extprocv3.CommonResponse{ClearRouteCache: rng.IntN(2) == 0}
		if rng.IntN(4) > 0 {
			hm := &extprocv3.HeaderMutation{}
			for k := rng.IntN(5); k > 0; k-- {
				o := &corev3.HeaderValueOption{AppendAction: corev3.HeaderValueOption_HeaderAppendAction(rng.IntN(4))}
				if rng.IntN(5) > 0 {
					o.Header = &corev3.HeaderValue{Key: str(), RawValue: []byte(str())}
				}
				hm.SetHeaders = append(hm.SetHeaders, o)
			}
			for k := rng.IntN(3); k > 0; k-- {
				hm.RemoveHeaders = append(hm.RemoveHeaders, str())
			}
			cr.HeaderMutation = hm
		}
		if rng.IntN(6) == 0 {
			cr = nil
		}
		if rng.IntN(2) == 0 { // a streamed body's decision goes with the headers' answer
			d.Response = &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{Response: cr}}
		} else {
			d.Response = &extprocv3.ProcessingResponse_RequestBody{RequestBody: &extprocv3.BodyResponse{Response: cr}}
		}
		check(d)
	}
}

// A request's first message, with Envoy's protocol configuration, takes
// the fast path: the configuration is the shared value, not a fresh one per
// request.
func TestCodecProtocolConfigShared(t *testing.T) {
	for _, want := range []*extprocv3.ProtocolConfiguration{
		{RequestBodyMode: extprocfilterv3.ProcessingMode_BUFFERED},
		{RequestBodyMode: extprocfilterv3.ProcessingMode_STREAMED, SendBodyWithoutWaitingForHeaderResponse: true},
	} {
		b, err := proto.Marshal(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{}},
			MetadataContext: &corev3.Metadata{}, ProtocolConfig: want})
		if err != nil {
			t.Fatal(err)
		}
		var a, c received
		if err := (Codec{}).Unmarshal(split(b, 16384), &a); err != nil {
			t.Fatal(err)
		}
		if err := (Codec{}).Unmarshal(split(b, 16384), &c); err != nil {
			t.Fatal(err)
		}
		if !proto.Equal(a.ProtocolConfig, want) || a.ProtocolConfig != c.ProtocolConfig || a.MetadataContext == nil {
			t.Fatalf("decoded %v (shared: %v), want %v shared", a.ProtocolConfig, a.ProtocolConfig == c.ProtocolConfig, want)
		}
		a.release()
		c.release()
	}
}
