//go:build race

package fleetsim

// raceEnabled: the race detector slows the simulator several-fold, so the
// long simulation tests run without it (make test runs them again).
const raceEnabled = true
