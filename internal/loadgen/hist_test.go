package loadgen

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestHistogramBucketsTileTheLine(t *testing.T) {
	// Consecutive buckets are contiguous and each value lands in the bucket
	// whose bounds contain it.
	prevHi := uint64(0)
	for i := 0; i < direct+40*subBuckets; i++ {
		lo, hi := bucketBounds(i)
		if lo != prevHi || hi <= lo {
			t.Fatalf("bucket %d = [%d, %d), previous ended at %d", i, lo, hi, prevHi)
		}
		if bucketOf(int64(lo)) != i || bucketOf(int64(hi-1)) != i {
			t.Fatalf("bucket %d bounds map to %d / %d", i, bucketOf(int64(lo)), bucketOf(int64(hi-1)))
		}
		if lo >= direct && float64(hi-lo)/float64(lo) > 1.0/subBuckets+1e-12 {
			t.Fatalf("bucket %d is %.4f%% wide", i, 100*float64(hi-lo)/float64(lo))
		}
		prevHi = hi
	}
	if i := bucketOf(math.MaxInt64); i < 0 {
		t.Fatal("max int64 has no bucket")
	}
}

// TestHistogramQuantilesWithinHalfPercent checks the precision promise
// against exact nearest-rank quantiles of several distributions spanning
// nanoseconds to minutes.
func TestHistogramQuantilesWithinHalfPercent(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	dists := map[string]func() int64{
		"lognormal-ms": func() int64 { return int64(math.Exp(rng.NormFloat64()*1.5) * 1e6) },
		"uniform-us":   func() int64 { return rng.Int64N(1e6) },
		"exp-s":        func() int64 { return int64(rng.ExpFloat64() * 1e9) },
		"small-ints":   func() int64 { return rng.Int64N(300) },
		"wide":         func() int64 { return int64(math.Exp(rng.Float64() * 40)) },
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
			tol := math.Max(exact*0.004, 0.5)
			if math.Abs(got-exact) > tol {
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

func TestHistogramMergeAndEmpty(t *testing.T) {
	var a, b, all Histogram
	if a.Quantile(0.5) != 0 || a.Mean() != 0 || a.Count() != 0 {
		t.Fatal("empty histogram not zero")
	}
	for i := int64(1); i <= 1000; i++ {
		v := i * 12345
		if i%2 == 0 {
			a.Record(v)
		} else {
			b.Record(v)
		}
		all.Record(v)
	}
	a.Merge(&b)
	for _, q := range []float64{0.5, 0.9, 0.99} {
		if a.Quantile(q) != all.Quantile(q) {
			t.Fatalf("merged q%v %v != %v", q, a.Quantile(q), all.Quantile(q))
		}
	}
	if a.Count() != 1000 || a.Min() != 12345 || a.Max() != 12345000 {
		t.Fatalf("merged count/min/max %d %d %d", a.Count(), a.Min(), a.Max())
	}
	a.Record(-5)
	if a.Min() != 0 {
		t.Fatal("negative value not clamped to 0")
	}
}

func BenchmarkHistogramRecord(b *testing.B) {
	var h Histogram
	for i := 0; b.Loop(); i++ {
		h.Record(int64(i*7919) & (1<<30 - 1))
	}
}
