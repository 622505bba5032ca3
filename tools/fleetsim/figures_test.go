package fleetsim

import (
	"context"
	"math"
	"strings"
	"testing"

	"github.com/inferlb/inferlb/extproc"
	"github.com/inferlb/inferlb/extproc/body"
	"github.com/inferlb/inferlb/internal/tokens"
	"github.com/inferlb/inferlb/internal/words"
)

// steadyChat is a short fault-free multi-turn scenario on the reference
// fleet (H100 and A100 engines), for the figures' tests.
const steadyChat = `
name: steady-chat
description: test
fleet: ../../examples/fleet-3region.yaml
duration: 40s
warmup: 10s
seed: 5
workload:
  kind: sessions
  sessions_per_s: 3
  turns: {min: 3, max: 5}
  user_tokens: {min: 50, max: 150}
  output_tokens: {min: 20, max: 60}
  system_prompts: 2
  system_prompt_tokens: 300
  think_time: 1s
  regions:
    - at: 0s
      shares: {us-east: 0.4, us-west: 0.3, eu-west: 0.3}
`

// The random-key baseline is inferlb with affinity off: the same control
// loop publishes a policy with affinity off for every class, so ext_proc
// gives every request a fresh key and follow-up turns scatter, where
// inferlb's keys keep them on their engine.
func TestRandomKeyBaseline(t *testing.T) {
	sc := parseSmall(t, steadyChat)
	s, err := newSim(context.Background(), Options{Scenario: sc, Policy: PolicyRandomKey})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.loop(); err != nil {
		t.Fatal(err)
	}
	rk, err := s.result()
	if err != nil {
		t.Fatal(err)
	}
	x := s.pol.(*inferlb)
	if x.ctrl == nil || s.rec.cycles < 5 {
		t.Fatalf("the control loop ran %d cycles", s.rec.cycles)
	}
	for _, c := range sc.Fleet.Classes {
		if c.Affinity.Mode == "off" {
			t.Fatalf("the scenario's own class %s was switched off (policies share it)", c.Name)
		}
	}
	for i, r := range x.applied {
		if r == nil {
			t.Fatalf("frontend %d got no resources", i)
		}
		for _, c := range r.Policy.GetClasses() {
			if !c.GetAffinity().GetOff() {
				t.Errorf("frontend %d: class %s has affinity on in the published policy", i, c.GetName())
			}
		}
	}
	ib, err := Run(context.Background(), Options{Scenario: sc, Policy: PolicyInferlb})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("remapped: random key %.1f%%, inferlb %.1f%%; hit rate %.1f%% vs %.1f%%", 100*rk.Remapped, 100*ib.Remapped, 100*rk.HitRate, 100*ib.HitRate)
	// A fresh key lands on its conversation's last engine with probability
	// Σ w², the frontend's weights squared: with one H100 of a region at
	// 80% that is about 0.65, so a random key moves about a third of the
	// follow-up turns, and inferlb's keys a small part of that.
	if rk.Remapped < 0.25 || ib.Remapped > rk.Remapped/4 {
		t.Errorf("follow-up turns moved: random key %.1f%% (want ≥ 25%%), inferlb %.1f%% (want ≤ a quarter of that)", 100*rk.Remapped, 100*ib.Remapped)
	}
	if rk.HitRate >= ib.HitRate {
		t.Errorf("random key hit rate %.3f not below inferlb's %.3f", rk.HitRate, ib.HitRate)
	}
}

// Utilization is work over capacity: round robin gives every engine of the
// mixed fleet the same requests, and an A100 (less than half an H100's
// prefill rate, twice its decode step) then shows a proportionally higher
// utilization, while its in-flight count says less. Per-engine figures add
// up to the policy's.
func TestUtilizationIsCapacityNormalised(t *testing.T) {
	sc := parseSmall(t, steadyChat)
	r, err := Run(context.Background(), Options{Scenario: sc, Policy: PolicyRoundRobin})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Engines) != len(sc.Fleet.Engines) {
		t.Fatalf("%d engine rows for %d engines", len(r.Engines), len(sc.Fleet.Engines))
	}
	served := 0
	byGPU := map[string][]float64{}
	costs := map[string]tokenCost{}
	var loads, utils []float64
	for j, e := range r.Engines {
		served += e.Served
		if e.Served == 0 || !(e.Utilization > 0) || e.Utilization > 1 {
			t.Errorf("%s: served %d, utilization %v", e.ID, e.Served, e.Utilization)
		}
		byGPU[e.GPU] = append(byGPU[e.GPU], e.Utilization/float64(e.Served))
		costs[e.GPU] = engineTokenCost(sc.Fleet, sc.Fleet.Engines[j])
		loads, utils = append(loads, e.Load), append(utils, e.Utilization)
	}
	if served != r.Served {
		t.Errorf("engines served %d, the policy %d", served, r.Served)
	}
	mean := func(xs []float64) float64 {
		s := 0.0
		for _, x := range xs {
			s += x
		}
		return s / float64(len(xs))
	}
	// Utilization per request served, A100 over H100, against the ratio
	// of their per-token costs (prompt and output costs move alike here).
	got := mean(byGPU["A100"]) / mean(byGPU["H100"])
	lo := math.Min(costs["A100"].prompt/costs["H100"].prompt, costs["A100"].output/costs["H100"].output)
	hi := math.Max(costs["A100"].prompt/costs["H100"].prompt, costs["A100"].output/costs["H100"].output)
	t.Logf("utilization per request A100/H100 %.2f (token cost ratios %.2f–%.2f)", got, lo, hi)
	if got < 0.9*lo || got > 1.1*hi {
		t.Errorf("A100/H100 utilization per request %.2f, want within the token cost ratios %.2f–%.2f", got, lo, hi)
	}
	// (the per-engine figures are rounded to 3 decimals)
	if math.Abs(r.MaxMeanUtil-maxOverMean(utils)) > 0.01 || math.Abs(r.MaxMeanLoad-maxOverMean(loads)) > 0.01 || r.MaxMeanUtil <= 1 {
		t.Errorf("max/mean util %v load %v, from the engines %v %v", r.MaxMeanUtil, r.MaxMeanLoad, maxOverMean(utils), maxOverMean(loads))
	}
}

