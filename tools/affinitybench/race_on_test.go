//go:build race

package affinitybench

const raceEnabled = true
