package controlplane

import (
	"github.com/inferlb/inferlb/optimizer"
	"github.com/inferlb/inferlb/xds/translate"
)

// solvedView adds the solution's utilization and limit to each engine's
// view and returns the solved utilization by engine id.
func solvedView(res *Result, sol *optimizer.Solution) map[string]float64 {
	engUtil := map[string]float64{}
	for j, er := range sol.Engines {
		engUtil[er.ID] = er.Utilization
		if j < len(res.Engines) && res.Engines[j].ID == er.ID {
			res.Engines[j].SolvedUtilization = er.Utilization
			if er.CapacityRPS > 0 {
				res.Engines[j].UtilizationLimit = er.LimitRPS / er.CapacityRPS
			}
		}
	}
	return engUtil
}

// envoyView splits the translated endpoints into the admin view's weights
// and priorities (only the failover ones, priority > 0, are listed).
func envoyView(ew map[string]translate.EndpointWeight) (weights, priority map[string]uint32) {
	weights, priority = make(map[string]uint32, len(ew)), map[string]uint32{}
	for id, w := range ew {
		weights[id] = w.Weight
		if w.Priority > 0 {
			priority[id] = w.Priority
		}
	}
	return weights, priority
}
