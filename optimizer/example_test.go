package optimizer_test

import (
	"fmt"

	"github.com/inferlb/inferlb/optimizer"
)

// Two regions, one engine each, 60 ms apart. East's 30 req/s would fit on
// its own engine (72% of capacity, under the 80% headroom), with a mean
// time to first token 12 ms above its zero-load value; but the objective
// prices the wait at its tail (Problem.TailFactor, 4.6 × the load-dependent
// part: a wait's 99th percentile), and at 72% east's tail plus the
// congestion one more request adds outweighs the 60 ms round trip: the
// optimizer keeps 72% home and sends the rest west, where the marginal
// costs meet; at 40 req/s 63%.
func Example() {
	prof, err := optimizer.NewProfile(optimizer.StepModel{PrefillTokensPerS: 25000, OverheadMs: 10,
		DecodeStepMs: 6.5, DecodeStepPerSeqMs: 0.055, MaxRunning: 256, KVCapacityTokens: 450000}, 200, 200)
	if err != nil {
		panic(err)
	}
	for _, rate := range []float64{30, 40} {
		p := &optimizer.Problem{
			Headroom:   0.8,
			Frontends:  []optimizer.Frontend{{ID: "east"}},
			Engines:    []optimizer.Engine{{ID: "east-1", Profile: prof, Replicas: 1, ReadyReplicas: 1, Health: 1}, {ID: "west-1", Profile: prof, Replicas: 1, ReadyReplicas: 1, Health: 1}},
			Classes:    []optimizer.Class{{ID: "chat", PromptTokens: 200, OutputTokens: 200, Eligible: []int{0, 1}}},
			Priorities: []optimizer.Priority{{Name: "default", ShedCost: 1}},
			Demand:     [][]optimizer.Demand{{{RatePerS: []float64{rate}}}},
			RTTMs:      [][]float64{{1, 60}},
		}
		sol, err := optimizer.Solve(p, optimizer.Options{})
		if err != nil {
			panic(err)
		}
		f := sol.Flow("east", "chat")
		fmt.Printf("%.0f req/s:\n", rate)
		for _, w := range f.Weights {
			fmt.Printf("  %s: weight %.2f, utilization %.2f, network %.0f ms, TTFT %.0f ms, congestion %.0f ms\n",
				w.Engine, w.Weight, w.Utilization, w.NetworkMs, w.TTFTMs, w.CongestionMs)
		}
	}
	// Output:
	// 30 req/s:
	//   east-1: weight 0.72, utilization 0.52, network 1 ms, TTFT 36 ms, congestion 49 ms
	//   west-1: weight 0.28, utilization 0.21, network 60 ms, TTFT 30 ms, congestion 17 ms
	// 40 req/s:
	//   east-1: weight 0.63, utilization 0.61, network 1 ms, TTFT 38 ms, congestion 65 ms
	//   west-1: weight 0.37, utilization 0.35, network 60 ms, TTFT 32 ms, congestion 30 ms
}

// What a request costs an H100 depends on its shape: a 1,500-token chat
// turn whose history is 85% in the prefix cache costs about one 200/200
// reference request; the same turn uncached costs three, and reaches the
// latency curves' hockey stick sooner (the utilization at which one more
// request costs 12× its zero-load latency, Problem.MarginalStretch):
// prefill shares every decode step.
func ExampleProfile_Capacity() {
	prof, err := optimizer.NewProfile(optimizer.StepModel{PrefillTokensPerS: 25000, OverheadMs: 10,
		DecodeStepMs: 6.5, DecodeStepPerSeqMs: 0.055, MaxRunning: 256, KVCapacityTokens: 450000}, 200, 200)
	if err != nil {
		panic(err)
	}
	for _, s := range []optimizer.Shape{
		{PromptTokens: 200, OutputTokens: 200},
		{PromptTokens: 1500, OutputTokens: 180, CachedShare: 0.85},
		{PromptTokens: 1500, OutputTokens: 180},
	} {
		fmt.Printf("%4.0f prompt tokens (%2.0f%% cached), %3.0f output: %4.1f req/s, %.2f reference requests, full at u = %.2f\n",
			s.PromptTokens, 100*s.CachedShare, s.OutputTokens, prof.Capacity(s), prof.Ratio(s), prof.FullUtilization(s, 12, 0.95))
	}
	// Output:
	//  200 prompt tokens ( 0% cached), 200 output: 41.5 req/s, 1.00 reference requests, full at u = 0.87
	// 1500 prompt tokens (85% cached), 180 output: 42.6 req/s, 0.97 reference requests, full at u = 0.87
	// 1500 prompt tokens ( 0% cached), 180 output: 13.4 req/s, 3.09 reference requests, full at u = 0.68
}
