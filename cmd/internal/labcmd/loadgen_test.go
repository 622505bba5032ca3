package labcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"

	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/tools/enginesim"
)

func runLoadgen(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	cmd := newLoadgenCmd()
	var out, errOut bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	cmd.SetArgs(args)
	cmd.SilenceUsage, cmd.SilenceErrors = true, true
	err = cmd.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

func TestLoadgenRejectsBadFlags(t *testing.T) {
	dir := t.TempDir()
	badTrace := filepath.Join(dir, "bad.csv")
	os.WriteFile(badTrace, []byte("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,12,x\n"), 0o644)
	u := []string{"--url", "http://127.0.0.1:1", "--model", "m"}
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"--model", "m", "--workload", "azure"}, "--url is required"},
		{[]string{"--url", "localhost:80", "--model", "m", "--workload", "azure"}, "--url: \"localhost:80\" is not an http(s)://host[:port] URL"},
		{append(u, "--workload", "sharegpt"), `--workload "sharegpt": want mooncake, azure or multiturn`},
		{append(u, "--workload", "azure"), "--workload azure needs --trace FILE"},
		{append(u, "--workload", "azure", "--trace", badTrace), "azure trace line 2: GeneratedTokens: \"x\" is not an integer"},
		{append(u, "--workload", "multiturn"), "--workload multiturn has no timestamps: choose --arrival poisson"},
		{append(u, "--workload", "multiturn", "--arrival", "poisson"), "poisson arrivals need a rate > 0"},
		{append(u, "--workload", "multiturn", "--arrival", "closed", "--concurrency", "2", "--rate", "3"), "--rate and --rate-at apply to --arrival poisson"},
		{append(u, "--workload", "multiturn", "--arrival", "closed", "--concurrency", "2"), "--workload multiturn is endless: bound it with --max-requests or --duration, or run it with --until-interrupted"},
		{append(u, "--workload", "multiturn", "--arrival", "closed", "--concurrency", "2", "--rate-at", "1s:2"), "--rate and --rate-at apply to --arrival poisson"},
		{append(u, "--workload", "multiturn", "--arrival", "poisson", "--rate", "1", "--rate-at", "1s"), "--rate-at: rate change \"1s\": want AT:RATE"},
		{append(u, "--workload", "multiturn", "--arrival", "poisson", "--rate", "1", "--rate-at", "2s:1", "--rate-at", "1s:3"), "--rate-at \"1s:3\": times must increase"},
		{append(u, "--workload", "multiturn", "--arrival", "closed", "--concurrency", "2", "--region-shares", "us=1,us=2"), `--region-shares: region phase "us=1,us=2"`},
		{append(u, "--workload", "multiturn", "--arrival", "closed", "--concurrency", "2", "--turns", "5-2"), "--turns: range \"5-2\""},
		{append(u, "--workload", "multiturn", "--arrival", "closed", "--concurrency", "2", "--region-header", "x"), "--region-header applies with --direct-engine"},
		{append(u, "--workload", "multiturn", "--arrival", "closed", "--concurrency", "2", "--format", "xml"), `--format: workload: unknown prompt format "xml"`},
		// A typed 0 is not read as "the default".
		{append(u, "--workload", "multiturn", "--arrival", "closed", "--concurrency", "2", "--time-scale", "0"), "--time-scale: must be > 0, got 0"},
		{append(u, "--workload", "mooncake", "--trace", badTrace, "--speedup", "0"), "--speedup: must be > 0, got 0"},
		{append(u, "--workload", "mooncake", "--trace", badTrace, "--block-tokens", "0"), "--block-tokens: must be at least 1, got 0"},
		{append(u, "--workload", "multiturn", "--max-conns", "0"), "--max-conns: must be at least 1, got 0"},
	}
	for _, c := range cases {
		_, _, err := runLoadgen(context.Background(), c.args...)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("loadgen %s: error %v, want %q", strings.Join(c.args, " "), err, c.want)
		}
	}
}

