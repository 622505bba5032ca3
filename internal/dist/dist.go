// Package dist measures distributions: how far apart two weight vectors
// are (the total-variation distance: the control plane's deadband, the
// simulator's and the affinity bench's weight churn), and the quantiles of
// a Prometheus histogram (the benches' engine TTFT).
package dist

import (
	"cmp"
	"math"

	dto "github.com/prometheus/client_model/go"

	"github.com/inferlb/inferlb/internal/ordered"
)

// TotalVariation is the total-variation distance between the distributions
// that the weights a and b describe: half the sum, over every key of either
// map, of |a[k]/Σa − b[k]/Σb|: 0 for the same shares, 1 for shares on
// disjoint keys; the least share of traffic that moves when weights a are
// replaced by b.
//
// The weights (≥ 0) need not be normalized: each map is divided by its own
// sum. A key missing from a map weighs 0 there. A map whose weights sum to
// 0 (an empty one too) has no share anywhere: its distance to any
// distribution is 1/2, to another such map 0. Sums run in key order, so the
// result does not depend on map order: replicas of the control plane agree
// to the bit.
func TotalVariation[K cmp.Ordered](a, b map[K]float64) float64 {
	sa, sb := ordered.Sum(a), ordered.Sum(b)
	share := func(m map[K]float64, sum float64, k K) float64 {
		if sum > 0 {
			return m[k] / sum
		}
		return 0
	}
	union := make(map[K]bool, len(a)+len(b))
	for k := range a {
		union[k] = true
	}
	for k := range b {
		union[k] = true
	}
	d := 0.0
	for _, k := range ordered.Keys(union) {
		d += math.Abs(share(a, sa, k) - share(b, sb, k))
	}
	return d / 2
}

// Histogram is a cumulative histogram as Prometheus keeps one: Counts[i]
// observations were at most Bounds[i] (ascending and positive; a last
// bound of +Inf, as the text format has, is the overflow), and Total counts
// every observation, those above the last bound too. A Total below the
// last count (left 0) means the last count is the total.
type Histogram struct {
	Bounds []float64
	Counts []uint64
	Total  uint64
}

// Add adds the buckets of m to h, bucket i to bucket i: the histograms of
// several servers with the same bucket bounds merge into one.
func (h *Histogram) Add(m *dto.Histogram) {
	for i, b := range m.GetBucket() {
		if len(h.Bounds) <= i {
			h.Bounds = append(h.Bounds, b.GetUpperBound())
			h.Counts = append(h.Counts, 0)
		}
		h.Counts[i] += b.GetCumulativeCount()
	}
	h.Total += m.GetSampleCount()
}

// Quantile is the q-quantile (0 ≤ q ≤ 1) of the observations as
// Prometheus' histogram_quantile estimates it: the observation of rank
// q·Total lies in the first bucket whose count reaches the rank, and is
// placed linearly within that bucket (the first bucket starts at 0). When
// the rank lies above the last finite bound, the answer is that bound. An
// empty histogram's quantiles are 0.
func (h *Histogram) Quantile(q float64) float64 {
	total := h.Total
	if n := len(h.Counts); n > 0 && h.Counts[n-1] > total {
		total = h.Counts[n-1]
	}
	if total == 0 {
		return 0
	}
	rank := q * float64(total)
	lo, below := 0.0, 0.0
	for i, c := range h.Counts {
		if math.IsInf(h.Bounds[i], 1) {
			break
		}
		if float64(c) >= rank {
			in := float64(c) - below
			if in <= 0 {
				return h.Bounds[i]
			}
			return lo + (h.Bounds[i]-lo)*(rank-below)/in
		}
		lo, below = h.Bounds[i], float64(c)
	}
	return lo
}
