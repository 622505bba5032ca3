// Package procs runs the Go scheduler on one processor while one is enough
// and on all of them (GOMAXPROCS's default) when it is not.
//
// Why: a service that answers one request at a time pays, on every
// message, for handing it between goroutines on different processors. With
// several processors (Ps) the runtime wakes an idle one for each goroutine
// it readies: a futex wake-up, a spinning thread looking for work, and the
// gRPC writer flushing each frame alone because it runs beside the handler
// instead of after it. On ext_proc's protocol benchmark, one request at a
// time, that is a sizeable share of the CPU per decision (the figures are
// in docs/decisions/adaptive-procs.md).
// Under load every P has work, nothing is woken, and more Ps are what more
// CPUs are for.
//
// Controller measures the process's CPU use once per Interval. On one P,
// above Up (CPU-seconds per second, of the one P) it returns to the
// runtime's default (runtime.SetDefaultGOMAXPROCS, which also resumes the
// runtime's own updates from the container's CPU limit); on more, below
// Down for Hold consecutive intervals it goes back to one. The band between
// Down and Up keeps it from flapping. A burst that arrives on one P runs
// on one for at most one Interval, or not at all if the service signals
// Wake when it sees one coming (ext_proc does for a megabyte of request
// bodies in hand).
package procs

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"time"
)

// Defaults of Controller's thresholds.
const (
	DefaultInterval = time.Second
	DefaultUp       = 0.7
	DefaultDown     = 0.3
	DefaultHold     = 3
)

// ErrBadThresholds is returned by Validate for thresholds that would flap
// or never move.
var ErrBadThresholds = errors.New("procs: want 0 < Down < Up < 1")

// Controller switches between one P and the runtime's default.
type Controller struct {
	// Interval between measurements (DefaultInterval when 0).
	Interval time.Duration
	// Up and Down are CPU-seconds per second (DefaultUp, DefaultDown
	// when 0); Hold is how many consecutive intervals below Down bring it
	// back to one P (DefaultHold when 0).
	Up, Down float64
	Hold     int
	// CPUTime returns the process's CPU time so far (default: its user and
	// system time from getrusage); SetProcs sets the Ps, 0 meaning the runtime's default
	// (default: runtime.GOMAXPROCS and runtime.SetDefaultGOMAXPROCS);
	// DefaultProcs is what the default would be (default: the value before
	// the controller first changed it). Tests replace them.
	CPUTime      func() time.Duration
	SetProcs     func(n int)
	DefaultProcs int
	// OnChange, if set, is called after each switch with the new number of
	// Ps and the CPU use that caused it.
	OnChange func(procs int, cores float64)
	// Wake, if set, is a burst's signal (work in hand that one P would take
	// long to clear): on one P, a value received from it switches to the
	// default at once instead of at the end of the interval. Signal it
	// without blocking (a buffer of one, and a select with a default).
	Wake <-chan struct{}
}

// Validate checks the thresholds after defaults.
func (c *Controller) Validate() error {
	c.defaults()
	if !(c.Down > 0 && c.Down < c.Up && c.Up < 1) || c.Hold < 1 || c.Interval <= 0 {
		return fmt.Errorf("%w: up %v, down %v, hold %d, interval %v", ErrBadThresholds, c.Up, c.Down, c.Hold, c.Interval)
	}
	return nil
}

func (c *Controller) defaults() {
	if c.Interval == 0 {
		c.Interval = DefaultInterval
	}
	if c.Up == 0 {
		c.Up = DefaultUp
	}
	if c.Down == 0 {
		c.Down = DefaultDown
	}
	if c.Hold == 0 {
		c.Hold = DefaultHold
	}
	if c.CPUTime == nil {
		c.CPUTime = processCPU
	}
	if c.SetProcs == nil {
		c.SetProcs = func(n int) {
			if n == 0 {
				runtime.SetDefaultGOMAXPROCS()
				return
			}
			runtime.GOMAXPROCS(n)
		}
	}
	if c.DefaultProcs == 0 {
		c.DefaultProcs = runtime.GOMAXPROCS(0)
	}
}

// UserSet reports whether GOMAXPROCS is set in the environment: the
// operator's choice, which the service leaves alone.
func UserSet() bool {
	_, set := os.LookupEnv("GOMAXPROCS")
	return set
}

// Run starts on one P (nothing is in flight yet) and switches until ctx
// ends, then leaves the runtime's default. It returns at once, changing
// nothing, when the default is one P already.
func (c *Controller) Run(ctx context.Context) error {
	if err := c.Validate(); err != nil {
		return err
	}
	if c.DefaultProcs <= 1 {
		return nil
	}
	procs := 1
	c.SetProcs(1)
	defer c.SetProcs(0)
	tick := time.NewTicker(c.Interval)
	defer tick.Stop()
	last, lastAt := c.CPUTime(), time.Now()
	below := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.Wake:
			if procs == 1 {
				procs, below = c.DefaultProcs, 0
				c.SetProcs(0)
				if c.OnChange != nil {
					c.OnChange(procs, float64(c.CPUTime()-last)/float64(max(time.Since(lastAt), 1)))
				}
			}
		case now := <-tick.C:
			cpu := c.CPUTime()
			el := now.Sub(lastAt)
			if el <= 0 {
				continue
			}
			cores := float64(cpu-last) / float64(el)
			last, lastAt = cpu, now
			switch {
			case procs == 1 && cores > c.Up:
				procs, below = c.DefaultProcs, 0
				c.SetProcs(0)
				if c.OnChange != nil {
					c.OnChange(procs, cores)
				}
			case procs > 1 && cores < c.Down:
				if below++; below >= c.Hold {
					procs, below = 1, 0
					c.SetProcs(1)
					if c.OnChange != nil {
						c.OnChange(procs, cores)
					}
				}
			default:
				below = 0
			}
		}
	}
}

// processCPU is the process's user and system CPU time (getrusage): the
// system part is most of a one-at-a-time service's (socket reads and
// writes), which the runtime's own CPU estimates leave out.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
