package picker

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/structpb"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc"
)

// fakeStream plays Envoy's side of one ext_proc stream.
type fakeStream struct {
	grpc.ServerStream
	in  []*extprocv3.ProcessingRequest
	out []*extprocv3.ProcessingResponse
}

func (f *fakeStream) Context() context.Context { return context.Background() }
func (f *fakeStream) Recv() (*extprocv3.ProcessingRequest, error) {
	if len(f.in) == 0 {
		return nil, io.EOF
	}
	m := f.in[0]
	f.in = f.in[1:]
	return m, nil
}
func (f *fakeStream) Send(m *extprocv3.ProcessingResponse) error {
	f.out = append(f.out, m)
	return nil
}

func testPicker(t testing.TB, fallbacks int) *Picker {
	srv := extproc.New(extproc.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	pol := &policyv1.RoutingPolicy{NodeId: "n", Version: "1", DefaultPriority: "standard",
		Priorities:   []*policyv1.Priority{{Name: "standard", Level: 0}},
		LoadBalancer: &policyv1.LoadBalancer{MaglevTableSize: 307, HashBalanceFactor: 150},
		Classes: []*policyv1.ClassPolicy{{Name: "c", Cluster: "class-c", Model: "m", MaxRetries: 1, RetryBudgetFraction: 1,
			Endpoints: []*policyv1.Endpoint{
				{EngineId: "a", Address: "10.0.0.1:80", Weight: 3, Healthy: true},
				{EngineId: "b", Address: "10.0.0.2:80", Weight: 2, Healthy: true},
				{EngineId: "c", Address: "10.0.0.3:80", Weight: 1, Healthy: true},
				{EngineId: "d", Address: "10.0.0.4:80", Weight: 1, Priority: 1, Healthy: true},
			}}}}
	if err := srv.SetPolicy(pol); err != nil {
		t.Fatal(err)
	}
	return New(srv, Options{Fallbacks: fallbacks, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}

func reqHeaders(path string, eos bool, duplex bool, subset []string) *extprocv3.ProcessingRequest {
	r := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		EndOfStream: eos,
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte(path)},
			{Key: "x-gateway-destination-endpoint", RawValue: []byte("6.6.6.6:1")}}}}}}
	if duplex {
		r.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED}
	}
	if subset != nil {
		var vs []any
		for _, s := range subset {
			vs = append(vs, s)
		}
		st, _ := structpb.NewStruct(map[string]any{SubsetKey: vs})
		r.MetadataContext = &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: st}}
	}
	return r
}

func reqBody(b string, eos bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: eos}}}
}

const chatBody = `{"model":"m","messages":[{"role":"user","content":"hello"}],"user":"u1"}`

// destinations returns the endpoint list of the answer: the header and
// the dynamic metadata, which must agree (the protocol forbids two values).
func destinations(t *testing.T, out []*extprocv3.ProcessingResponse) string {
	t.Helper()
	for _, r := range out {
		md := r.GetDynamicMetadata()
		if md == nil {
			continue
		}
		meta := md.GetFields()[DestinationNamespace].GetStructValue().GetFields()[DestinationKey].GetStringValue()
		var common *extprocv3.CommonResponse
		switch v := r.Response.(type) {
		case *extprocv3.ProcessingResponse_RequestHeaders:
			common = v.RequestHeaders.GetResponse()
		case *extprocv3.ProcessingResponse_RequestBody:
			common = v.RequestBody.GetResponse()
		}
		hdr := ""
		for _, h := range common.GetHeaderMutation().GetSetHeaders() {
			if h.GetHeader().GetKey() == DestinationKey {
				hdr = string(h.GetHeader().GetRawValue())
			}
		}
		if hdr != meta || hdr == "" {
			t.Fatalf("header %q, metadata %q: must be one non-empty value", hdr, meta)
		}
		return hdr
	}
	return ""
}

