package loadgen

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"
)

// immediateEngine answers every request at once: one chunk of text, the
// usage block and [DONE], written in one go — the fastest engine there is,
// so what remains of TTFT is the generator's own floor (plus loopback HTTP).
func immediateEngine(b *testing.B) *httptest.Server {
	resp := []byte("data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n" +
		"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":101,\"completion_tokens\":1,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n" +
		"data: [DONE]\n\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write(resp)
	}))
	b.Cleanup(srv.Close)
	return srv
}

// BenchmarkFloor measures the generator's own TTFT floor: Poisson arrivals at
// 500 requests/s for 4 s against an engine that answers at once. Reported:
// TTFT p50/p99/max and the send lag p99 (how late requests left against
// their schedule), in microseconds. The bar: TTFT p99 < 1 ms.
func BenchmarkFloor(b *testing.B) {
	b.Run("direct", func(b *testing.B) { benchFloor(b, false) })
	b.Run("net-http", func(b *testing.B) { benchFloor(b, true) })
}

func benchFloor(b *testing.B, netHTTP bool) {
	srv := immediateEngine(b)
	c := testClient(b, srv.URL)
	c.NetHTTP = netHTTP
	for b.Loop() {
		probe := StartJitterProbe()
		rep, err := Run(context.Background(), Config{Client: c, Source: &fixed{prompt: 100, out: 1},
			Arrival: Arrival{Kind: Poisson, Rate: 500}, MaxRequests: 2000, Seed: 1})
		jit := probe()
		if err != nil {
			b.Fatal(err)
		}
		if rep.Requests.OK != 2000 {
			b.Fatalf("%+v %v", rep.Requests, rep.Errors)
		}
		b.ReportMetric(rep.TTFT.P50*1e3, "ttft-p50-µs")
		b.ReportMetric(rep.TTFT.P99*1e3, "ttft-p99-µs")
		b.ReportMetric(rep.TTFT.Max*1e3, "ttft-max-µs")
		b.ReportMetric(rep.SendLag.P99*1e3, "send-lag-p99-µs")
		b.ReportMetric(rep.RequestsPerS, "req/s")
		b.ReportMetric(jit.Quantile(0.99)/1e3, "probe-late-p99-µs")
		b.Logf("500 req/s against an immediate engine: TTFT p50 %.0f µs, p90 %.0f µs, p99 %.0f µs, max %.0f µs; send lag p99 %.0f µs; %.1f req/s achieved. "+
			"Environment: a 1 ms ticker in the same process woke late by p50 %.0f µs, p99 %.0f µs, max %.0f µs; CPU pressure (PSI some avg10) %s",
			rep.TTFT.P50*1e3, rep.TTFT.P90*1e3, rep.TTFT.P99*1e3, rep.TTFT.Max*1e3, rep.SendLag.P99*1e3, rep.RequestsPerS,
			jit.Quantile(0.5)/1e3, jit.Quantile(0.99)/1e3, float64(jit.Max())/1e3, cpuPressure())
	}
}

// BenchmarkCapacity measures how many requests per second the generator can
// drive (closed loop, 64 in flight, immediate engine); the engine shares the
// process and the CPU, so this is a lower bound.
func BenchmarkCapacity(b *testing.B) {
	srv := immediateEngine(b)
	c := testClient(b, srv.URL)
	for b.Loop() {
		start := time.Now()
		rep, err := Run(context.Background(), Config{Client: c, Source: &fixed{prompt: 100, out: 1},
			Arrival: Arrival{Kind: Closed, Concurrency: 64}, MaxRequests: 10000})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(float64(rep.Requests.OK)/time.Since(start).Seconds(), "req/s")
	}
}

// cpuPressure returns the kernel's CPU pressure (the share of the last 10 s
// in which some runnable task waited for a CPU), to read a timing figure
// against: on a machine shared with other work the tail is theirs.
func cpuPressure() string {
	b, err := os.ReadFile("/proc/pressure/cpu")
	if err != nil {
		return "unknown"
	}
	for _, f := range strings.Fields(string(b)) {
		if v, ok := strings.CutPrefix(f, "avg10="); ok {
			return v + "%"
		}
	}
	return "unknown"
}
