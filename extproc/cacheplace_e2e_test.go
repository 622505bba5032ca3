package extproc_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferlb/inferlb/internal/envoytest"
)

// Through a real Envoy, cache-aware placement's pick is where the request
// is served: every turn of a conversation reaches the engine that served
// its first, and the access log reports each placed request served on its
// pick (inferlb_extproc_placements_served_total).
func TestCachePlacementThroughEnvoy(t *testing.T) {
	noLeaks(t)
	reg := prometheus.NewRegistry()
	r := startRig(t, rigOptions{engines: 3, cachePlacement: true, registry: reg})
	const convs, turns = 12, 3
	system := strings.Repeat("You answer questions about the inventory of a hardware store. ", 40)
	first := make([]string, convs)
	sent := 0
	for turn := range turns {
		for c := range convs {
			msgs := []msg{{"system", system}}
			for k := 0; k <= turn; k++ {
				if k > 0 {
					msgs = append(msgs, msg{"assistant", fmt.Sprintf("answer %d", k-1)})
				}
				msgs = append(msgs, msg{"user", fmt.Sprintf("conversation %d asks question %d", c, k)})
			}
			res := r.post(chatMsgs("llama-3-8b", msgs, nil), nil)
			if res.status != 200 {
				t.Fatalf("conversation %d turn %d: %d %s", c, turn, res.status, res.body)
			}
			sent++
			if turn == 0 {
				first[c] = res.engine
			} else if res.engine != first[c] {
				t.Errorf("conversation %d turn %d served by %s, its first turn by %s", c, turn, res.engine, first[c])
			}
		}
	}
	served := func() (picked, elsewhere float64) {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() != "inferlb_extproc_placements_served_total" {
				continue
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "outcome" && l.GetValue() == "picked" {
						picked += m.GetCounter().GetValue()
					} else if l.GetName() == "outcome" {
						elsewhere += m.GetCounter().GetValue()
					}
				}
			}
		}
		return picked, elsewhere
	}
	// The access log reaches ext_proc after the response.
	if err := envoytest.Poll(context.Background(), 10*time.Second, 20*time.Millisecond, func() error {
		if p, e := served(); p+e < float64(sent) {
			return fmt.Errorf("%v picked + %v elsewhere of %d served", p, e, sent)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if p, e := served(); e != 0 {
		t.Errorf("%v of %v placed requests were served elsewhere than their pick, one at a time", e, p+e)
	}
}
