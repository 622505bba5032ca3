package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestHistogramQuantilesWithinOnePercent checks the precision promise
// (1/128 of the value, or one rank off) against exact nearest-rank
// quantiles of several distributions spanning nanoseconds to minutes; min,
// max and mean are exact.
func TestHistogramQuantilesWithinOnePercent(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	dists := map[string]func() int64{
		"lognormal-ms": func() int64 { return int64(math.Exp(rng.NormFloat64()*1.5) * 1e6) },
		"uniform-us":   func() int64 { return rng.Int64N(1e6) },
		"exp-s":        func() int64 { return int64(rng.ExpFloat64() * 1e9) },
		"small-ints":   func() int64 { return rng.Int64N(300) },
		"wide":         func() int64 { return int64(math.Exp(rng.Float64() * 32)) }, // 1 ns to 22 h
	}
	for name, draw := range dists {
		var h Histogram
		vals := make([]int64, 20000)
		for i := range vals {
			vals[i] = draw()
			h.Record(vals[i])
		}
		slices.Sort(vals)
		for _, q := range []float64{0.01, 0.1, 0.5, 0.9, 0.99, 0.999} {
			rank := int(math.Ceil(q * float64(len(vals))))
			exact := float64(vals[rank-1])
			got := h.Quantile(q)
			lo, hi := float64(vals[max(rank-2, 0)]), float64(vals[min(rank, len(vals)-1)])
			if got < lo*(1-1.0/128)-0.5 || got > hi*(1+1.0/128)+0.5 {
				t.Errorf("%s q%.3f: got %.1f, exact %.1f (error %.3f%%)", name, q, got, exact, 100*math.Abs(got-exact)/exact)
			}
		}
		if h.Max() != vals[len(vals)-1] || h.Min() != vals[0] || h.Quantile(1) != float64(vals[len(vals)-1]) {
			t.Errorf("%s: min/max not exact", name)
		}
		sum := 0.0
		for _, v := range vals {
			sum += float64(v)
		}
		if math.Abs(h.Mean()-sum/float64(len(vals))) > 1e-6*sum/float64(len(vals)) {
			t.Errorf("%s: mean %.3f, exact %.3f", name, h.Mean(), sum/float64(len(vals)))
		}
	}
}

// An empty histogram answers 0, a day or more still counts, and a negative
// value counts as 0.
func TestHistogramEdges(t *testing.T) {
	var h Histogram
	if h.Quantile(0.5) != 0 || h.Mean() != 0 || h.Count() != 0 || h.Max() != 0 {
		t.Fatal("empty histogram not zero")
	}
	h.Record(int64(48 * time.Hour))
	h.Record(-5)
	if h.Count() != 2 || h.Min() != 0 || h.Max() != int64(48*time.Hour) {
		t.Fatalf("count/min/max %d %d %d", h.Count(), h.Min(), h.Max())
	}
	if q := h.Quantile(0.99); q < float64(histHighest) || q > float64(48*time.Hour) {
		t.Fatalf("p99 of a 48 h value: %v", time.Duration(q))
	}
}
