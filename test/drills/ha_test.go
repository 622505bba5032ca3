package drills

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/tools/enginesim"
	"github.com/inferlb/inferlb/xds/xdstest"
)

// adsReplica returns the control-plane replica Envoy's ADS stream is on
// (the inferlb_xds host with an active request), or -1.
func (s *stack) adsReplica() (int, error) {
	b, err := s.envoy.Admin("/clusters")
	if err != nil {
		return -1, err
	}
	for k, addr := range s.cpXDS {
		if strings.Contains(string(b), "inferlb_xds::"+addr+"::rq_active::1\n") {
			return k, nil
		}
	}
	return -1, nil
}

// tvShares is the total-variation distance between two share maps.
func tvShares(a, b map[string]float64) float64 {
	sa, sb := 0.0, 0.0
	for _, v := range a {
		sa += v
	}
	for _, v := range b {
		sb += v
	}
	d := 0.0
	for k := range a {
		d += math.Abs(a[k]/sa - b[k]/sb)
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			d += b[k] / sb
		}
	}
	return d / 2
}

// Item 7: two control-plane replicas behind the same Envoy and ext_proc.
// They compute the same weights from the same signals; Envoy lists both in
// its ADS cluster and ext_proc reports to both. Killing the replica Envoy
// is connected to loses nothing: Envoy keeps its config, reconnects to the
// other, and a change (an engine failing its health check) still reaches
// it; then the other way round; then both at once (control-plane loss),
// and back. Nothing fails or is cut throughout.
func TestDrillHighAvailability(t *testing.T) {
	s := startStack(t, stackOptions{replicas: 2, cpArgs: []string{"--health-check-interval", "1s"}})
	tr := s.startTraffic(trafficOptions{rate: 5, maxTokens: 60})
	tr.waitSent(t, 15, 20*time.Second)

	// Same signals, same weights, up to the deadband: each replica holds
	// its published weights while its proposal stays within --deadband
	// (0.03 total variation) of them, so two replicas proposing the same
	// can each hold a different earlier value, at most 2× the deadband
	// apart (triangle inequality). Replicas planning from different
	// signals differ by more: one engine seen down moves a third of it.
	var w0, w1 map[string]float64
	if err := envoytest.Poll(context.Background(), 30*time.Second, 200*time.Millisecond, func() error {
		var err error
		if w0, err = s.weights(0); err != nil {
			return err
		}
		if w1, err = s.weights(1); err != nil {
			return err
		}
		if len(w0) != 3 || len(w1) != 3 {
			return fmt.Errorf("weights %v and %v", w0, w1)
		}
		if d := tvShares(w0, w1); d > 2*0.03 {
			return fmt.Errorf("replicas disagree: %v vs %v (TV %.3f)", w0, w1, d)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	t.Logf("replicas' weights: %v and %v (TV %.4f)", w0, w1, tvShares(w0, w1))
	for k := range s.cps {
		if n, err := metric(s.cpAdmin[k]+"/metrics", "inferlb_reports_total"); err != nil || n < 3 {
			t.Fatalf("replica %d got %v reports (%v): ext_proc must report to both", k, n, err)
		}
	}

	// failover kills the replica Envoy is on and waits until Envoy is on
	// another one; it returns how long that took.
	failover := func(what string) time.Duration {
		t.Helper()
		var from int
		if err := envoytest.Poll(context.Background(), 20*time.Second, 100*time.Millisecond, func() error {
			k, err := s.adsReplica()
			if err == nil && k < 0 {
				err = fmt.Errorf("Envoy's ADS stream is on no replica")
			}
			from = k
			return err
		}); err != nil {
			t.Fatal(err)
		}
		s.procs.Kill(s.cps[from])
		killed := time.Now()
		if err := envoytest.Poll(context.Background(), 30*time.Second, 50*time.Millisecond, func() error {
			k, err := s.adsReplica()
			if err == nil && (k < 0 || k == from) {
				err = fmt.Errorf("Envoy not reconnected (on %d)", k)
			}
			return err
		}); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		d := time.Since(killed)
		t.Logf("%s: replica %d killed, Envoy on replica %d after %.2f s", what, from, 1-from, d.Seconds())
		return d
	}
	// A change after a failover reaches Envoy through the survivor: e0
	// fails its health checks and the control plane marks it unhealthy.
	changeReaches := func(what string) {
		t.Helper()
		for _, f := range []struct {
			faults enginesim.Faults
			want   string
		}{{enginesim.Faults{HealthFail: true}, "UNHEALTHY"}, {enginesim.Faults{}, "HEALTHY"}} {
			if err := s.engines[0].SetFaults(f.faults); err != nil {
				t.Fatal(err)
			}
			if err := envoytest.Poll(context.Background(), 20*time.Second, 100*time.Millisecond, func() error {
				cs, err := xdstest.Clusters(s.envoy)
				if err != nil {
					return err
				}
				if h := cs["inferlb_chat"][s.engines[0].Addr()]; h.EDSHealth != f.want {
					return fmt.Errorf("e0's health at Envoy: %s, want %s", h.EDSHealth, f.want)
				}
				return nil
			}); err != nil {
				t.Fatalf("%s: the control plane's verdict on e0 did not reach Envoy: %v", what, err)
			}
		}
		t.Logf("%s: e0 marked unhealthy and healthy again at Envoy", what)
	}

	first := failover("first failover")
	changeReaches("after the first failover")
	// The killed replica comes back; kill the one now in use.
	for k := range s.cps {
		if !s.cps[k].Running() {
			if err := s.procs.Restart(s.cps[k]); err != nil {
				t.Fatal(err)
			}
			s.waitCP(k)
		}
	}
	second := failover("second failover")
	changeReaches("after the second failover")

	// Control-plane loss: both gone for a while. Envoy and ext_proc keep
	// their last config and policy.
	for k := range s.cps {
		s.procs.Kill(s.cps[k])
	}
	lost := time.Now()
	tr.waitSent(t, tr.sentCount()+20, 20*time.Second)
	during := tr.tally(lost, time.Now())
	if err := s.procs.Restart(s.cps[0]); err != nil {
		t.Fatal(err)
	}
	s.waitCP(0)
	if err := envoytest.Poll(context.Background(), 30*time.Second, 100*time.Millisecond, func() error {
		if k, err := s.adsReplica(); err != nil || k != 0 {
			return fmt.Errorf("Envoy on replica %d (%v)", k, err)
		}
		return nil
	}); err != nil {
		t.Fatalf("Envoy did not reconnect after the control-plane loss: %v", err)
	}
	tally := tr.stop()
	t.Logf("while no control plane ran (%.1f s): %s", time.Since(lost).Seconds(), during)
	t.Logf("whole run: %s (failovers %.2f s and %.2f s)", tally, first.Seconds(), second.Seconds())
	if tally.all.failed+tally.all.cut+tally.all.shed != 0 {
		t.Errorf("requests lost across replica failovers and control-plane loss: %s", tally)
	}
}
