package extproc

import (
	"math"
	"strings"
	"testing"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
)

func newStates() func(string) *classState {
	m := map[string]*classState{}
	return func(n string) *classState {
		if m[n] == nil {
			m[n] = newClassState()
		}
		return m[n]
	}
}

func testPolicy() *policyv1.RoutingPolicy {
	return &policyv1.RoutingPolicy{
		NodeId: "n", Version: "1",
		Priorities:      []*policyv1.Priority{{Name: "hi", Level: 0}, {Name: "mid", Level: 1}, {Name: "lo", Level: 2}},
		DefaultPriority: "mid",
		Classes: []*policyv1.ClassPolicy{
			{Name: "m-any", Cluster: "c1", Model: "m"},
			{Name: "m-long", Cluster: "c2", Model: "m", MinContextTokens: 128000},
			{Name: "m-eu", Cluster: "c3", Model: "m", Residency: "eu"},
		},
	}
}

func TestCompileRejects(t *testing.T) {
	cases := []struct {
		mut  func(*policyv1.RoutingPolicy)
		want string
	}{
		{func(p *policyv1.RoutingPolicy) { p.Classes[1].Name = "m-any" }, "duplicate class name"},
		{func(p *policyv1.RoutingPolicy) { p.Classes[0].Cluster = "" }, "empty cluster"},
		{func(p *policyv1.RoutingPolicy) { p.Classes[0].Cluster = "a\nb" }, "control character"},
		{func(p *policyv1.RoutingPolicy) { p.Classes[0].ShedFractionByLevel = map[uint32]float64{1: 1.5} }, "outside [0,1]"},
		{func(p *policyv1.RoutingPolicy) { p.Classes[0].ShedFractionByLevel = map[uint32]float64{7: 0.5} }, "no priority has"},
		{func(p *policyv1.RoutingPolicy) { p.Classes[0].RetryBudgetFraction = math.NaN() }, "retry_budget_fraction"},
		{func(p *policyv1.RoutingPolicy) { p.DefaultPriority = "vip" }, `default_priority "vip"`},
		{func(p *policyv1.RoutingPolicy) { p.Priorities[1].Level = 0 }, "level 0 already used"},
		{func(p *policyv1.RoutingPolicy) { p.Engines = []*policyv1.EngineRef{{Id: "e"}} }, "empty address"},
		{func(p *policyv1.RoutingPolicy) {
			p.Engines = []*policyv1.EngineRef{{Id: "e1", Address: "10.0.0.1:8000"}, {Id: "e2", Address: "10.0.0.1:8000"}}
		}, `address "10.0.0.1:8000" already belongs to "e1"`},
		{func(p *policyv1.RoutingPolicy) { p.Version = "v\xff" }, "version: \"v\\xff\" is not valid UTF-8"},
		{func(p *policyv1.RoutingPolicy) { p.Priorities[0].Name = "hi\xff" }, "not valid UTF-8"},
		{func(p *policyv1.RoutingPolicy) { p.Classes[0].Name = "m\xff" }, "not valid UTF-8"},
		{func(p *policyv1.RoutingPolicy) {
			p.Engines = []*policyv1.EngineRef{{Id: "e\xff", Address: "10.0.0.1:8000"}}
		}, "not valid UTF-8"},
	}
	for _, c := range cases {
		p := testPolicy()
		c.mut(p)
		_, err := Compile(p, newStates())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("want error containing %q, got %v", c.want, err)
		}
	}
}

func TestRouteRule(t *testing.T) {
	p, err := Compile(testPolicy(), newStates())
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		model, res string
		need       int
		want       string
		err        routeErr
	}{
		{"m", "", 1000, "m-any", 0},  // no residency: prefer classes without one
		{"m", "eu", 1000, "m-eu", 0}, // residency must match
		{"m", "us", 1000, "", errResidency},
		{"x", "", 10, "", errUnknownModel},
	}
	for _, c := range cases {
		got, e := p.Route(c.model, c.res, c.need)
		if e != c.err || (got != nil && got.Name != c.want) {
			t.Errorf("Route(%q,%q,%d) = %v,%v; want %q,%v", c.model, c.res, c.need, got, e, c.want, c.err)
		}
	}
	// Context: with the general class guaranteeing 8k, a 100k request goes
	// to the long-context class; more than any guarantee goes to the largest.
	tp := testPolicy()
	tp.Classes[0].MinContextTokens = 8000
	p, _ = Compile(tp, newStates())
	for need, want := range map[int]string{4000: "m-any", 100000: "m-long", 500000: "m-long"} {
		if got, _ := p.Route("m", "", need); got == nil || got.Name != want {
			t.Errorf("need %d: %v, want %s", need, got, want)
		}
	}
}

