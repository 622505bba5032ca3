package drills

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/xds/auth"
)

// Reports with the token (a compromised or broken reporter):
//
//   - one report of 3 errors of 3 responses and 0 requests must not set
//     the largest penalty (0.9): its penalty is worth the requests behind
//     it;
//   - a report whose address and engine id disagree, or naming an address
//     that is no engine, is refused (engine_mismatch) or its entry dropped
//     (unknown_engine), each counted;
//   - a penalty decays with time, not only on traffic, so an engine whose
//     probe share brings too little evidence does not stay out for
//     minutes.
//
// Without these guards e0's penalty is 0.90 after the small report, the
// mismatched report is accepted, nothing is counted, and the penalty is
// still 0.90 after 25 s.
func TestDrillReportEvidence(t *testing.T) {
	s := startStack(t, stackOptions{auth: "token", cpArgs: []string{"--penalty-half-life", "1s"}})
	tr := s.startTraffic(trafficOptions{rate: 2, maxTokens: 8})
	tr.waitSent(t, 6, 20*time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rc := policyv1.NewReportsClient(s.dialCP(t, auth.Client{TokenFile: s.auth.tokenFile}))
	e0, e1 := s.engines[0].Addr(), s.engines[1].Addr()
	report := func(requests uint64, ev ...*policyv1.EngineEvidence) error {
		now := time.Now()
		_, err := rc.Report(ctx, &policyv1.ReportRequest{NodeId: nodeID, Instance: "insider",
			IntervalStart: timestamppb.New(now.Add(-time.Second)), IntervalEnd: timestamppb.New(now),
			Demand:  []*policyv1.DemandSample{{Class: "chat", Priority: "high", Requests: requests}},
			Engines: ev})
		return err
	}
	penalty := func() engineView {
		views, err := s.cycleView(0)
		if err != nil {
			t.Fatal(err)
		}
		return views["e0"]
	}
	cpMetrics := s.cpAdmin[0] + "/metrics"

	// One small report: 3 errors, 3 responses, no requests.
	if err := report(0, &policyv1.EngineEvidence{Address: e0, EngineId: "e0", Responses: 3, Errors: 3}); err != nil {
		t.Fatalf("small report: %v", err)
	}
	worst := 0.0
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); {
		worst = max(worst, penalty().Penalty)
		tr.waitSent(t, tr.sentCount()+1, 10*time.Second)
	}
	if worst > 0.2 {
		t.Errorf("one report of 3 errors of 3 responses and 0 requests: e0's penalty reached %.2f, want ≤ 0.2", worst)
	}

	// Address and id disagree: refused; an address that is no engine:
	// dropped. Both counted.
	err := report(1, &policyv1.EngineEvidence{Address: e0, EngineId: "e1", Responses: 1})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "is engine e0, not \"e1\"") {
		t.Errorf("address of e0 named e1: %v, want InvalidArgument naming both", err)
	}
	if err := report(1, &policyv1.EngineEvidence{Address: "127.0.0.1:1", EngineId: "e9", Responses: 1, Errors: 1},
		&policyv1.EngineEvidence{Address: e1, EngineId: "e1", Responses: 1}); err != nil {
		t.Errorf("a report naming an unknown engine: %v, want its entry dropped", err)
	}
	if n, err := metric(cpMetrics, "inferlb_reports_rejected_total", `reason="engine_mismatch"`); err != nil || n < 1 {
		t.Errorf("mismatched reports counted: %v (%v), want ≥ 1", n, err)
	}
	if n, err := metric(cpMetrics, "inferlb_reports_adjusted_total", `reason="unknown_engine"`); err != nil || n < 1 {
		t.Errorf("unknown engines counted: %v (%v), want ≥ 1", n, err)
	}

	// A report with enough requests behind it sets the largest penalty;
	// e0's probe share (0.1 of 2 requests/s) then brings too little
	// evidence to judge it: the penalty decays with time (half-life 1 s,
	// 6 s without evidence).
	if err := report(30, &policyv1.EngineEvidence{Address: e0, EngineId: "e0", Responses: 90, Errors: 90}); err != nil {
		t.Fatalf("large report: %v", err)
	}
	if err := envoytest.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error {
		if p := penalty().Penalty; p < 0.85 {
			return fmt.Errorf("e0 penalty %.2f after 90 errors of 90 responses", p)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := envoytest.Poll(ctx, 25*time.Second, 250*time.Millisecond, func() error {
		if v := penalty(); v.Penalty > 0.3 {
			return fmt.Errorf("e0 penalty %.2f (%s)", v.Penalty, v.PenaltyWhy)
		}
		return nil
	}); err != nil {
		t.Errorf("penalty without evidence for e0 not decaying: %v", err)
	}
	t.Logf("small report: e0's penalty at most %.2f; the largest penalty fell below 0.3 in %.1f s", worst, time.Since(start).Seconds())
	tally := tr.stop()
	t.Logf("traffic: %s", tally)
	if tally.all.failed != 0 || tally.all.cut != 0 {
		t.Errorf("requests failed: %s", tally)
	}
}
