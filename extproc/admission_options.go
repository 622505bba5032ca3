package extproc

import (
	"errors"
	"fmt"
	"math"
)

// Admission tunes this instance's local admission and retry budget (the
// control plane's policy sets the limits and fractions they apply to).
// Start from DefaultAdmission; the values and their reasons are at the
// constants in admission.go.
type Admission struct {
	// LocalReserve is the share of a class's in-flight limit kept for more
	// important traffic: the least important level is refused at
	// (1 − LocalReserve) of the limit, level 0 only at the limit, levels
	// between linearly. [0, 1).
	LocalReserve float64
	// RetryBurst is the most retries a class's budget holds (and its
	// start). ≥ 1.
	RetryBurst float64
}

// DefaultAdmission is the production tuning.
func DefaultAdmission() Admission {
	return Admission{LocalReserve: localReserve, RetryBurst: retryBurst}
}

// Validate checks the options, naming each bad one by its key.
func (a Admission) Validate() error {
	var errs []error
	if !(a.LocalReserve >= 0 && a.LocalReserve < 1) {
		errs = append(errs, fmt.Errorf("local_reserve: must be in [0, 1), got %v", a.LocalReserve))
	}
	if !(a.RetryBurst >= 1) || math.IsInf(a.RetryBurst, 0) {
		errs = append(errs, fmt.Errorf("retry_burst: must be ≥ 1 and finite, got %v", a.RetryBurst))
	}
	return errors.Join(errs...)
}

// setAdmission gives a policy being installed, and its classes, the
// admission options.
func (p *Policy) setAdmission(a Admission) {
	p.adm = a
	for _, c := range p.classes {
		c.retryBurst = a.RetryBurst
	}
}

// SetAdmission sets the admission options (Validate them first); they apply
// from the next SetPolicy.
func (d *Decider) SetAdmission(a Admission) {
	d.statesMu.Lock()
	defer d.statesMu.Unlock()
	d.adm = a
}
