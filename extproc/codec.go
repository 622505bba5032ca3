package extproc

import (
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/encoding"
	_ "google.golang.org/grpc/encoding/proto" // registers the standard codec Codec delegates to
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// Codec is the gRPC codec of the ext_proc server (grpc.ForceServerCodecV2):
// the standard protobuf codec, except for the ProcessingRequests Envoy sends
// on every request. A request body then aliases a single copy of the message
// bytes, where the standard codec copies it twice (from the transport's
// frames into a pooled buffer, then into the message). Request and response
// headers are decoded with a handful of allocations instead of three per
// header; the protocol configuration Envoy sends with a request's first
// message (in both body modes) is one of a few shared values. Anything the
// fast paths do not recognise exactly goes to the standard codec, so the
// result is always what proto.Unmarshal gives (FuzzCodec holds it to that).
//
// It is kept for the allocations it saves on every request; the CPU it
// saves is small. BenchmarkCodecRequest, BenchmarkCodecUnmarshalBody and
// BenchmarkCodecUnmarshal measure both against the standard codec; the
// figures behind keeping it are in docs/decisions/extproc-codec.md.
type Codec struct{}

var protoCodec = encoding.GetCodecV2("proto")

// Name is the content subtype: the codec speaks standard protobuf.
func (Codec) Name() string { return "proto" }

// Marshal is the standard codec's, except for the constant answers below,
// which are encoded once.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	if d, ok := v.(*decision); ok {
		return mem.BufferSlice{mem.SliceBuffer(encodeDecision(d))}, nil
	}
	if r, ok := v.(*extprocv3.ProcessingResponse); ok {
		if b, ok := constEncoded[r]; ok {
			// A SliceBuffer's Free is a no-op: the transport writes it and
			// leaves it alone.
			return mem.BufferSlice{mem.SliceBuffer(b)}, nil
		}
	}
	return protoCodec.Marshal(v)
}

// The constant answers: "continue" to a buffered body's request headers
// (the decision goes with the body's answer), to each chunk of a streamed
// body (the decision went with the headers' answer) and to response
// headers. They are shared by every stream: never modify one.
var (
	respContinueHeaders = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{}}}
	respContinueBody = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
		RequestBody: &extprocv3.BodyResponse{}}}
	respContinueResponseHeaders = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{}}}
	respContinueTrailers = &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
		RequestTrailers: &extprocv3.TrailersResponse{}}}
	constEncoded = func() map[*extprocv3.ProcessingResponse][]byte {
		m := map[*extprocv3.ProcessingResponse][]byte{}
		for _, r := range []*extprocv3.ProcessingResponse{respContinueHeaders, respContinueBody, respContinueResponseHeaders, respContinueTrailers} {
			b, err := proto.Marshal(r)
			if err != nil {
				panic(err) // constant messages: cannot fail
			}
			m[r] = b
		}
		return m
	}()
)

// Unmarshal decodes data into v. Into a *received (what Server.Process
// receives into) the bytes come from the buffer pools, and stay the
// message's until its release.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	if r, ok := v.(*received); ok {
		r.release()
		p := getBuf(data.Len())
		data.CopyTo(*p)
		if decodeFast(*p, &r.ProcessingRequest) {
			r.buf = p
			return nil
		}
		// The standard decoder copies what it keeps: the buffer is free
		// again at once.
		err := protoCodec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(*p)}, &r.ProcessingRequest)
		putBuf(p)
		return err
	}
	req, ok := v.(*extprocv3.ProcessingRequest)
	if !ok {
		return protoCodec.Unmarshal(data, v)
	}
	// One copy, owned by the message from here on (the transport's buffers
	// go back to its pool when this returns): bodies and header bytes alias
	// it.
	buf := data.Materialize()
	if decodeFast(buf, req) {
		return nil
	}
	return protoCodec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(buf)}, v)
}

