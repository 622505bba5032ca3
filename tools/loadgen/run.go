package loadgen

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/inferlb/inferlb/tools/workload"
)

// ArrivalKind selects how requests are started.
type ArrivalKind int

const (
	// Poisson starts new requests open loop at exponential gaps of mean 1/Rate.
	Poisson ArrivalKind = iota
	// Trace starts them open loop at the workload's own offsets ÷ Speedup.
	Trace
	// Closed keeps Concurrency requests in flight: each worker sends its next
	// request when its last one ends (after the think time, for a session's
	// next turn).
	Closed
)

// ParseArrival parses "poisson", "trace" or "closed".
func ParseArrival(s string) (ArrivalKind, error) {
	switch s {
	case "poisson":
		return Poisson, nil
	case "trace":
		return Trace, nil
	case "closed":
		return Closed, nil
	}
	return 0, fmt.Errorf("arrival %q: want poisson, trace or closed", s)
}

func (a ArrivalKind) String() string { return [...]string{"poisson", "trace", "closed"}[a] }

// Arrival is an arrival process.
type Arrival struct {
	Kind ArrivalKind
	Rate float64 // Poisson: new requests per second
	// RateChanges (Poisson) change the rate from a time on: the process is
	// a non-homogeneous Poisson process with a piecewise-constant rate
	// (Rate until the first change). Times are in the target's time, in
	// increasing order; a rate of 0 pauses new requests.
	RateChanges []RateChange
	Speedup     float64 // Trace: time compression (2 = twice as fast); default 1
	Concurrency int     // Closed: requests in flight
}

// RateChange is a Poisson rate that applies from At on.
type RateChange struct {
	At   time.Duration
	Rate float64
}

// ParseRateChange parses "AT:RATE", e.g. "120s:12".
func ParseRateChange(s string) (RateChange, error) {
	at, rate, ok := strings.Cut(s, ":")
	if !ok {
		return RateChange{}, fmt.Errorf("rate change %q: want AT:RATE, e.g. 120s:12", s)
	}
	d, err := time.ParseDuration(at)
	if err != nil || d < 0 {
		return RateChange{}, fmt.Errorf("rate change %q: time %q is not a duration ≥ 0", s, at)
	}
	r, err := strconv.ParseFloat(rate, 64)
	if err != nil || !(r >= 0) || math.IsInf(r, 0) {
		return RateChange{}, fmt.Errorf("rate change %q: rate %q is not a number ≥ 0", s, rate)
	}
	return RateChange{At: d, Rate: r}, nil
}

// nextArrival returns the arrival after prev of a Poisson process whose
// rate is base, changed by changes, given e, a draw of Exp(1): the time at
// which the integrated rate since prev reaches e. ok is false when the rate
// stays 0 from some point on and no arrival ever comes.
func nextArrival(prev time.Duration, e, base float64, changes []RateChange) (time.Duration, bool) {
	t, rate := prev, base
	i := 0
	for ; i < len(changes) && changes[i].At <= t; i++ {
		rate = changes[i].Rate
	}
	for {
		if i == len(changes) {
			if rate <= 0 {
				return 0, false
			}
			return t + time.Duration(e/rate*float64(time.Second)), true
		}
		span := (changes[i].At - t).Seconds()
		if rate > 0 && e <= rate*span {
			return t + time.Duration(e/rate*float64(time.Second)), true
		}
		e -= rate * span
		t, rate = changes[i].At, changes[i].Rate
		i++
	}
}

// SLO bounds a request must meet to count toward goodput. A zero bound is
// not checked.
type SLO struct {
	TTFT time.Duration
	TPOT time.Duration
}

// Config is one load-generation run.
type Config struct {
	Client  *Client
	Source  workload.Source
	Arrival Arrival
	// MaxRequests bounds the requests sent (follow-up turns included); 0 is
	// no bound. Duration bounds the time in which requests are sent; 0 is no
	// bound. A run needs at least one of them, a finite workload, or
	// UntilCancelled.
	MaxRequests int
	Duration    time.Duration
	// UntilCancelled allows a run with no bound: it sends until ctx is
	// cancelled (the demo's default, ended by Ctrl-C), and the report covers
	// everything that finished.
	UntilCancelled bool
	SLO            SLO
	// Progress receives a progress line every ProgressEvery (default 1 s);
	// nil prints none.
	Progress      io.Writer
	ProgressEvery time.Duration
	// Seed drives the Poisson process.
	Seed uint64
	// TimeScale is the target's time scale (engine-sim --time-scale s: real
	// seconds per simulated second; 0 means 1). With s ≠ 1 the run is in
	// the target's time: trace offsets, the Poisson rate, think times,
	// Duration and the SLO bounds are simulated time, and the report's
	// latencies and rates are converted to simulated time. Client.Timeout and
	// the Results passed to OnResult stay in real time.
	TimeScale float64
	// OnResult, if set, is called after each request (from its goroutine).
	OnResult func(*workload.Request, *Result)
	// OnStart, if set, is called with the run's start time before the first
	// request is sent.
	OnStart func(time.Time)
}

