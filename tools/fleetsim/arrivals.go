package fleetsim

import (
	"math/rand/v2"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/internal/tokens/hf"
)

// SessionStarts returns when an open-loop sessions scenario's sessions
// start (from the start of traffic) under seed: the arrival process Run
// draws (newSession), exponential gaps at sessions_per_s times the rate
// phase and the surges in force at each start, the same random stream.
// It lets another driver (tools/simreal's load generator) send the sessions
// at the times the simulator starts them. Closed-loop (users) and trace
// workloads have no such schedule: nil.
func SessionStarts(sc *Scenario, seed uint64) []time.Duration {
	w := &sc.Workload
	if w.Kind != Sessions || w.Users > 0 {
		return nil
	}
	arr := rand.New(rand.NewPCG(seed, 0x617272))
	rate := func(t time.Duration) float64 {
		f := 1.0
		for _, ph := range w.RatePhases {
			if t >= ph.At {
				f = ph.Factor
			}
		}
		for _, x := range sc.Faults {
			if x.Kind == Surge && x.At <= t && (x.For <= 0 || t < x.At+x.For) {
				f *= x.Factor
			}
		}
		return w.SessionsPerS * f
	}
	var out []time.Duration
	for t := time.Duration(0); t < sc.Duration; {
		if w.MaxSessions > 0 && len(out) >= w.MaxSessions {
			break
		}
		r := rate(t)
		if r <= 0 {
			t += time.Second
			continue
		}
		out = append(out, t)
		t += time.Duration(arr.ExpFloat64() / r * float64(time.Second))
	}
	return out
}

// WithSimTokenizer is spec with every model naming the tokenizer the
// simulated ext_procs count with, and that tokenizer: a real ext_proc given
// both (extproc.Options.Tokenizers) counts tokens as the simulator's do,
// which is what a comparison with the real stack needs (tools/simreal).
func WithSimTokenizer(spec *fleet.Spec) (*fleet.Spec, *hf.Tokenizer, error) {
	return withSimTokenizer(spec)
}

// Lead is how long the simulated control plane runs before traffic starts:
// its cycles fall at Lead + warm-up + k × interval, i.e. at fixed phases of
// the traffic. A real run that starts its traffic Lead after its control
// plane sees the same phases (tools/simreal), which matters: the first
// cycle to see traffic anchors the class's cached-share estimate.
const Lead = lead
