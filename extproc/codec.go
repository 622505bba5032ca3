package extproc

import (
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the standard codec Codec delegates to
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	"github.com/inferlb/inferlb/api/headers"
)

// Codec is the gRPC codec of the ext_proc server (grpc.ForceServerCodecV2):
// the standard protobuf codec, except for a ProcessingRequest that carries
// a request body, whose body then aliases a single copy of the message
// bytes. The standard codec copies a body twice on the way in (into a pooled
// buffer that it clears first, then into the message); at 220 KB those copies
// and the clearing were about a fifth of the service's CPU. Anything the fast
// path does not recognise exactly goes to the standard codec, so the result
// is always what proto.Unmarshal gives (a fuzz test holds it to that).
type Codec struct{}

var protoCodec = encoding.GetCodecV2("proto")

// Name is the content subtype: the codec speaks standard protobuf.
func (Codec) Name() string { return "proto" }

// Marshal is the standard codec's, except for the constant answers below,
// which are encoded once.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	if r, ok := v.(*extprocv3.ProcessingResponse); ok {
		if b, ok := constEncoded[r]; ok {
			// A SliceBuffer's Free is a no-op: the transport writes it and
			// leaves it alone.
			return mem.BufferSlice{mem.SliceBuffer(b)}, nil
		}
	}
	return protoCodec.Marshal(v)
}

// The constant answers: every request's request-headers answer (the decision
// goes with the body's) and the response-headers answers, which only strip
// Envoy's internal headers. They are shared by every stream: never modify
// one.
var (
	respContinueHeaders = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{}}}
	// respObserved[strip] removes the upstream-host header (bit 0) and the
	// attempt-count header (bit 1).
	respObserved = func() (r [4]*extprocv3.ProcessingResponse) {
		for strip := range r {
			var remove []string
			if strip&1 != 0 {
				remove = append(remove, headers.UpstreamHost)
			}
			if strip&2 != 0 {
				remove = append(remove, attemptCount)
			}
			r[strip] = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{ResponseHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{HeaderMutation: &extprocv3.HeaderMutation{RemoveHeaders: remove}}}}}
		}
		return r
	}()
	constEncoded = func() map[*extprocv3.ProcessingResponse][]byte {
		m := map[*extprocv3.ProcessingResponse][]byte{}
		for _, r := range append([]*extprocv3.ProcessingResponse{respContinueHeaders}, respObserved[:]...) {
			b, err := proto.Marshal(r)
			if err != nil {
				panic(err) // constant messages: cannot fail
			}
			m[r] = b
		}
		return m
	}()
)

// attemptCount is the header Envoy adds to responses with the number of
// upstream attempts (route's include_attempt_count_in_response).
const attemptCount = "x-envoy-attempt-count"

// tagRequestBody is the first byte of a ProcessingRequest whose first field
// is request_body (field 4, length-delimited).
const tagRequestBody = 4<<3 | byte(protowire.BytesType)

// Unmarshal decodes data into v.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	req, ok := v.(*extprocv3.ProcessingRequest)
	if !ok || len(data) == 0 || len(data[0].ReadOnlyData()) == 0 || data[0].ReadOnlyData()[0] != tagRequestBody {
		return protoCodec.Unmarshal(data, v)
	}
	// One copy, owned by the message from here on (the transport's buffers
	// go back to its pool when this returns).
	buf := data.Materialize()
	if b, rest, ok := decodeRequestBody(buf); ok {
		req.Reset()
		req.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: b}
		// Other fields (Envoy always adds an empty metadata_context) are
		// small: the standard decoder merges them in.
		if len(rest) == 0 || mergeRest.Unmarshal(rest, req) == nil {
			return nil
		}
	}
	return protoCodec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(buf)}, v)
}

// decodeRequestBody decodes the request_body field of a ProcessingRequest
// (exactly one, holding an HttpBody with at most its body and end_of_stream
// fields, each at most once) and returns the wire bytes of the other
// top-level fields. Anything else (a repeated or unknown HttpBody field,
// malformed wire data) reports false.
func decodeRequestBody(b []byte) (body *extprocv3.HttpBody, rest []byte, ok bool) {
	var inner []byte
	seen := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, nil, false
		}
		if num == 4 {
			v, m := protowire.ConsumeBytes(b[n:])
			if typ != protowire.BytesType || m < 0 || seen {
				return nil, nil, false
			}
			inner, seen = v, true
			b = b[n+m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return nil, nil, false
		}
		rest = append(rest, b[:n+m]...)
		b = b[n+m:]
	}
	if !seen {
		return nil, nil, false
	}
	out := &extprocv3.HttpBody{}
	var seenBody, seenEOS bool
	for len(inner) > 0 {
		num, typ, n := protowire.ConsumeTag(inner)
		if n < 0 {
			return nil, nil, false
		}
		inner = inner[n:]
		switch {
		case num == 1 && typ == protowire.BytesType && !seenBody:
			v, m := protowire.ConsumeBytes(inner)
			if m < 0 {
				return nil, nil, false
			}
			out.Body, seenBody = v, true
			inner = inner[m:]
		case num == 2 && typ == protowire.VarintType && !seenEOS:
			v, m := protowire.ConsumeVarint(inner)
			if m < 0 {
				return nil, nil, false
			}
			out.EndOfStream, seenEOS = v != 0, true
			inner = inner[m:]
		default:
			return nil, nil, false
		}
	}
	return out, rest, true
}

// mergeRest decodes the small top-level fields beside a request body into
// the message that already holds the body.
var mergeRest = proto.UnmarshalOptions{Merge: true}
