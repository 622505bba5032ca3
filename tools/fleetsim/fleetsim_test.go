package fleetsim

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/inferlb/inferlb/api/fleet"
)

// small is a short scenario on the reference fleet with every kind of
// fault, for tests.
const small = `
name: small
description: test
fleet: ../../examples/fleet-3region.yaml
duration: 24s
warmup: 3s
seed: 3
slo: {ttft_ms: 1000, tpot_ms: 60}
workload:
  kind: sessions
  sessions_per_s: 3
  turns: {min: 1, max: 3}
  user_tokens: {min: 20, max: 60}
  output_tokens: {min: 10, max: 40}
  system_prompt_tokens: 60
  think_time: 1s
  priorities: {critical: 0.3, batch: 0.7}
  regions:
    - at: 0s
      shares: {us-east: 0.5, us-west: 0.25, eu-west: 0.25}
    - at: 12s
      shares: {us-east: 0.2, eu-west: 0.8}
faults:
  - {at: 4s, kind: crash, engine: us-east-h100-1, for: 8s}
  - {at: 6s, kind: slowdown, engine: eu-west-h100-1, factor: 4, for: 6s}
  - {at: 8s, kind: hang, engine: us-west-h100-1, for: 4s}
  - {at: 15s, kind: region_loss, region: us-west, for: 5s}
  - {at: 12s, kind: surge, factor: 3, for: 6s}
`

