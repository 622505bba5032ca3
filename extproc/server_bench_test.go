package extproc

import (
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/proto"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/internal/tokens/hf"
)

func benchBody(size int) []byte {
	var sb strings.Builder
	words := []string{"the", "model", "serves", "tokens", "quickly", "while", "cache", "blocks"}
	for i := 0; sb.Len() < size-220; i++ {
		sb.WriteString(words[i%len(words)])
		sb.WriteByte(' ')
	}
	return []byte(fmt.Sprintf(`{"model":"llama-3-8b","stream":true,"max_tokens":128,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":%q}]}`, sb.String()))
}

func benchServer(b testing.TB) *Server {
	return benchServerWith(b, nil, []*policyv1.ClassPolicy{{Name: "llama", Cluster: "c", Model: "llama-3-8b", RetryBudgetFraction: 0.1, MaxRetries: 1}})
}

func benchServerWith(b testing.TB, toks map[string]*hf.Tokenizer, classes []*policyv1.ClassPolicy) *Server {
	s := New(Options{Registry: prometheus.NewRegistry(), Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Tokenizers: toks})
	err := s.SetPolicy(&policyv1.RoutingPolicy{NodeId: "n", Region: "r", Version: "1",
		Priorities: []*policyv1.Priority{{Name: "p", Level: 0}}, DefaultPriority: "p", Classes: classes})
	if err != nil {
		b.Fatal(err)
	}
	return s
}

// twoClassServer has an 8K and a 128K class of one model with GPT-2's
// tokenizer (the context bound's costly path: 8 KB bodies are near the
// small class's limit and get counted; 220 KB ones are counted up to it).
func twoClassServer(b *testing.B) *Server {
	tok, err := hf.Load("../internal/tokens/hf/testdata/gpt2.tokenizer.json.gz")
	if err != nil {
		b.Fatal(err)
	}
	return benchServerWith(b, map[string]*hf.Tokenizer{tok.SHA256(): tok}, []*policyv1.ClassPolicy{
		{Name: "short", Cluster: "c1", Model: "llama-3-8b", MaxContextTokens: 8192, TokenizerSha256: tok.SHA256(), ChatTemplateTokens: 64, RetryBudgetFraction: 0.1, MaxRetries: 1},
		{Name: "long", Cluster: "c2", Model: "llama-3-8b", MaxContextTokens: 131072, TokenizerSha256: tok.SHA256(), ChatTemplateTokens: 64, RetryBudgetFraction: 0.1, MaxRetries: 1},
	})
}

// BenchmarkDecision is one request's work in the service, without gRPC:
// request headers, body (parse, route, admit), response headers; the body
// message is decoded from its wire form as gRPC would.
func BenchmarkDecision(b *testing.B) {
	benchDecision(b, func(b *testing.B) *Server { return benchServer(b) })
}

// BenchmarkDecisionNearLimit is BenchmarkDecision where the context bound
// must count tokens (twoClassServer).
func BenchmarkDecisionNearLimit(b *testing.B) {
	benchDecision(b, twoClassServer)
}

func benchDecision(b *testing.B, server func(*testing.B) *Server) {
	for _, size := range []int{8 << 10, 220 << 10} {
		b.Run(strconv.Itoa(size>>10)+"KB", func(b *testing.B) {
			s := server(b)
			body := benchBody(size)
			hdr := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
					{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")},
					{Key: "content-length", RawValue: []byte(strconv.Itoa(len(body)))}, {Key: "x-session-id", RawValue: []byte("s1")},
				}}}}}
			wire, _ := proto.Marshal(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}})
			rh := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
				Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}}}}
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				st := &stream{}
				if _, err := s.step(st, hdr); err != nil {
					b.Fatal(err)
				}
				var req extprocv3.ProcessingRequest
				if err := proto.Unmarshal(wire, &req); err != nil {
					b.Fatal(err)
				}
				r, err := s.step(st, &req)
				if err != nil || r.GetRequestBody() == nil {
					b.Fatal(err, r)
				}
				if _, err := s.step(st, rh); err != nil {
					b.Fatal(err)
				}
				s.abandon(st.id)
			}
		})
	}
}
