package drills

import (
	"context"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/inferlb/inferlb/internal/envoytest"
)

// measureCapacity saturates every engine directly (no Envoy: 2 × its
// running slots of closed-loop clients each) and returns the completed
// requests per second of the whole fleet, once the fleet is quiet again
// (waitQuiet).
func (s *stack) measureCapacity(t *testing.T, maxTokens int, d time.Duration) float64 {
	t.Helper()
	var done atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	for _, e := range s.engines {
		c := newClient(e.URL())
		defer c.close()
		for k := 0; k < 8; k++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; ctx.Err() == nil; i++ {
					r := c.do(ctx, request{prompt: fmt.Sprintf("capacity %d %d %s", k, i, filler), maxTokens: maxTokens})
					if r.outcome == outcomeOK && ctx.Err() == nil {
						done.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	capacity := float64(done.Load()) / time.Since(start).Seconds()
	quiet := time.Now()
	s.waitQuiet(t)
	t.Logf("the fleet was quiet %v after the capacity measurement", time.Since(quiet).Round(100*time.Millisecond))
	return capacity
}

// waitQuiet waits until every engine is idle (nothing running, waiting or
// pending) and no control plane replica reads background load on any
// engine. Load sent to the engines around the balancer (measureCapacity's)
// is someone else's load to the control plane, correctly: started at
// once, a drill's traffic met a plan that still saw it in the engines'
// windows, sent 90% to one engine and shed the top priority for a cycle.
// It does not wait for that load to leave the evidence windows: the first
// tokens its last queued requests got would then be judged against an
// idle window's load (a 0.9 penalty and corrections of 3 in one run;
// docs/control-plane.md, known gaps); the drill's traffic starts while the
// load is still in the windows.
func (s *stack) waitQuiet(t *testing.T) {
	t.Helper()
	if err := envoytest.Poll(context.Background(), 30*time.Second, 100*time.Millisecond, func() error {
		for i, e := range s.engines {
			if st := e.Stats(); st.Running+st.Waiting+st.Pending > 0 {
				return fmt.Errorf("engine e%d: %d running, %d waiting, %d pending", i, st.Running, st.Waiting, st.Pending)
			}
		}
		for k := range s.cpAdmin {
			v, err := s.cycleView(k)
			if err != nil {
				return err
			}
			for id, x := range v {
				if x.Background > 0 {
					return fmt.Errorf("control plane %d reads background load %.2f on %s", k, x.Background, id)
				}
			}
		}
		return nil
	}); err != nil {
		t.Fatalf("the fleet did not quieten after the capacity measurement: %v", err)
	}
}

// filler makes a capacity request as long as the drill traffic's (30 words).
const filler = "w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19 w20 w21 w22 w23 w24 w25 w26 w27 w28"

// Item 2: at 1.3× the fleet's measured capacity, with half the traffic at
// the top priority, the control plane must see overload, not faults: no
// engine penalized, weights steady, the low priority shed, the top
// priority never shed, and the fleet kept busy — admitted throughput at
// least 90% of the measured capacity.
func TestDrillOverload(t *testing.T) {
	s := startStack(t, stackOptions{})
	capacity := s.measureCapacity(t, 16, 6*time.Second)
	t.Logf("measured capacity: %.1f requests/s (3 engines, 16 output tokens)", capacity)

	tr := s.startTraffic(trafficOptions{rate: 1.3 * capacity, maxTokens: 16, mix: map[string]float64{"high": 0.5, "low": 0.5}})
	// Let the loop settle (a few cycles: demand window 4 s), then measure
	// for 15 s.
	settle := time.Now().Add(8 * time.Second)
	var maxPenalty, maxCorrection float64
	var penalized, firstPenalty string
	minShare, maxShare := 1.0, 0.0
	var lowShed []float64
	var running, waiting float64
	engineSamples, backgroundSamples := 0, 0
	var background float64
	freeWithQueue, freeNoQueue := 0, 0
	var mu sync.Mutex
	measureFrom := settle
	measureTo := settle.Add(15 * time.Second)
	// trace is every distinct cycle the polls saw, logged when the drill
	// fails: the shed the policy published and what the cycle read of each
	// engine.
	var trace []string
	if err := envoytestPollUntil(measureTo, func() {
		v, err := s.cycleView(0)
		p, perr := s.published(0)
		if err == nil && perr == nil {
			line := fmt.Sprintf("shed high %.2f low %.2f;", p.Shed["high"], p.Shed["low"])
			for _, id := range slices.Sorted(maps.Keys(v)) {
				x := v[id]
				line += fmt.Sprintf(" %s: share %.2f bg %.2f obs %.2f own %.2f/%.2f planned %.2f corr %.2f run %.1f wait %.1f done %.1f/s;",
					id, p.Weights[id], x.Background, x.Utilization, x.Own, x.OwnWindow, x.Planned, x.Correction, x.Window.Running, x.Window.Waiting, x.Window.Completions)
			}
			if n := len(trace); n == 0 || !strings.HasSuffix(trace[n-1], line) {
				trace = append(trace, time.Now().Format("15:04:05.0 ")+line)
			}
		}
		if err == nil {
			if time.Now().After(settle) {
				mu.Lock()
				for _, x := range v {
					background += x.Background
				}
				backgroundSamples++
				mu.Unlock()
			}
			for id, x := range v {
				maxCorrection = max(maxCorrection, x.Correction)
				if x.Penalty == 0 {
					continue
				}
				w := x.Window
				why := fmt.Sprintf("%s: %.2f %s; residuals TTFT %.2f TBOT %.2f request time %.2f; evidence: %.0f first tokens, mean TTFT %.0f ms against %.0f predicted; %.0f queue waits, mean %.0f ms; %.1f running, %.1f waiting, %.1f done/s",
					id, x.Penalty, x.PenaltyWhy, x.TTFTResidual, x.TBOTResidual, x.E2EResidual, w.TTFTCount, w.TTFTMeanMs, x.TTFTPredMs, w.QueueCount, w.QueueMeanMs, w.Running, w.Waiting, w.Completions)
				if firstPenalty == "" {
					firstPenalty = why
				}
				if x.Penalty > maxPenalty {
					maxPenalty, penalized = x.Penalty, why
				}
			}
		}
		if time.Now().After(settle) {
			if perr == nil {
				mu.Lock()
				lowShed = append(lowShed, p.Shed["low"])
				mu.Unlock()
			}
			for _, e := range s.engines {
				st := e.Stats()
				mu.Lock()
				running += float64(st.Running)
				waiting += float64(st.Waiting)
				if st.Running < 4 {
					if st.Waiting > 0 {
						freeWithQueue++
					} else {
						freeNoQueue++
					}
				}
				mu.Unlock()
			}
			engineSamples++
			if sh, err := s.envoyShares(); err == nil {
				mu.Lock()
				for _, x := range sh {
					minShare, maxShare = math.Min(minShare, x), math.Max(maxShare, x)
				}
				mu.Unlock()
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
	tally := tr.stop()
	window := tr.tally(measureFrom, measureTo)
	admitted := float64(window.all.ok) / measureTo.Sub(measureFrom).Seconds()
	t.Logf("offered %.1f/s (1.3× capacity); in the 15-s window: %s", 1.3*capacity, window)
	t.Logf("admitted %.1f/s = %.0f%% of the measured capacity; engine shares %.3f–%.3f; largest penalty %.2f %s",
		admitted, 100*admitted/capacity, minShare, maxShare, maxPenalty, penalized)
	t.Logf("whole run: %s; largest profile correction %.2f", tally, maxCorrection)
	slices.Sort(lowShed)
	if n := len(lowShed); n > 0 {
		t.Logf("planned low-priority shed in the window: min %.3f, median %.3f, max %.3f (%d samples)", lowShed[0], lowShed[n/2], lowShed[n-1], n)
	}
	if backgroundSamples > 0 {
		t.Logf("mean background load the control plane read per engine: %.3f", background/float64(backgroundSamples*len(s.engines)))
	}
	if engineSamples > 0 {
		k := float64(engineSamples * len(s.engines))
		t.Logf("engines in the window: mean running %.2f of 4, mean waiting %.2f; free slot with queue %d, without %d of %.0f", running/k, waiting/k, freeWithQueue, freeNoQueue, k)
	}
	if b, err := get("http://" + s.extHTTP + "/metrics"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if strings.HasPrefix(l, "inferlb_extproc_decisions_total") {
				t.Log(l)
			}
		}
	}
	defer func() {
		if t.Failed() {
			for _, l := range trace {
				t.Log(l)
			}
		}
	}()
	if h := tally.byPriority["high"]; h == nil || h.shed != 0 || h.failed != 0 || h.cut != 0 {
		t.Errorf("top priority shed or failed at 1.3× overload: %s", tally)
	}
	if l := window.byPriority["low"]; l == nil || l.shed == 0 {
		t.Errorf("the low priority was not shed at 1.3× overload: %s", window)
	}
	if admitted < 0.9*capacity {
		t.Errorf("admitted %.1f/s, %.0f%% of the measured capacity %.1f/s; want ≥ 90%%", admitted, 100*admitted/capacity, capacity)
	}
	if maxPenalty > 0 {
		t.Errorf("overload penalized a healthy engine: largest %s; first seen %s", penalized, firstPenalty)
	}
	if maxShare > 0.5 || minShare < 0.2 {
		t.Errorf("weights swung under overload: shares between %.3f and %.3f (3 equal engines)", minShare, maxShare)
	}
	if tally.all.failed != 0 || tally.all.cut != 0 {
		t.Errorf("requests failed: %s", tally)
	}
}

// envoytestPollUntil calls f every 200 ms until the deadline.
func envoytestPollUntil(deadline time.Time, f func()) error {
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for time.Now().Before(deadline) {
		f()
		<-t.C
	}
	return nil
}
