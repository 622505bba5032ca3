package loadgen

import (
	"math"
	"math/rand/v2"
	"testing"
)

// latencies are n durations in nanoseconds spread over 100 µs – 10 s
// (log-uniform), fixed by the seed.
func latencies(n int) []int64 {
	r := rand.New(rand.NewPCG(1, 2))
	v := make([]int64, n)
	for i := range v {
		v[i] = int64(1e5 * math.Pow(10, 4*r.Float64()))
	}
	return v
}

// BenchmarkHistogramRecord is one Record of a latency.
func BenchmarkHistogramRecord(b *testing.B) {
	vals := latencies(1 << 16)
	var h Histogram
	i := 0
	for b.Loop() {
		h.Record(vals[i&(len(vals)-1)])
		i++
	}
}

// BenchmarkHistogramSmall is a histogram made, filled with 100 latencies
// (one class of a short phase) and asked its p50, p90 and p99.
func BenchmarkHistogramSmall(b *testing.B) {
	vals := latencies(100)
	b.ReportAllocs()
	for b.Loop() {
		var h Histogram
		for _, v := range vals {
			h.Record(v)
		}
		_ = h.Quantile(0.5) + h.Quantile(0.9) + h.Quantile(0.99)
	}
}