// decodeFast decodes the messages Envoy sends on every request — request
// headers, request body, response headers — each member of the request
// oneof present once, with any other top-level fields merged in by the
// standard decoder. It reports false, leaving req to the standard codec, for
// anything else.
func decodeFast(b []byte, req *extprocv3.ProcessingRequest) bool {
	var inner, rest []byte
	member := protowire.Number(0)
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return false
		}
		if num >= 2 && num <= 7 { // the request oneof
			v, m := protowire.ConsumeBytes(b[n:])
			if typ != protowire.BytesType || m < 0 || member != 0 {
				return false
			}
			member, inner = num, v
			b = b[n+m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b[n:])
		if m < 0 {
			return false
		}
		if rest == nil && len(b) == n+m {
			rest = b[:n+m] // the only other field: no copy
		} else {
			rest = append(rest[:len(rest):len(rest)], b[:n+m]...)
		}
		b = b[n+m:]
	}
	req.Reset()
	switch member {
	case 4:
		body, ok := decodeHTTPBody(inner)
		if !ok {
			return false
		}
		req.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: body}
	case 2, 3:
		h, ok := decodeHTTPHeaders(inner)
		if !ok {
			return false
		}
		if member == 2 {
			req.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: h}
		} else {
			req.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: h}
		}
	default:
		return false
	}
	// Envoy 1.40 adds an empty metadata_context to every message, and its
	// protocol configuration to a request's first.
	if len(rest) > 0 && !decodeRestFast(rest, req) {
		// The standard decoder then merges every field of rest.
		req.MetadataContext, req.ProtocolConfig = nil, nil
		return mergeRest.Unmarshal(rest, req) == nil
	}
	return true
}

// decodeRestFast decodes the top-level fields Envoy sends beside a
// request's first message: an empty metadata_context and the
// protocol_config (its body modes and send_body_without_waiting), each at
// most once. The configuration is one of a few shared, read-only values:
// the standard decoder allocated one per request.
func decodeRestFast(b []byte, req *extprocv3.ProcessingRequest) bool {
	var seenMeta, seenConfig bool
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.BytesType {
			return false
		}
		v, m := protowire.ConsumeBytes(b[n:])
		if m < 0 {
			return false
		}
		switch {
		case num == fieldRequestMetadata && len(v) == 0 && !seenMeta:
			seenMeta = true
			req.MetadataContext = &corev3.Metadata{}
		case num == fieldRequestProtocolConfig && !seenConfig:
			seenConfig = true
			pc, ok := decodeProtocolConfig(v)
			if !ok {
				return false
			}
			req.ProtocolConfig = pc
		default:
			return false
		}
		b = b[n+m:]
	}
	return true
}

// Field numbers of ProcessingRequest and ProtocolConfiguration.
const (
	fieldRequestMetadata       = 8  // ProcessingRequest.metadata_context
	fieldRequestProtocolConfig = 11 // ProcessingRequest.protocol_config
)

// protocolConfigs are the shared ProtocolConfigurations, by request body
// mode, response body mode and send_body_without_waiting_for_header_response.
var protocolConfigs = func() (t [8][8][2]*extprocv3.ProtocolConfiguration) {
	for i := range t {
		for j := range t[i] {
			for k := range t[i][j] {
				t[i][j][k] = &extprocv3.ProtocolConfiguration{RequestBodyMode: extprocfilterv3.ProcessingMode_BodySendMode(i),
					ResponseBodyMode: extprocfilterv3.ProcessingMode_BodySendMode(j), SendBodyWithoutWaitingForHeaderResponse: k == 1}
			}
		}
	}
	return t
}()

// decodeProtocolConfig decodes a ProtocolConfiguration with at most its
// three fields, each once, to its shared value.
func decodeProtocolConfig(b []byte) (*extprocv3.ProtocolConfiguration, bool) {
	var vals [4]uint64
	var seen [4]bool
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 || typ != protowire.VarintType || num < 1 || num > 3 || seen[num] {
			return nil, false
		}
		v, m := protowire.ConsumeVarint(b[n:])
		if m < 0 {
			return nil, false
		}
		seen[num], vals[num] = true, v
		b = b[n+m:]
	}
	if vals[1] >= 8 || vals[2] >= 8 || vals[3] > 1 {
		return nil, false
	}
	return protocolConfigs[vals[1]][vals[2]][vals[3]], true
}

// decodeHTTPBody decodes an HttpBody with at most its body and end_of_stream
// fields, each at most once; the body aliases b.
func decodeHTTPBody(b []byte) (*extprocv3.HttpBody, bool) {
	body, _, eos, ok := bytesAndVarint(b, 1, 2)
	if !ok {
		return nil, false
	}
	// Capped: an append to the body must not overwrite what follows it.
	return &extprocv3.HttpBody{Body: body[:len(body):len(body)], EndOfStream: eos != 0}, true
}

