//go:build !race

package simreal

const raceEnabled = false
