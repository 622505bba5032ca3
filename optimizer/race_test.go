//go:build race

package optimizer

// raceEnabled: the race detector slows gonum's dense simplex about tenfold,
// so the reference comparison runs fewer instances under -race.
const raceEnabled = true