// With several seeds every figure is the median of the runs' and counts
// are totals; the seeds are Seed, Seed+1, …, each run as with --seed.
func TestSeedsMedians(t *testing.T) {
	sc := parseSmall(t, steadyChat)
	res, err := RunScenario(context.Background(), sc, RunOptions{Policies: []string{PolicyRoundRobin}, Seeds: 3, Parallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Seeds) != 3 || res.Seeds[0] != 5 || res.Seeds[2] != 7 {
		t.Fatalf("seeds %v, want 5, 6, 7", res.Seeds)
	}
	m := res.Policies[0]
	var p99s []float64
	arrived := 0
	for _, seed := range res.Seeds {
		r, err := Run(context.Background(), Options{Scenario: sc, Policy: PolicyRoundRobin, Seed: seed})
		if err != nil {
			t.Fatal(err)
		}
		p99s = append(p99s, r.TTFT.P99)
		arrived += r.Arrived
	}
	if m.Arrived != arrived {
		t.Errorf("arrived %d, the runs' total %d", m.Arrived, arrived)
	}
	if want := median(p99s); m.TTFT.P99 != want {
		t.Errorf("p99 %v, the runs' median %v (%v)", m.TTFT.P99, want, p99s)
	}
	if len(m.BySeed) != 3 || m.BySeed[1].Seed != 6 || m.BySeed[1].TTFTP99Ms != p99s[1] {
		t.Errorf("by seed: %+v", m.BySeed)
	}
	var b strings.Builder
	WriteTable(&b, res)
	if !strings.Contains(b.String(), "Medians over 3 seeds (5–7)") {
		t.Errorf("table does not say it shows medians:\n%s", b.String())
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}, {nil, 0}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

// The simulated ext_procs' tokenizer counts the workloads' texts as the
// engines do, so a prompt of 6,000 of the simulator's words (about 36 KB,
// above what the byte bound lets into the 32k general class) is routed to
// the general class, as the rivals' exact count routes it, not to the
// H100-only long-context class.
func TestSimTokenizerCountsLikeTheEngines(t *testing.T) {
	tok, err := simTok()
	if err != nil {
		t.Fatal(err)
	}
	for seed := range uint64(20) {
		text := words.Words(seed, 500+int(seed)*300)
		if got, want := tok.Count(text), tokens.Count(text); got != want {
			t.Fatalf("seed %d: the simulator's tokenizer counts %d tokens, the engines' rule %d", seed, got, want)
		}
	}
	sc := parseSmall(t, steadyChat)
	s, err := newSim(context.Background(), Options{Scenario: sc, Policy: PolicyOld})
	if err != nil {
		t.Fatal(err)
	}
	d := s.pol.(*oldController).dec[0]
	long := words.Words(99, 6000)
	b := []byte(`{"model":"` + sc.Workload.Model + `","messages":[{"role":"user","content":"` + long + `"}],"max_tokens":100}`)
	if len(b) <= 32768 {
		t.Fatalf("test body of %d bytes is not above the general class's 32k", len(b))
	}
	var dc extproc.Decision
	if rej := d.Decide(extproc.Input{Kind: body.Chat, Body: b}, &dc); rej != nil {
		t.Fatalf("refused: %v", rej)
	}
	if dc.Class.Name != "general" || dc.Bound != "tokenizer" {
		t.Errorf("a %d-token prompt of %d bytes went to class %q (bound %q), want general by the tokenizer", tokens.Count(long), len(b), dc.Class.Name, dc.Bound)
	}
}
