package extproc

import (
	"testing"
	"time"
)

// Under overload the local guardrail must not refuse critical requests
// while admitting less important ones whenever a slot frees up (priority
// inversion). A refusal at a level closes the class to every less
// important level for strictHold: the freed slots go to the refused level.
// Without the latch the level-1 request after the release is admitted.
func TestLocalGuardrailStrictPriority(t *testing.T) {
	d := NewDecider(time.Unix(0, 0))
	tp := testPolicy()
	tp.Classes[0].LocalInflightLimit = 10
	p, _, err := d.SetPolicy(tp)
	if err != nil {
		t.Fatal(err)
	}
	if p.maxLevel != 2 {
		t.Fatalf("test policy has %d levels below the top, want 2", p.maxLevel)
	}
	c := p.byModel["m"][0]
	now := int64(time.Hour)
	admit := func(level uint32) shedReason { return p.admitAt(c, level, uint64(level), now) }
	for i := 0; i < 10; i++ {
		if r := admit(0); r != admitted {
			t.Fatalf("level 0, request %d of the limit 10: %v", i+1, r)
		}
	}
	if r := admit(0); r != shedLocal {
		t.Fatalf("level 0 beyond the limit: %v", r)
	}
	// Three slots free up: they are level 0's for strictHold.
	for i := 0; i < 3; i++ {
		c.release()
	}
	now += int64(strictHold / 2)
	for _, l := range []uint32{1, 2} {
		if r := admit(l); r != shedLocal {
			t.Errorf("level %d admitted %v after a level-0 refusal", l, strictHold/2)
		}
	}
	if r := admit(0); r != admitted {
		t.Errorf("level 0 after the release: %v", r)
	}
	// After strictHold without another refusal, level 1 comes back (8 of
	// 10 in flight is its threshold: 9 now, so one slot more first).
	c.release()
	now += int64(strictHold)
	if r := admit(1); r != admitted {
		t.Errorf("level 1 %v after the last level-0 refusal: %v", strictHold*3/2, r)
	}
	// A refusal of the least important level closes nothing.
	for admit(2) == admitted {
	}
	c.release()
	c.release()
	if r := admit(1); r != admitted {
		t.Errorf("level 1 after a level-2 refusal: %v", r)
	}
}
