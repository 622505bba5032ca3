package extproc

import (
	"context"
	"errors"
	"io"
	"strconv"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/lni/goutils/leaktest"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc/body"
)

// streamedHeaders is the first message of a request as Envoy sends it in
// the given body mode (with or without send_body_without_waiting), with a
// content-length unless cl < 0.
func streamedHeaders(mode extprocfilterv3.ProcessingMode_BodySendMode, noWait bool, cl int) *extprocv3.ProcessingRequest {
	h := []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")}}
	if cl >= 0 {
		h = append(h, &corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(cl))})
	}
	return &extprocv3.ProcessingRequest{
		Request:        &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: h}}},
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: mode, SendBodyWithoutWaitingForHeaderResponse: noWait},
	}
}

func chunk(b []byte, end bool) *extprocv3.ProcessingRequest {
	return &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: b, EndOfStream: end}}}
}

// The ext_proc protocol of a streamed body (STREAMED, sent without waiting
// for the headers' answer), message by message: the headers' answer waits
// for the body and carries the decision, each chunk is answered after it,
// then the stream ends; a body is whole at its end, its trailers, or its
// declared length; one past the limit is refused as its chunks arrive; a
// slow upload gets Envoy's timer extended once; modes the service cannot
// route in are refused with what to configure.
func TestStreamedBodyProtocol(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	s := benchServer(t)
	s.opt.BodyLimit = 4096
	c := serveOnLoopback(t, s, grpc.ForceServerCodecV2(Codec{}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	body := []byte(`{"model":"llama-3-8b","messages":[{"role":"user","content":"hello there"}]}`)
	streamed := extprocfilterv3.ProcessingMode_STREAMED

	// exchange sends msgs and returns what the service answered until it
	// ended the stream.
	exchange := func(msgs ...*extprocv3.ProcessingRequest) ([]*extprocv3.ProcessingResponse, error) {
		t.Helper()
		st, err := c.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if err := st.Send(m); err != nil {
				t.Fatal(err)
			}
		}
		var out []*extprocv3.ProcessingResponse
		for {
			r, err := st.Recv()
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			if err != nil {
				return out, err
			}
			out = append(out, r)
		}
	}
	// routed checks a decision in the headers' answer, then n chunk
	// answers (and a trailers' answer if trailers).
	routed := func(name string, out []*extprocv3.ProcessingResponse, err error, n int, trailers bool) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		want := 1 + n
		if trailers {
			want++
		}
		if len(out) != want {
			t.Fatalf("%s: %d answers, want %d: %v", name, len(out), want, out)
		}
		cr := out[0].GetRequestHeaders().GetResponse()
		if !cr.GetClearRouteCache() || len(cr.GetHeaderMutation().GetSetHeaders()) == 0 || cr.GetHeaderMutation().GetSetHeaders()[0].GetHeader().GetKey() != "x-inferlb-cluster" {
			t.Fatalf("%s: the headers' answer is not the decision: %v", name, out[0])
		}
		for _, r := range out[1 : 1+n] {
			if r.GetRequestBody() == nil || r.GetRequestBody().GetResponse() != nil {
				t.Fatalf("%s: a chunk's answer is not a plain continue: %v", name, r)
			}
		}
		if trailers && out[want-1].GetRequestTrailers() == nil {
			t.Fatalf("%s: no trailers' answer last: %v", name, out[want-1])
		}
	}
	streamed0 := testutil.ToFloat64(s.m.bodiesStreamed)

	// Chunked, no content-length: whole at the chunk that ends it.
	out, err := exchange(streamedHeaders(streamed, true, -1), chunk(body[:20], false), chunk(body[20:], false), chunk(nil, true))
	routed("chunked", out, err, 3, false)
	// With its content-length: whole at its last byte, without waiting
	// for Envoy's (empty) end chunk.
	out, err = exchange(streamedHeaders(streamed, true, len(body)), chunk(body[:30], false), chunk(body[30:], false))
	routed("declared length", out, err, 2, false)
	out, err = exchange(streamedHeaders(streamed, true, len(body)), chunk(body, false))
	routed("declared length, one chunk", out, err, 1, false)
	// Ended by trailers.
	out, err = exchange(streamedHeaders(streamed, true, -1), chunk(body, false),
		&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}})
	routed("trailers", out, err, 1, true)
	if got := testutil.ToFloat64(s.m.bodiesStreamed) - streamed0; got != 4 {
		t.Fatalf("%v streamed bodies counted, want 4", got)
	}

	// Past the limit, chunked: 413 at the chunk that crosses it, the
	// others never waited for.
	big := []byte(`{"model":"llama-3-8b","messages":[{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`)
	out, err = exchange(streamedHeaders(streamed, true, -1), chunk(big[:3000], false), chunk(big[3000:], false))
	if err != nil || len(out) != 1 || out[0].GetImmediateResponse().GetStatus().GetCode() != 413 ||
		!strings.Contains(string(out[0].GetImmediateResponse().GetBody()), "exceeds the limit of 4096 bytes") {
		t.Fatalf("chunked past the limit: want one 413 answer, got %v %v", out, err)
	}

	// A slow upload: after UploadGrace the service asks Envoy to wait
	// UploadTimeout, once; the request is then decided as usual.
	slow0 := testutil.ToFloat64(s.m.slowUploads)
	st, err := c.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(streamedHeaders(streamed, true, len(body))); err != nil {
		t.Fatal(err)
	}
	if err := st.Send(chunk(body[:10], false)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	r, err := st.Recv()
	if err != nil || r.GetOverrideMessageTimeout().AsDuration() != DefaultUploadTimeout || r.Response != nil {
		t.Fatalf("slow upload: want an override_message_timeout of %v alone, got %v %v", DefaultUploadTimeout, r, err)
	}
	if waited := time.Since(start); waited > 5*time.Second {
		t.Fatalf("the timer was extended after %v", waited)
	}
	if got := testutil.ToFloat64(s.m.slowUploads) - slow0; got != 1 {
		t.Fatalf("%v slow uploads counted, want 1", got)
	}
	if err := st.Send(chunk(body[10:], false)); err != nil {
		t.Fatal(err)
	}
	var rest []*extprocv3.ProcessingResponse
	for {
		r, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		rest = append(rest, r)
	}
	routed("slow upload", rest, nil, 2, false)

	// Modes the service cannot route in.
	for _, m := range []struct {
		mode   extprocfilterv3.ProcessingMode_BodySendMode
		noWait bool
		says   string
	}{
		{streamed, false, "STREAMED without send_body_without_waiting_for_header_response"},
		{extprocfilterv3.ProcessingMode_FULL_DUPLEX_STREAMED, true, "request_body_mode FULL_DUPLEX_STREAMED"},
		{extprocfilterv3.ProcessingMode_NONE, false, "request_body_mode NONE"},
	} {
		_, err := exchange(streamedHeaders(m.mode, m.noWait, len(body)))
		if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), m.says) || !strings.Contains(err.Error(), "configure the ext_proc filter's request_body_mode BUFFERED, or STREAMED with") {
			t.Fatalf("%v: want FailedPrecondition saying %q and what to configure, got %v", m.mode, m.says, err)
		}
	}
	// BUFFERED, as before: continue to the headers, the decision with the body.
	out, err = exchange(streamedHeaders(extprocfilterv3.ProcessingMode_BUFFERED, false, len(body)), chunk(body, true))
	if err != nil || len(out) != 2 || out[0].GetRequestHeaders().GetResponse() != nil || out[1].GetRequestBody().GetResponse().GetHeaderMutation() == nil {
		t.Fatalf("buffered: %v %v", out, err)
	}
}

