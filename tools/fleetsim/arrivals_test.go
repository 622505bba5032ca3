package fleetsim

import (
	"context"
	"testing"
)

// SessionStarts is the simulator's own arrival process: a run of the small
// scenario (a surge ×3 from 12 s to 18 s) starts exactly as many sessions,
// and the schedule is denser during the surge.
func TestSessionStartsMatchSim(t *testing.T) {
	sc := parseSmall(t, small)
	for _, seed := range []uint64{3, 4} {
		s, err := newSim(context.Background(), Options{Scenario: sc, Policy: PolicyRoundRobin, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		if err := s.loop(); err != nil {
			t.Fatal(err)
		}
		starts := SessionStarts(sc, seed)
		if len(starts) != s.sessions {
			t.Errorf("seed %d: SessionStarts has %d sessions, the simulator started %d", seed, len(starts), s.sessions)
		}
		in := func(a, b float64) int {
			n := 0
			for _, x := range starts {
				if x.Seconds() >= a && x.Seconds() < b {
					n++
				}
			}
			return n
		}
		if surge, before := in(12, 18), in(4, 10); surge <= 2*before {
			t.Errorf("seed %d: %d sessions in the 6 s of the ×3 surge, %d in 6 s before it", seed, surge, before)
		}
	}
}
