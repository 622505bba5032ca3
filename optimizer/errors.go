package optimizer

import "errors"

// Sentinel errors. Every error returned by Validate, Solve and the
// constructors wraps one of these (test with errors.Is) and names the
// offending frontend, class, engine or field in its message.
var (
	// ErrNegativeDemand: a demand rate is negative, NaN or infinite.
	ErrNegativeDemand = errors.New("optimizer: negative or non-finite demand")
	// ErrNoEligibleEngine: a (frontend, class) has demand but its class
	// lists no eligible engine.
	ErrNoEligibleEngine = errors.New("optimizer: no eligible engine for a class with demand")
	// ErrNonConvexProfile: a latency curve has a negative linear or queueing
	// coefficient, or a capacity or per-token cost that is not positive, so
	// that latency is not convex and increasing in load.
	ErrNonConvexProfile = errors.New("optimizer: latency profile is not convex and increasing")
	// ErrInvalidProblem: any other malformed input (sizes that disagree,
	// duplicate ids, a fraction outside [0, 1], a headroom outside (0, 1), ...).
	ErrInvalidProblem = errors.New("optimizer: invalid problem")
	// ErrTooLarge: the reference LP solver was asked to solve an instance
	// larger than Options.MaxReferenceArcs.
	ErrTooLarge = errors.New("optimizer: instance too large for the reference solver")
	// ErrNotConverged: the solver hit its iteration limit before reaching its
	// tolerance. Solve still returns its last iterate along with this error.
	ErrNotConverged = errors.New("optimizer: not converged")
	// ErrBadFit: a profile regression had too few or degenerate samples.
	ErrBadFit = errors.New("optimizer: cannot fit profile")
)
