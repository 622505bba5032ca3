package fleetsim

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb/tools/enginesim/model"
	"github.com/inferlb/inferlb/tools/workload"
)

// regionalSim is the small scenario's fleet (fleet-3region: 4 engines in
// each of us-east, us-west, eu-west; us-west→us-east 70 ms, us-west→eu-west
// 140 ms) under one policy, before any traffic.
func regionalSim(t *testing.T, policy string) *Sim {
	t.Helper()
	s, err := newSim(context.Background(), Options{Scenario: parseSmall(t, small), Policy: policy})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// pickFrom routes n fresh general-class requests from the frontend of
// region and returns the regions of the engines picked.
func pickFrom(t *testing.T, s *Sim, region string, n int) map[string]int {
	t.Helper()
	f := s.frontOf[region]
	got := map[string]int{}
	for i := range n {
		prompt := make([]uint64, 64)
		for k := range prompt {
			prompt[k] = uint64(1000*i + k + 1)
		}
		p := &request{front: f, class: s.classIx["general"], prompt: prompt, host: -1, w: workload.Request{MaxTokens: 16}}
		j := s.pol.Pick(p)
		if j < 0 {
			t.Fatalf("%s: no engine picked", region)
		}
		got[s.engines[j].region]++
	}
	return got
}

func setRegionHealth(s *Sim, region string, ok bool) {
	for _, e := range s.engines {
		if e.region == region {
			e.healthy = ok
		}
	}
}

// A regional rival keeps a frontend's traffic in its own region while any
// engine there is eligible, spills only when none is, and then to the
// nearest other region by round trip: us-west's frontend to us-east
// (70 ms), not eu-west (140 ms); with us-east gone too, eu-west. The
// global variants, on the same fleet, send some of us-west's traffic out
// of the region (what the regional deployment exists to stop).
func TestRegionalRoutingRule(t *testing.T) {
	for _, pol := range []string{PolicyLLMDRegional, PolicySGLangRegional, PolicyDynamoRegional} {
		t.Run(pol, func(t *testing.T) {
			s := regionalSim(t, pol)
			for _, r := range []string{"us-east", "us-west", "eu-west"} {
				if got := pickFrom(t, s, r, 40); got[r] != 40 {
					t.Errorf("healthy fleet: frontend %s picked %v, want all 40 in %s", r, got, r)
				}
			}
			setRegionHealth(s, "us-west", false)
			if got := pickFrom(t, s, "us-west", 40); got["us-east"] != 40 {
				t.Errorf("us-west down: us-west's frontend picked %v, want all 40 in us-east (70 ms, nearer than eu-west's 140 ms)", got)
			}
			if got := pickFrom(t, s, "eu-west", 20); got["eu-west"] != 20 {
				t.Errorf("us-west down: eu-west's frontend picked %v, want all in eu-west", got)
			}
			setRegionHealth(s, "us-east", false)
			if got := pickFrom(t, s, "us-west", 20); got["eu-west"] != 20 {
				t.Errorf("us-west and us-east down: us-west's frontend picked %v, want all 20 in eu-west", got)
			}
			setRegionHealth(s, "us-west", true)
			if got := pickFrom(t, s, "us-west", 20); got["us-west"] != 20 {
				t.Errorf("us-west back: its frontend picked %v, want all 20 back home", got)
			}
		})
	}
	for _, pol := range []string{PolicyLLMD, PolicySGLang, PolicyDynamo} {
		s := regionalSim(t, pol)
		// Load us-west's engines a little so the global routers' load
		// terms push some traffic elsewhere.
		load(t, s, "us-west", 3)
		if got := pickFrom(t, s, "us-west", 60); got["us-west"] == 60 {
			t.Errorf("%s (global): every pick stayed in us-west (%v); the regional test above would not tell the variants apart", pol, got)
		}
	}
}

// load submits n requests of 2,000 prompt tokens to each engine of region
// and advances them 50 ms (past the overhead into the scheduler).
func load(t *testing.T, s *Sim, region string, n int) {
	t.Helper()
	for _, e := range s.engines {
		if e.region != region {
			continue
		}
		for i := range n {
			prompt := make([]uint64, 2000)
			for k := range prompt {
				prompt[k] = uint64(7_000_000 + 10_000*i + k)
			}
			r := &model.Request{Prompt: prompt, MaxTokens: 4000, EndReason: model.FinishLength, Tag: &request{}}
			if _, err := e.reps.Submit(r, 0); err != nil {
				t.Fatal(err)
			}
		}
		e.reps.Advance(50 * time.Millisecond)
	}
}

// llm_d_regional's eligibility is the EPP saturation detector's: with
// every us-west engine holding more than 5 waiting requests its frontend
// spills to us-east; sglang_regional and dynamo_regional have no per-worker
// admission limit and stay home under the same load.
func TestRegionalSpillsOnlyWhenSaturated(t *testing.T) {
	for _, tc := range []struct {
		pol   string
		spill bool
	}{{PolicyLLMDRegional, true}, {PolicySGLangRegional, false}, {PolicyDynamoRegional, false}} {
		s := regionalSim(t, tc.pol)
		load(t, s, "us-west", 300) // max_running 256: ≥ 44 waiting each
		for _, e := range s.engines {
			if e.region == "us-west" && s.llmdUnsaturated(e.ix) {
				t.Fatalf("%s not saturated after the load: %+v", e.spec.ID, e.reps.Stats())
			}
		}
		got := pickFrom(t, s, "us-west", 20)
		want := "us-west"
		if tc.spill {
			want = "us-east"
		}
		if got[want] != 20 {
			t.Errorf("%s with us-west saturated: picked %v, want all 20 in %s", tc.pol, got, want)
		}
	}
}

// With every region saturated llm_d_regional keeps to its own region
// (nothing is shed; non-sheddable requests go to a saturated pool).
func TestRegionalAllSaturatedStaysHome(t *testing.T) {
	s := regionalSim(t, PolicyLLMDRegional)
	for _, r := range []string{"us-east", "us-west", "eu-west"} {
		load(t, s, r, 300)
	}
	if got := pickFrom(t, s, "us-west", 20); got["us-west"] != 20 {
		t.Errorf("everything saturated: picked %v, want all 20 in us-west", got)
	}
}

// The report names the strongest rival (lowest p99, then least shed; not
// inferlb or random_key) and the stronger deployment of each rival.
func TestMarkStrongest(t *testing.T) {
	pr := func(name string, p99, shed float64) *PolicyResult {
		return &PolicyResult{Policy: name, TTFT: Quantiles{P50: p99 / 2, P99: p99}, ShedPct: shed}
	}
	r := &ScenarioResult{Policies: []*PolicyResult{
		pr(PolicyInferlb, 50, 0), pr(PolicyRandomKey, 60, 0),
		pr(PolicyLLMD, 300, 0), pr(PolicyLLMDRegional, 120, 0),
		pr(PolicySGLang, 200, 0), pr(PolicySGLangRegional, 250, 0),
		pr(PolicyDynamo, 120, 1), pr(PolicyDynamoRegional, 400, 0),
		pr(PolicyNearest, 130, 0),
	}}
	markStrongest(r)
	if r.StrongestRival != PolicyLLMDRegional {
		t.Errorf("strongest rival %q, want %s (p99 tie with dynamo_kv, less shed)", r.StrongestRival, PolicyLLMDRegional)
	}
	want := fmt.Sprint([]string{PolicyLLMDRegional, PolicySGLang, PolicyDynamo})
	if got := fmt.Sprint(r.StrongerVariant); got != want {
		t.Errorf("stronger variants %s, want %s", got, want)
	}
	var b strings.Builder
	WriteTable(&b, r)
	if !strings.Contains(b.String(), "Strongest rival") || !strings.Contains(b.String(), "**llm_d_regional**") {
		t.Errorf("table does not name the strongest rival:\n%s", b.String())
	}
}
