package optimizer

import (
	"fmt"
	"math"
	"sort"

	"gonum.org/v1/gonum/mat"
)

// Sample is one measurement of an engine at a steady load: the offered rate
// of reference-shaped requests and the mean TTFT and TBOT observed.
type Sample struct {
	RatePerS float64
	TTFTMs   float64
	TBOTMs   float64
}

// Fit is the result of FitProfile.
type Fit struct {
	// CapacityRPS is the fitted saturation rate (utilization 1).
	CapacityRPS float64
	TTFT, TBOT  Curve
	// Goodness of fit of each curve on the samples.
	TTFTR2, TBOTR2     float64
	TTFTRMSE, TBOTRMSE float64 // ms
}

// FitProfile fits Curve coefficients and the capacity μ to samples taken at
// different loads: u = rate/μ, TTFT(u) = α + β·u + γ·u/(1−u) and the same
// form for TBOT, with β, γ ≥ 0 (convex, increasing).
//
// For a fixed μ both fits are linear least squares with non-negativity,
// solved exactly by trying every active set of (β, γ); μ is then chosen by a
// log-spaced scan over (max rate, 50·max rate) refined by golden-section
// search, minimizing the sum of the two curves' squared errors, each
// normalized by its variance (so neither dominates by its units). The TTFT
// queue term is what identifies μ: samples should include loads above about
// half of capacity.
func FitProfile(samples []Sample) (Fit, error) {
	if len(samples) < 4 {
		return Fit{}, fmt.Errorf("%w: %d samples, need at least 4", ErrBadFit, len(samples))
	}
	maxRate := 0.0
	rates := map[float64]bool{}
	for i, s := range samples {
		if !(s.RatePerS > 0) || !finite(s.RatePerS) || !finite(s.TTFTMs) || !finite(s.TBOTMs) || s.TTFTMs < 0 || s.TBOTMs < 0 {
			return Fit{}, fmt.Errorf("%w: sample %d is %+v (rate must be > 0, latencies ≥ 0)", ErrBadFit, i, s)
		}
		maxRate = math.Max(maxRate, s.RatePerS)
		rates[s.RatePerS] = true
	}
	if len(rates) < 3 {
		return Fit{}, fmt.Errorf("%w: samples at %d distinct rates, need at least 3", ErrBadFit, len(rates))
	}
	ttft := make([]float64, len(samples))
	tbot := make([]float64, len(samples))
	for i, s := range samples {
		ttft[i], tbot[i] = s.TTFTMs, s.TBOTMs
	}
	vT, vB := variance(ttft), variance(tbot)
	loss := func(mu float64) float64 {
		_, sT := fitCurve(samples, mu, ttft)
		_, sB := fitCurve(samples, mu, tbot)
		return sT/math.Max(vT, 1e-12) + sB/math.Max(vB, 1e-12)
	}
	lo, hi := math.Log(maxRate*1.0001), math.Log(maxRate*50)
	const n = 200
	best, bestI := math.Inf(1), 0
	for i := 0; i <= n; i++ {
		if l := loss(math.Exp(lo + (hi-lo)*float64(i)/n)); l < best {
			best, bestI = l, i
		}
	}
	a := lo + (hi-lo)*float64(max(bestI-1, 0))/n
	b := lo + (hi-lo)*float64(min(bestI+1, n))/n
	const g = 0.6180339887498949
	c, d := b-g*(b-a), a+g*(b-a)
	fc, fd := loss(math.Exp(c)), loss(math.Exp(d))
	for it := 0; it < 60; it++ {
		if fc < fd {
			b, d, fd = d, c, fc
			c = b - g*(b-a)
			fc = loss(math.Exp(c))
		} else {
			a, c, fc = c, d, fd
			d = a + g*(b-a)
			fd = loss(math.Exp(d))
		}
	}
	mu := math.Exp((a + b) / 2)
	f := Fit{CapacityRPS: mu}
	var sT, sB float64
	f.TTFT, sT = fitCurve(samples, mu, ttft)
	f.TBOT, sB = fitCurve(samples, mu, tbot)
	nn := float64(len(samples))
	f.TTFTRMSE, f.TBOTRMSE = math.Sqrt(sT/nn), math.Sqrt(sB/nn)
	f.TTFTR2, f.TBOTR2 = 1-sT/(vT*nn), 1-sB/(vB*nn)
	return f, nil
}

func variance(y []float64) float64 {
	m := 0.0
	for _, v := range y {
		m += v
	}
	m /= float64(len(y))
	s := 0.0
	for _, v := range y {
		s += (v - m) * (v - m)
	}
	return s / float64(len(y))
}

// fitCurve solves min Σ (α + β·u + γ·h(u) − y)² over β, γ ≥ 0 (α free)
// exactly: the unconstrained fit, then each face with β or γ at 0, keeping
// the best feasible one. It returns the curve and its sum of squares.
func fitCurve(samples []Sample, mu float64, y []float64) (Curve, float64) {
	type cols struct{ lin, queue bool }
	best, bestSS := Curve{}, math.Inf(1)
	for _, cs := range []cols{{true, true}, {true, false}, {false, true}, {false, false}} {
		k := 1
		if cs.lin {
			k++
		}
		if cs.queue {
			k++
		}
		A := mat.NewDense(len(samples), k, nil)
		for i, s := range samples {
			u := s.RatePerS / mu
			A.Set(i, 0, 1)
			c := 1
			if cs.lin {
				A.Set(i, c, u)
				c++
			}
			if cs.queue {
				A.Set(i, c, u/(1-u))
			}
		}
		var x mat.VecDense
		if err := x.SolveVec(A, mat.NewVecDense(len(y), append([]float64(nil), y...))); err != nil {
			continue
		}
		cv := Curve{Base: x.AtVec(0)}
		c := 1
		if cs.lin {
			cv.Linear = x.AtVec(c)
			c++
		}
		if cs.queue {
			cv.Queue = x.AtVec(c)
		}
		if cv.Linear < 0 || cv.Queue < 0 {
			continue
		}
		ss := 0.0
		for i, s := range samples {
			r := cv.At(s.RatePerS/mu) - y[i]
			ss += r * r
		}
		if ss < bestSS {
			best, bestSS = cv, ss
		}
	}
	return best, bestSS
}

// sortSamples orders samples by rate (for stable output).
func sortSamples(s []Sample) {
	sort.Slice(s, func(i, j int) bool { return s[i].RatePerS < s[j].RatePerS })
}
