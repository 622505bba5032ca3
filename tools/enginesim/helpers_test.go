package enginesim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/internal/envoyrun"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// testProfile has large, round step costs so load effects dwarf timer noise:
// a step is 20 ms + 2 ms per decoding sequence + 1 ms per 10 prefilled
// tokens; each request pays 10 ms overhead.
var testProfile = fleet.Profile{
	GPU: "T", Model: "m", PrefillTokensPerS: 10000, OverheadMs: 10, DecodeStepMs: 20,
	DecodeStepPerSeqMs: 2, MaxRunning: 64, MaxBatchedTokens: 4096, KVCapacityTokens: 200000,
	BlockSize: 16, MaxContextTokens: 4096,
}

// start starts an engine; the caller closes it (defer s.Close() after the
// leaktest defer, so it runs first).
func start(t *testing.T, o Options) *Server {
	t.Helper()
	if o.Model == "" {
		o.Model = "m"
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if o.Profile.PrefillTokensPerS == 0 {
		o.Profile = testProfile
	}
	s, err := Start(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// chatBody is a chat request whose user message has n words (n+2 tokens
// with the two role markers) starting with prefix.
func chatBody(model, system, user string, maxTokens int, stream bool) []byte {
	m := map[string]any{
		"model": model,
		"messages": []map[string]any{
			{"role": "system", "content": system},
			{"role": "user", "content": user},
		},
		"stream": stream,
	}
	if maxTokens > 0 {
		m["max_tokens"] = maxTokens
	}
	if stream {
		m["stream_options"] = map[string]any{"include_usage": true}
	}
	b, _ := json.Marshal(m)
	return b
}

// text returns n distinct-ish words with the given seed word.
func text(seed string, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		fmt.Fprintf(&b, "%s%d", seed, i)
	}
	return b.String()
}

type chunk struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Model   string `json:"model"`
	Choices []struct {
		Index int `json:"index"`
		Delta *struct {
			Role    string  `json:"role"`
			Content *string `json:"content"`
		} `json:"delta"`
		Text         *string `json:"text"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		TotalTokens         int `json:"total_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// streamResult is a parsed SSE response.
type streamResult struct {
	chunks    []chunk
	content   string
	finish    string
	done      bool
	firstTok  time.Duration // from request start to the first content chunk
	tokenTime []time.Duration
}

// readSSE parses an SSE body strictly: every event is one "data: " line
// followed by a blank line, and the stream ends with data: [DONE].
func readSSE(t *testing.T, body io.Reader, t0 time.Time) *streamResult {
	t.Helper()
	res := &streamResult{}
	br := bufio.NewReader(body)
	for {
		line, err := br.ReadString('\n')
		if err == io.EOF && line == "" {
			break
		}
		if err != nil {
			t.Fatalf("reading stream: %v (partial %q)", err, line)
		}
		if !strings.HasPrefix(line, "data: ") || !strings.HasSuffix(line, "\n") {
			t.Fatalf("not an SSE data line: %q", line)
		}
		blank, err := br.ReadString('\n')
		if err != nil || blank != "\n" {
			t.Fatalf("event not followed by a blank line: %q %v", blank, err)
		}
		payload := strings.TrimSuffix(strings.TrimPrefix(line, "data: "), "\n")
		if res.done {
			t.Fatalf("data after [DONE]: %q", payload)
		}
		if payload == "[DONE]" {
			res.done = true
			continue
		}
		var c chunk
		dec := json.NewDecoder(strings.NewReader(payload))
		if err := dec.Decode(&c); err != nil {
			t.Fatalf("chunk is not JSON: %v: %q", err, payload)
		}
		res.chunks = append(res.chunks, c)
		for _, ch := range c.Choices {
			var s *string
			if ch.Delta != nil {
				s = ch.Delta.Content
			} else {
				s = ch.Text
			}
			if s != nil && *s != "" {
				el := time.Since(t0)
				if res.content == "" {
					res.firstTok = el
				}
				res.tokenTime = append(res.tokenTime, el)
				res.content += *s
			}
			if ch.FinishReason != nil {
				res.finish = *ch.FinishReason
			}
		}
	}
	return res
}

func post(t *testing.T, ctx context.Context, url string, body []byte, hdr map[string]string) (*http.Response, time.Time) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	t0 := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp, t0
}

// streamChat sends a streaming chat request and parses the whole stream.
func streamChat(t *testing.T, s *Server, body []byte, hdr map[string]string) *streamResult {
	t.Helper()
	resp, t0 := post(t, context.Background(), s.URL()+"/v1/chat/completions", body, hdr)
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d: %s", resp.StatusCode, b)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Fatalf("content type %q", ct)
	}
	return readSSE(t, resp.Body, t0)
}

// scrape parses the engine's /metrics with expfmt.
func scrape(t *testing.T, s *Server) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.LegacyValidation)
	mf, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return mf
}

// value returns the value of the family's metric whose labels include want.
func value(t *testing.T, mf map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	t.Helper()
	f := mf[name]
	if f == nil {
		t.Fatalf("metric %s missing", name)
	}
outer:
	for _, m := range f.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		if labels["model_name"] != "m" {
			t.Errorf("%s: model_name label %q", name, labels["model_name"])
		}
		for k, v := range want {
			if labels[k] != v {
				continue outer
			}
		}
		switch {
		case m.Gauge != nil:
			return m.Gauge.GetValue()
		case m.Counter != nil:
			return m.Counter.GetValue()
		case m.Histogram != nil:
			return float64(m.Histogram.GetSampleCount())
		}
	}
	t.Fatalf("metric %s%v missing", name, want)
	return 0
}

// eventually polls cond every 5 ms until it holds or the deadline passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if err := envoyrun.Poll(context.Background(), d, 5*time.Millisecond, func() error {
		if !cond() {
			return fmt.Errorf("waiting for %s", what)
		}
		return nil
	}); err != nil {
		t.Fatalf("timed out: %v", err)
	}
}
