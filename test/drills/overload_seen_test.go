package drills

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// The control plane must see demand in overload. A report whose second
// holds more requests than the frontend's bound (default twice the fleet's
// profile capacity) is clipped to it and counted, not refused whole; the
// bound follows the capacity the engines show; and the local guardrail
// keeps strict priority order. Here, at 2.2× the measured capacity
// (reports a second apart, as in production), 30% of it at the top
// priority: no report is refused, the plan sees at least 75% of the
// offered demand and sheds the low priority, and the top priority loses
// at most 2% of its requests.
//
// An intake that refused such reports whole ("rate") would leave the plan
// seeing a fraction of the demand, shedding nothing, and the guardrail
// shedding the top priority locally.
func TestDrillOverloadSeen(t *testing.T) {
	s := startStack(t, stackOptions{extArgs: []string{"--report-interval", "1s"}})
	capacity := s.measureCapacity(t, 16, 5*time.Second)
	offered := 2.2 * capacity
	t.Logf("measured capacity %.1f requests/s; offering %.1f/s", capacity, offered)
	tr := s.startTraffic(trafficOptions{rate: offered, maxTokens: 16, mix: map[string]float64{"high": 0.3, "low": 0.7}})
	settle := time.Now().Add(8 * time.Second)
	measureTo := settle.Add(12 * time.Second)
	var demand, lowShed, highShed []float64
	var sum [5]float64 // the engine views' background, own and observed utilization, penalty, correction
	views := 0
	if err := envoytestPollUntil(measureTo, func() {
		if time.Now().Before(settle) {
			return
		}
		// The demand the control plane plans with (its intake, shed
		// requests included), and what it sheds.
		var sig struct {
			Demand map[string]struct {
				RequestsPerS float64 `json:"requests_per_s"`
			} `json:"demand"`
		}
		if err := getJSON(s.cpAdmin[0]+"/signals", &sig); err == nil {
			demand = append(demand, sig.Demand[nodeID+"/chat/high"].RequestsPerS+sig.Demand[nodeID+"/chat/low"].RequestsPerS)
		}
		if p, err := s.published(0); err == nil {
			lowShed = append(lowShed, p.Shed["low"])
			highShed = append(highShed, p.Shed["high"])
		}
		if v, err := s.cycleView(0); err == nil {
			views++
			for _, x := range v {
				sum[0] += x.Background
				sum[1] += x.Own
				sum[2] += x.Utilization
				sum[3] += x.Penalty
				sum[4] += x.Correction
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	tally := tr.stop()
	window := tr.tally(settle, measureTo)
	t.Logf("in the 12-s window: %s", window)
	if len(demand) == 0 {
		t.Fatal("no published decision read")
	}
	slices.Sort(demand)
	slices.Sort(lowShed)
	med := demand[len(demand)/2]
	t.Logf("planned demand: median %.1f/s (%.0f%% of the offered %.1f/s), range %.1f–%.1f; low shed median %.2f",
		med, 100*med/offered, offered, demand[0], demand[len(demand)-1], lowShed[len(lowShed)/2])
	slices.Sort(highShed)
	if views > 0 {
		n := float64(3 * views)
		t.Logf("engines as the plan saw them (means over %d views): background %.2f, own utilization %.2f, observed %.2f, penalty %.2f, profile correction %.2f; planned top-priority shed median %.2f, max %.2f",
			views, sum[0]/n, sum[1]/n, sum[2]/n, sum[3]/n, sum[4]/n, highShed[len(highShed)/2], highShed[len(highShed)-1])
	}
	metrics := s.cpAdmin[0] + "/metrics"
	if n, err := metric(metrics, "inferlb_reports_rejected_total", `reason="rate"`); err == nil && n > 0 {
		t.Errorf("%v genuine reports refused as above the rate bound", n)
	}
	if n, err := metric(metrics, "inferlb_reports_adjusted_total", `reason="rate_clipped"`); err == nil {
		t.Logf("reports clipped to the bound: %v", n)
	}
	if med < 0.75*offered {
		t.Errorf("the plan saw a median %.1f/s of the %.1f/s offered (%.0f%%), want ≥ 75%%", med, offered, 100*med/offered)
	}
	if lowShed[len(lowShed)/2] == 0 {
		t.Errorf("the plan shed nothing at 2.2× capacity")
	}
	h := window.byPriority["high"]
	if h == nil {
		t.Fatal("no top-priority requests in the window")
	}
	if sent := h.ok + h.shed + h.failed + h.cut; float64(h.shed) > 0.02*float64(sent) || h.failed+h.cut > 0 {
		t.Errorf("top priority hurt at 2.2× capacity: %s", fmt.Sprint(*h))
	}
	if tally.all.failed != 0 || tally.all.cut != 0 {
		t.Errorf("requests failed: %s", tally)
	}
}
