package fleetsim

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/inferlb/inferlb/internal/envoylb"
	"github.com/inferlb/inferlb/xds/translate"
)

type fifoLoad struct {
	active []int
	total  int
}

func (l *fifoLoad) Active(i int) int { return l.active[i] }
func (l *fifoLoad) Total() int       { return l.total }

// spillShare is the share of requests Envoy's bounded load sends away from
// their key's engine on a cluster weighted as the optimizer weights a
// region of two H100s and two A100s (40.5/40.5/9.5/9.5%), with 8 requests
// in flight (a frontend of the steady scenarios) and 300 conversations.
func spillShare(factor uint32) float64 {
	hs := make([]envoylb.Host, 4)
	for i, w := range []uint32{405, 405, 95, 95} {
		hs[i] = envoylb.Host{Key: fmt.Sprintf("10.0.0.%d:8000", i+1), Weight: w, Healthy: true}
	}
	lb, err := envoylb.New(envoylb.Config{Policy: envoylb.Maglev, HashBalanceFactor: factor}, hs)
	if err != nil {
		panic(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	l := &fifoLoad{active: make([]int, len(hs))}
	var inflight []int
	spilled, n := 0, 20000
	for range n {
		h := envoylb.HeaderHash(fmt.Sprintf("conv-%d", rng.IntN(300)))
		got := lb.Choose(h, l, nil, 0)
		if got != lb.Choose(h, nil, nil, 0) {
			spilled++
		}
		l.active[got]++
		l.total++
		inflight = append(inflight, got)
		if len(inflight) > 8 {
			l.active[inflight[0]]--
			l.total--
			inflight = inflight[1:]
		}
	}
	return float64(spilled) / float64(n)
}

// The translation's default hash_balance_factor keeps conversations on
// their engines at ordinary load: a spill is a cold prefill for that turn
// and for the next one, which goes back. At 150 a few requests in flight
// on an H100 already cross the bound (in the simulator's steady scenarios
// spills and returns were 85% of the remapped follow-up turns, and the
// slowest 1% were mostly those); the default spills at most a fifth as
// often.
func TestDefaultBalanceFactorSpillsRarely(t *testing.T) {
	def := translate.DefaultOptions().HashBalanceFactor
	at150, atDef := spillShare(150), spillShare(def)
	t.Logf("spilled: %.2f%% at hash_balance_factor 150, %.2f%% at the default %d", 100*at150, 100*atDef, def)
	if at150 < 0.005 {
		t.Fatalf("at 150 only %.2f%% spilled: the test does not reach the bound", 100*at150)
	}
	if atDef > at150/5 {
		t.Errorf("the default %d spills %.2f%% of requests, more than a fifth of 150's %.2f%%", def, 100*atDef, 100*at150)
	}
}