// Run sends the workload and returns the report. It returns when every
// request sent has finished: requests are bounded by Client.Timeout, and
// cancelling ctx cancels those in flight (they count as cancelled, and the
// report covers what completed).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if cfg.Client == nil || cfg.Source == nil {
		return nil, errors.New("loadgen: config needs a client and a source")
	}
	a := cfg.Arrival
	switch a.Kind {
	case Poisson:
		if !(a.Rate > 0) {
			return nil, fmt.Errorf("loadgen: poisson arrivals need a rate > 0, got %v", a.Rate)
		}
		for k, c := range a.RateChanges {
			if !(c.Rate >= 0) || math.IsInf(c.Rate, 0) || c.At < 0 {
				return nil, fmt.Errorf("loadgen: rate change %d: want a time ≥ 0 and a rate ≥ 0, got %v at %v", k+1, c.Rate, c.At)
			}
			if k > 0 && c.At <= a.RateChanges[k-1].At {
				return nil, fmt.Errorf("loadgen: rate changes must be in increasing time order (%v after %v)", c.At, a.RateChanges[k-1].At)
			}
		}
	case Trace, Closed:
		if len(a.RateChanges) > 0 {
			return nil, errors.New("loadgen: rate changes apply to poisson arrivals")
		}
	}
	switch a.Kind {
	case Poisson:
	case Trace:
		if !cfg.Source.Timed() {
			return nil, errors.New("loadgen: trace arrivals need a workload with timestamps (this one has none; use poisson or closed)")
		}
		if a.Speedup == 0 {
			a.Speedup = 1
		}
		if !(a.Speedup > 0) {
			return nil, fmt.Errorf("loadgen: speedup must be > 0, got %v", a.Speedup)
		}
	case Closed:
		if a.Concurrency < 1 {
			return nil, fmt.Errorf("loadgen: closed loop needs a concurrency ≥ 1, got %d", a.Concurrency)
		}
	default:
		return nil, fmt.Errorf("loadgen: unknown arrival kind %d", a.Kind)
	}
	if cfg.MaxRequests < 0 || cfg.Duration < 0 {
		return nil, errors.New("loadgen: max requests and duration must be ≥ 0")
	}
	if cfg.MaxRequests == 0 && cfg.Duration == 0 && !cfg.Source.Timed() && !cfg.UntilCancelled {
		return nil, errors.New("loadgen: an endless workload needs a request count, a duration bound, or UntilCancelled")
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = time.Second
	}
	if cfg.TimeScale == 0 {
		cfg.TimeScale = 1
	}
	if !(cfg.TimeScale > 0) || math.IsInf(cfg.TimeScale, 0) {
		return nil, fmt.Errorf("loadgen: time scale must be > 0, got %v", cfg.TimeScale)
	}
	r := &runner{cfg: cfg, arr: a, col: newCollector(cfg.SLO, cfg.TimeScale)}
	r.fu, _ = cfg.Source.(workload.FollowUper)
	return r.run(ctx)
}

type runner struct {
	cfg         Config
	arr         Arrival
	col         *collector
	fu          workload.FollowUper
	ctx         context.Context    // cancels in-flight requests
	stop        context.Context    // ends sending (duration reached or ctx cancelled)
	stopSending context.CancelFunc // releases stop

	start    time.Time
	deadline time.Time // zero: none
	issued   atomic.Int64
	wg       sync.WaitGroup
	srcMu    sync.Mutex
}

// wall converts a duration in the target's time to real time.
func (r *runner) wall(d time.Duration) time.Duration {
	return time.Duration(float64(d) * r.cfg.TimeScale)
}

// reserve claims one request slot; false once the count or time bound is
// reached or the run is stopping.
func (r *runner) reserve() bool {
	if r.stop.Err() != nil {
		return false
	}
	if !r.deadline.IsZero() && !time.Now().Before(r.deadline) {
		return false
	}
	if r.cfg.MaxRequests > 0 && r.issued.Add(1) > int64(r.cfg.MaxRequests) {
		return false
	}
	return true
}

func (r *runner) next(at time.Duration) (workload.Request, bool) {
	r.srcMu.Lock()
	defer r.srcMu.Unlock()
	return r.cfg.Source.Next(at)
}

// waitUntil sleeps until t; false if sending must stop first.
func (r *runner) waitUntil(t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return r.stop.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return true
	case <-r.stop.Done():
		return false
	}
}

// begin starts the run's clock: offsets, the duration bound and the metrics
// count from now. run releases the stop context after every request ended.
func (r *runner) begin() {
	r.start = time.Now()
	if r.cfg.Duration > 0 {
		r.deadline = r.start.Add(r.wall(r.cfg.Duration))
		r.stop, r.stopSending = context.WithDeadline(r.ctx, r.deadline)
	} else {
		r.stop, r.stopSending = context.WithCancel(r.ctx)
	}
	r.col.begin(r.start)
	if r.cfg.OnStart != nil {
		r.cfg.OnStart(r.start)
	}
}

