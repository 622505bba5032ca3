package extproc

import (
	"strings"
	"testing"
	"time"
)

// The admission options a Decider is given apply to the policies it
// installs: the local reserve decides where the least important level is
// refused, the retry burst how many retries the budget holds.
func TestAdmissionOptions(t *testing.T) {
	decider := func(a Admission) (*Policy, *Class) {
		d := NewDecider(time.Unix(0, 0))
		d.SetAdmission(a)
		tp := testPolicy()
		tp.Classes[0].LocalInflightLimit = 10
		tp.Classes[0].RetryBudgetFraction, tp.Classes[0].MaxRetries = 1, 10
		p, _, err := d.SetPolicy(tp)
		if err != nil {
			t.Fatal(err)
		}
		return p, p.byModel["m"][0]
	}
	// admitted counts requests of the least important level (2) admitted
	// before the first local refusal.
	admitted := func(p *Policy, c *Class) int {
		n := 0
		for p.admit(c, 2, uint64(n)) == admitted {
			n++
		}
		return n
	}
	pd, cd := decider(DefaultAdmission())
	if k := cd.grantRetries(); k != int(retryBurst) {
		t.Errorf("default burst: %d retries granted, want %v", k, retryBurst)
	}
	if n := admitted(pd, cd); n != 6 { // refused at (1 − 0.4) × 10
		t.Errorf("default reserve: %d admitted at the lowest level, want 6", n)
	}
	p0, c0 := decider(Admission{LocalReserve: 0, RetryBurst: 3})
	if k := c0.grantRetries(); k != 3 { // before the requests in flight raise utilization
		t.Errorf("burst 3: %d retries granted, want 3", k)
	}
	if n := admitted(p0, c0); n != 10 {
		t.Errorf("no reserve: %d admitted at the lowest level, want 10", n)
	}
	_, c30 := decider(Admission{LocalReserve: 0.4, RetryBurst: 30})
	c30.grantRetries()
	if held := c30.state.tokens; held != 30 {
		t.Errorf("burst 30: the budget holds %v retries (it starts full), want 30", held)
	}
}

func TestAdmissionValidate(t *testing.T) {
	if err := DefaultAdmission().Validate(); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		a    Admission
		want string
	}{
		{Admission{LocalReserve: 1, RetryBurst: 10}, "local_reserve: must be in [0, 1), got 1"},
		{Admission{LocalReserve: -0.1, RetryBurst: 10}, "local_reserve"},
		{Admission{LocalReserve: 0.4, RetryBurst: 0.5}, "retry_burst: must be ≥ 1 and finite, got 0.5"},
	} {
		if err := c.a.Validate(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: err %v, want %q", c.a, err, c.want)
		}
	}
}
