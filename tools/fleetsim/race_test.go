//go:build race

package fleetsim

// raceEnabled: the race detector slows the simulator several-fold, so
// TestAffinityBar skips itself under it (make test runs it again without).
const raceEnabled = true
