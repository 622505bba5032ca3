package signals

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc/cpclient"
)

// An instance that got no answer resends its report merged with the next
// (cpclient.Reporter), though the first may have arrived (a deadline that
// expired after the control plane took it, a loaded machine's TestEvidence
// Reports flake): the intake counts every interval once, whatever arrives
// twice or late, in demand, evidence and the prefix view.
func TestIntakeCountsResentReportsOnce(t *testing.T) {
	now := time.Unix(5000, 0)
	t0 := now.Add(-3 * time.Second)
	rep := func(i int, n uint64) *policyv1.ReportRequest {
		return &policyv1.ReportRequest{NodeId: "fe", Instance: "i1",
			IntervalStart: timestamppb.New(t0.Add(time.Duration(i) * time.Second)), IntervalEnd: timestamppb.New(t0.Add(time.Duration(i+1) * time.Second)),
			Demand:   []*policyv1.DemandSample{{Class: "c", Priority: "p", Requests: n, PromptTokens: n * 100, OutputTokens: n * 50}},
			Engines:  []*policyv1.EngineEvidence{{Address: "10.0.0.1:8000", Responses: n, Errors: n / 4, HeaderLatencySumSeconds: 0.01 * float64(n), HeaderLatencyCount: n}},
			Prefixes: []*policyv1.PrefixReport{{Class: "c", Requests: n, Tokens: n * 150, Counts: []*policyv1.PrefixCount{{Prefix: 7, DepthBytes: 64, Requests: n, Tokens: n * 150, Continuations: 1 << i}}}}}
	}
	p, b, c := rep(0, 20), rep(1, 8), rep(2, 12)
	m := cpclient.Merge(p, b)
	view := func(sends ...*policyv1.ReportRequest) string {
		in, err := NewIntake(IntakeOptions{Window: 10 * time.Second, Nodes: []string{"fe"}, Classes: []string{"c"}, Priorities: []string{"p"},
			Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range sends {
			if err := in.Report(context.Background(), r); err != nil {
				t.Fatal(err)
			}
		}
		d, ev := in.Snapshot(now)
		bs, _ := json.Marshal([]any{d[DemandKey{"fe", "c", "p"}], ev, in.Prefixes(now)})
		return string(bs)
	}
	// Each interval arrives once: as sent, or the three merged into one
	// (the same counts; the demand's rate divides by the span of the
	// longest report, so the two differ there).
	want, wantMerged := view(m, c), view(cpclient.Merge(m, c))
	for _, tc := range []struct {
		name   string
		sends  []*policyv1.ReportRequest
		merged bool
	}{
		{"first arrived, then its resend", []*policyv1.ReportRequest{p, m, c}, false},
		{"resend, then the first (late)", []*policyv1.ReportRequest{m, p, c}, false},
		{"resent twice (gRPC retry)", []*policyv1.ReportRequest{p, m, m, c}, false},
		{"resend after the next", []*policyv1.ReportRequest{p, c, m}, false},
		{"first, resend, late first, next", []*policyv1.ReportRequest{p, m, p, c}, false},
		{"twice-merged resend, all delivered", []*policyv1.ReportRequest{p, m, cpclient.Merge(m, c)}, true},
		{"twice-merged resend, the middle lost", []*policyv1.ReportRequest{p, cpclient.Merge(m, c)}, true},
	} {
		w := want
		if tc.merged {
			w = wantMerged
		}
		if got := view(tc.sends...); got != w {
			t.Errorf("%s: intake view\n%s\nwant (each interval once)\n%s", tc.name, got, w)
		}
	}
	// A "copy" that holds more than the report it would resend is no copy:
	// refused, not silently dropped.
	in, err := NewIntake(IntakeOptions{Window: 10 * time.Second, Nodes: []string{"fe"}, Classes: []string{"c"}, Priorities: []string{"p"},
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	if err := in.Report(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	big := rep(0, 40)
	if err := in.Report(context.Background(), big); err == nil || !strings.Contains(err.Error(), "more than the 28 and 28 of the report it resends") {
		t.Fatalf("a larger report with an accepted report's interval_start: %v", err)
	}
}
