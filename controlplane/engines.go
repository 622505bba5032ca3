package controlplane

import (
	"math"
	"time"

	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/optimizer"
	"github.com/inferlb/inferlb/xds/translate"
)

// engineStep is what the cycle concluded about the engines (steps 1–2):
// the inputs of the problem, the deadband and the translation.
type engineStep struct {
	// problem is each engine as the optimizer sees it (in fleet order):
	// capacity scaled by health and background load, its penalty, its
	// profile with the online correction (correction.go).
	problem []optimizer.Engine
	// health is the EDS health by engine id.
	health map[string]translate.Health
	// recovered: engines that were impaired last cycle and are not now.
	recovered map[string]bool
	// corrected: engines whose profile correction moved past
	// correctionReplan this cycle.
	corrected map[string]bool
	// up: engines whose state is up (a penalized one keeps a probe share).
	up map[string]bool
}

// penaltyDecay is the factor a penalty decays by since the last step (1 on
// the first).
func (c *Controller) penaltyDecay(now time.Time) float64 {
	if c.lastStep.IsZero() {
		return 1
	}
	if dt := now.Sub(c.lastStep); dt > 0 {
		return math.Exp2(-dt.Seconds() / c.cfg.Penalty.HalfLife.Seconds())
	}
	return 1
}

// assessEngines is steps 1–2: each engine's view (penalty.go's observe),
// its next penalty, whether it recovered; the views go into res.Engines
// and res.PenaltyNotes. It updates the controller's penalties and
// impairments.
func (c *Controller) assessEngines(in Inputs, decay float64, res *Result) engineStep {
	st := engineStep{health: map[string]translate.Health{}, recovered: map[string]bool{}, corrected: map[string]bool{}}
	views, states, as, up := c.observe(in)
	c.rememberOwn(in.Now, views)
	st.up = up
	profiles, replan := c.correctProfiles(in.Now, views)
	res.PenaltyNotes = notFaults(as)
	for j, e := range c.problem.engines {
		v, state := views[j], states[j]
		st.health[e.ID], _ = c.healthOf(state)
		pen, why := c.nextPenalty(e.ID, c.penalties[e.ID], *as[e.ID], decay)
		c.penalties[e.ID] = pen
		v.Penalty, v.PenaltyWhy = pen, why
		impaired := pen > 0 || (state != signals.Up && state != signals.New)
		if c.impaired[e.ID] && !impaired {
			st.recovered[e.ID] = true
			v.PenaltyWhy = "recovered: the stability term is lifted for its classes this cycle"
		}
		c.impaired[e.ID] = impaired
		if replan[e.ID] {
			// A corrected profile is a new model of the engine, not
			// noise: its classes are solved without the stability term;
			// unlike a recovery's, the new weights still pay for their
			// cache misses at the deadband (correction.go).
			st.corrected[e.ID] = true
		}
		res.Engines = append(res.Engines, v)
		reps := float64(max(e.Replicas, 1))
		st.problem = append(st.problem, optimizer.Engine{ID: e.ID, Profile: profiles[e.ID], Replicas: reps, ReadyReplicas: reps,
			Health: v.HealthFactor * (1 - v.BackgroundLoad), Penalty: pen})
	}
	return st
}

func (c *Controller) healthOf(s signals.State) (translate.Health, float64) {
	switch s {
	case signals.Up:
		return translate.Healthy, 1
	case signals.Down:
		return translate.Unhealthy, 0
	}
	return translate.Unknown, c.cfg.UnknownHealth
}
