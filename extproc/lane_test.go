package extproc

import (
	"context"
	"runtime"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// waiters polls until n callers wait in the lane (deadline 5 s).
func waiters(t *testing.T, l *lane, n int) {
	t.Helper()
	for end := time.Now().Add(5 * time.Second); ; {
		l.mu.Lock()
		w := len(l.waiting)
		l.mu.Unlock()
		if w == n {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%d callers wait in the lane, want %d", w, n)
		}
		time.Sleep(time.Millisecond) // polling for the goroutines to park
	}
}

// TestLane: the lane holds at most its limit, serves waiters in order,
// lets more in when the limit grows, and treats a limit below 1 as 1.
func TestLane(t *testing.T) {
	defer leaktest.AfterTest(t)()
	var l lane
	if l.acquire(2) || l.acquire(2) {
		t.Fatal("the first two places of a lane of 2 waited")
	}
	order := make(chan int, 3)
	for i := range 3 {
		go func() {
			if !l.acquire(2) {
				t.Errorf("caller %d: a third place in a lane of 2 did not wait", i)
			}
			order <- i
		}()
		waiters(t, &l, i+1) // one at a time, so the order of arrival is known
	}
	l.release(2) // one place freed: the oldest waiter gets it
	if got := <-order; got != 0 {
		t.Fatalf("first served: caller %d, want 0 (first come, first served)", got)
	}
	waiters(t, &l, 2)
	l.release(4) // the limit grew to 4: both remaining waiters get in
	if a, b := <-order, <-order; a+b != 3 {
		t.Fatalf("served after the limit grew: %d and %d, want 1 and 2", a, b)
	}
	if l.busy != 3 { // the two of the start, one of which caller 0 took over, and callers 1 and 2
		t.Fatalf("busy %d, want 3", l.busy)
	}
	for range 3 {
		l.release(0)
	}
	if l.busy != 0 || len(l.waiting) != 0 {
		t.Fatalf("after every release: busy %d, waiting %d", l.busy, len(l.waiting))
	}
	if l.acquire(0) {
		t.Fatal("a limit of 0 admits no one: want it treated as 1")
	}
	go func() { l.acquire(0); order <- 9 }()
	waiters(t, &l, 1)
	l.release(0)
	if got := <-order; got != 9 {
		t.Fatalf("got %d", got)
	}
	l.release(0)
}

// A decision on a large body waits while GOMAXPROCS others hold the
// large-body lane, and small bodies pass it meanwhile: a burst of large
// bodies never stands, runnable, in front of a small request's decision.
func TestLargeBodiesWaitInTheirLane(t *testing.T) {
	t.Cleanup(leaktest.AfterTest(t))
	s := memoryTestServer(t, Options{})
	c := memoryServer(t, s)
	ctx := context.Background()
	procs := runtime.GOMAXPROCS(0)
	for range procs { // the lane full, as with GOMAXPROCS parses under way
		s.largeLane.acquire(procs)
	}
	large := make(chan error, 1)
	go func() {
		r, err := exchange(ctx, c, benchBody(2*LargeBody))
		if err == nil && r.GetRequestBody() == nil {
			err = errNoDecision(r)
		}
		large <- err
	}()
	waiters(t, &s.largeLane, 1)
	if r, err := exchange(ctx, c, benchBody(8<<10)); err != nil || r.GetRequestBody() == nil {
		t.Fatalf("a small body beside the full lane: %v %v", r, err)
	}
	select {
	case err := <-large:
		t.Fatalf("the large body was decided on while the lane was full (%v)", err)
	default:
	}
	s.largeLane.release(procs)
	if err := <-large; err != nil {
		t.Fatalf("the large body once a place was free: %v", err)
	}
	for range procs - 1 {
		s.largeLane.release(procs)
	}
	if n := testutil.ToFloat64(s.m.largeBodyWaits); n != 1 {
		t.Fatalf("inferlb_extproc_large_body_waits_total %v, want 1", n)
	}
}
