package fleet

import (
	"fmt"
	"math"
	"slices"
)

// InRealTime is the fleet as it runs in real time when its engines are
// simulators at time scale scale (engine-sim --time-scale: a simulated
// second lasts scale real seconds): every duration of the profiles and the
// network times scale, every rate (prefill throughput, capacity, a
// frontend's request bound) divided by it. The simulator's /metrics are in
// real time, as a real engine's, so a control plane reading it plans with
// this spec (control-plane --time-scale). Scale 1 returns s itself.
func (s *Spec) InRealTime(scale float64) (*Spec, error) {
	if !(scale > 0) || math.IsInf(scale, 0) {
		return nil, fmt.Errorf("fleet: time scale must be a positive number, got %v", scale)
	}
	if scale == 1 {
		return s, nil
	}
	c := *s
	c.ix = nil
	c.Profiles = slices.Clone(s.Profiles)
	for i := range c.Profiles {
		p := &c.Profiles[i]
		p.PrefillTokensPerS /= scale
		p.CapacityRPS /= scale
		p.OverheadMs *= scale
		p.DecodeStepMs *= scale
		p.DecodeStepPerSeqMs *= scale
		for _, cv := range []**Curve{&p.TTFTCurve, &p.TBOTCurve} {
			if *cv != nil {
				x := **cv
				x.BaseMs, x.LinearMs, x.QueueMs = x.BaseMs*scale, x.LinearMs*scale, x.QueueMs*scale
				*cv = &x
			}
		}
	}
	if s.Network.SameRegionRTTMs != nil {
		v := *s.Network.SameRegionRTTMs * scale
		c.Network.SameRegionRTTMs = &v
	}
	c.Network.Links = slices.Clone(s.Network.Links)
	for i := range c.Network.Links {
		c.Network.Links[i].RTTMs *= scale
	}
	c.Frontends = slices.Clone(s.Frontends)
	for i := range c.Frontends {
		c.Frontends[i].MaxRequestsPerS /= scale
	}
	return New(c)
}
