package ordered

import (
	"math"
	"testing"
)

// Values whose sum depends on the order of addition: Sum gives one answer
// whatever order the map was built in (and its iteration order).
func TestSumIsInKeyOrder(t *testing.T) {
	keys := []string{"a", "b", "c", "d", "e"}
	vals := []float64{1e16, 1, -1e16, 1, 0.1}
	want := 0.0
	for _, v := range vals { // the keys' order
		want += v
	}
	for run := 0; run < 50; run++ {
		m := map[string]float64{}
		for i := range keys {
			j := (i + run) % len(keys)
			m[keys[j]] = vals[j]
		}
		if got := Sum(m); math.Float64bits(got) != math.Float64bits(want) {
			t.Fatalf("run %d: sum %v, want %v (in key order)", run, got, want)
		}
	}
	if k := Keys(map[int]bool{3: true, 1: true, 2: true}); len(k) != 3 || k[0] != 1 || k[2] != 3 {
		t.Fatalf("keys %v", k)
	}
}
