package controlplane

import (
	"math"
	"strconv"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/xds/translate"
)

// classPolicy is one class's translation input at a node: the decided
// weights and shed fractions, the utilization to publish, the retry
// policy, the local in-flight limit, the context bounds and the affinity
// configuration with the class's split table.
func (c *Controller) classPolicy(cl fleet.Class, cd *ClassDecision, util float64, av *AffinityView) translate.Class {
	if av == nil {
		av = &AffinityView{}
	}
	budget, retries := c.retryPolicy()
	tc := translate.Class{Name: cl.Name, Model: cl.Model, Residency: cl.Residency,
		MinContextTokens: uint32(cl.MinContextTokens), MaxContextTokens: uint32(c.maxContext(cl)),
		Weights: cd.Weights, ShedByLevel: cd.shedLevels, RetryBudgetFraction: budget,
		MaxRetries: retries, LocalInflightLimit: uint32(c.InflightLimit(cl.Name)), Utilization: util,
		MeanOutputTokens: uint32(math.Round(cl.MeanOutputTokens)),
		Affinity: translate.Affinity{Keys: cl.Affinity.Keys, Off: cl.Affinity.Mode == fleet.AffinityOff,
			Rules: av.rules, SharedDepthBytes: av.SharedDepthBytes},
		HashBalanceFactor: c.hashBalanceFactor(cl.Name)}
	if m, ok := c.spec.ModelByName(cl.Model); ok {
		tc.TokenizerSHA256, tc.ChatTemplateTokens = m.TokenizerSHA256, uint32(m.ChatTemplateTokens)
	}
	return tc
}

// translateNode is step 6 for one node: its classes translated (policy
// version nextVersion), the Envoy weights and priorities that translation
// chose copied into the admin view, and the resources kept from prev when
// nothing changed (the old version stamp stays). exclusive names the
// engines only this node sends requests to (exclusiveEngines).
func (c *Controller) translateNode(fe fleet.Frontend, nd *NodeDecision, classes []translate.Class, health map[string]translate.Health,
	exclusive map[string]bool, prev *NodeDecision, now time.Time, nextVersion int64) error {
	f := &c.problem
	tn := translate.Node{NodeID: fe.NodeID, Region: fe.Region, Engines: map[string]translate.Engine{},
		Priorities: f.tprios, DefaultPriority: f.defaultPriority, GeneratedAt: now, Classes: classes}
	for _, cd := range nd.Classes {
		for id := range cd.Weights {
			e, _ := c.spec.EngineByID(id)
			tn.Engines[id] = translate.Engine{ID: id, Address: e.Address, Region: e.Region, Health: health[id], HealthPath: e.HealthPath,
				PrefillTokensPerS: c.profiles[id].PrefillTokensPerS * float64(max(e.Replicas, 1)), Exclusive: exclusive[id]}
		}
	}
	// The policy version only moves when the decision changed.
	tn.PolicyVersion = strconv.FormatInt(nextVersion, 10)
	r, err := translate.Translate(tn, c.cfg.Translate)
	if err != nil {
		return err
	}
	for name, cd := range nd.Classes {
		cd.EnvoyW, cd.Priority = envoyView(r.Weights[name])
	}
	if prev != nil && prev.Resources != nil && prev.Resources.PolicyHash == r.PolicyHash &&
		prev.Resources.EndpointVersion == r.EndpointVersion && prev.Resources.ClusterVersion == r.ClusterVersion {
		nd.Resources = prev.Resources // unchanged: keep the old version stamp
	} else {
		nd.Resources, nd.Changed = r, true
	}
	return nil
}