func parseSmall(t *testing.T, doc string) *Scenario {
	t.Helper()
	sc, err := ParseScenario([]byte(doc), filepath.Join(".", "small.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

// Every policy ends every request: arrived = served + shed + failed +
// rejected (Run checks it and errors otherwise), through crashes, hangs,
// slowdowns, a region loss and a surge; crashes fail requests somewhere.
func TestConservationUnderFaults(t *testing.T) {
	sc := parseSmall(t, small)
	failed := 0
	for _, p := range PolicyNames() {
		r, err := Run(context.Background(), Options{Scenario: sc, Policy: p})
		if err != nil {
			t.Fatalf("%s: %v", p, err)
		}
		if r.Arrived == 0 || r.Served == 0 {
			t.Fatalf("%s: arrived %d served %d", p, r.Arrived, r.Served)
		}
		if r.Arrived != r.Served+r.Shed+r.Failed+r.Rejected {
			t.Fatalf("%s: %d arrived ≠ %d+%d+%d+%d", p, r.Arrived, r.Served, r.Shed, r.Failed, r.Rejected)
		}
		if r.Rejected > 0 {
			t.Errorf("%s: %d requests rejected before routing", p, r.Rejected)
		}
		failed += r.Failed
	}
	if failed == 0 {
		t.Error("no policy lost a request to a crash or a region loss")
	}
}

// shared is one run of the small scenario with seed 7 (inferlb, the old
// controller, round robin), computed once for the tests that need one.
var shared struct {
	once sync.Once
	r    *ScenarioResult
	err  error
}

func sharedRun(t *testing.T) *ScenarioResult {
	t.Helper()
	shared.once.Do(func() {
		sc, err := ParseScenario([]byte(small), "small.yaml")
		if err != nil {
			shared.err = err
			return
		}
		shared.r, shared.err = RunScenario(context.Background(), sc, RunOptions{Policies: []string{PolicyInferlb, PolicyOld, PolicyRoundRobin}, Seed: 7, Parallel: 2})
	})
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	return shared.r
}

func figures(t *testing.T, r *ScenarioResult) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, pr := range r.Policies {
		c := *pr
		c.WallSeconds = 0
		var b bytes.Buffer
		if err := WriteJSON(&b, c); err != nil {
			t.Fatal(err)
		}
		out[pr.Policy] = b.String()
	}
	return out
}

// A seed gives the same figures, run after run; another seed other ones.
func TestDeterministic(t *testing.T) {
	sc := parseSmall(t, small)
	first := figures(t, sharedRun(t))
	again, err := RunScenario(context.Background(), sc, RunOptions{Policies: []string{PolicyInferlb, PolicyOld}, Seed: 7, Parallel: 2})
	if err != nil {
		t.Fatal(err)
	}
	for p, f := range figures(t, again) {
		if f != first[p] {
			a, b := strings.Split(first[p], "\n"), strings.Split(f, "\n")
			for i := range min(len(a), len(b)) {
				if a[i] != b[i] {
					t.Errorf("%s: two runs with seed 7 differ: %s ≠ %s", p, strings.TrimSpace(a[i]), strings.TrimSpace(b[i]))
				}
			}
		}
	}
	other, err := RunScenario(context.Background(), sc, RunOptions{Policies: []string{PolicyRoundRobin}, Seed: 8})
	if err != nil {
		t.Fatal(err)
	}
	if figures(t, other)[PolicyRoundRobin] == first[PolicyRoundRobin] {
		t.Error("seeds 7 and 8 gave the same figures")
	}
}

// inferlb's control loop runs in the simulation: its cycles publish
// weights, ext_proc's reports reach the intake (demand is planned, so the
// weights move off the idle split), and the decisions go through its
// Decider and envoylb.
func TestInferlbControlLoopInTheLoop(t *testing.T) {
	sc := parseSmall(t, small)
	s, err := newSim(context.Background(), Options{Scenario: sc, Policy: PolicyInferlb})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.loop(); err != nil {
		t.Fatal(err)
	}
	x := s.pol.(*inferlb)
	if s.rec.cycles < 6 {
		t.Fatalf("%d control cycles in 39 s of virtual time", s.rec.cycles)
	}
	st := x.pl.intake.Status()
	if st.Accepted == 0 || st.Rejected != 0 {
		t.Fatalf("intake accepted %d reports, rejected %d (%s)", st.Accepted, st.Rejected, st.LastRejection)
	}
	for i, d := range x.dec {
		if d.Policy() == nil || d.Policy().Version == "" {
			t.Fatalf("frontend %d has no policy", i)
		}
		if len(x.clusters[i]) == 0 {
			t.Fatalf("frontend %d has no clusters", i)
		}
	}
	w := x.Weights()
	if len(w) == 0 {
		t.Fatal("no published weights")
	}
}

// Scenario files are checked like fleet specs: every problem, with its
// key path and line.
func TestScenarioErrors(t *testing.T) {
	for _, c := range []struct {
		name, doc string
		want      []string
	}{
		{"unknown key", "name: x\nfleet: ../../examples/fleet-3region.yaml\nduration: 10s\nbogus: 1\nworkload: {kind: sessions, sessions_per_s: 1, regions: [{at: 0s, shares: {us-east: 1}}]}\n",
			[]string{"line 4: bogus: unknown key"}},
		{"bad duration", "name: x\nfleet: ../../examples/fleet-3region.yaml\nduration: ten\nworkload: {kind: sessions, sessions_per_s: 1, regions: [{at: 0s, shares: {us-east: 1}}]}\n",
			[]string{`line 3: duration: "ten" is not a duration`}},
		{"wrong kind", "name: x\nfleet: ../../examples/fleet-3region.yaml\nduration: [1]\nworkload: {kind: sessions, sessions_per_s: 1, regions: [{at: 0s, shares: {us-east: 1}}]}\n",
			[]string{"line 3: duration: must be a string"}},
		{"unknown fault engine and region", "name: x\nfleet: ../../examples/fleet-3region.yaml\nduration: 10s\nworkload: {kind: sessions, sessions_per_s: 1, regions: [{at: 0s, shares: {us-east: 1}}]}\nfaults:\n  - {at: 1s, kind: crash, engine: nope}\n  - {at: 1s, kind: region_loss, region: mars}\n  - {at: 1s, kind: melt}\n",
			[]string{`line 6: faults[0].engine: unknown engine "nope"`, `line 7: faults[1].region: unknown region "mars"`, `line 8: faults[2].kind: unknown fault "melt"`}},
		{"workload", "name: x\nfleet: ../../examples/fleet-3region.yaml\nduration: 10s\nworkload:\n  kind: sessions\n  regions:\n    - at: 0s\n      shares: {atlantis: 1}\n  turns: {min: 3, max: 1}\n",
			[]string{"workload.sessions_per_s: must be positive", `line 8: workload.regions[0].shares.atlantis: unknown frontend region "atlantis"`, "line 9: workload.turns: want 1 ≤ min ≤ max"}},
		{"missing fleet file", "name: x\nfleet: nowhere.yaml\nduration: 10s\nworkload: {kind: azure, trace: t.csv, regions: [{at: 0s, shares: {a: 1}}]}\n",
			[]string{"line 2: fleet: nowhere.yaml"}},
		{"policies", "name: x\nfleet: ../../examples/fleet-3region.yaml\nduration: 10s\nworkload: {kind: sessions, sessions_per_s: 1, regions: [{at: 0s, shares: {us-east: 1}}]}\npolicies: [inferlb, magic, inferlb]\n",
			[]string{`policies[1]: unknown policy "magic"`, `policies[2]: policy "inferlb" twice`}},
		{"trace priorities", "name: x\nfleet: ../../examples/fleet-3region.yaml\nduration: 10s\nworkload: {kind: azure, trace: t.csv, priorities: {critical: 1, vip: 1}, regions: [{at: 0s, shares: {us-east: 1}}]}\n",
			[]string{`line 4: workload.priorities.vip: unknown priority "vip"`}},
		{"trace window", "name: x\nfleet: ../../examples/fleet-3region.yaml\nduration: 10s\nworkload: {kind: azure, trace: t.csv, rows: 10, window: 1m, max_output_tokens: 64, regions: [{at: 0s, shares: {us-east: 1}}]}\n",
			[]string{"line 4: workload.window: give rows or window, not both", "line 4: workload.max_output_tokens: applies to mooncake traces only"}},
		{"seeds", "name: x\nfleet: ../../examples/fleet-3region.yaml\nduration: 10s\nseeds: 0\nworkload: {kind: sessions, sessions_per_s: 1, regions: [{at: 0s, shares: {us-east: 1}}]}\n",
			[]string{"line 4: seeds: must be in [1, 50], got 0"}},
		{"empty", "", []string{"empty scenario: no YAML document"}},
	} {
		_, err := ParseScenario([]byte(c.doc), "t.yaml")
		if err == nil {
			t.Errorf("%s: accepted", c.name)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q\ndoes not contain %q", c.name, err, w)
			}
		}
		if !strings.HasPrefix(err.Error(), "scenario t.yaml:") && c.name != "empty" {
			t.Errorf("%s: error %q does not name the file", c.name, err)
		}
	}
}

// Every example scenario loads.
func TestExampleScenarios(t *testing.T) {
	files, err := filepath.Glob("../../examples/sim/*.yaml")
	if err != nil || len(files) < 10 {
		t.Fatalf("example scenarios: %v (%d)", err, len(files))
	}
	for _, f := range files {
		if strings.HasPrefix(filepath.Base(f), "fleet-") {
			if _, err := fleet.Load(f); err != nil {
				t.Errorf("%s: %v", f, err)
			}
			continue
		}
		if _, err := LoadScenario(f); err != nil {
			t.Errorf("%v", err)
		}
	}
}

// --out writes results.json, every chart as PNG and SVG, and the summary.
func TestWriteOut(t *testing.T) {
	r := sharedRun(t)
	dir := t.TempDir()
	if err := WriteOut(dir, r); err != nil {
		t.Fatal(err)
	}
	if err := WriteSummary(dir, []*ScenarioResult{r}, "# t\n"); err != nil {
		t.Fatal(err)
	}
	// Every image the summary links exists (a chart with nothing to draw
	// has no file, and its link would be a broken image).
	summary, err := os.ReadFile(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	links := regexp.MustCompile(`!\[[^]]*\]\(([^)]+)\)`).FindAllStringSubmatch(string(summary), -1)
	if len(links) == 0 {
		t.Error("the summary links no chart")
	}
	for _, m := range links {
		if _, err := os.Stat(filepath.Join(dir, m[1])); err != nil {
			t.Errorf("the summary links %s: %v", m[1], err)
		}
	}
	for _, n := range []string{"ttft_cdf", "p99_over_time", "weights_inferlb", "weights_old_controller", "utilization"} {
		for _, ext := range []string{".png", ".svg"} {
			st, err := os.Stat(filepath.Join(dir, "small", n+ext))
			if err != nil || st.Size() < 1000 {
				t.Errorf("%s%s: %v", n, ext, err)
			}
		}
	}
	var back ScenarioResult
	b, err := os.ReadFile(filepath.Join(dir, "small", "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if len(back.Policies) != 3 || back.Policies[0].Arrived == 0 || back.BestHitRate <= 0 {
		t.Fatalf("results.json: %+v", back)
	}
	md, _ := os.ReadFile(filepath.Join(dir, "README.md"))
	if !strings.Contains(string(md), "| inferlb |") || !strings.Contains(string(md), "(small/engines.md)") {
		t.Fatalf("summary has no table row for inferlb or no link to the engine tables:\n%s", md)
	}
	eng, _ := os.ReadFile(filepath.Join(dir, "small", "engines.md"))
	if !strings.Contains(string(eng), "## inferlb") || !strings.Contains(string(eng), "| us-east-h100-1 | H100 | us-east |") {
		t.Fatalf("engines.md has no per-engine rows for inferlb:\n%s", eng)
	}
}

// overloaded is about 1.4× what the reference fleet serves within the SLO:
// long prompts that share nothing, in three priorities.
const overloaded = `
name: overloaded
description: test
fleet: ../../examples/fleet-3region.yaml
duration: 24s
warmup: 12s
seed: 4
slo: {ttft_ms: 1000, tpot_ms: 60}
workload:
  kind: sessions
  sessions_per_s: 120
  turns: {min: 1, max: 1}
  user_tokens: {min: 800, max: 1400}
  output_tokens: {min: 150, max: 350}
  system_prompt_tokens: 1
  priorities: {critical: 0.2, standard: 0.6, batch: 0.2}
  regions:
    - at: 0s
      shares: {us-east: 0.4, us-west: 0.3, eu-west: 0.3}
`

// Under a real overload inferlb sheds, the least important priority first
// and the top one not at all, and the result says so per priority.
func TestInferlbShedsLowestPriorityFirstUnderOverload(t *testing.T) {
	res, err := Run(context.Background(), Options{Scenario: parseSmall(t, overloaded), Policy: PolicyInferlb})
	if err != nil {
		t.Fatal(err)
	}
	by := res.ShedPctByPriority
	t.Logf("shed %.1f%%, by priority %v, goodput %.3f, p99 %.0f ms", res.ShedPct, by, res.Goodput, res.TTFT.P99)
	if res.Shed == 0 || len(by) != 3 {
		t.Fatalf("shed %d of %d, by priority %v", res.Shed, res.Arrived, by)
	}
	if by["critical"] != 0 || !(by["batch"] > by["standard"]) || !(by["batch"] > 50) {
		t.Fatalf("shed by priority %v: want batch first (most of it), critical never", by)
	}
	var b bytes.Buffer
	WriteTable(&b, &ScenarioResult{Scenario: "overloaded", Policies: []*PolicyResult{res}})
	if !strings.Contains(b.String(), "Shed by priority (inferlb): batch ") {
		t.Fatalf("table without the shed by priority:\n%s", b.String())
	}
}

// Over several seeds each priority's shed share is the runs' median.
func TestSeedsMedianShedByPriority(t *testing.T) {
	runs := []*PolicyResult{
		{Policy: "inferlb", ShedPctByPriority: map[string]float64{"batch": 80, "critical": 0}},
		{Policy: "inferlb", ShedPctByPriority: map[string]float64{"batch": 60, "critical": 0}},
		{Policy: "inferlb", ShedPctByPriority: map[string]float64{"batch": 90, "critical": 0}},
	}
	m := medianResult(runs, []uint64{1, 2, 3})
	if got := m.ShedPctByPriority; got["batch"] != 80 || got["critical"] != 0 || len(got) != 2 {
		t.Fatalf("shed by priority %v, want batch 80 (the median), critical 0", got)
	}
}
