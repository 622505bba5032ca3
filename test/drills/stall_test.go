package drills

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/inferlb/inferlb/internal/envoytest"
)

// A control plane that stalls must accept, when it resumes, the reports
// ext_proc merged meanwhile: ext_proc merges unsent reports for 30 s
// (docs/extproc.md), so the reports a stalled control plane reads when it
// resumes may have ended that long ago. Here the only control plane stops
// (SIGSTOP) for 18 s under traffic and resumes: no report is refused,
// demand is heard again at once, and Envoy and ext_proc serve every
// request from their last configuration meanwhile.
//
// An intake that judged such reports by their age alone would refuse the
// ones read on resume (reason clock).
func TestDrillStalledControlPlane(t *testing.T) {
	s := startStack(t, stackOptions{})
	tr := s.startTraffic(trafficOptions{rate: 4, maxTokens: 8})
	tr.waitSent(t, 8, 20*time.Second)
	metrics := s.cpAdmin[0] + "/metrics"
	before, err := metric(metrics, "inferlb_reports_total")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cps[0].Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.cps[0].Signal(syscall.SIGCONT) })
	stopped := time.Now()
	// About 18 s of traffic (72 requests at 4/s) without a control plane.
	tr.waitSent(t, tr.sentCount()+72, 40*time.Second)
	if err := s.cps[0].Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	stall := time.Since(stopped)
	// Reports flow again.
	if err := envoytest.Poll(context.Background(), 10*time.Second, 100*time.Millisecond, func() error {
		n, err := metric(metrics, "inferlb_reports_total")
		if err == nil && n < before+8 {
			err = fmt.Errorf("%v reports since the stall began", n-before)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	tr.waitSent(t, tr.sentCount()+8, 20*time.Second)
	tally := tr.stop()
	got, _ := metric(metrics, "inferlb_reports_total")
	rejected, err := metric(metrics, "inferlb_reports_rejected_total")
	if err != nil {
		rejected = 0 // no rejection at all: the counter has no series
	}
	t.Logf("control plane stopped %.1f s; %v reports read since, %v refused; traffic: %s", stall.Seconds(), got-before, rejected, tally)
	if rejected > 0 {
		clock, _ := metric(metrics, "inferlb_reports_rejected_total", `reason="clock"`)
		t.Errorf("%v reports refused after the stall (%v as clock)", rejected, clock)
	}
	if tally.all.failed+tally.all.cut+tally.all.shed != 0 {
		t.Errorf("requests lost while the control plane was stopped: %s", tally)
	}
}
