package optimizer

import (
	"errors"
	"math"
	"math/rand/v2"
	"testing"
)

// TestFitRecoversProfile: samples drawn from a known profile (the H100
// step-model profile) at 12 loads from 10% to 92% of capacity, with 2%
// multiplicative noise, give back the capacity within 3%, every curve
// coefficient within 10% (of its value, or 0.5 ms when it is 0), and
// R² ≥ 0.98 for both curves.
func TestFitRecoversProfile(t *testing.T) {
	truth, err := NewProfile(stepH100, 500, 200)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var samples []Sample
	for rep := 0; rep < 3; rep++ {
		for k := 0; k < 12; k++ {
			u := 0.1 + 0.82*float64(k)/11
			noise := func() float64 { return 1 + 0.02*rng.NormFloat64() }
			samples = append(samples, Sample{RatePerS: u * truth.CapacityRPS,
				TTFTMs: truth.TTFT.At(u) * noise(), TBOTMs: truth.TBOT.At(u) * noise()})
		}
	}
	sortSamples(samples)
	f, err := FitProfile(samples)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fit: capacity %.3f (true %.3f), TTFT %+v (true %+v) R² %.4f RMSE %.2f ms, TBOT %+v (true %+v) R² %.4f RMSE %.2f ms",
		f.CapacityRPS, truth.CapacityRPS, f.TTFT, truth.TTFT, f.TTFTR2, f.TTFTRMSE, f.TBOT, truth.TBOT, f.TBOTR2, f.TBOTRMSE)
	if rel := math.Abs(f.CapacityRPS-truth.CapacityRPS) / truth.CapacityRPS; rel > 0.03 {
		t.Errorf("capacity %.3f vs %.3f (%.1f%%)", f.CapacityRPS, truth.CapacityRPS, 100*rel)
	}
	near := func(name string, got, want float64) {
		if math.Abs(got-want) > math.Max(0.10*math.Abs(want), 0.5) {
			t.Errorf("%s = %.3f, want %.3f ± 10%%", name, got, want)
		}
	}
	near("TTFT base", f.TTFT.Base, truth.TTFT.Base)
	near("TTFT linear", f.TTFT.Linear, truth.TTFT.Linear)
	near("TTFT queue", f.TTFT.Queue, truth.TTFT.Queue)
	near("TBOT base", f.TBOT.Base, truth.TBOT.Base)
	near("TBOT linear", f.TBOT.Linear, truth.TBOT.Linear)
	if f.TTFTR2 < 0.98 || f.TBOTR2 < 0.98 {
		t.Errorf("R² TTFT %.4f TBOT %.4f, want ≥ 0.98", f.TTFTR2, f.TBOTR2)
	}
}

func TestFitRejectsBadSamples(t *testing.T) {
	for _, s := range [][]Sample{
		nil,
		{{1, 1, 1}, {2, 1, 1}, {3, 1, 1}},
		{{1, 1, 1}, {1, 2, 1}, {2, 1, 1}, {2, 1, 1}},
		{{1, 1, 1}, {2, 1, 1}, {3, 1, 1}, {-4, 1, 1}},
		{{1, 1, 1}, {2, 1, 1}, {3, math.NaN(), 1}, {4, 1, 1}},
	} {
		if _, err := FitProfile(s); !errors.Is(err, ErrBadFit) {
			t.Errorf("FitProfile(%v) = %v, want ErrBadFit", s, err)
		}
	}
}
