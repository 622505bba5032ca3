package controlplane

import (
	"math"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/internal/dist"
	"github.com/inferlb/inferlb/xds/translate"
)

// hold is step 4 for one (frontend, class): against the published
// decision prevCD, the proposal cd keeps the published weights when the
// deadband says the move is not worth it (deadband.go's apply; never when
// an eligible engine's health moved or one of them recovered), the
// published shed fractions unless one moved by ShedDeadband, and the
// published utilization unless it moved by 0.05. It returns the class's
// utilization to publish.
func (c *Controller) hold(node string, cl fleet.Class, solved bool, prevCD, cd *ClassDecision, util float64,
	db *deadbandCycle, eng engineStep) float64 {
	if prevCD != nil && prevCD.Weights != nil {
		cd.TVDistance = dist.TotalVariation(prevCD.Weights, cd.Proposed)
		if !healthMoved(prevCD, cd) && !c.touchesRecovered(cl.Name, eng.recovered) {
			db.apply(node, cl, solved, prevCD, cd)
		}
		if !c.shedMoved(prevCD, cd) && prevCD.shedLevels != nil {
			cd.shedLevels, cd.Shed = prevCD.shedLevels, prevCD.Shed
		}
	}
	db.decided(node, cl.Name, cd.Weights)
	util = round2(util)
	if prevCD != nil && prevCD.util >= 0 && math.Abs(prevCD.util-util) < 0.05 {
		util = prevCD.util // utilization jitter is not worth a policy push
	}
	cd.util = util
	if cd.Held {
		cd.Weights = heldOnProposed(cd.Weights, cd.Proposed)
	}
	return util
}

// healthMoved: an eligible engine's health differs from the published
// decision's.
func healthMoved(prevCD, cd *ClassDecision) bool {
	moved := false
	for id, h := range cd.Health {
		if prevCD.Health != nil && prevCD.Health[id] != h {
			moved = true
		}
		// Seeded from a state file (no health known): only an engine that
		// carries weight and is not healthy counts.
		if prevCD.Health == nil && prevCD.Weights[id] > 0 && h != translate.Healthy.String() {
			moved = true
		}
	}
	return moved
}

// shedMoved: a shed fraction moved by ShedDeadband or more.
func (c *Controller) shedMoved(prevCD, cd *ClassDecision) bool {
	for lvl := range unionKeys(prevCD.shedLevels, cd.shedLevels) {
		if math.Abs(prevCD.shedLevels[lvl]-cd.shedLevels[lvl]) >= c.cfg.ShedDeadband {
			return true
		}
	}
	return false
}
