package llmclient_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"

	"github.com/inferlb/inferlb/internal/llmclient"
	"github.com/inferlb/inferlb/internal/llmclient/llmclienttest"
	"github.com/inferlb/inferlb/internal/tokens"
)

func testClient(t testing.TB, url string) *llmclient.Client {
	c := &llmclient.Client{HTTP: llmclient.NewHTTPClient(256), BaseURL: url, Model: "m", IgnoreEOS: true, Timeout: 10 * time.Second}
	t.Cleanup(c.CloseIdleConnections)
	return c
}

func TestStreamParsing(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t)) // runs after the servers and clients close
	eng := llmclienttest.Start(t, &llmclienttest.Engine{Behave: func(*http.Request, *llmclient.APIRequest) string { return "multi" }, ITL: time.Millisecond})
	c := testClient(t, eng.URL())
	req := llmclient.Request{Prompt: "hello there", MaxTokens: 6}
	res := c.Do(context.Background(), &req, true)
	if res.Outcome != llmclient.OK || res.OutputTokens != 6 || !res.HasUsage || len(strings.Fields(res.Text)) != 6 || len(res.ITLs) != 0 {
		t.Fatalf("one chunk of 6 tokens: %+v", res)
	}
	if got := eng.Requests()[0]; got.Path != "/v1/completions" || got.Body.Prompt == nil || *got.Body.Prompt != "hello there" {
		t.Fatalf("completion request %+v", got)
	}
	// Without usage, output tokens are counted from the text.
	var buf bytes.Buffer
	buf.WriteString(": comment\n\ndata: {\"choices\":[{\"delta\":{\"content\":\"ab cd\"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":\" ef\"}}]}\n\ndata: [DONE]\n\n")
	var r llmclient.Result
	r.Sent = time.Now()
	err := llmclient.Stream(c, &buf, &r, true)
	r.E2E = time.Since(r.Sent)
	if err != nil || r.OutputTokens != 3 || r.Text != "ab cd ef" || len(r.ITLs) != 1 {
		t.Fatalf("stream without usage: %+v %v", r, err)
	}
	if tp, ok := r.TPOT(); !ok || tp < 0 {
		t.Fatalf("TPOT %v %v", tp, ok)
	}
	if err := llmclient.Stream(c, strings.NewReader("data: {oops\n\n"), &llmclient.Result{}, false); err == nil || !strings.Contains(err.Error(), "malformed SSE chunk") {
		t.Fatalf("malformed chunk: %v", err)
	}
}

func TestDirectPathReusesAndRecoversConnections(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	var conns atomic.Int64
	var closing atomic.Bool
	eng := llmclienttest.Start(t, &llmclienttest.Engine{ConnState: func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}, Behave: func(*http.Request, *llmclient.APIRequest) string {
		if closing.Load() {
			return "close"
		}
		return ""
	}})
	c := testClient(t, eng.URL())
	req := llmclient.Request{Messages: []tokens.Message{{Role: "user", Content: "hello"}}, MaxTokens: 3}
	for i := 0; i < 20; i++ {
		if res := c.Do(context.Background(), &req, false); res.Outcome != llmclient.OK {
			t.Fatalf("request %d: %v", i, res.Err)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Fatalf("20 sequential requests opened %d connections, want 1 (keep-alive)", n)
	}
	// The server drops its idle connections: the next request finds its
	// pooled connection dead and retries on a new one.
	eng.Server.CloseClientConnections()
	if res := c.Do(context.Background(), &req, false); res.Outcome != llmclient.OK {
		t.Fatalf("after the server closed the connection: %v", res.Err)
	}
	if n := conns.Load(); n != 2 {
		t.Fatalf("%d connections, want 2", n)
	}
	if len(eng.Requests()) != 21 {
		t.Fatalf("server saw %d requests, want 21 (no duplicate from the retry)", len(eng.Requests()))
	}
	// A response with Connection: close is not pooled.
	closing.Store(true)
	for i := 0; i < 3; i++ {
		if res := c.Do(context.Background(), &req, false); res.Outcome != llmclient.OK {
			t.Fatalf("Connection: close response %d: %v", i, res.Err)
		}
	}
	if n := conns.Load(); n != 4 {
		t.Fatalf("%d connections after three Connection: close answers, want 4", n)
	}
}

// Both paths report an answered request to an httptrace.ClientTrace, once
// (the drills tell streams the server answered from those still waiting).
func TestBothPathsReportTheFirstResponseByte(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	eng := llmclienttest.Start(t, &llmclienttest.Engine{})
	req := llmclient.Request{Messages: []tokens.Message{{Role: "user", Content: "hello"}}, MaxTokens: 3}
	for _, netHTTP := range []bool{false, true} {
		c := testClient(t, eng.URL())
		c.NetHTTP = netHTTP
		for i := 0; i < 3; i++ {
			var got atomic.Int64
			ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{GotFirstResponseByte: func() { got.Add(1) }})
			if res := c.Do(ctx, &req, false); res.Outcome != llmclient.OK {
				t.Fatalf("NetHTTP %v, request %d: %v", netHTTP, i, res.Err)
			}
			if n := got.Load(); n != 1 {
				t.Errorf("NetHTTP %v, request %d: GotFirstResponseByte called %d times, want 1", netHTTP, i, n)
			}
		}
	}
}
