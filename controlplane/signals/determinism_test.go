package signals

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
)

// The intake's snapshot sums reports over instances and demand streams:
// two control planes given the same reports (from instances that reported
// in a different order) agree bit for bit.
func TestIntakeSnapshotIsDeterministic(t *testing.T) {
	now := time.Unix(5000, 0)
	nodes, classes, prios := []string{"fa", "fb"}, []string{"c", "d", "e"}, []string{"p", "q"}
	var reps []*policyv1.ReportRequest
	for k := 0; k < 12; k++ {
		r := &policyv1.ReportRequest{NodeId: nodes[k%2], Instance: fmt.Sprintf("i%d", k),
			// Intervals that straddle the window's start: fractional weights.
			IntervalStart: timestamppb.New(now.Add(-10*time.Second - time.Duration(k+1)*37*time.Millisecond)),
			IntervalEnd:   timestamppb.New(now.Add(-10*time.Second + time.Duration(k+1)*71*time.Millisecond))}
		for c, cl := range classes {
			for p, pr := range prios {
				n := uint64(3 + 7*k + 5*c + 2*p)
				r.Demand = append(r.Demand, &policyv1.DemandSample{Class: cl, Priority: pr, Requests: n, Shed: n / 7, PromptTokens: n * 301, OutputTokens: n * 97})
			}
		}
		for e := 0; e < 3; e++ {
			r.Engines = append(r.Engines, &policyv1.EngineEvidence{Address: fmt.Sprintf("10.0.0.%d:8000", e), Responses: uint64(10 + k + e), Errors: uint64(k % 3),
				HeaderLatencySumSeconds: 0.0317 * float64(10+k+e), HeaderLatencyCount: uint64(10 + k + e), Completed: uint64(9 + k), CompletionSecondsSum: 1.73 * float64(9+k),
				CompletionPromptTokens: uint64(301 * (9 + k)), CompletionOutputTokens: uint64(97 * (9 + k))})
		}
		reps = append(reps, r)
	}
	snapshot := func(order []int) string {
		in, err := NewIntake(IntakeOptions{Window: 10 * time.Second, Nodes: nodes, Classes: classes, Priorities: prios,
			Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range order {
			if err := in.Report(context.Background(), reps[i]); err != nil {
				t.Fatal(err)
			}
		}
		d, ev := in.Snapshot(now)
		// JSON writes floats exactly (shortest round-trip form) and map
		// keys sorted.
		dm := map[string]DemandRate{}
		for k, v := range d {
			dm[k.Node+"/"+k.Class+"/"+k.Priority] = v
		}
		b, err := json.Marshal([]any{dm, ev})
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	order := make([]int, len(reps))
	for i := range order {
		order[i] = i
	}
	want := snapshot(order)
	for run := 0; run < 20; run++ {
		o := slices.Clone(order)
		if run%2 == 1 {
			slices.Reverse(o)
		} else {
			// A rotation: another arrival order.
			o = append(o[run%len(o):], o[:run%len(o)]...)
		}
		if got := snapshot(o); got != want {
			t.Fatalf("arrival order %v: snapshot\n%s\nwant\n%s", o, got, want)
		}
	}
}