// decodeHTTPHeaders decodes an HttpHeaders with at most its header map and
// end_of_stream, each once. The header map becomes one slice of
// HeaderValues whose keys and values share one string and whose raw values
// alias b, instead of three allocations per header.
func decodeHTTPHeaders(b []byte) (*extprocv3.HttpHeaders, bool) {
	hmap, seenMap, eos, ok := bytesAndVarint(b, 1, 3)
	if !ok {
		return nil, false
	}
	h := &extprocv3.HttpHeaders{EndOfStream: eos != 0}
	if seenMap {
		if h.Headers, ok = decodeHeaderMap(hmap); !ok {
			return nil, false
		}
	}
	return h, true
}

// bytesAndVarint walks a message whose only fields are a length-delimited
// field bytesNum and a varint field varintNum, each at most once, and
// returns their values; anything else reports false.
func bytesAndVarint(b []byte, bytesNum, varintNum protowire.Number) (v []byte, seenV bool, x uint64, ok bool) {
	seenX := false
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, false, 0, false
		}
		b = b[n:]
		var m int
		switch {
		case num == bytesNum && typ == protowire.BytesType && !seenV:
			v, m = protowire.ConsumeBytes(b)
			seenV = true
		case num == varintNum && typ == protowire.VarintType && !seenX:
			x, m = protowire.ConsumeVarint(b)
			seenX = true
		default:
			return nil, false, 0, false
		}
		if m < 0 {
			return nil, false, 0, false
		}
		b = b[m:]
	}
	return v, seenV, x, true
}

// decodeHeaderMap decodes a HeaderMap: only its repeated headers field, each
// HeaderValue with at most one each of key, value and raw_value.
func decodeHeaderMap(b []byte) (*corev3.HeaderMap, bool) {
	count := 0
	for r := b; len(r) > 0; count++ {
		num, typ, n := protowire.ConsumeTag(r)
		if n < 0 || num != 1 || typ != protowire.BytesType {
			return nil, false
		}
		_, m := protowire.ConsumeBytes(r[n:])
		if m < 0 {
			return nil, false
		}
		r = r[n+m:]
	}
	hm := &corev3.HeaderMap{}
	if count == 0 {
		return hm, true
	}
	str := string(b) // keys and values are substrings of this one copy
	vals := make([]corev3.HeaderValue, count)
	hm.Headers = make([]*corev3.HeaderValue, count)
	off := 0
	for i := range vals {
		_, _, n := protowire.ConsumeTag(b[off:])
		hv, m := protowire.ConsumeBytes(b[off+n:])
		// Offsets in b, from the bytes consumed (a length prefix may be
		// longer than the minimal varint).
		base := off + n + m - len(hv)
		var seen [4]bool
		for p := 0; p < len(hv); {
			num, typ, n := protowire.ConsumeTag(hv[p:])
			if n < 0 || num < 1 || num > 3 || typ != protowire.BytesType || seen[num] {
				return nil, false
			}
			seen[num] = true
			v, m := protowire.ConsumeBytes(hv[p+n:])
			if m < 0 {
				return nil, false
			}
			start := base + p + n + m - len(v)
			switch num {
			case 1, 2:
				if !utf8.Valid(v) {
					return nil, false
				}
				if num == 1 {
					vals[i].Key = str[start : start+len(v)]
				} else {
					vals[i].Value = str[start : start+len(v)]
				}
			case 3:
				vals[i].RawValue = v[:len(v):len(v)] // capped, as Body
			}
			p += n + m
		}
		hm.Headers[i] = &vals[i]
		off += n + m
	}
	return hm, true
}

// mergeRest decodes the small top-level fields beside a request body into
// the message that already holds the body.
var mergeRest = proto.UnmarshalOptions{Merge: true}

// decision is a routing decision's answer as Server.decide builds it: a
// request-body response (the body came buffered) or a request-headers
// response (it came streamed, and the headers' answer waited for it), whose
// common response holds only a header mutation (headers set with a key, a raw value and an append action;
// headers removed) and clear_route_cache. Its pointer is a proto.Message
// (the embedded message's methods), so any codec encodes it; Codec encodes
// it directly, without the generic marshaller's reflection, a noticeable
// share of the service's CPU at one request at a time.
type decision struct {
	extprocv3.ProcessingResponse
}

// Field numbers of the messages a decision is made of (the ext_proc and
// core v3 protos).
const (
	fieldResponseRequestHeaders = 1 // ProcessingResponse.request_headers
	fieldResponseRequestBody    = 3 // ProcessingResponse.request_body
	fieldBodyResponseResponse   = 1 // BodyResponse.response, HeadersResponse.response
	fieldCommonHeaderMutation   = 2 // CommonResponse.header_mutation
	fieldCommonClearRouteCache  = 5 // CommonResponse.clear_route_cache
	fieldMutationSetHeaders     = 1 // HeaderMutation.set_headers
	fieldMutationRemoveHeaders  = 2 // HeaderMutation.remove_headers
	fieldOptionHeader           = 1 // HeaderValueOption.header
	fieldOptionAppendAction     = 3 // HeaderValueOption.append_action
	fieldHeaderValueKey         = 1 // HeaderValue.key
	fieldHeaderValueRawValue    = 3 // HeaderValue.raw_value
)

