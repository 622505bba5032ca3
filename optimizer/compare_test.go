package optimizer

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

// TestFastMatchesReference: on 200 random small instances (40 under -race) the fast solver's
// objective is within 0.1% of the reference LP's (both evaluated on the
// exact convex model), and not below the LP's lower bound by more than the
// capacity tolerance allows.
func TestFastMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	worst := 0.0
	var tRef, tFast time.Duration
	instances := 200
	if raceEnabled {
		instances = 40
	}
	for n := 0; n < instances; n++ {
		o := genOpts{frontends: 1 + rng.IntN(3), classes: 1 + rng.IntN(2), engines: 2 + rng.IntN(3),
			load: 0.2 + 1.0*rng.Float64(), withLast: rng.IntN(2) == 0, stabilityMs: 50 * rng.Float64()}
		p := randomProblem(rng, o)
		t0 := time.Now()
		ref, err := Solve(p, Options{Method: Reference})
		tRef += time.Since(t0)
		if err != nil {
			t.Fatalf("instance %d: reference: %v", n, err)
		}
		t0 = time.Now()
		fast, err := Solve(p, Options{Method: Fast, Tolerance: 1e-4})
		tFast += time.Since(t0)
		if err != nil {
			t.Fatalf("instance %d: fast: %v", n, err)
		}
		if ref.Objective == 0 && fast.Objective == 0 {
			continue
		}
		rel := (fast.Objective - ref.Objective) / math.Abs(ref.Objective)
		worst = math.Max(worst, math.Abs(rel))
		if math.Abs(rel) > 1e-3 {
			t.Errorf("instance %d (%+v): fast %.6g vs reference %.6g (%.3g%%), bound %.6g, sweeps %d",
				n, o, fast.Objective, ref.Objective, 100*rel, ref.Bound, fast.Sweeps)
		}
		if fast.Objective < ref.Bound*(1-1e-4) {
			t.Errorf("instance %d: fast %.9g below the LP lower bound %.9g", n, fast.Objective, ref.Bound)
		}
	}
	t.Logf("worst relative difference %.3g%%; time in reference %v, fast %v", 100*worst, tRef, tFast)
}
