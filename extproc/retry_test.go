package extproc

import (
	"context"
	"math"
	"testing"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/controlplane"
	"github.com/inferlb/inferlb/controlplane/signals"
)

// The one retry-budget curve: full budget up to 70% utilization, none from
// 95%, linear between.
func TestRetryScaleCurve(t *testing.T) {
	cases := []struct{ u, want float64 }{
		{0, 1}, {0.5, 1}, {0.7, 1}, {0.75, 0.8}, {0.8, 0.6}, {0.825, 0.5},
		{0.9, 0.2}, {0.95, 0}, {1, 0}, {3, 0},
	}
	for _, tc := range cases {
		if got := retryScale(tc.u); math.Abs(got-tc.want) > 1e-9 {
			t.Errorf("retryScale(%v) = %v, want %v", tc.u, got, tc.want)
		}
	}
}

// The control plane publishes its configured retry budget unscaled, so the
// budget a class earns at ext_proc is fraction × retryScale(u), not that
// times the control plane's own curve as well (at u = 0.8 that was
// 0.2 × 0.4 × 0.6 of the requests).
func TestRetryBudgetIsScaledOnce(t *testing.T) {
	spec, err := fleet.Load("../examples/fleet-minimal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := controlplane.DefaultConfig()
	class := spec.Classes[0].Name
	// The smallest demand that plans the class busy (well past the 50%
	// where the control plane's curve started) without shedding: searched,
	// so that the test does not hang on the optimizer's capacity model.
	var rp *policyv1.RoutingPolicy
	var u float64
	for rate := 2.0; rate < 2000 && rp == nil; rate *= 1.1 {
		c, err := controlplane.NewController(spec, cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Unix(1_800_000_000, 0)
		ids := []string{"engine-1", "engine-2"}
		tr := signals.NewTracker(signals.TrackerOptions{StaleAfter: 5 * time.Second}, ids)
		for _, id := range ids {
			tr.Observe(signals.Sample{ID: id, At: now, Healthy: true})
		}
		dem := map[signals.DemandKey]signals.DemandRate{
			{Node: "frontend-local", Class: class, Priority: spec.Priorities[0].Name}: {RequestsPerS: rate, PromptTokens: 2000, OutputTokens: 300},
		}
		r, err := c.Step(context.Background(), controlplane.Inputs{Now: now, Engines: tr.Engines(now), Demand: dem})
		if err != nil {
			t.Fatal(err)
		}
		p := r.Nodes["frontend-local"].Resources.Policy
		cp := p.GetClasses()[0]
		if len(cp.GetShedFractionByLevel()) > 0 {
			t.Fatalf("at %.1f requests/s the class sheds before it is planned busy (utilization %.2f)", rate, cp.GetUtilization())
		}
		if cp.GetUtilization() >= 0.75 && cp.GetUtilization() < 0.95 {
			rp, u = p, cp.GetUtilization()
		}
	}
	if rp == nil {
		t.Fatal("no demand plans the class between 75% and 95% utilization")
	}
	cp := rp.GetClasses()[0]
	t.Logf("planned utilization %.2f, retry budget fraction %.2f", u, cp.GetRetryBudgetFraction())
	if cp.GetRetryBudgetFraction() != cfg.RetryBudget || cp.GetMaxRetries() != cfg.MaxRetries {
		t.Fatalf("published retry budget %v (max %d), want the configured %v (max %d) unscaled",
			cp.GetRetryBudgetFraction(), cp.GetMaxRetries(), cfg.RetryBudget, cfg.MaxRetries)
	}
	p, err := Compile(rp, newStates())
	if err != nil {
		t.Fatal(err)
	}
	ec := p.Classes()[0]
	const n = 4000
	used := 0
	for i := 0; i < n; i++ {
		for k := ec.grantRetries(); k > 0; k-- { // every retry granted is used
			ec.chargeRetry()
			used++
		}
	}
	want := n * cfg.RetryBudget * retryScale(u)
	t.Logf("%d requests at utilization %.2f earned %d retries (once scaled: %.0f)", n, u, used, want)
	if math.Abs(float64(used)-want) > retryBurst+2 {
		t.Fatalf("%d requests used %d retries, want %.0f (fraction %v × retryScale(%.2f) = %.3f)",
			n, used, want, cfg.RetryBudget, u, retryScale(u))
	}
}