func (r *runner) run(ctx context.Context) (*Report, error) {
	r.ctx = ctx
	progDone := make(chan struct{})
	var progWG sync.WaitGroup
	startProgress := func() {
		if r.cfg.Progress == nil {
			return
		}
		progWG.Add(1)
		go func() {
			defer progWG.Done()
			t := time.NewTicker(r.cfg.ProgressEvery)
			defer t.Stop()
			for {
				select {
				case <-t.C:
					fmt.Fprintln(r.cfg.Progress, r.col.progress(time.Now()))
				case <-progDone:
					return
				}
			}
		}()
	}

	switch r.arr.Kind {
	case Poisson:
		r.openLoop(func(prev time.Duration, rng *rand.Rand) (time.Duration, bool) {
			return nextArrival(prev, rng.ExpFloat64(), r.arr.Rate, r.arr.RateChanges)
		}, startProgress)
	case Trace:
		r.openLoop(nil, startProgress)
	case Closed:
		r.begin()
		startProgress()
		for range r.arr.Concurrency {
			r.wg.Add(1)
			go r.worker()
		}
	}
	r.wg.Wait()
	r.stopSending()
	close(progDone)
	progWG.Wait()
	end := time.Now()
	rep := r.col.report(end)
	rep.Arrival = r.arr.Kind.String()
	switch r.arr.Kind {
	case Poisson:
		rep.Rate = r.arr.Rate
	case Trace:
		rep.Speedup = r.arr.Speedup
	case Closed:
		rep.Concurrency = r.arr.Concurrency
	}
	rep.Interrupted = ctx.Err() != nil
	if r.cfg.TimeScale != 1 {
		rep.TimeScale = r.cfg.TimeScale
	}
	return rep, nil
}

// openLoop starts requests at scheduled times: gap != nil draws Poisson
// times; nil uses the workload's offsets ÷ speedup. A producer goroutine
// builds requests ahead of their time (prompt text can be large), so building
// them is off the sending path; the run's clock starts when the first request
// is ready.
func (r *runner) openLoop(gap func(time.Duration, *rand.Rand) (time.Duration, bool), started func()) {
	type item struct {
		req workload.Request
		at  time.Duration
	}
	// 64 ahead: enough to absorb bursts, and a bound on memory when every
	// prompt is a megabyte (a full-size Mooncake row).
	ahead := make(chan item, 64)
	quit := make(chan struct{})
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer close(ahead)
		rng := rand.New(rand.NewPCG(r.cfg.Seed, 0x706f6973736f6e))
		var at time.Duration
		var ok bool
		for n := 0; r.cfg.MaxRequests == 0 || n < r.cfg.MaxRequests; n++ {
			if gap != nil {
				if at, ok = gap(at, rng); !ok {
					return
				}
				if r.cfg.Duration > 0 && at >= r.cfg.Duration {
					return
				}
			}
			req, ok := r.next(at)
			if !ok {
				return
			}
			if gap == nil {
				at = time.Duration(float64(req.Offset) / r.arr.Speedup)
				if r.cfg.Duration > 0 && at >= r.cfg.Duration {
					return
				}
			}
			select {
			case ahead <- item{req, at}:
			case <-quit:
				return
			}
		}
	}()
	defer close(quit) // the producer stops when sending stops
	first, ok := <-ahead
	r.begin()
	started()
	if !ok {
		return
	}
	for it := first; ; {
		if !r.waitUntil(r.start.Add(r.wall(it.at))) || !r.reserve() {
			return
		}
		r.wg.Add(1)
		go func(req workload.Request, at time.Duration) {
			defer r.wg.Done()
			r.session(req, r.start.Add(r.wall(at)))
		}(it.req, it.at)
		if it, ok = <-ahead; !ok {
			return
		}
	}
}

// session sends req (scheduled at due) and then its follow-up turns.
func (r *runner) session(req workload.Request, due time.Time) {
	for {
		res := r.send(&req, due)
		if r.fu == nil || res.Outcome != OK {
			return
		}
		next, ok := r.fu.FollowUp(req, res.Text)
		if !ok {
			return
		}
		due = time.Now().Add(r.wall(req.ThinkTime))
		if !r.waitUntil(due) || !r.reserve() {
			return
		}
		req = next
	}
}

func (r *runner) send(req *workload.Request, due time.Time) *Result {
	r.col.sent(time.Since(due))
	res := do(r.ctx, r.cfg.Client, req, r.fu != nil)
	r.col.done(req, &res)
	if r.cfg.OnResult != nil {
		r.cfg.OnResult(req, &res)
	}
	return &res
}

func (r *runner) worker() {
	defer r.wg.Done()
	for {
		if !r.reserve() {
			return
		}
		now := time.Now()
		req, ok := r.next(time.Duration(float64(now.Sub(r.start)) / r.cfg.TimeScale))
		if !ok {
			return
		}
		r.session(req, now)
	}
}
