package loadgen

import (
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"
)

// The probe records one lateness per 1 ms sleep, stops when asked (its
// goroutine ends), and the starvation it reports cannot exceed the time it
// ran.
func TestJitterProbeMeasuresLatenessAndStops(t *testing.T) {
	defer leaktest.AfterTest(t)()
	start := time.Now()
	stop := StartJitterProbe()
	<-time.After(30 * time.Millisecond) // the probe runs meanwhile
	h := stop()
	ran := time.Since(start)
	if h.Count() == 0 || uint64(h.Count()) > uint64(ran/time.Millisecond)+1 {
		t.Fatalf("%d wake-ups in %v: want at least 1 and at most one per ms", h.Count(), ran)
	}
	if s := Starvation(h); s < 0 || s > ran {
		t.Fatalf("starvation %v outside [0, %v]", s, ran)
	}
	if Starvation(&Histogram{}) != 0 {
		t.Fatal("an empty probe reports starvation")
	}
}