// The answer in each body mode: BUFFERED (the headers answered at once,
// the endpoints with the body) and FULL_DUPLEX_STREAMED (the endpoints
// with the headers, sent once the body is whole, then the body back as it
// came); the same endpoints, a client's own destination header overwritten;
// fallbacks distinct and healthy; a subset honoured.
func TestEndpointPickerProtocol(t *testing.T) {
	pk := testPicker(t, 2)
	run := func(msgs ...*extprocv3.ProcessingRequest) []*extprocv3.ProcessingResponse {
		f := &fakeStream{in: msgs}
		if err := pk.Process(f); err != nil {
			t.Fatal(err)
		}
		return f.out
	}
	buffered := run(reqHeaders("/v1/chat/completions", false, false, nil), reqBody(chatBody, true))
	if len(buffered) != 2 || buffered[0].GetRequestHeaders() == nil || buffered[1].GetRequestBody() == nil {
		t.Fatalf("buffered answers %v", buffered)
	}
	want := destinations(t, buffered)
	duplex := run(reqHeaders("/v1/chat/completions", false, true, nil), reqBody(chatBody[:20], false), reqBody(chatBody[20:], true))
	if len(duplex) != 2 || duplex[0].GetRequestHeaders() == nil {
		t.Fatalf("duplex answers %v", duplex)
	}
	if got := destinations(t, duplex); got != want {
		t.Errorf("duplex picked %s, buffered %s", got, want)
	}
	if b := duplex[1].GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse(); string(b.GetBody()) != chatBody || !b.GetEndOfStream() {
		t.Errorf("duplex body sent back %q (eos %v), want the request's", b.GetBody(), b.GetEndOfStream())
	}
	eps := strings.Split(want, ",")
	if len(eps) != 3 || eps[0] == eps[1] || eps[1] == eps[2] || eps[0] == eps[2] {
		t.Errorf("endpoints %v: want a primary and 2 distinct fallbacks", eps)
	}
	sub := destinations(t, run(reqHeaders("/v1/chat/completions", false, true, []string{"10.0.0.4:80"}), reqBody(chatBody, true)))
	if sub != "10.0.0.4:80" {
		t.Errorf("subset [10.0.0.4:80]: picked %s", sub)
	}
	if n := pk.tables.total["c"]; n != 0 {
		t.Errorf("%d requests still counted in flight after their streams ended", n)
	}
}

// Out-of-order messages end the stream with FailedPrecondition.
func TestEndpointPickerProtocolErrors(t *testing.T) {
	pk := testPicker(t, 0)
	for name, msgs := range map[string][]*extprocv3.ProcessingRequest{
		"body first":      {reqBody(chatBody, true)},
		"headers twice":   {reqHeaders("/v1/completions", false, true, nil), reqHeaders("/v1/completions", false, true, nil)},
		"buffered chunks": {reqHeaders("/v1/chat/completions", false, false, nil), reqBody("{", false)},
	} {
		err := pk.Process(&fakeStream{in: msgs})
		if status.Code(err) != codes.FailedPrecondition {
			t.Errorf("%s: %v, want FailedPrecondition", name, err)
		}
	}
}

// FuzzEndpointPickerStream: any sequence of messages Envoy (or a broken
// peer) sends gets answers or a precise error, never a crash; every
// answer that names endpoints names them the same in header and metadata;
// nothing stays counted in flight once the stream is over.
func FuzzEndpointPickerStream(f *testing.F) {
	f.Add([]byte{0, 1, 1, 2, 3}, chatBody, true)
	f.Add([]byte{0, 1, 4, 5, 6}, chatBody, false)
	f.Add([]byte{1, 0, 2}, `{"model":"x"}`, true)
	f.Add([]byte{0, 2, 1, 5}, `{`, true)
	pk := testPicker(f, 2)
	f.Fuzz(func(t *testing.T, ops []byte, body string, duplex bool) {
		if len(ops) > 32 {
			ops = ops[:32]
		}
		var msgs []*extprocv3.ProcessingRequest
		for i, op := range ops {
			switch op % 7 {
			case 0:
				var subset []string
				if op&0x10 != 0 {
					subset = []string{"10.0.0.2:80", body}
				}
				msgs = append(msgs, reqHeaders([]string{"/v1/chat/completions", "/v1/completions", "/v1/models", "/x"}[int(op>>4)%4], op&0x8 != 0, duplex, subset))
			case 1:
				cut := min(len(body), i)
				msgs = append(msgs, reqBody(body[:cut], false), reqBody(body[cut:], true))
			case 2:
				msgs = append(msgs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}})
			case 3:
				st, _ := structpb.NewStruct(map[string]any{ServedKey: body})
				msgs = append(msgs, &extprocv3.ProcessingRequest{
					MetadataContext: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{DestinationNamespace: st}},
					Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{
						Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(fmt.Sprint(int(op) * 3))}}}}}})
			case 4:
				msgs = append(msgs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: op&0x8 != 0}}})
			case 5:
				msgs = append(msgs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}})
			case 6:
				msgs = append(msgs, &extprocv3.ProcessingRequest{})
			}
		}
		s := &fakeStream{in: msgs}
		if err := pk.Process(s); err != nil && status.Code(err) != codes.FailedPrecondition {
			t.Fatalf("error %v, want none or FailedPrecondition", err)
		}
		_ = destinations(t, s.out)
		pk.tables.mu.Lock()
		defer pk.tables.mu.Unlock()
		for class, n := range pk.tables.total {
			if n != 0 || len(pk.tables.loads[class]) != 0 {
				t.Fatalf("class %s: %d in flight after the stream (%v)", class, n, pk.tables.loads[class])
			}
		}
	})
}
