package extproc

import (
	"context"
	"encoding/json"
	"net"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/lni/goutils/leaktest"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/internal/tokens/hf"
)

// Messages out of order end the stream with FailedPrecondition instead of a
// guess; before any policy, requests get 503.
func TestStateMachine(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	s := New(Options{Registry: prometheus.NewRegistry()})
	c := serveOnLoopback(t, s)
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

// serveOnLoopback serves s over gRPC on a loopback port with the given
// server options and returns a client of it; both stop when the test ends
// (before a leak check registered earlier with t.Cleanup).
func serveOnLoopback(t *testing.T, s *Server, opts ...grpc.ServerOption) extprocv3.ExternalProcessorClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(opts...)
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		g.Stop()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		g.Stop()
	})
	return extprocv3.NewExternalProcessorClient(conn)
}

// Demand reports count a request's output as its max_tokens, or the class's
// mean_output_tokens from the policy when the body states none (not 0,
// which made the control plane underestimate decode demand).
func TestDemandOutputTokens(t *testing.T) {
	s := New(Options{Registry: prometheus.NewRegistry()})
	if err := s.SetPolicy(&policyv1.RoutingPolicy{NodeId: "n", Version: "1",
		Priorities: []*policyv1.Priority{{Name: "p", Level: 0}}, DefaultPriority: "p",
		Classes: []*policyv1.ClassPolicy{{Name: "llama", Cluster: "c", Model: "m", MeanOutputTokens: 300}}}); err != nil {
		t.Fatal(err)
	}
	hdr := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")}}}}}}
	for _, body := range []string{
		`{"model":"m","messages":[{"role":"user","content":"a"}]}`,                           // no max_tokens: 300
		`{"model":"m","max_tokens":40,"messages":[{"role":"user","content":"b"}]}`,           // 40
		`{"model":"m","max_completion_tokens":0,"messages":[{"role":"user","content":"c"}]}`, // stated 0: 0
	} {
		st := &stream{}
		if _, err := s.step(st, hdr); err != nil {
			t.Fatal(err)
		}
		r, err := s.step(st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: []byte(body), EndOfStream: true}}})
		if err != nil || r.GetRequestBody() == nil {
			t.Fatalf("%s: %v %v", body, r, err)
		}
		s.abandon(st.id)
	}
	rep := s.Observer().Flush(time.Now())
	if len(rep.GetDemand()) != 1 || rep.GetDemand()[0].GetRequests() != 3 || rep.GetDemand()[0].GetOutputTokens() != 340 {
		t.Fatalf("demand %v, want 3 requests and 300+40+0 = 340 output tokens", rep.GetDemand())
	}
}

// TestContextBoundMethods: the cheapest bound that decides is used —
// 11 × bytes for a short request, the bytes bound when it settles the
// class, the tokenizer only near a limit, and counting stops past the
// smaller class's limit (a long prompt is not tokenized whole).
func TestContextBoundMethods(t *testing.T) {
	tok, err := hf.Load("../internal/tokens/hf/testdata/gpt2.tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	s := New(Options{Registry: prometheus.NewRegistry(), Tokenizers: map[string]*hf.Tokenizer{tok.SHA256(): tok}})
	if err := s.SetPolicy(&policyv1.RoutingPolicy{NodeId: "n", Version: "1",
		Priorities: []*policyv1.Priority{{Name: "p", Level: 0}}, DefaultPriority: "p",
		Classes: []*policyv1.ClassPolicy{
			{Name: "short", Cluster: "c1", Model: "m", MaxContextTokens: 4096, TokenizerSha256: tok.SHA256(), ChatTemplateTokens: 16},
			{Name: "long", Cluster: "c2", Model: "m", MaxContextTokens: 1 << 20, TokenizerSha256: tok.SHA256(), ChatTemplateTokens: 16},
		}}); err != nil {
		t.Fatal(err)
	}
	chat := func(text string) string {
		b, _ := json.Marshal(map[string]any{"model": "m", "max_tokens": 10, "messages": []map[string]string{{"role": "user", "content": text}}})
		return string(b)
	}
	cases := []struct {
		name, body, class, method string
	}{
		{"short request", chat("hello there"), "short", boundShort},
		{"bytes settle it", chat(strings.Repeat("a", 3000)), "short", boundBytes},
		{"near the limit: counted", chat(strings.Repeat("word ", 1000)), "short", boundTokenizer},
		{"digits over the limit", chat(strings.Repeat("9,", 2100)), "long", boundTokenizer},
		{"long prompt: counting stops early", chat(strings.Repeat("word ", 200000)), "long", boundTokenizer},
	}
	hdr := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")}}}}}}
	for _, c := range cases {
		before := testutil.ToFloat64(s.m.contextBounds.WithLabelValues(c.method))
		st := &stream{}
		if _, err := s.step(st, hdr); err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		r, err := s.step(st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: []byte(c.body), EndOfStream: true}}})
		took := time.Since(t0)
		if err != nil || r.GetRequestBody() == nil {
			t.Fatalf("%s: %v %v", c.name, r, err)
		}
		if st.dc.Class.Name != c.class || testutil.ToFloat64(s.m.contextBounds.WithLabelValues(c.method)) != before+1 {
			t.Errorf("%s: class %s, want %s by %s", c.name, st.dc.Class.Name, c.class, c.method)
		}
		t.Logf("%s: %d bytes, %v", c.name, len(c.body), took)
		s.abandon(st.id)
	}
}

// The policy version is one series however many versions a frontend applies
// (a {version} label would leave a series per version in Prometheus), and
// its value tells versions apart; a rejected policy leaves it alone.
func TestPolicyVersionMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := New(Options{Registry: reg})
	series := func() []float64 {
		t.Helper()
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		var vals []float64
		for _, mf := range mfs {
			if mf.GetName() == "inferlb_extproc_policy_version_hash" {
				for _, m := range mf.GetMetric() {
					vals = append(vals, m.GetGauge().GetValue())
				}
			}
		}
		return vals
	}
	if v := series(); len(v) != 1 || v[0] != 0 {
		t.Fatalf("before any policy: %v, want one series at 0", v)
	}
	for _, version := range []string{"a1", "b2", "c3"} {
		p := testPolicy()
		p.Version = version
		if err := s.SetPolicy(p); err != nil {
			t.Fatal(err)
		}
		if v := series(); len(v) != 1 || v[0] != VersionHash(version) {
			t.Fatalf("after %s: %v, want one series at %v", version, v, VersionHash(version))
		}
	}
	if VersionHash("a1") == VersionHash("b2") || VersionHash("") == 0 {
		t.Fatal("VersionHash does not tell versions apart from each other or from no policy")
	}
	bad := testPolicy()
	bad.Version = "bad"
	bad.DefaultPriority = "no-such-priority"
	if err := s.SetPolicy(bad); err == nil {
		t.Fatal("a policy with an unknown default priority was accepted")
	}
	if v := series(); len(v) != 1 || v[0] != VersionHash("c3") {
		t.Fatalf("after a rejected policy: %v, want c3's %v", v, VersionHash("c3"))
	}
}
