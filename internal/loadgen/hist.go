package loadgen

import (
	"math"
	"math/bits"
	"time"
)

// Histogram records non-negative integer values (durations in nanoseconds)
// in log-linear buckets, HDR-style: values below 2·subBuckets are exact; above,
// every power-of-two range is split into subBuckets equal buckets, so a
// bucket is at most 1/subBuckets = 0.78% of its lower bound wide. A quantile
// is reported as its bucket's midpoint (clamped to the exact min and max), so
// its relative error is at most 1/(2·subBuckets) ≈ 0.4%. Min, max, count and
// sum are exact. The zero value is ready to use; it is not safe for
// concurrent use.
type Histogram struct {
	counts   []uint64
	n        uint64
	sum      float64
	min, max int64
}

const (
	subBits    = 7
	subBuckets = 1 << subBits // 128
	// direct is the number of values stored exactly (one bucket each).
	direct = 2 * subBuckets
)

// bucketOf returns the bucket index of v ≥ 0.
func bucketOf(v int64) int {
	u := uint64(v)
	if u < direct {
		return int(u)
	}
	shift := bits.Len64(u) - (subBits + 1) // ≥ 1
	top := u >> uint(shift)                // in [subBuckets, 2·subBuckets)
	return direct + (shift-1)*subBuckets + int(top-subBuckets)
}

// bucketBounds returns the inclusive lower and exclusive upper bound of
// bucket i.
func bucketBounds(i int) (lo, hi uint64) {
	if i < direct {
		return uint64(i), uint64(i) + 1
	}
	j := i - direct
	shift := uint(j/subBuckets + 1)
	top := uint64(j%subBuckets + subBuckets)
	return top << shift, (top + 1) << shift
}

// Record adds one value; negative values count as 0.
func (h *Histogram) Record(v int64) {
	if v < 0 {
		v = 0
	}
	i := bucketOf(v)
	if i >= len(h.counts) {
		n := max(2*len(h.counts), i+1, direct)
		c := make([]uint64, n)
		copy(c, h.counts)
		h.counts = c
	}
	h.counts[i]++
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

// Merge adds every value of o.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	if len(o.counts) > len(h.counts) {
		c := make([]uint64, len(o.counts))
		copy(c, h.counts)
		h.counts = c
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	if h.n == 0 || o.max > h.max {
		h.max = o.max
	}
	h.n += o.n
	h.sum += o.sum
}

// Count is the number of values recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Min and Max are exact (0 when empty).
func (h *Histogram) Min() int64 { return h.min }

// Max is the largest value recorded.
func (h *Histogram) Max() int64 { return h.max }

// Mean is the exact mean (0 when empty).
func (h *Histogram) Mean() float64 {
	if h.n == 0 {
		return 0
	}
	return h.sum / float64(h.n)
}

// Quantile returns the q-quantile (0 ≤ q ≤ 1) by nearest rank: the value of
// rank ⌈q·n⌉ (at least 1), estimated as its bucket's midpoint. It returns 0
// when the histogram is empty.
func (h *Histogram) Quantile(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	if q <= 0 {
		return float64(h.min)
	}
	if q >= 1 {
		return float64(h.max)
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	rank = max(rank, 1)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			lo, hi := bucketBounds(i)
			var v float64
			if hi-lo == 1 {
				v = float64(lo)
			} else {
				v = (float64(lo) + float64(hi-1)) / 2
			}
			return math.Min(math.Max(v, float64(h.min)), float64(h.max))
		}
	}
	return float64(h.max)
}
