package optimizer

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	sim "github.com/inferlb/inferlb/tools/enginesim/model"
)

type simCollector struct {
	ttft, tbot []float64
	warm       time.Duration
}

func (c *simCollector) Token(r *sim.Request, t time.Duration) {}

func (c *simCollector) Finished(r *sim.Request, t time.Duration) {
	if r.Arrival < c.warm || r.Generated < 2 {
		return
	}
	c.ttft = append(c.ttft, float64(r.FirstToken-r.Arrival)/1e6)
	c.tbot = append(c.tbot, float64(r.LastToken-r.FirstToken)/1e6/float64(r.Generated-1))
}

// simulate drives the engine simulator's scheduler core in virtual time
// with Poisson arrivals of fixed-shape requests (unique prompts: no prefix
// cache hits) and returns the mean TTFT and TBOT after a warm-up.
func simulate(t *testing.T, cfg sim.Config, rate float64, prompt, output, n int, seed uint64) Sample {
	c := &simCollector{}
	e, err := sim.New(cfg, c)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 99))
	var now time.Duration
	nextArr := time.Duration(rng.ExpFloat64() / rate * 1e9)
	c.warm = time.Duration(float64(n) / 5 / rate * 1e9) // skip the first 20%
	sent := 0
	for sent < n || e.Stats().Running+e.Stats().Waiting+e.Stats().Pending > 0 {
		ev, ok := e.NextEvent()
		if sent < n && (!ok || nextArr <= ev) {
			now = nextArr
			e.Advance(now)
			toks := make([]uint64, prompt)
			for k := range toks {
				toks[k] = rng.Uint64()
			}
			if err := e.Submit(&sim.Request{Prompt: toks, MaxTokens: output}, now); err != nil {
				t.Fatal(err)
			}
			sent++
			nextArr = now + time.Duration(rng.ExpFloat64()/rate*1e9)
			continue
		}
		if !ok {
			break
		}
		now = ev
		e.Advance(now)
	}
	mean := func(x []float64) float64 {
		s := 0.0
		for _, v := range x {
			s += v
		}
		return s / float64(len(x))
	}
	return Sample{RatePerS: rate, TTFTMs: mean(c.ttft), TBOTMs: mean(c.tbot)}
}

// TestFitRecoversSimulator: a load sweep of the engine simulator (its
// scheduler core in virtual time, the H100 profile of
// examples/fleet-3region.yaml, 200/200-token requests, 10%–80% of the
// derived capacity, 3,000 requests per point) is fitted by FitProfile.
// Stated errors: the fitted capacity is within 5% of the capacity the step
// model implies (NewProfile; measured 1.6%), the fitted zero-load TBOT
// within 5% of the configured decode step (measured 1%), and both curves
// fit with R² ≥ 0.99 (measured 1.000). The derived curves themselves
// overstate congestion at mid loads (see docs/optimizer.md).
func TestFitRecoversSimulator(t *testing.T) {
	step := StepModel{PrefillTokensPerS: 25000, OverheadMs: 10, DecodeStepMs: 6.5, DecodeStepPerSeqMs: 0.055, MaxRunning: 256, KVCapacityTokens: 450000}
	cfg := sim.Config{PrefillTokensPerS: step.PrefillTokensPerS, OverheadMs: step.OverheadMs, DecodeStepMs: step.DecodeStepMs,
		DecodeStepPerSeqMs: step.DecodeStepPerSeqMs, MaxRunning: step.MaxRunning, MaxBatchedTokens: 8192,
		KVCapacityTokens: step.KVCapacityTokens, BlockSize: 16}
	derived, err := NewProfile(step, 200, 200)
	if err != nil {
		t.Fatal(err)
	}
	const n = 3000
	var samples []Sample
	for k := 0; k < 8; k++ {
		u := 0.1 + 0.1*float64(k)
		s := simulate(t, cfg, u*derived.CapacityRPS, 200, 200, n, uint64(k+1))
		t.Logf("u %.1f rate %.2f: TTFT %.1f ms (derived %.1f), TBOT %.2f ms (derived %.2f)",
			u, s.RatePerS, s.TTFTMs, derived.TTFT.At(u), s.TBOTMs, derived.TBOT.At(u))
		samples = append(samples, s)
	}
	f, err := FitProfile(samples)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fit: capacity %.2f req/s (derived %.2f), TTFT %+v R² %.3f RMSE %.2f ms, TBOT %+v R² %.3f RMSE %.2f ms",
		f.CapacityRPS, derived.CapacityRPS, f.TTFT, f.TTFTR2, f.TTFTRMSE, f.TBOT, f.TBOTR2, f.TBOTRMSE)
	if rel := math.Abs(f.CapacityRPS-derived.CapacityRPS) / derived.CapacityRPS; rel > 0.05 {
		t.Errorf("fitted capacity %.2f is %.0f%% off the derived %.2f (bound 5%%)", f.CapacityRPS, 100*rel, derived.CapacityRPS)
	}
	if rel := math.Abs(f.TBOT.Base-step.DecodeStepMs) / step.DecodeStepMs; rel > 0.05 {
		t.Errorf("fitted zero-load TBOT %.2f ms vs decode step %.2f ms (bound 5%%)", f.TBOT.Base, step.DecodeStepMs)
	}
	if f.TTFTR2 < 0.99 || f.TBOTR2 < 0.99 {
		t.Errorf("R² TTFT %.3f TBOT %.3f, want ≥ 0.99", f.TTFTR2, f.TBOTR2)
	}
}
