//go:build race

package simreal

const raceEnabled = true
