package drills

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/xds/xdstest"
)

// An engine removed from the fleet must leave Envoy at once: the class
// clusters drop a host when EDS stops naming it, even while it passes
// Envoy's active health check. The control plane restarts with one engine
// fewer, and after its first cycle (1 s) not one request reaches the
// removed engine, and none fails.
//
// Without ignore_health_on_host_removal e2 stays in Envoy's cluster
// (flagged pending_dynamic_removal) at its old weight and keeps serving
// about a third of the requests.
func TestDrillRemovedEngine(t *testing.T) {
	s := startStack(t, stackOptions{})
	tr := s.startTraffic(trafficOptions{rate: 8, maxTokens: 8})
	tr.waitSent(t, 16, 20*time.Second)
	removed := s.engines[2]

	// The same control plane, its fleet without e2.
	var addrs []string
	for _, e := range s.engines[:2] {
		addrs = append(addrs, e.Addr())
	}
	if err := os.WriteFile(s.fleetPath, []byte(fleetYAML(drillProfile, addrs, 0)), 0o644); err != nil {
		t.Fatal(err)
	}
	s.procs.Stop(s.cps[0])
	if err := s.procs.Restart(s.cps[0]); err != nil {
		t.Fatal(err)
	}
	s.waitCP(0)
	ready := time.Now()
	// Its first cycle (warm-up 500 ms, interval 1 s) publishes the two
	// engines.
	if err := envoytest.Poll(context.Background(), 15*time.Second, 50*time.Millisecond, func() error {
		cs, err := xdstest.Clusters(s.envoy)
		if err != nil {
			return err
		}
		if h, ok := cs["inferlb_chat"][removed.Addr()]; ok {
			return fmt.Errorf("e2 still in Envoy's inferlb_chat (weight %d, %d hosts)", h.Weight, len(cs["inferlb_chat"]))
		}
		if n := len(cs["inferlb_chat"]); n != 2 {
			return fmt.Errorf("Envoy's inferlb_chat has %d hosts, want 2", n)
		}
		return nil
	}); err != nil {
		b, _ := s.envoy.Admin("/clusters")
		var lines []string
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "inferlb_chat::"+removed.Addr()) && (strings.Contains(l, "health_flags") || strings.Contains(l, "weight") || strings.Contains(l, "rq_total")) {
				lines = append(lines, l)
			}
		}
		t.Fatalf("removed engine not dropped: %v\n%s", err, strings.Join(lines, "\n"))
	}
	dropped := time.Since(ready)
	// From then on, count what reaches e2 (a request prefills within
	// milliseconds of reaching it).
	before := removed.Stats()
	sent := tr.sentCount()
	tr.waitSent(t, sent+40, 30*time.Second)
	after := removed.Stats()
	tally := tr.stop()
	t.Logf("e2 left Envoy %.1f s after the restarted control plane came up; then %d requests sent, e2 prefilled %d prompt tokens; traffic: %s",
		dropped.Seconds(), tr.sentCount()-sent, after.PromptTokens-before.PromptTokens, tally)
	if dropped > 3*time.Second {
		t.Errorf("e2 left Envoy %.1f s after the control plane came up, want within its first cycle (warm-up 0.5 s + 1 s, and slack)", dropped.Seconds())
	}
	if after.PromptTokens != before.PromptTokens {
		t.Errorf("the removed engine still got requests: %d prompt tokens prefilled", after.PromptTokens-before.PromptTokens)
	}
	if tally.all.failed != 0 || tally.all.cut != 0 {
		t.Errorf("requests failed: %s", tally)
	}
}
