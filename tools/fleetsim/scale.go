package fleetsim

import (
	"fmt"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/tools/workload"
)

// SimGCPercent and SimMemoryLimit are the garbage collector's targets while
// simulating (the command and the benchmark set them): the simulator's heap
// is mostly live state (a thousand engines' prefix caches hold a few
// hundred bytes per block), so collecting at 4× growth instead of 2× cuts
// the GC's share, and the soft limit makes it collect sooner when a large
// fleet's caches fill up.
const (
	SimGCPercent   = 400
	SimMemoryLimit = 4 << 30
)

// ScaleScenario is the scale benchmark's scenario: engines H100 engines of
// the reference profile spread over four regions (one frontend each), and
// open-loop chat sessions sized so that requests arrive at about half the
// fleet's capacity; MaxArrivals in Options bounds the run.
func ScaleScenario(engines int, requests int) (*Scenario, error) {
	regions := []string{"r0", "r1", "r2", "r3"}
	same := 1.0
	spec := fleet.Spec{Name: fmt.Sprintf("scale-%d", engines), Network: fleet.Network{SameRegionRTTMs: &same}}
	for _, r := range regions {
		spec.Regions = append(spec.Regions, fleet.Region{Name: r})
		spec.Frontends = append(spec.Frontends, fleet.Frontend{Name: "fe-" + r, Region: r, NodeID: "fe-" + r})
	}
	for i := range regions {
		for j := i + 1; j < len(regions); j++ {
			spec.Network.Links = append(spec.Network.Links, fleet.Link{A: regions[i], B: regions[j], RTTMs: float64(30 * (j - i))})
		}
	}
	spec.Models = []fleet.Model{{Name: "m", MaxContextTokens: 32768}}
	spec.Profiles = []fleet.Profile{{GPU: "H100", Model: "m", PrefillTokensPerS: 25000, OverheadMs: 10, DecodeStepMs: 6.5,
		DecodeStepPerSeqMs: 0.055, MaxRunning: 256, MaxBatchedTokens: 8192, KVCapacityTokens: 450000, BlockSize: 16}}
	spec.Classes = []fleet.Class{{Name: "general", Model: "m", MeanPromptTokens: 400, MeanOutputTokens: 100}}
	spec.Priorities = []fleet.Priority{{Name: "standard", Level: 0, ShedCost: 1000}}
	for i := 0; i < engines; i++ {
		r := regions[i%len(regions)]
		spec.Engines = append(spec.Engines, fleet.Engine{ID: fmt.Sprintf("e%04d", i),
			Address: fmt.Sprintf("10.%d.%d.%d:8000", i/65536, i/256%256, i%256), Region: r, GPU: "H100", Model: "m"})
	}
	fs, err := fleet.New(spec)
	if err != nil {
		return nil, err
	}
	// About 12 req/s per engine at this shape (half of an H100's ~25):
	// sessions of 2.5 turns on average.
	perS := float64(engines) * 12 / 2.5
	shares := make([]workload.Share, len(regions))
	for i, r := range regions {
		shares[i] = workload.Share{Name: r, Weight: 1}
	}
	dur := time.Duration(float64(requests)/(perS*2.5)*float64(time.Second)) + 30*time.Second
	sc := &Scenario{Name: spec.Name, Fleet: fs, Duration: dur, Warmup: 0, Seed: 1,
		SLO: SLO{TTFT: time.Second, TPOT: 100 * time.Millisecond},
		Workload: Workload{Kind: Sessions, SessionsPerS: perS, Model: "m", MultiTurn: workload.MultiTurnOptions{
			Format: workload.Chat, SystemPrompts: 16, SystemPromptTokens: 200, Turns: workload.Range{Min: 1, Max: 4},
			UserTokens: workload.Range{Min: 50, Max: 150}, OutputTokens: workload.Range{Min: 50, Max: 150},
			ThinkTime: 2 * time.Second, Regions: []workload.RegionPhase{{At: 0, Shares: shares}}, Seed: 1}},
		Policies: PolicyNames(),
		Control: Control{Interval: 5 * time.Second, ScrapeInterval: time.Second, ReportInterval: time.Second,
			HealthCheckInterval: 2 * time.Second, OldGain: 1}}
	return sc, nil
}
