package extproc

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/inferlb/inferlb/internal/hashmix"
)

// classState is the runtime state of one class at this instance; it
// survives policy swaps.
type classState struct {
	inflight atomic.Int64
	// closedBelow and closedUntil are the strict-priority latch: until
	// closedUntil (monotonic ns) no level less important than closedBelow
	// is admitted (admit). Read without a lock; written under mu.
	closedBelow atomic.Uint32
	closedUntil atomic.Int64

	mu     sync.Mutex
	tokens float64 // retry budget, in retries
}

// Admission defaults (DefaultAdmission; documented in docs/extproc.md).
const (
	// localReserve is the share of a class's local in-flight limit kept for
	// more important traffic: the least important level is refused at
	// (1 − localReserve) of the limit, level 0 only at the limit itself,
	// levels between linearly.
	//
	// 0.4: the control plane sets a class's limit at three times its
	// engines' running slots, so the least important level is refused at
	// 1.8× the slots, where the engines are saturated and queueing (no
	// throughput is lost), and the most important keeps 1.2× the slots of
	// room: with a smaller reserve (and twice the slots), a fleet planned
	// near capacity under overload queues up to the limit and refuses the
	// top priority locally.
	localReserve = 0.4
	// retryBurst is the most retries the budget holds (and its start).
	retryBurst = 10.0
	// Utilization knee and ceiling for the retry budget: full budget up to
	// retryKnee, none from retryCeiling on, linear between.
	retryKnee    = 0.7
	retryCeiling = 0.95
	// strictHold is how long a local refusal at one level closes the
	// class to every less important level: the reserve alone lets a
	// less important level take the slots that free up between two
	// refusals of a more important one, so under overload the guardrail
	// would refuse critical requests while admitting standard ones
	// (TestLocalGuardrailStrictPriority). A second is a few generations'
	// turnover.
	strictHold = time.Second
)

// monoBase anchors the monotonic clock of the strict-priority latch.
var monoBase = time.Now()

// shedUnit maps an affinity-key hash to [0,1) with a finalizer independent
// of the hash Envoy's Maglev uses, so shedding does not correlate with the
// engine a key maps to.
func shedUnit(h uint64) float64 {
	return float64(hashmix.SplitMix64(h)>>11) / (1 << 53)
}

type shedReason uint8

const (
	admitted shedReason = iota
	shedPolicy
	shedLocal
)

func (r shedReason) String() string {
	switch r {
	case shedPolicy:
		return "shed_policy"
	case shedLocal:
		return "shed_local"
	}
	return "admitted"
}

// admit decides admission and, when admitted, counts the request in flight
// (the caller must call release once).
func (p *Policy) admit(c *Class, level uint32, keyHash uint64) shedReason {
	return p.admitAt(c, level, keyHash, int64(time.Since(monoBase)))
}

// admitAt is admit at monotonic time now (ns).
//
// The local guardrail is in strict priority order: a request refused at
// level ℓ closes the class to every level less important than ℓ for
// strictHold, so the slots that free up go to ℓ and above.
func (p *Policy) admitAt(c *Class, level uint32, keyHash uint64, now int64) shedReason {
	if f := c.ShedFraction(level); f > 0 && shedUnit(keyHash) < f {
		return shedPolicy
	}
	st := c.state
	if now < st.closedUntil.Load() && level > st.closedBelow.Load() {
		return shedLocal
	}
	n := st.inflight.Add(1)
	if c.InflightLimit > 0 {
		limit := float64(c.InflightLimit)
		if p.maxLevel > 0 {
			limit *= 1 - p.adm.LocalReserve*float64(level)/float64(p.maxLevel)
		}
		if float64(n) > limit {
			st.inflight.Add(-1)
			st.close(level, now)
			return shedLocal
		}
	}
	return admitted
}

// close latches the class shut to levels less important than level for
// strictHold from now (a latch already closed at a more important level
// keeps it).
func (s *classState) close(level uint32, now int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if now >= s.closedUntil.Load() || level <= s.closedBelow.Load() {
		s.closedBelow.Store(level)
		s.closedUntil.Store(now + int64(strictHold))
	}
}

func (c *Class) release() { c.state.inflight.Add(-1) }

// sheds reports whether the class sheds any traffic under this policy.
func (c *Class) sheds() bool {
	for _, f := range c.shed {
		if f > 0 {
			return true
		}
	}
	return false
}

// utilization is the larger of the optimizer's prediction and the local
// in-flight ratio.
func (c *Class) utilization() float64 {
	u := c.Utilization
	if c.InflightLimit > 0 {
		u = max(u, float64(c.state.inflight.Load())/float64(c.InflightLimit))
	}
	return u
}

// retryScale is the budget's share at utilization u: the one curve of the
// retry budget. The control plane publishes its configured fraction
// unscaled; only here is the utilization known both as planned (the
// policy) and as it is now (the local in-flight ratio).
func retryScale(u float64) float64 {
	switch {
	case u <= retryKnee:
		return 1
	case u >= retryCeiling:
		return 0
	}
	return (retryCeiling - u) / (retryCeiling - retryKnee)
}

// grantRetries credits the class's retry budget for one request and grants
// this request up to MaxRetries retries, as many whole retries as the
// budget holds. The budget earns RetryFraction × retryScale(utilization)
// retries per request, holds at most retryBurst (Admission.RetryBurst) × retryScale, and pays
// nothing while the class sheds.
//
// A grant is an allowance, not a reservation: the budget is charged for a
// retry when Envoy reports the failed attempt that caused it (useRetry,
// from the upstream log, within a flush interval). Reserving at grant time
// and refunding at the end would hold a long stream's unused retries for
// its whole generation, draining the budget while nothing fails. Between a
// burst of failures and their charges Envoy's own cluster retry budget
// caps concurrent retries.
func (c *Class) grantRetries() int {
	if c.MaxRetries == 0 || c.RetryFraction == 0 || c.sheds() {
		return 0
	}
	scale := retryScale(c.utilization())
	if scale == 0 {
		return 0
	}
	s := c.state
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tokens = min(s.tokens+c.RetryFraction*scale, c.retryBurst*scale)
	return max(0, min(c.MaxRetries, int(s.tokens)))
}

// chargeRetry takes one used retry from the budget. The budget may go into
// debt (down to −retryBurst) after a burst: requests get no retries until it
// is earned back.
func (c *Class) chargeRetry() {
	s := c.state
	s.mu.Lock()
	s.tokens = max(s.tokens-1, -retryBurst)
	s.mu.Unlock()
}

func newClassState() *classState { return &classState{tokens: retryBurst} }
