package optimizer

import (
	"testing"

	sim "github.com/inferlb/inferlb/tools/enginesim/model"
)

func TestProbeAccuracy(t *testing.T) {
	for _, step := range []StepModel{stepH100, stepA100} {
		cfg := simConfig(step)
		for _, sh := range [][2]int{{200, 200}, {1000, 100}, {4000, 200}} {
			d, _ := NewProfile(step, float64(sh[0]), float64(sh[1]))
			for _, u := range []float64{0.2, 0.5, 0.8, 0.95} {
				s := simulate(t, cfg, u*d.CapacityRPS, sh[0], sh[1], 3000, 5)
				t.Logf("%v %v u %.2f: TTFT sim %.1f derived %.1f (%.0f%%), TBOT sim %.2f derived %.2f", step.DecodeStepMs, sh, u, s.TTFTMs, d.TTFT.At(u), 100*(d.TTFT.At(u)/s.TTFTMs-1), s.TBOTMs, d.TBOT.At(u))
			}
		}
	}
}

func simConfig(step StepModel) sim.Config {
	return sim.Config{PrefillTokensPerS: step.PrefillTokensPerS, OverheadMs: step.OverheadMs, DecodeStepMs: step.DecodeStepMs,
		DecodeStepPerSeqMs: step.DecodeStepPerSeqMs, MaxRunning: step.MaxRunning, MaxBatchedTokens: 8192,
		KVCapacityTokens: step.KVCapacityTokens, BlockSize: 16}
}
