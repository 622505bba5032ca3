package loadgen

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"

	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/internal/llmclient/llmclienttest"
	"github.com/inferlb/inferlb/tools/workload"
)

// The piecewise-constant Poisson process puts, in each phase, about its
// rate × its length arrivals, and none while the rate is 0.
func TestRateChangesShapeThePoissonProcess(t *testing.T) {
	changes := []RateChange{{At: 100 * time.Second, Rate: 30}, {At: 200 * time.Second, Rate: 0}, {At: 300 * time.Second, Rate: 5}}
	rng := rand.New(rand.NewPCG(1, 2))
	count := make([]int, 4)
	var at time.Duration
	for {
		var ok bool
		if at, ok = nextArrival(at, rng.ExpFloat64(), 10, changes); !ok {
			t.Fatal("the last phase has a rate: arrivals never end")
		}
		if at >= 400*time.Second {
			break
		}
		count[int(at/(100*time.Second))]++
	}
	for k, want := range []float64{1000, 3000, 0, 500} {
		// 4 standard deviations of a Poisson count.
		if got := float64(count[k]); math.Abs(got-want) > 4*math.Sqrt(want)+0.5 {
			t.Errorf("phase %d: %v arrivals, want about %v", k, got, want)
		}
	}
	// A rate that stays 0 ends the process.
	if _, ok := nextArrival(0, 1, 1, []RateChange{{At: time.Second, Rate: 0}}); !ok {
		t.Error("the first arrival, before the pause, should come")
	}
	if _, ok := nextArrival(2*time.Second, 1, 1, []RateChange{{At: time.Second, Rate: 0}}); ok {
		t.Error("a rate that stays 0 has no next arrival")
	}
}

func TestParseRateChange(t *testing.T) {
	if rc, err := ParseRateChange("120s:12.5"); err != nil || rc != (RateChange{120 * time.Second, 12.5}) {
		t.Errorf("120s:12.5 → %+v, %v", rc, err)
	}
	for _, bad := range []string{"12", "x:1", "-1s:2", "1s:-2", "1s:NaN", "1s:Inf", "1s:"} {
		if _, err := ParseRateChange(bad); err == nil || !strings.Contains(err.Error(), bad) {
			t.Errorf("%q: error %v, want one naming it", bad, err)
		}
	}
}

// An unbounded run is refused unless it is asked for; asked for, it sends
// until its context ends and reports what finished.
func TestUntilCancelledRunsUntilTheContextEnds(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	eng := llmclienttest.Start(t, &llmclienttest.Engine{})
	c := testClient(t, eng.URL())
	if _, err := Run(context.Background(), Config{Client: c, Source: &fixed{prompt: 5, out: 2}, Arrival: Arrival{Kind: Poisson, Rate: 50}}); err == nil {
		t.Fatal("an unbounded run without UntilCancelled was accepted")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan *Report)
	// Count finished OK requests (OnResult runs after the report counted
	// them): a request the engine has received may still be in flight at
	// cancel, and would count as cancelled on a slow machine.
	var ok atomic.Int64
	onResult := func(_ *workload.Request, res *Result) {
		if res.Outcome == OK {
			ok.Add(1)
		}
	}
	go func() {
		rep, err := Run(ctx, Config{Client: c, Source: &fixed{prompt: 5, out: 2}, Arrival: Arrival{Kind: Poisson, Rate: 50}, UntilCancelled: true, OnResult: onResult})
		if err != nil {
			t.Error(err)
		}
		done <- rep
	}()
	if err := envoytest.Poll(context.Background(), 20*time.Second, 10*time.Millisecond, func() error {
		if n := ok.Load(); n < 20 {
			return fmt.Errorf("%d requests OK", n)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	cancel()
	rep := <-done
	if rep == nil || !rep.Interrupted || rep.Requests.OK < 20 {
		t.Fatalf("report %+v, want an interrupted run with the 20+ requests that finished", rep)
	}
}
