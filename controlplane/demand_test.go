package controlplane

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/inferlb/inferlb/controlplane/signals"
)

var demandKey = signals.DemandKey{Node: "fe-east", Class: "chat", Priority: "high"}

// windowRate is what the intake reports for a Poisson stream of rate r over
// a window of w: a count over w.
func windowRate(rng *rand.Rand, r float64, w time.Duration) float64 {
	// Poisson by counting exponential gaps (r·w is small).
	n, t := 0, rng.ExpFloat64()/r
	for t < w.Seconds() {
		n++
		t += rng.ExpFloat64() / r
	}
	return float64(n) / w.Seconds()
}

func smoothStep(c *Controller, now time.Time, req, prompt float64) signals.DemandRate {
	in := map[signals.DemandKey]signals.DemandRate{}
	if req > 0 {
		in[demandKey] = signals.DemandRate{RequestsPerS: req, PromptTokens: prompt, OutputTokens: 100}
	}
	return c.smoothDemand(now, in, 10*time.Second)[demandKey]
}

// At steady demand the planned rate's noise is a fraction of the window's
// (4 req/s over 10 s windows, every 5 s: about ±16%), without a bias.
func TestDemandSmoothingHoldsNoise(t *testing.T) {
	c, err := NewController(testFleet(t), DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(3, 4))
	now := time.Unix(1_800_000_000, 0)
	var raw, sm []float64
	for i := range 200 {
		now = now.Add(5 * time.Second)
		x := windowRate(rng, 4, 10*time.Second)
		s := smoothStep(c, now, x, 1000).RequestsPerS
		if i >= 20 { // past the first time constants
			raw, sm = append(raw, x), append(sm, s)
		}
	}
	mr, sr := meanSD(raw)
	ms, ss := meanSD(sm)
	t.Logf("window rates %.2f ± %.2f req/s, planned %.2f ± %.2f", mr, sr, ms, ss)
	if ss > 0.45*sr {
		t.Errorf("smoothed spread %.3f is not below 0.45× the window's %.3f", ss, sr)
	}
	if math.Abs(ms-4) > 0.25 {
		t.Errorf("smoothed mean %.2f, want about 4", ms)
	}
}

func meanSD(xs []float64) (mean, sd float64) {
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	for _, x := range xs {
		sd += (x - mean) * (x - mean)
	}
	return mean, math.Sqrt(sd / float64(len(xs)))
}

// A real change is followed at once (a step beyond three standard
// deviations of the window's count), a small one within the time
// constant; a key that goes quiet drops out; token means stay weighted by
// requests; 0 turns smoothing off.
func TestDemandSmoothingFollowsChanges(t *testing.T) {
	c, err := NewController(testFleet(t), DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	step := func(req, prompt float64) signals.DemandRate {
		now = now.Add(5 * time.Second)
		return smoothStep(c, now, req, prompt)
	}
	if got := step(4, 1000); got.RequestsPerS != 4 || got.PromptTokens != 1000 {
		t.Fatalf("first window planned as %+v, want it as is", got)
	}
	// 4 → 4.4 req/s (44 against 40 requests: one standard deviation):
	// followed over the time constant, not at once.
	got := step(4.4, 1000)
	if !(got.RequestsPerS > 4 && got.RequestsPerS < 4.2) {
		t.Errorf("a one-sigma change planned at once or not at all: %.3f", got.RequestsPerS)
	}
	for range 5 { // 30 s in all: one time constant
		got = step(4.4, 1000)
	}
	if gap := (4.4 - got.RequestsPerS) / 0.4; gap > 0.45 || gap < 0.25 {
		t.Errorf("after one time constant %.3f req/s: %.0f%% of the change left, want about 37%%", got.RequestsPerS, 100*gap)
	}
	// A surge to 8 req/s is planned at once.
	if got = step(8, 3000); got.RequestsPerS != 8 || got.PromptTokens != 3000 {
		t.Errorf("a surge to 8 req/s planned as %+v", got)
	}
	// Token means are per request: the prompt mean moves with the token
	// rate over the request rate, not on its own.
	got = step(8, 1000)
	if want := (8*3000 + (1-math.Exp(-5.0/30))*8*(1000-3000)) / 8; math.Abs(got.PromptTokens-want) > 1 {
		t.Errorf("prompt mean %.1f, want %.1f", got.PromptTokens, want)
	}
	// Gone quiet: out at once, and forgotten.
	if got = step(0, 0); got.RequestsPerS != 0 {
		t.Errorf("a frontend gone quiet still planned at %.3f req/s", got.RequestsPerS)
	}
	if len(c.smoothed) != 0 {
		t.Errorf("state kept for %d keys without demand", len(c.smoothed))
	}
	// Off: the window's rates as they are.
	cfg := DefaultConfig()
	cfg.DemandSmoothing = 0
	off, err := NewController(testFleet(t), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	smoothStep(off, now, 4, 1000)
	if got := smoothStep(off, now.Add(5*time.Second), 4.4, 1000); got.RequestsPerS != 4.4 {
		t.Errorf("smoothing off planned %.3f for a window of 4.4", got.RequestsPerS)
	}
	cfg.DemandSmoothing = -time.Second
	if _, err := NewController(testFleet(t), cfg, nil); err == nil || !contains(err.Error(), "demand_smoothing: must be ≥ 0") {
		t.Errorf("negative demand_smoothing: %v", err)
	}
}
