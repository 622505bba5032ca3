package auth

import (
	"testing"
	"time"
)

// SetCheckEvery makes the watchers made from now to the end of the test
// look at their files every d instead of every second, so that rotation
// tests take milliseconds per step.
func SetCheckEvery(t testing.TB, d time.Duration) {
	old := checkEvery
	checkEvery = d
	t.Cleanup(func() { checkEvery = old })
}
