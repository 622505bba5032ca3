package controlplane

import (
	"math"
	"time"

	"github.com/inferlb/inferlb/controlplane/signals"
)

// Demand smoothing. The intake reports demand as rates over a window (10 s
// by default); at a few requests per second such a rate is a count of a
// few dozen, whose Poisson noise (±15% at 4 req/s) moved the optimum, and
// with it the weights, every cycle at steady demand: cache misses for no
// gain. The optimizer plans with a smoothed demand instead: per (frontend,
// class, priority) an exponentially weighted mean with time constant
// DemandSmoothing, which follows a real change at once when the window's
// rate departs from the smoothed one by more than demandJumpSigma standard
// deviations of the window's count (a surge, a region's traffic moving, a
// frontend going quiet). Mean prompt and output tokens are smoothed as
// token rates, so they stay weighted by requests.
//
// Background load and the plan it is compared with keep the window's
// rates: they are set against the engines' own load now.

// demandJumpSigma is how many standard deviations of a window's request
// count make a change real rather than noise.
const demandJumpSigma = 3

// defaultDemandWindow is the intake window assumed when Inputs do not say.
const defaultDemandWindow = 10 * time.Second

// smoothedDemand is one key's state: rates of requests, shed requests,
// prompt and output tokens.
type smoothedDemand struct{ req, shed, pt, ot float64 }

func smoothedOf(r signals.DemandRate) smoothedDemand {
	return smoothedDemand{req: r.RequestsPerS, shed: r.ShedPerS, pt: r.PromptTokens * r.RequestsPerS, ot: r.OutputTokens * r.RequestsPerS}
}

func (s smoothedDemand) rate() signals.DemandRate {
	r := signals.DemandRate{RequestsPerS: s.req, ShedPerS: s.shed}
	if s.req > 0 {
		r.PromptTokens, r.OutputTokens = s.pt/s.req, s.ot/s.req
	}
	return r
}

// smoothDemand returns the demand the optimizer plans with at now, and
// keeps the state for the next cycle.
func (c *Controller) smoothDemand(now time.Time, dem map[signals.DemandKey]signals.DemandRate, window time.Duration) map[signals.DemandKey]signals.DemandRate {
	tau := c.cfg.DemandSmoothing
	if tau <= 0 {
		return dem
	}
	if window <= 0 {
		window = defaultDemandWindow
	}
	w := window.Seconds()
	alpha := 1.0
	if !c.smoothedAt.IsZero() {
		if dt := now.Sub(c.smoothedAt); dt > 0 {
			alpha = 1 - math.Exp(-dt.Seconds()/tau.Seconds())
		} else {
			alpha = 0 // the same instant again: nothing new
		}
	}
	c.smoothedAt = now
	if c.smoothed == nil {
		c.smoothed = map[signals.DemandKey]smoothedDemand{}
	}
	out := make(map[signals.DemandKey]signals.DemandRate, len(dem))
	keys := make(map[signals.DemandKey]bool, len(dem)+len(c.smoothed))
	for k := range dem {
		keys[k] = true
	}
	for k := range c.smoothed {
		keys[k] = true
	}
	for k := range keys {
		x := smoothedOf(dem[k])
		s, seen := c.smoothed[k]
		// The window's count has Poisson standard deviation √(rate·W): a
		// departure beyond demandJumpSigma of it is a change, followed at
		// once. (At least one request's worth, so that a key that comes
		// or goes at a trickle is not held.)
		sd := math.Sqrt(math.Max(s.req, x.req)*w) / w
		if !seen || math.Abs(x.req-s.req) > demandJumpSigma*math.Max(sd, 1/w) {
			s = x
		} else {
			s = smoothedDemand{req: s.req + alpha*(x.req-s.req), shed: s.shed + alpha*(x.shed-s.shed),
				pt: s.pt + alpha*(x.pt-s.pt), ot: s.ot + alpha*(x.ot-s.ot)}
		}
		if s.req < 1e-6 && x.req == 0 {
			delete(c.smoothed, k)
			continue
		}
		c.smoothed[k] = s
		out[k] = s.rate()
	}
	return out
}