func TestLoadgenReplaysATraceIntoTheSimulator(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	srv, err := enginesim.Start(ctx, enginesim.Options{Model: "m", Profile: enginesim.H100Llama8B, MaxContextTokens: 32768, TimeScale: 0.01})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	out := filepath.Join(t.TempDir(), "report.json")
	perReq := filepath.Join(t.TempDir(), "requests.jsonl")
	stdout, stderr, err := runLoadgen(ctx, "--url", srv.URL(), "--model", "m", "--workload", "azure",
		"--trace", "../../../tools/workload/testdata/azure_code_head.csv", "--time-scale", "0.01", "--max-requests", "30",
		"--slo-ttft", "1s", "--json-out", out, "--requests-out", perReq, "--progress=false")
	if err != nil {
		t.Fatalf("loadgen: %v\n%s", err, stderr)
	}
	for _, s := range []string{"30 sent, 30 ok", "TTFT (ms)", "goodput"} {
		if !strings.Contains(stdout, s) {
			t.Errorf("table lacks %q:\n%s", s, stdout)
		}
	}
	b, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Requests  struct{ OK int } `json:"requests"`
		Prompt    int64            `json:"prompt_tokens"`
		TimeScale float64          `json:"time_scale"`
		TTFT      struct {
			P50 float64 `json:"p50_ms"`
		} `json:"ttft"`
	}
	// In the simulator's time, every TTFT includes its 10 ms request overhead.
	if err := json.Unmarshal(b, &rep); err != nil || rep.Requests.OK != 30 || rep.Prompt == 0 || rep.TimeScale != 0.01 || rep.TTFT.P50 < 10 {
		t.Fatalf("JSON report %+v (%v):\n%s", rep, err, b)
	}
	lines, err := os.ReadFile(perReq)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(lines)), "\n") {
		var r struct {
			Outcome string  `json:"outcome"`
			TTFT    float64 `json:"ttft_ms"`
			SentS   float64 `json:"sent_s"`
			Prompt  int     `json:"prompt_tokens"`
		}
		if err := json.Unmarshal([]byte(line), &r); err != nil || r.Outcome != "ok" || r.TTFT < 10 || r.SentS < 0 || r.Prompt < 1 {
			t.Fatalf("request record %s: %+v %v", line, r, err)
		}
		n++
	}
	if n != 30 {
		t.Fatalf("%d request records, want 30", n)
	}
}

func TestLoadgenInterruptedPrintsWhatFinished(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	var got, gone atomic.Int64
	quit := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) // the server notices a client leaving only after the body
		got.Add(1)
		select { // never answers
		case <-r.Context().Done():
			gone.Add(1)
		case <-quit:
		}
	}))
	defer srv.Close()
	defer close(quit)
	ctx, cancel := context.WithCancel(context.Background())
	type result struct {
		stdout string
		err    error
	}
	done := make(chan result)
	go func() {
		out, _, err := runLoadgen(ctx, "--url", srv.URL, "--model", "m", "--workload", "multiturn", "--arrival", "closed",
			"--concurrency", "2", "--duration", "1h", "--progress=false")
		done <- result{out, err}
	}()
	if err := envoytest.Poll(context.Background(), 10*time.Second, 5*time.Millisecond, func() error {
		if n := got.Load(); n < 2 {
			return fmt.Errorf("the server saw %d of 2 requests", n)
		}
		return nil
	}); err != nil {
		t.Error(err) // cancel anyway, so the run ends
	}
	cancel()
	res := <-done
	if res.err == nil || !strings.Contains(res.err.Error(), "interrupted") || !strings.Contains(res.stdout, "(interrupted)") || !strings.Contains(res.stdout, "2 cancelled") {
		t.Fatalf("interrupted run: %v\n%s", res.err, res.stdout)
	}
	// The cancelled requests' connections were closed: the server saw both
	// clients leave.
	if err := envoytest.Poll(context.Background(), 10*time.Second, 5*time.Millisecond, func() error {
		if n := gone.Load(); n != 2 {
			return fmt.Errorf("the server saw %d of 2 cancelled clients leave", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}
