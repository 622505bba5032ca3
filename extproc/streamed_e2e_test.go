package extproc_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	envoyconfigs "github.com/inferlb/inferlb/envoy-configs"
	"github.com/inferlb/inferlb/extproc"
	"github.com/inferlb/inferlb/internal/envoytest"
)

// counterValue sums a counter family's series whose labels include the
// given pairs (name, value, ...).
func counterValue(t *testing.T, s *extproc.Server, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := s.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	n := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			n += m.GetCounter().GetValue()
		}
	}
	return n
}

// Behind the frontend bootstrap's streamed body mode, Envoy streams the
// body to ext_proc without waiting for the headers' answer, and ext_proc routes in that answer, once
// the body has ended: requests are routed by their body (the model picks
// the class), a slow client's upload outlives message_timeout (ext_proc
// extends Envoy's timer), a chunked body past the limit gets 413 as its
// chunks arrive, and a body that ends with trailers is routed too.
func TestStreamedBodies(t *testing.T) {
	noLeaks(t)
	r := startRig(t, rigOptions{bodyLimit: 64 << 10, bodyMode: envoyconfigs.BodyStreamed})
	buffered0 := counterValue(t, r.ext, "inferlb_extproc_request_bodies_total", "mode", "buffered")
	streamed0 := counterValue(t, r.ext, "inferlb_extproc_request_bodies_total", "mode", "streamed")

	// Routed by the body: each model to its class's engines.
	for i := 0; i < 20; i++ {
		res := r.post(chat("s", fmt.Sprintf("hello %d", i)), map[string]string{"x-session-id": fmt.Sprint(i)})
		if res.status != 200 || !strings.HasPrefix(res.engine, "e") {
			t.Fatalf("llama request %d: %d from %q: %s", i, res.status, res.engine, res.body)
		}
	}
	if res := r.post(chatMsgs("qwen-2-7b", []msg{{"user", "hi"}}, nil), nil); res.status != 200 || res.engine != "qwen0" {
		t.Fatalf("qwen request: %d %s %s", res.status, res.engine, res.body)
	}
	if got := counterValue(t, r.ext, "inferlb_extproc_request_bodies_total", "mode", "streamed") - streamed0; got != 21 {
		t.Fatalf("%v bodies streamed, want 21", got)
	}
	if got := counterValue(t, r.ext, "inferlb_extproc_request_bodies_total", "mode", "buffered") - buffered0; got != 0 {
		t.Fatalf("%v bodies buffered, want none: the bootstrap streams them", got)
	}

	// A client that pauses mid-body for longer than message_timeout (1 s):
	// ext_proc extends the timer after its grace, and the request is served.
	body := chat("slow", "a client on a slow link")
	pr, pw := io.Pipe()
	done := make(chan result, 1)
	go func() {
		req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", pr)
		req.ContentLength = int64(len(body))
		req.Header.Set("content-type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			done <- result{status: -1, body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- result{status: resp.StatusCode, body: string(b)}
	}()
	start := time.Now()
	if _, err := pw.Write(body[:len(body)/2]); err != nil {
		t.Fatal(err)
	}
	slow0 := 0.0
	if err := envoytest.Poll(context.Background(), 10*time.Second, 10*time.Millisecond, func() error {
		if n := counterValue(t, r.ext, "inferlb_extproc_slow_uploads_total"); n == slow0 {
			return fmt.Errorf("no slow upload counted yet")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	// The pause under test: the rest of the body comes past the 1-s
	// message_timeout.
	<-time.After(time.Until(start.Add(1500 * time.Millisecond)))
	if _, err := pw.Write(body[len(body)/2:]); err != nil {
		t.Fatal(err)
	}
	pw.Close()
	if res := <-done; res.status != 200 {
		t.Fatalf("slow upload: %d %s (want 200: ext_proc extends Envoy's timer)", res.status, res.body)
	}
	if took := time.Since(start); took < time.Second {
		t.Fatalf("the slow upload took %v: the pause was not past message_timeout", took)
	}

	// Chunked past the limit, no content-length: 413 from ext_proc as the
	// chunks arrive, not a 504 when Envoy's buffer stalls.
	big := chat("sys", strings.Repeat("word ", (64<<10)/5))
	rej0 := counterValue(t, r.ext, "inferlb_extproc_rejected_total", "reason", "too_large")
	res := r.postChunked("/v1/chat/completions", big)
	if res.status != 413 {
		t.Fatalf("chunked oversized: %d %s", res.status, res.body)
	}
	if m, _, _ := openAIError(t, res.body); !strings.Contains(m, "exceeds the limit of 65536 bytes") {
		t.Fatalf("chunked oversized message %q", m)
	}
	if counterValue(t, r.ext, "inferlb_extproc_rejected_total", "reason", "too_large") != rej0+1 {
		t.Fatal("the chunked oversized body was not refused by ext_proc")
	}

	// A body that ends with trailers, over HTTP/2 (Envoy drops HTTP/1's):
	// no chunk says the body ended, and Envoy 1.40 holds the trailers until
	// the headers' answer.
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	h2 := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{Protocols: &protos}}
	defer h2.CloseIdleConnections()
	// With its content-length, ext_proc knows when the body is whole.
	tb := chat("t", "with trailers")
	req, _ := http.NewRequest("POST", r.url+"/v1/chat/completions", io.MultiReader(bytes.NewReader(tb)))
	req.ContentLength = int64(len(tb))
	req.Header.Set("content-type", "application/json")
	req.Trailer = http.Header{"X-Checksum": {"abc"}}
	resp, err := h2.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("body with trailers: %d %s", resp.StatusCode, b)
	}
}

// Behind the default (buffered) bootstrap, a body declared at least
// StreamAbove long is streamed by a route of its own: one within the
// limits is routed by its body as any other (Envoy routes it again by the
// decision's cluster header), and a hostile one, a hundred thousand tiny
// messages, is refused 400 on what its first bytes prove, before Envoy
// has sent ext_proc the rest; the bodies below StreamAbove stay buffered.
func TestLargeBodiesStreamed(t *testing.T) {
	noLeaks(t)
	r := startRig(t, rigOptions{bodyLimit: 4 << 20, streamAbove: 64 << 10})
	mode := func(m string) float64 {
		return counterValue(t, r.ext, "inferlb_extproc_request_bodies_total", "mode", m)
	}
	buffered0, streamed0 := mode("buffered"), mode("streamed")

	if res := r.post(chat("s", "a short one"), nil); res.status != 200 || !strings.HasPrefix(res.engine, "e") {
		t.Fatalf("a short request: %d from %q: %s", res.status, res.engine, res.body)
	}
	long := chat("s", strings.Repeat("lorem ipsum ", 10_000)) // 120 KB
	if res := r.post(long, nil); res.status != 200 || !strings.HasPrefix(res.engine, "e") {
		t.Fatalf("a long request: %d from %q: %s", res.status, res.engine, res.body)
	}
	if res := r.post(chatMsgs("qwen-2-7b", []msg{{"user", strings.Repeat("dolor sit ", 10_000)}}, nil), nil); res.status != 200 || res.engine != "qwen0" {
		t.Fatalf("a long qwen request: %d from %q: %s", res.status, res.engine, res.body)
	}
	if b, s := mode("buffered")-buffered0, mode("streamed")-streamed0; b != 1 || s != 2 {
		t.Fatalf("bodies buffered %v, streamed %v; want 1 and 2", b, s)
	}

	// The client sends the first 640 KB of the 3.1 MB it declares (past
	// the 16,385th message, which proves it over --max-messages) and the
	// rest only after the answer: a body read whole would never be
	// answered.
	msg := `{"role":"user","content":"a"}`
	hostile := `{"model":"llama-3-8b","messages":[` + strings.Repeat(msg+",", 99_999) + msg + `]}`
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	answered := make(chan struct{})
	go func() {
		_, _ = pw.Write([]byte(hostile[:640<<10]))
		select {
		case <-answered:
			pw.CloseWithError(errors.New("answered before the upload ended"))
		case <-ctx.Done():
			pw.CloseWithError(errors.New("no answer to the body's first 640 KB within 10 s"))
		}
	}()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r.url+"/v1/chat/completions", pr)
	req.ContentLength = int64(len(hostile))
	req.Header.Set("content-type", "application/json")
	hc := &http.Client{}
	defer hc.CloseIdleConnections()
	resp, err := hc.Do(req)
	close(answered)
	if err != nil {
		t.Fatalf("100,000 messages, the first 640 KB sent: %v (no answer before the rest of the body)", err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 400 || !strings.Contains(string(b), `"too_many_messages"`) {
		t.Fatalf("100,000 messages (%d bytes): %d %s, want 400 too_many_messages", len(hostile), resp.StatusCode, b)
	}
	if got := counterValue(t, r.ext, "inferlb_extproc_request_bodies_cut_total"); got != 1 {
		t.Fatalf("bodies cut short: %v, want 1 (the hostile body refused before its end)", got)
	}
}