// encodeDecision encodes d as proto.Marshal does (fields in number order,
// empty ones left out).
func encodeDecision(d *decision) []byte {
	cr, outer := d.GetRequestBody().GetResponse(), protowire.Number(fieldResponseRequestBody)
	if h := d.GetRequestHeaders(); h != nil {
		cr, outer = h.GetResponse(), fieldResponseRequestHeaders
	}
	hm := cr.GetHeaderMutation()
	// Sizes, innermost first.
	optSize := func(o *corev3.HeaderValueOption) (hv, opt int) {
		h := o.GetHeader()
		if len(h.GetKey()) > 0 {
			hv += protowire.SizeTag(fieldHeaderValueKey) + protowire.SizeBytes(len(h.GetKey()))
		}
		if len(h.GetRawValue()) > 0 {
			hv += protowire.SizeTag(fieldHeaderValueRawValue) + protowire.SizeBytes(len(h.GetRawValue()))
		}
		if h != nil {
			opt += protowire.SizeTag(fieldOptionHeader) + protowire.SizeBytes(hv)
		}
		if a := o.GetAppendAction(); a != 0 {
			opt += protowire.SizeTag(fieldOptionAppendAction) + protowire.SizeVarint(uint64(a))
		}
		return hv, opt
	}
	hmSize := 0
	for _, o := range hm.GetSetHeaders() {
		_, opt := optSize(o)
		hmSize += protowire.SizeTag(fieldMutationSetHeaders) + protowire.SizeBytes(opt)
	}
	for _, k := range hm.GetRemoveHeaders() {
		hmSize += protowire.SizeTag(fieldMutationRemoveHeaders) + protowire.SizeBytes(len(k))
	}
	crSize := 0
	if hm != nil {
		crSize += protowire.SizeTag(fieldCommonHeaderMutation) + protowire.SizeBytes(hmSize)
	}
	if cr.GetClearRouteCache() {
		crSize += protowire.SizeTag(fieldCommonClearRouteCache) + protowire.SizeVarint(1)
	}
	brSize := 0
	if cr != nil {
		brSize = protowire.SizeTag(fieldBodyResponseResponse) + protowire.SizeBytes(crSize)
	}
	b := make([]byte, 0, protowire.SizeTag(outer)+protowire.SizeBytes(brSize))
	b = protowire.AppendTag(b, outer, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(brSize))
	if cr == nil {
		return b
	}
	b = protowire.AppendTag(b, fieldBodyResponseResponse, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(crSize))
	if hm != nil {
		b = protowire.AppendTag(b, fieldCommonHeaderMutation, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(hmSize))
		for _, o := range hm.GetSetHeaders() {
			hv, opt := optSize(o)
			b = protowire.AppendTag(b, fieldMutationSetHeaders, protowire.BytesType)
			b = protowire.AppendVarint(b, uint64(opt))
			if h := o.GetHeader(); h != nil {
				b = protowire.AppendTag(b, fieldOptionHeader, protowire.BytesType)
				b = protowire.AppendVarint(b, uint64(hv))
				if len(h.GetKey()) > 0 {
					b = protowire.AppendTag(b, fieldHeaderValueKey, protowire.BytesType)
					b = protowire.AppendString(b, h.GetKey())
				}
				if len(h.GetRawValue()) > 0 {
					b = protowire.AppendTag(b, fieldHeaderValueRawValue, protowire.BytesType)
					b = protowire.AppendBytes(b, h.GetRawValue())
				}
			}
			if a := o.GetAppendAction(); a != 0 {
				b = protowire.AppendTag(b, fieldOptionAppendAction, protowire.VarintType)
				b = protowire.AppendVarint(b, uint64(a))
			}
		}
		for _, k := range hm.GetRemoveHeaders() {
			b = protowire.AppendTag(b, fieldMutationRemoveHeaders, protowire.BytesType)
			b = protowire.AppendString(b, k)
		}
	}
	if cr.GetClearRouteCache() {
		b = protowire.AppendTag(b, fieldCommonClearRouteCache, protowire.VarintType)
		b = protowire.AppendVarint(b, 1)
	}
	return b
}
