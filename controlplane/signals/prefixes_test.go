package signals

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
)

func prefixReport(node, inst string, at time.Time, pr ...*policyv1.PrefixReport) *policyv1.ReportRequest {
	return &policyv1.ReportRequest{NodeId: node, Instance: inst, IntervalStart: timestamppb.New(at.Add(-time.Second)),
		IntervalEnd: timestamppb.New(at), Prefixes: pr}
}

// Reports from two frontends merge into one view per class: lower bounds
// (count minus error) add up, totals add up, continuation bitmaps are
// or-ed, and everything decays with the half-life, so shares stay shares.
func TestPrefixesMergeAndDecay(t *testing.T) {
	now := time.Unix(1000, 0)
	clock := now
	in, err := NewIntake(IntakeOptions{Window: 10 * time.Second, Nodes: []string{"a", "b"}, Classes: []string{"chat"},
		Priorities: []string{"p"}, Now: func() time.Time { return clock }, Prefix: PrefixOptions{HalfLife: 10 * time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	rep := func(node string, total, n, errb uint64, conv uint64) *policyv1.ReportRequest {
		return prefixReport(node, "i", clock, &policyv1.PrefixReport{Class: "chat", Requests: total, Tokens: 100 * total,
			Counts: []*policyv1.PrefixCount{{Prefix: 7, Parent: 3, DepthBytes: 1024, DepthTokens: 200, Flags: 0, Requests: n, RequestsError: errb, Tokens: 100 * n, Continuations: conv, Conversations: conv << 40}}})
	}
	for _, r := range []*policyv1.ReportRequest{rep("a", 100, 40, 0, 0b0011), rep("b", 100, 30, 10, 0b0110)} {
		if err := in.Report(context.Background(), r); err != nil {
			t.Fatal(err)
		}
	}
	v := in.Prefixes(clock)["chat"]
	if v.Requests != 200 || v.Tokens != 20000 || len(v.Points) != 1 {
		t.Fatalf("view %+v", v)
	}
	p := v.Points[0]
	if p.Requests != 60 || p.Upper != 70 || math.Abs(p.Tokens-6000) > 1e-9 || p.Parent != 3 || p.DepthBytes != 1024 {
		t.Fatalf("point %+v", p)
	}
	if want := LinearCount(0b0111); p.Continuations != want || want < 3 || want > 3.2 {
		t.Fatalf("continuations %v, want %v (3 bits)", p.Continuations, want)
	}
	if want := LinearCount(0b0111 << 40); p.Conversations != want {
		t.Fatalf("conversations %v, want %v (3 bits, or-ed like continuations)", p.Conversations, want)
	}
	// One half-life later: everything halves, the share stays.
	clock = now.Add(10 * time.Second)
	v = in.Prefixes(clock)["chat"]
	if math.Abs(v.Requests-100) > 1e-9 || math.Abs(v.Points[0].Requests-30) > 1e-9 {
		t.Fatalf("after a half-life: %v total, %v at the point", v.Requests, v.Points[0].Requests)
	}
	// Continuation bitmaps age out after two epochs.
	clock = now.Add(25 * time.Second)
	if p := in.Prefixes(clock)["chat"].Points[0]; p.Continuations != 0 || p.Conversations != 0 {
		t.Fatalf("continuations, conversations after two epochs: %v, %v", p.Continuations, p.Conversations)
	}
	// Long gone points are forgotten.
	clock = now.Add(200 * time.Second)
	if pts := in.Prefixes(clock)["chat"].Points; len(pts) != 0 {
		t.Fatalf("points after 20 half-lives: %+v", pts)
	}
}

func TestPrefixesPrune(t *testing.T) {
	x, err := NewPrefixes(PrefixOptions{Capacity: 8})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(0, 0)
	pr := &policyv1.PrefixReport{Class: "c", Requests: 1000}
	for i := 1; i <= 20; i++ {
		pr.Counts = append(pr.Counts, &policyv1.PrefixCount{Prefix: uint64(i), Requests: uint64(i)})
	}
	x.Add(now, &policyv1.ReportRequest{Prefixes: []*policyv1.PrefixReport{pr}})
	pts := x.Snapshot(now)["c"].Points
	if len(pts) != 8 || pts[0].Prefix != 20 || pts[7].Prefix != 13 {
		t.Fatalf("kept %+v", pts)
	}
}

func TestPrefixReportsValidated(t *testing.T) {
	in, err := NewIntake(IntakeOptions{Window: time.Second, Nodes: []string{"a"}, Classes: []string{"chat"}, Priorities: []string{"p"}})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for _, c := range []struct {
		pr   []*policyv1.PrefixReport
		want string
	}{
		{[]*policyv1.PrefixReport{{Class: "code"}}, `prefixes[0].class "code" is not a class of the fleet`},
		{[]*policyv1.PrefixReport{{Class: "chat"}, {Class: "chat"}}, `prefixes[1] (class "chat"): the class is reported twice`},
		{[]*policyv1.PrefixReport{{Class: "chat", Requests: 5, Counts: []*policyv1.PrefixCount{{Prefix: 1, Requests: 2, RequestsError: 3}}}},
			"counts[0] (0000000000000001): requests_error 3 > requests 2"},
		{[]*policyv1.PrefixReport{{Class: "chat", Requests: 5, Counts: []*policyv1.PrefixCount{{Prefix: 1, Requests: 9, RequestsError: 1}}}},
			"8 requests beyond the error bound, more than the class's 5"},
	} {
		err := in.Report(context.Background(), prefixReport("a", "i", now, c.pr...))
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "report from a/i: ") {
			t.Errorf("%v: error %v, want %q", c.pr, err, c.want)
		}
	}
	if v := in.Prefixes(now); len(v) != 0 {
		t.Fatalf("rejected reports reached the view: %v", v)
	}
}