// A streamed body over a limit is refused as soon as its first bytes prove
// it, before the rest arrives (the bootstrap streams large bodies so that
// Envoy need not read a hostile one whole), with the answer the whole body
// gets; a body as large within the limits is read to its end and routed.
func TestStreamedBodyProvedOverEarly(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	s := benchServerWith(t, nil, []*policyv1.ClassPolicy{{Name: "llama", Cluster: "c", Model: "llama-3-8b", MaxContextTokens: 131072, RetryBudgetFraction: 0.1, MaxRetries: 1}})
	s.dec.SetMaxMessages(10_000)
	c := serveOnLoopback(t, s, grpc.ForceServerCodecV2(Codec{}))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// send streams body in chunks of chunkSize and returns the first
	// answer, and how many bytes had been sent when it came (each chunk is
	// given the time to be read before the next goes).
	send := func(body []byte, chunkSize int) (*extprocv3.ProcessingResponse, int) {
		t.Helper()
		st, err := c.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer st.CloseSend()
		if err := st.Send(streamedHeaders(extprocfilterv3.ProcessingMode_STREAMED, true, len(body))); err != nil {
			t.Fatal(err)
		}
		recv := make(chan *extprocv3.ProcessingResponse, 1)
		go func() {
			for {
				r, err := st.Recv()
				if err == nil && r.GetOverrideMessageTimeout() != nil {
					continue // a slow upload's timer extension, for Envoy
				}
				recv <- r
				return
			}
		}()
		sent := 0
		for sent < len(body) {
			end := min(sent+chunkSize, len(body))
			if err := st.Send(chunk(body[sent:end], end == len(body))); err != nil {
				break // the service answered and ended the stream
			}
			sent = end
			select {
			case r := <-recv:
				return r, sent
			case <-time.After(100 * time.Millisecond):
			}
		}
		select {
		case r := <-recv:
			return r, sent
		case <-ctx.Done():
			t.Fatal("no answer")
		}
		return nil, 0
	}

	// 100,000 tiny messages (3.1 MB), over the 10,000-message limit from
	// the 10,001st, about 300 KB in.
	msg := `{"role":"user","content":"a"}`
	hostile := []byte(`{"model":"llama-3-8b","messages":[` + strings.Repeat(msg+",", 99_999) + msg + `]}`)
	var whole Decision
	want := s.dec.Decide(Input{Kind: body.Chat, Body: hostile, Now: time.Now()}, &whole)
	if want == nil || want.e.code != "too_many_messages" {
		t.Fatalf("the whole body: %v, want too_many_messages", want)
	}
	// Over gRPC, as Envoy sends it: refused before the rest arrives.
	r, sent := send(hostile, 64<<10)
	if ir := r.GetImmediateResponse(); ir.GetStatus().GetCode() != 400 || string(ir.GetBody()) != string(want.e.body()) {
		t.Fatalf("answer %v, want the whole body's 400: %s", r, want.e.body())
	}
	if sent >= len(hostile) {
		t.Fatalf("answered after all %d bytes: the proof is in the first 300 KB", len(hostile))
	}
	// Which chunk is answered, driven through the state machine one
	// message at a time (what is asserted is not how fast). In chunks of
	// 64 KiB the first check comes at 256 KiB, short of the proof (the
	// 10,001st message starts at byte 300,063), the next at 512 KiB (the
	// eighth). In chunks of 75,000 bytes the first comes at 300,000, just
	// short of it; the next is still at 512 KiB, with the chunk that
	// crosses it (the seventh), not at twice the size first checked (the
	// eighth).
	for _, c := range []struct{ size, want int }{{64 << 10, 8}, {75_000, 7}} {
		st := &stream{}
		if r, err := s.step(st, streamedHeaders(extprocfilterv3.ProcessingMode_STREAMED, true, len(hostile))); r != nil || err != nil {
			t.Fatalf("headers: answer %v, %v; want none before the body", r, err)
		}
		var err error
		n := 0
		for r, sent = nil, 0; sent < len(hostile) && r == nil; n++ {
			end := min(sent+c.size, len(hostile))
			if r, err = s.step(st, chunk(hostile[sent:end], end == len(hostile))); err != nil {
				t.Fatal(err)
			}
			sent = end
		}
		st.releaseHeld()
		s.holdBody(st, 0)
		if ir := r.GetImmediateResponse(); ir.GetStatus().GetCode() != 400 || string(ir.GetBody()) != string(want.e.body()) {
			t.Fatalf("in chunks of %d bytes: answer %v, want the whole body's 400: %s", c.size, r, want.e.body())
		}
		if n != c.want {
			t.Fatalf("in chunks of %d bytes: answered at chunk %d (%d of %d bytes), want %d (the first past 512 KiB)", c.size, n, sent, len(hostile), c.want)
		}
	}

	// 600 KB of words in one message (120,000 tokens): within the limits,
	// read whole and routed.
	long := []byte(`{"model":"llama-3-8b","messages":[{"role":"user","content":"` + strings.Repeat("word ", 120_000) + `"}]}`)
	r, sent = send(long, 64<<10)
	if sent != len(long) || r.GetRequestHeaders().GetResponse().GetHeaderMutation() == nil {
		t.Fatalf("a long prompt within the limits: answer %v after %d of %d bytes, want its route after the whole body", r, sent, len(long))
	}
}
