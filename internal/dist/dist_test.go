package dist

import (
	"fmt"
	"math"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func TestTotalVariation(t *testing.T) {
	type w = map[string]float64
	for _, c := range []struct {
		name string
		a, b w
		want float64
	}{
		{"the same shares", w{"x": 0.25, "y": 0.75}, w{"x": 0.25, "y": 0.75}, 0},
		{"the same shares, other scales", w{"x": 1, "y": 3}, w{"x": 20, "y": 60}, 0},
		{"disjoint keys", w{"x": 1}, w{"y": 5}, 1},
		{"a missing key weighs 0", w{"x": 0.5, "y": 0.5}, w{"x": 1}, 0.5},
		{"a zero weight is a missing key", w{"x": 1, "y": 0}, w{"x": 1}, 0},
		{"each map normalized by its own sum", w{"x": 1, "y": 1}, w{"x": 3, "y": 1}, 0.25},
		{"a zero-sum map has no shares", w{}, w{"x": 2, "y": 2}, 0.5},
		{"two zero-sum maps", w{"x": 0}, nil, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := TotalVariation(c.a, c.b); math.Abs(got-c.want) > 1e-15 {
				t.Errorf("TotalVariation(%v, %v) = %v, want %v", c.a, c.b, got, c.want)
			}
			if got, back := TotalVariation(c.a, c.b), TotalVariation(c.b, c.a); got != back {
				t.Errorf("not symmetric: %v one way, %v the other", got, back)
			}
		})
	}
}

// The sums run in key order: the same maps, built in any order, give the
// same bits.
func TestTotalVariationIsInKeyOrder(t *testing.T) {
	vals := []float64{1e16, 1, -1e16 + 3, 1, 0.1, 7, 1e-9}
	var want float64
	for run := range 50 {
		a, b := map[string]float64{}, map[string]float64{}
		for i := range vals {
			j := (i + run) % len(vals)
			a[fmt.Sprint("k", j)] = math.Abs(vals[j])
			b[fmt.Sprint("k", (j+1)%len(vals))] = math.Abs(vals[j]) / 3
		}
		got := TotalVariation(a, b)
		if run == 0 {
			want = got
		}
		if math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("run %d: %v, want %v bit for bit", run, got, want)
		}
	}
}

func TestHistogramQuantile(t *testing.T) {
	inf := math.Inf(1)
	for _, c := range []struct {
		name string
		h    Histogram
		q    float64
		want float64
	}{
		{"empty", Histogram{}, 0.5, 0},
		{"no observations", Histogram{Bounds: []float64{1, 2}, Counts: []uint64{0, 0}}, 0.99, 0},
		{"the first bucket starts at 0", Histogram{Bounds: []float64{1, 2, 4}, Counts: []uint64{10, 30, 40}, Total: 40}, 0.25, 1},
		{"linear within the bucket", Histogram{Bounds: []float64{1, 2, 4}, Counts: []uint64{10, 30, 40}, Total: 40}, 0.5, 1.5},
		{"p99", Histogram{Bounds: []float64{1, 2, 4}, Counts: []uint64{10, 30, 40}, Total: 40}, 0.99, 3.92},
		{"above the last bound: that bound", Histogram{Bounds: []float64{1, 2, 4}, Counts: []uint64{10, 30, 40}, Total: 50}, 0.9, 4},
		{"below it, with observations above", Histogram{Bounds: []float64{1, 2, 4}, Counts: []uint64{10, 30, 40}, Total: 50}, 0.5, 1.75},
		{"no total: the last count", Histogram{Bounds: []float64{1, 2, 4}, Counts: []uint64{10, 30, 40}}, 0.5, 1.5},
		{"an +Inf bucket is the overflow", Histogram{Bounds: []float64{1, 2, inf}, Counts: []uint64{10, 20, 30}, Total: 30}, 0.9, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := c.h.Quantile(c.q); math.Abs(got-c.want) > 1e-12 {
				t.Errorf("Quantile(%v) of %+v = %v, want %v", c.q, c.h, got, c.want)
			}
		})
	}
}

// Add merges the histograms of several servers, as client_golang writes
// them, bucket by bucket.
func TestHistogramAddMerges(t *testing.T) {
	bounds := []float64{0.1, 0.5, 1}
	write := func(obs ...float64) *dto.Histogram {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "ttft", Buckets: bounds})
		for _, o := range obs {
			h.Observe(o)
		}
		var m dto.Metric
		if err := h.Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram()
	}
	var h Histogram
	h.Add(write(0.05, 0.3, 0.3, 5))
	h.Add(write(0.05, 0.7))
	want := Histogram{Bounds: bounds, Counts: []uint64{2, 4, 5}, Total: 6}
	if fmt.Sprint(h) != fmt.Sprint(want) {
		t.Fatalf("merged %+v, want %+v", h, want)
	}
	// Rank 3 of 6 lies in (0.1, 0.5], one of its two observations in.
	if got := h.Quantile(0.5); math.Abs(got-0.3) > 1e-12 {
		t.Fatalf("median %v, want 0.3", got)
	}
}
