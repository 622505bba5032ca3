package loadgen

import (
	"time"

	hdrhistogram "github.com/HdrHistogram/hdrhistogram-go"
)

// Histogram records non-negative durations in nanoseconds: an HdrHistogram
// with 2 significant figures (values below 256 exact; above, every power of
// two split into 128 buckets, so a quantile is within 1/128 ≈ 0.8% of the
// value of its rank) up to histHighest, plus an exact count, sum, min and
// max, which the reports print (HDR's own are rounded to their buckets).
// The zero value is ready to use (the stats structs hold four per class);
// it is not safe for concurrent use.
//
// It replaced a hand-written log-linear histogram of the same resolution:
// recording costs the same, and quantiles are faster and take less memory
// (BenchmarkHistogram* measures both; the figures are in
// docs/decisions/loadgen-histogram.md).
type Histogram struct {
	h        *hdrhistogram.Histogram // nil until the first value
	n        uint64
	sum      float64
	min, max int64
}

// histHighest is the largest value the buckets tell apart, a day in
// nanoseconds: longer values count in its bucket (Max stays exact).
const histHighest = int64(24 * time.Hour)

// newHDR is an empty HdrHistogram of Histogram's range and resolution.
func newHDR() *hdrhistogram.Histogram { return hdrhistogram.New(1, histHighest, 2) }

// Record adds one value; negative values count as 0.
func (h *Histogram) Record(v int64) {
	v = max(v, 0)
	if h.h == nil {
		h.h = newHDR()
	}
	// In range by construction: RecordValue fails only above histHighest.
	_ = h.h.RecordValue(min(v, histHighest))
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if h.n == 0 || v > h.max {
		h.max = v
	}
	h.n++
	h.sum += float64(v)
}

// RecordDuration records d in nanoseconds.
func (h *Histogram) RecordDuration(d time.Duration) { h.Record(int64(d)) }

// Count is the number of values recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Min is the smallest value recorded, exact (0 when empty).
func (h *Histogram) Min() int64 { return h.min }

// Max is the largest value recorded, exact (0 when empty).
func (h *Histogram) Max() int64 { return h.max }

// Mean is the exact mean (0 when empty).
func (h *Histogram) Mean() float64 {
	if h.n == 0 {
		return 0
	}
	return h.sum / float64(h.n)
}

// Quantile returns the q-quantile (0 ≤ q ≤ 1): HdrHistogram's value at that
// rank (the top of its bucket), clamped to the exact min and max; 0 when
// the histogram is empty.
func (h *Histogram) Quantile(q float64) float64 {
	switch {
	case h.n == 0:
		return 0
	case q <= 0:
		return float64(h.min)
	case q >= 1:
		return float64(h.max)
	}
	return float64(min(max(h.h.ValueAtQuantile(100*q), h.min), h.max))
}
