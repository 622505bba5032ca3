// Package ordered computes over maps in key order. Go's map order varies
// from run to run and float addition is not associative, so a sum over a
// map's values can differ in its last bits between two runs on the same
// inputs; replicas of the control plane (and replays of the fleet
// simulator) must agree bit for bit.
package ordered

import (
	"cmp"
	"maps"
	"slices"
)

// Keys are m's keys, sorted.
func Keys[K cmp.Ordered, V any](m map[K]V) []K {
	return slices.Sorted(maps.Keys(m))
}

// Sum adds m's values in key order.
func Sum[K cmp.Ordered](m map[K]float64) float64 {
	s := 0.0
	for _, k := range Keys(m) {
		s += m[k]
	}
	return s
}
