package signals

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
)

// The intake's checks: a report above its node's bound is clipped to it and
// counted (an overload's genuine burst), not refused, so the planner sees
// the demand it must shed; a capacity-derived bound follows the capacity
// measured; evidence for an unknown engine is dropped and counted, an
// engine id that is not its address's refuses the report; an instance's
// evidence is worth at most MaxAttempts responses per request it admitted.
// Without these checks the 30-request report is refused ("rate"), the
// unknown and mismatched engines are accepted, and 3 errors without
// requests are 3 errors of evidence.
func TestIntakeClipsAndChecksEngines(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	var adjusted []string
	in, err := NewIntake(IntakeOptions{Window: 10 * time.Second, Nodes: []string{"fe"}, Classes: []string{"c"},
		Priorities: []string{"p", "q"}, Now: func() time.Time { return now },
		MaxRequestsPerS: map[string]float64{"fe": 24}, CapacityBound: map[string]bool{"fe": true}, MaxInflight: map[string]float64{"fe": 10},
		MaxAttempts: 3, Engines: map[string]string{"10.0.0.1:8000": "e1", "10.0.0.2:8000": "e2"},
		OnAdjust: func(r string) { adjusted = append(adjusted, r) }})
	if err != nil {
		t.Fatal(err)
	}
	rep := func(inst string, high, low uint64, ev ...*policyv1.EngineEvidence) *policyv1.ReportRequest {
		return &policyv1.ReportRequest{NodeId: "fe", Instance: inst,
			IntervalStart: timestamppb.New(now.Add(-time.Second)), IntervalEnd: timestamppb.New(now),
			Demand:  []*policyv1.DemandSample{{Class: "c", Priority: "p", Requests: high}, {Class: "c", Priority: "q", Requests: low, Shed: low / 2}},
			Engines: ev}
	}
	// 30 requests in a second against a bound of 24: clipped, both
	// priorities alike, counted.
	if err := in.Report(context.Background(), rep("a", 10, 20)); err != nil {
		t.Fatalf("a report 25%% above the bound: %v, want it clipped", err)
	}
	d, _ := in.Snapshot(now)
	hi, lo := d[DemandKey{"fe", "c", "p"}].RequestsPerS, d[DemandKey{"fe", "c", "q"}].RequestsPerS
	if hi+lo < 23 || hi+lo > 24 || math.Abs(lo/hi-2) > 0.2 {
		t.Errorf("clipped demand %.1f + %.1f /s, want 24/s split 1:2", hi, lo)
	}
	if len(adjusted) != 1 || adjusted[0] != "rate_clipped" {
		t.Errorf("adjustments %v, want [rate_clipped]", adjusted)
	}
	// The bound follows the capacity measured: 20/s served, bound 40/s.
	in.SetMeasuredRPS(20)
	now = now.Add(time.Second)
	adjusted = nil
	if err := in.Report(context.Background(), rep("b", 10, 20)); err != nil || len(adjusted) != 0 {
		t.Errorf("30/s under a measured bound of 40/s: %v, adjustments %v", err, adjusted)
	}

	// Unknown engine: its entry dropped, counted; the report stands.
	now = now.Add(time.Second)
	adjusted = nil
	err = in.Report(context.Background(), rep("c", 5, 0, &policyv1.EngineEvidence{Address: "10.9.9.9:1", Responses: 3, Errors: 3},
		&policyv1.EngineEvidence{Address: "10.0.0.1:8000", EngineId: "e1", Responses: 3}))
	if err != nil || len(adjusted) != 1 || adjusted[0] != "unknown_engine" {
		t.Errorf("unknown engine: %v, adjustments %v", err, adjusted)
	}
	_, ev := in.Snapshot(now)
	if _, ok := ev["10.9.9.9:1"]; ok {
		t.Error("evidence for an unknown engine kept")
	}
	// Address of e1 named e2: refused.
	err = in.Report(context.Background(), rep("d", 5, 0, &policyv1.EngineEvidence{Address: "10.0.0.1:8000", EngineId: "e2", Responses: 3, Errors: 3}))
	var rj *Rejection
	if !errors.As(err, &rj) || rj.Reason != "engine_mismatch" {
		t.Errorf("address/id mismatch: %v, want an engine_mismatch rejection", err)
	}

	// 3 errors and no requests (within the in-flight credit): worth nothing;
	// 1 request: worth 3 responses of its 9.
	now = now.Add(time.Second)
	if err := in.Report(context.Background(), rep("e", 0, 0, &policyv1.EngineEvidence{Address: "10.0.0.2:8000", EngineId: "e2", Responses: 3, Errors: 3})); err != nil {
		t.Fatal(err)
	}
	if err := in.Report(context.Background(), rep("f", 1, 0, &policyv1.EngineEvidence{Address: "10.0.0.2:8000", EngineId: "e2", Responses: 9, Errors: 9})); err != nil {
		t.Fatal(err)
	}
	_, ev = in.Snapshot(now)
	if e := ev["10.0.0.2:8000"]; math.Abs(e.Errors-3) > 1e-9 || math.Abs(e.Responses-3) > 1e-9 {
		t.Errorf("e2's evidence %+v, want 3 errors of 3 responses (1 request's worth)", e)
	}
}

// A report read late (sent before the control plane stalled, or held by
// a partition) is taken up to MergeBacklog beyond the clock skew, so a
// stall of tens of seconds does not refuse them as "clock". Its merged resend
// (same interval_start) replaces it: counted once.
func TestIntakeTakesLateReports(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	in, err := NewIntake(IntakeOptions{Window: time.Minute, Nodes: []string{"fe"}, Classes: []string{"c"},
		Priorities: []string{"p"}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	start := now.Add(-21 * time.Second)
	late := &policyv1.ReportRequest{NodeId: "fe", Instance: "a", IntervalStart: timestamppb.New(start), IntervalEnd: timestamppb.New(now.Add(-20 * time.Second)),
		Demand: []*policyv1.DemandSample{{Class: "c", Priority: "p", Requests: 10}}}
	if err := in.Report(context.Background(), late); err != nil {
		t.Fatalf("a report 20 s late: %v", err)
	}
	merged := &policyv1.ReportRequest{NodeId: "fe", Instance: "a", IntervalStart: timestamppb.New(start), IntervalEnd: timestamppb.New(now),
		Demand: []*policyv1.DemandSample{{Class: "c", Priority: "p", Requests: 30}}}
	if err := in.Report(context.Background(), merged); err != nil {
		t.Fatalf("its merged resend: %v", err)
	}
	d, _ := in.Snapshot(now)
	if got := d[DemandKey{"fe", "c", "p"}].RequestsPerS * 21; math.Abs(got-30) > 1e-6 {
		t.Errorf("%.1f requests counted over the merged interval, want 30 (the late copy replaced)", got)
	}
	stale := &policyv1.ReportRequest{NodeId: "fe", Instance: "b", IntervalStart: timestamppb.New(now.Add(-46 * time.Second)),
		IntervalEnd: timestamppb.New(now.Add(-45 * time.Second)), Demand: []*policyv1.DemandSample{{Class: "c", Priority: "p", Requests: 1}}}
	var rj *Rejection
	if err := in.Report(context.Background(), stale); !errors.As(err, &rj) || rj.Reason != "clock" {
		t.Errorf("a report 45 s late: %v, want a clock rejection", err)
	}
}
