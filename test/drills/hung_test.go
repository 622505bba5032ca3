package drills

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/tools/enginesim"
	"github.com/inferlb/inferlb/xds/xdstest"
)

// A control-plane replica that hangs (SIGSTOP: its TCP connections stay
// open, nothing answers) must not hold Envoy's ADS stream: the bootstrap's
// ADS cluster pings its connection (HTTP/2 keepalive), so Envoy must be on
// the other replica within 10 s, a change must reach it through that
// replica, and no request may fail throughout.
//
// Without the keepalive Envoy stays on the stopped replica well past 10 s
// (and the poll's 30 s).
func TestDrillHungReplica(t *testing.T) {
	s := startStack(t, stackOptions{replicas: 2, cpArgs: []string{"--health-check-interval", "1s"}})
	tr := s.startTraffic(trafficOptions{rate: 5, maxTokens: 16})
	tr.waitSent(t, 15, 20*time.Second)

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
	if err := s.cps[from].Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.cps[from].Signal(syscall.SIGCONT) })
	stopped := time.Now()
	err := envoytest.Poll(context.Background(), 30*time.Second, 50*time.Millisecond, func() error {
		k, err := s.adsReplica()
		if err == nil && (k < 0 || k == from) {
			err = fmt.Errorf("Envoy's ADS stream on replica %d", k)
		}
		return err
	})
	took := time.Since(stopped)
	if err != nil {
		t.Fatalf("replica %d stopped: no failover after %.1f s: %v", from, took.Seconds(), err)
	}
	t.Logf("replica %d stopped (SIGSTOP); Envoy on replica %d after %.2f s", from, 1-from, took.Seconds())
	if took > 10*time.Second {
		t.Errorf("failover took %.1f s, want within 10 s", took.Seconds())
	}
	// A change reaches Envoy through the survivor.
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
			t.Fatalf("with replica %d stopped, the survivor's verdict on e0 did not reach Envoy: %v", from, err)
		}
	}
	tr.waitSent(t, tr.sentCount()+10, 20*time.Second)
	if err := s.cps[from].Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	tally := tr.stop()
	t.Logf("traffic: %s", tally)
	if tally.all.failed+tally.all.cut+tally.all.shed != 0 {
		t.Errorf("requests lost while a replica hung: %s", tally)
	}
}
