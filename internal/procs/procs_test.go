package procs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"

	"github.com/inferlb/inferlb/internal/envoytest"
)

// fakeProcess is a process whose CPU use (in cores) the test sets; its CPU
// time integrates that over wall time. It records the Ps it was set to.
type fakeProcess struct {
	mu    sync.Mutex
	cores float64
	cpu   time.Duration
	at    time.Time
	sets  []int
}

func newFake() *fakeProcess { return &fakeProcess{at: time.Now()} }

func (f *fakeProcess) advance() {
	now := time.Now()
	f.cpu += time.Duration(f.cores * float64(now.Sub(f.at)))
	f.at = now
}

func (f *fakeProcess) setLoad(cores float64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.advance()
	f.cores = cores
}

func (f *fakeProcess) cpuTime() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.advance()
	return f.cpu
}

func (f *fakeProcess) setProcs(n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sets = append(f.sets, n)
}

func (f *fakeProcess) history() []int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]int(nil), f.sets...)
}

func waitFor(t *testing.T, f *fakeProcess, want []int) {
	t.Helper()
	err := envoytest.Poll(context.Background(), 10*time.Second, time.Millisecond, func() error {
		if got := f.history(); !slices.Equal(got, want) {
			return fmt.Errorf("Ps set %v, want %v", got, want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// One P while the process is quiet, the default (SetProcs(0)) as soon as
// one interval's use is above Up, held in the band between Down and Up,
// and one P again after Hold intervals below Down; the default when it
// stops.
func TestControllerFollowsLoad(t *testing.T) {
	defer leaktest.AfterTest(t)()
	f := newFake()
	var changes []int
	var mu sync.Mutex
	c := &Controller{Interval: 5 * time.Millisecond, CPUTime: f.cpuTime, SetProcs: f.setProcs, DefaultProcs: 4,
		OnChange: func(p int, _ float64) { mu.Lock(); changes = append(changes, p); mu.Unlock() }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()

	waitFor(t, f, []int{1}) // starts on one P
	f.setLoad(0.9)
	waitFor(t, f, []int{1, 0}) // busy: the runtime's default
	f.setLoad(0.5)
	// In the band: nothing changes over many intervals (polled: 20
	// intervals' worth of the fake's CPU time must pass first).
	start := f.cpuTime()
	if err := envoytest.Poll(context.Background(), 10*time.Second, time.Millisecond, func() error {
		if f.cpuTime()-start < 20*c.Interval/2 {
			return errors.New("not yet 20 intervals")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := f.history(); !slices.Equal(got, []int{1, 0}) {
		t.Fatalf("at 0.5 cores (between Down %v and Up %v) the Ps changed: %v", c.Down, c.Up, got)
	}
	f.setLoad(0.05)
	waitFor(t, f, []int{1, 0, 1}) // quiet for Hold intervals: one P
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := f.history(); !slices.Equal(got, []int{1, 0, 1, 0}) {
		t.Fatalf("after the end the Ps are not the runtime's default: %v", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(changes, []int{4, 1}) {
		t.Fatalf("OnChange saw %v, want [4 1]", changes)
	}
}

// With one P by default (one CPU, or a container limited to one) there is
// nothing to switch: Run changes nothing and returns.
func TestControllerOneCPU(t *testing.T) {
	defer leaktest.AfterTest(t)()
	f := newFake()
	c := &Controller{CPUTime: f.cpuTime, SetProcs: f.setProcs, DefaultProcs: 1}
	if err := c.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := f.history(); len(got) != 0 {
		t.Fatalf("Ps set %v on a one-CPU process", got)
	}
}

func TestControllerValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    Controller
		ok   bool
	}{
		{"defaults", Controller{}, true},
		{"down above up", Controller{Up: 0.5, Down: 0.6}, false},
		{"down equal to up", Controller{Up: 0.5, Down: 0.5}, false},
		{"up of a whole P", Controller{Up: 1}, false},
		{"negative down", Controller{Down: -0.1}, false},
		{"negative hold", Controller{Hold: -1}, false},
		{"negative interval", Controller{Interval: -time.Second}, false},
		{"NaN", Controller{Up: math.NaN()}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.c.Validate()
			if tc.ok != (err == nil) {
				t.Fatalf("Validate() = %v, want ok %v", err, tc.ok)
			}
			if err != nil && !errors.Is(err, ErrBadThresholds) {
				t.Fatalf("error %v is not ErrBadThresholds", err)
			}
		})
	}
}

// A burst's signal on Wake switches a quiet process to the default at
// once, long before its interval ends; on more than one P it changes
// nothing, and the Hold intervals below Down still bring it back to one.
func TestControllerWakes(t *testing.T) {
	defer leaktest.AfterTest(t)()
	f := newFake()
	wake := make(chan struct{}, 1)
	c := &Controller{Interval: time.Hour, CPUTime: f.cpuTime, SetProcs: f.setProcs, DefaultProcs: 2, Wake: wake}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	waitFor(t, f, []int{1})
	wake <- struct{}{}
	waitFor(t, f, []int{1, 0}) // at once: the interval is an hour
	wake <- struct{}{}
	wake <- struct{}{} // both received (the buffer holds one): no switch on more than one P
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got := f.history(); !slices.Equal(got, []int{1, 0, 0}) {
		t.Fatalf("Ps set %v, want [1 0 0] (one P, the default on the signal, the default at the end)", got)
	}

	// Back to one P after Hold quiet intervals, as without the signal.
	f2 := newFake()
	wake2 := make(chan struct{}, 1)
	c2 := &Controller{Interval: 5 * time.Millisecond, CPUTime: f2.cpuTime, SetProcs: f2.setProcs, DefaultProcs: 2, Wake: wake2}
	ctx2, cancel2 := context.WithCancel(context.Background())
	go func() { done <- c2.Run(ctx2) }()
	waitFor(t, f2, []int{1})
	wake2 <- struct{}{}
	waitFor(t, f2, []int{1, 0, 1})
	cancel2()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
