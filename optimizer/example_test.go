package optimizer_test

import (
	"fmt"

	"github.com/inferlb/inferlb/optimizer"
)

// Two regions, one engine each, 60 ms apart. East's 30 req/s would fit on
// its own engine (72% of capacity, under the 80% headroom), but at that load
// every decode step is slower (TBOT grows with the running batch) by more
// than the 60 ms round trip costs, so the optimizer sends part of the
// traffic west: at the optimum both engines' marginal costs (network +
// latency + congestion) are equal.
func Example() {
	prof, err := optimizer.NewProfile(optimizer.StepModel{PrefillTokensPerS: 25000, OverheadMs: 10,
		DecodeStepMs: 6.5, DecodeStepPerSeqMs: 0.055, MaxRunning: 256, KVCapacityTokens: 450000}, 200, 200)
	if err != nil {
		panic(err)
	}
	p := &optimizer.Problem{
		Headroom:   0.8,
		Frontends:  []optimizer.Frontend{{ID: "east"}},
		Engines:    []optimizer.Engine{{ID: "east-1", Profile: prof, Replicas: 1, ReadyReplicas: 1, Health: 1}, {ID: "west-1", Profile: prof, Replicas: 1, ReadyReplicas: 1, Health: 1}},
		Classes:    []optimizer.Class{{ID: "chat", PromptTokens: 200, OutputTokens: 200, Eligible: []int{0, 1}}},
		Priorities: []optimizer.Priority{{Name: "default", ShedCost: 1}},
		Demand:     [][]optimizer.Demand{{{RatePerS: []float64{30}}}},
		RTTMs:      [][]float64{{1, 60}},
	}
	sol, err := optimizer.Solve(p, optimizer.Options{})
	if err != nil {
		panic(err)
	}
	f := sol.Flow("east", "chat")
	for _, w := range f.Weights {
		fmt.Printf("%s: weight %.2f, utilization %.2f, network %.0f ms, latency %.0f ms, congestion %.0f ms\n",
			w.Engine, w.Weight, w.Utilization, w.NetworkMs, w.LatencyMs, w.CongestionMs)
	}
	fmt.Printf("shed %.0f%%\n", 100*f.Shed[0].Fraction)
	// Output:
	// east-1: weight 0.51, utilization 0.37, network 1 ms, latency 1979 ms, congestion 920 ms
	// west-1: weight 0.49, utilization 0.36, network 60 ms, latency 1951 ms, congestion 888 ms
	// shed 0%
}