// As the control plane publishes it for the example fleet: the general class
// mixes 32k-context A100s with 128k H100s, so it guarantees 32k, and a 50k
// request must go to the long-context class even though the general class
// asks nothing of its engines' context.
func TestRouteUsesTheGuaranteedContext(t *testing.T) {
	tp := testPolicy()
	tp.Classes[0].MaxContextTokens = 32768
	tp.Classes[1].MinContextTokens, tp.Classes[1].MaxContextTokens = 65536, 131072
	p, err := Compile(tp, newStates())
	if err != nil {
		t.Fatal(err)
	}
	for need, want := range map[int]string{1000: "m-any", 32768: "m-any", 50000: "m-long", 131072: "m-long", 500000: "m-long"} {
		if got, _ := p.Route("m", "", need); got == nil || got.Name != want {
			t.Errorf("need %d: %v, want %s", need, got, want)
		}
	}
}

// Lowest priority first: a level's fraction counts only when every less
// important level sheds everything.
func TestShedFractionsGuarded(t *testing.T) {
	tp := testPolicy()
	tp.Classes[0].ShedFractionByLevel = map[uint32]float64{0: 0.3, 1: 0.5, 2: 1}
	p, _ := Compile(tp, newStates())
	c := p.byModel["m"][0]
	if c.ShedFraction(2) != 1 || c.ShedFraction(1) != 0.5 || c.ShedFraction(0) != 0 {
		t.Fatalf("effective fractions %v", c.shed)
	}
}

// The shed hash is uniform: the share below f is f.
func TestShedUnitUniform(t *testing.T) {
	const n = 200000
	below := 0
	for i := uint64(0); i < n; i++ {
		if shedUnit(keyHash('s', string(rune(i))+"x"+hex16(i))) < 0.25 {
			below++
		}
	}
	if got := float64(below) / n; math.Abs(got-0.25) > 0.005 {
		t.Fatalf("share below 0.25: %.4f", got)
	}
}

// The retry budget: retries granted are at most the budget fraction of
// requests (plus the burst), tighten with utilization and stop while the
// class sheds; unused retries are refunded.
func TestRetryBudget(t *testing.T) {
	tp := testPolicy()
	tp.Classes[0].RetryBudgetFraction = 0.1
	tp.Classes[0].MaxRetries = 2
	p, _ := Compile(tp, newStates())
	c := p.byModel["m"][0]
	used := 0
	for i := 0; i < 1000; i++ {
		for k := c.grantRetries(); k > 0; k-- { // every retry granted is used
			c.chargeRetry()
			used++
		}
	}
	if used > 100+retryBurst+1 || used < 100 {
		t.Fatalf("1000 requests with a 10%% budget used %d retries", used)
	}
	// Requests that use no retry cost nothing: the budget refills.
	for i := 0; i < 100; i++ {
		c.grantRetries()
	}
	if k := c.grantRetries(); k != 2 {
		t.Fatalf("after requests without retries a request gets %d retries, want 2", k)
	}
	// A burst of failures puts the budget in debt: no retries until earned.
	for i := 0; i < 30; i++ {
		c.chargeRetry()
	}
	if k := c.grantRetries(); k != 0 {
		t.Fatalf("in debt: %d retries", k)
	}
	// High utilization: nothing.
	tp.Classes[0].Utilization = 0.96
	p, _ = Compile(tp, newStates())
	if k := p.byModel["m"][0].grantRetries(); k != 0 {
		t.Fatalf("at utilization 0.96: %d retries", k)
	}
	if s := retryScale(0.825); math.Abs(s-0.5) > 1e-9 {
		t.Fatalf("retryScale(0.825) = %v", s)
	}
	// Shedding: nothing.
	tp.Classes[0].Utilization = 0
	tp.Classes[0].ShedFractionByLevel = map[uint32]float64{2: 0.1}
	p, _ = Compile(tp, newStates())
	if k := p.byModel["m"][0].grantRetries(); k != 0 {
		t.Fatalf("while shedding: %d retries", k)
	}
}
