package rivalbench

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/tools/loadgen"
	"github.com/inferlb/inferlb/tools/workload"
)

func TestParseRouters(t *testing.T) {
	for _, tc := range []struct {
		in      string
		want    []string
		wantErr string
	}{
		{in: "all", want: RouterIDs()},
		{in: "inferlb, round-robin", want: []string{"inferlb", "round-robin"}},
		{in: "smg-cache_aware,,vllm-router-consistent_hash", want: []string{"smg-cache_aware", "vllm-router-consistent_hash"}},
		{in: "smg", wantErr: `unknown router "smg"`},
		{in: "inferlb,inferlb", wantErr: "listed twice"},
		{in: " , ", wantErr: "no router"},
	} {
		got, err := ParseRouters(tc.in)
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("ParseRouters(%q) = %v, want an error with %q", tc.in, err, tc.wantErr)
			}
			continue
		}
		if err != nil {
			t.Errorf("ParseRouters(%q): %v", tc.in, err)
			continue
		}
		var ids []string
		for _, r := range got {
			ids = append(ids, r.ID)
		}
		if strings.Join(ids, ",") != strings.Join(tc.want, ",") {
			t.Errorf("ParseRouters(%q) = %v, want %v", tc.in, ids, tc.want)
		}
	}
}

func TestParseWorkloads(t *testing.T) {
	ws, err := ParseWorkloads("all")
	if err != nil || len(ws) != len(Workloads) {
		t.Fatalf("all: %d workloads, %v", len(ws), err)
	}
	ws, err = ParseWorkloads("rag,mooncake")
	if err != nil || len(ws) != 2 || ws[0].Name != "rag" || ws[1].Name != "mooncake" {
		t.Fatalf("rag,mooncake: %+v, %v", ws, err)
	}
	if _, err := ParseWorkloads("chat"); err == nil || !strings.Contains(err.Error(), `unknown workload "chat"`) {
		t.Fatalf("unknown workload: %v", err)
	}
	if _, err := ParseWorkloads(""); err == nil {
		t.Fatal("no workload: no error")
	}
}

// Every synthetic workload builds, the same for every router (same seed),
// and its first requests are conversations where they should be.
func TestWorkloadsBuildTheSameTrafficForEveryRouter(t *testing.T) {
	o := DefaultOptions()
	o.DataDir = "../../data/traces"
	for _, w := range Workloads {
		a, arrA, err := w.build(o, 0)
		if err != nil {
			if strings.Contains(err.Error(), "no such file") {
				t.Logf("%s: %v (no shared traces here)", w.Name, err)
				continue
			}
			t.Fatalf("%s: %v", w.Name, err)
		}
		b, arrB, err := w.build(o, 0)
		if err != nil {
			t.Fatal(err)
		}
		if arrA.Kind != arrB.Kind || arrA.Rate != arrB.Rate {
			t.Fatalf("%s: arrivals differ", w.Name)
		}
		ra, rb := workload.Slice(a, 5), workload.Slice(b, 5)
		if len(ra) != 5 || len(rb) != 5 {
			t.Fatalf("%s: %d and %d requests", w.Name, len(ra), len(rb))
		}
		for i := range ra {
			if ra[i].PromptTokens != rb[i].PromptTokens || ra[i].Offset != rb[i].Offset || ra[i].MaxTokens != rb[i].MaxTokens {
				t.Fatalf("%s: request %d differs between two builds", w.Name, i)
			}
			if w.FollowUps != (ra[i].Turns > 0) {
				t.Fatalf("%s: FollowUps %v but request %d has %d turns", w.Name, w.FollowUps, i, ra[i].Turns)
			}
		}
		if w.Name == "multiturn-sessions" && ra[0].SessionID == "" || w.Name == "multiturn" && ra[0].SessionID != "" {
			t.Fatalf("%s: session id %q", w.Name, ra[0].SessionID)
		}
	}
}

// A follow-up counts as served without its history when the engine had
// cached less than its previous turn's prompt, less one block.
func TestMeasureHistoryMisses(t *testing.T) {
	m := newMeasure()
	turn := func(idx, turn, turns int) *workload.Request {
		return &workload.Request{Index: idx, Turn: turn, Turns: turns}
	}
	served := func(prompt, cached int) *loadgen.Result {
		return &loadgen.Result{Outcome: loadgen.OK, TTFT: 10 * time.Millisecond, HasUsage: true, PromptTokens: prompt, CachedTokens: cached}
	}
	m.observe(turn(1, 1, 3), served(1000, 0))
	m.observe(turn(1, 2, 3), served(1500, 992)) // within one block: history
	m.observe(turn(1, 3, 3), served(2000, 400)) // lost it
	m.observe(turn(2, 1, 2), served(800, 0))
	m.observe(turn(2, 2, 2), &loadgen.Result{Outcome: loadgen.Rejected})
	m.observe(turn(3, 1, 3), &loadgen.Result{Outcome: loadgen.Failed})
	m.observe(turn(3, 2, 3), served(900, 0))                // its previous turn failed: not judged
	m.observe(&workload.Request{Index: 4}, served(5000, 0)) // single-shot
	r := m.result(&loadgen.Report{})
	if r.FollowUps != 2 || r.HistoryMisses != 1 || r.HistoryMissShare != 0.5 {
		t.Fatalf("follow-ups %d, misses %d (%.2f), want 2, 1 (0.50)", r.FollowUps, r.HistoryMisses, r.HistoryMissShare)
	}
	if sent, ok := m.counts(); sent != 8 || ok != 6 {
		t.Fatalf("sent %d ok %d, want 8 and 6", sent, ok)
	}
	if got := len(m.ttftsMs()); got != 6 {
		t.Fatalf("%d TTFTs, want 6", got)
	}
}

func TestEngineFigures(t *testing.T) {
	before := engineCounters{"a": {hits: 10, queries: 100, requests: 1, region: "x", bySource: map[string]float64{"x": 1}}, "b": {region: "y"}}
	after := engineCounters{"a": {hits: 60, queries: 200, requests: 31, region: "x", bySource: map[string]float64{"x": 21, "y": 10}},
		"b": {hits: 50, queries: 100, requests: 11, region: "y", bySource: map[string]float64{"none": 11}}}
	var r RouterResult
	r.engineFigures(before, after)
	if math.Abs(r.HitRate-0.5) > 1e-9 {
		t.Fatalf("hit rate %v, want 0.5", r.HitRate)
	}
	// Of 41 requests, the 10 from y served in x crossed.
	if math.Abs(r.CrossRegionShare-10.0/41) > 1e-9 {
		t.Fatalf("cross-region share %v, want %v", r.CrossRegionShare, 10.0/41)
	}
	// 30 and 11 requests: the busiest over the mean.
	if math.Abs(r.LoadSpread-30/20.5) > 1e-9 {
		t.Fatalf("load spread %v, want %v", r.LoadSpread, 30/20.5)
	}
}

func TestSummarizeMediansAndRatios(t *testing.T) {
	w := WorkloadResult{Runs: []RunResult{
		{Routers: map[string]RouterResult{"inferlb": {TTFTP50: 50, TTFTP99: 300, OK: 10}, "round-robin": {TTFTP50: 100, TTFTP99: 300, OK: 10}}},
		{Routers: map[string]RouterResult{"inferlb": {TTFTP50: 90, TTFTP99: 100, OK: 12}, "round-robin": {TTFTP50: 100, TTFTP99: 200, OK: 12}}},
		{Routers: map[string]RouterResult{"inferlb": {TTFTP50: 70, TTFTP99: 800, OK: 11}, "round-robin": {TTFTP50: 100, TTFTP99: 400, OK: 11}}},
	}}
	w.summarize([]Router{Inferlb, RoundRobin})
	m := w.Median["inferlb"]
	// Ratios are taken per run (0.5, 0.9, 0.7 and 1, 0.5, 2), then the median.
	if m.TTFTP50 != 70 || m.TTFTP50Ratio != 0.7 || m.TTFTP99Ratio != 1 || m.OK != 11 {
		t.Fatalf("median %+v", m)
	}
	if w.Median["round-robin"].TTFTP50Ratio != 1 {
		t.Fatalf("round robin's own ratio %v", w.Median["round-robin"].TTFTP50Ratio)
	}
}

// The generated fleets are valid specs: the engine simulator's union and
// inferlb's own, in one region and in three.
func TestFleetYAMLIsAValidSpec(t *testing.T) {
	for _, regions := range [][]string{{"local"}, {"us-east", "us-west", "eu-west"}} {
		var es []engine
		for i, r := range regions {
			es = append(es, engine{ID: "r0-" + r + "-0", Region: r, Port: 20000 + i})
		}
		spec, err := fleet.Parse([]byte(fleetYAML("x", regions, es)))
		if err != nil {
			t.Fatalf("%v: %v", regions, err)
		}
		if len(spec.Engines) != len(regions) || len(spec.Frontends) != len(regions) {
			t.Fatalf("%v: %d engines, %d frontends", regions, len(spec.Engines), len(spec.Frontends))
		}
	}
}

func TestRegionalSourceDrawsByShares(t *testing.T) {
	src, err := workload.NewMultiTurn(workload.MultiTurnOptions{Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	r := withRegions(src, []workload.Share{{Name: "a", Weight: 3}, {Name: "b", Weight: 1}}, 7)
	n := map[string]int{}
	for i := 0; i < 4000; i++ {
		req, ok := r.Next(0)
		if !ok {
			t.Fatal("exhausted")
		}
		n[req.Region]++
	}
	// 3:1 within 5 standard deviations (sd of a's count ≈ 27).
	if n["a"] < 3000-140 || n["a"] > 3000+140 || n["a"]+n["b"] != 4000 {
		t.Fatalf("regions %v, want about 3000 a and 1000 b", n)
	}
	req, _ := r.Next(0)
	next, ok := r.(workload.FollowUper).FollowUp(req, "answer")
	if !ok || next.Region != req.Region || next.Turn != 2 {
		t.Fatalf("follow-up %+v, %v", next, ok)
	}
}

func TestOptionsCheck(t *testing.T) {
	base := DefaultOptions()
	base.Self, base.OutDir = "inferlb", "out"
	if err := base.check(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"regions", func(o *Options) { o.Regions = 2 }, "regions must be 1 or 3"},
		{"runs", func(o *Options) { o.Runs = 0 }, "runs must be at least 1"},
		{"duration", func(o *Options) { o.Duration = 0 }, "duration must be positive"},
		{"load", func(o *Options) { o.Load = math.NaN() }, "load must be positive"},
		{"shares count", func(o *Options) { o.Shares = []workload.Share{{Name: "local", Weight: 1}, {Name: "x", Weight: 1}} }, "2 region shares for 1 regions"},
		{"share region", func(o *Options) { o.Shares = []workload.Share{{Name: "x", Weight: 1}} }, `unknown region "x"`},
		{"no routers", func(o *Options) { o.Routers = nil }, "no router"},
	} {
		o := base
		tc.edit(&o)
		if err := o.check(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
}

func TestMeasureByRegion(t *testing.T) {
	m := newMeasure()
	for i := 0; i < 10; i++ {
		m.observe(&workload.Request{Index: i, Region: "a"}, &loadgen.Result{Outcome: loadgen.OK, TTFT: time.Duration(i+1) * time.Millisecond})
	}
	m.observe(&workload.Request{Index: 10, Region: "b"}, &loadgen.Result{Outcome: loadgen.Rejected})
	r := m.result(&loadgen.Report{})
	a, b := r.Regions["a"], r.Regions["b"]
	if a.Sent != 10 || a.OK != 10 || a.TTFTP50 != 5 || a.TTFTP99 != 10 {
		t.Fatalf("region a: %+v", a)
	}
	if b.Sent != 1 || b.Shed != 1 || b.OK != 0 {
		t.Fatalf("region b: %+v", b)
	}
	w := WorkloadResult{Runs: []RunResult{{Routers: map[string]RouterResult{"inferlb": r}}}}
	w.summarize([]Router{Inferlb})
	var table strings.Builder
	if err := writeRegionTable(&table, []string{"inferlb"}, w); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "by the clients' region") || strings.Count(table.String(), "inferlb") != 2 {
		t.Fatalf("region table:\n%s", table.String())
	}
}

// No bench prompt is empty, nor has a "tool" message: SGLang's routers
// refuse both (400), and the bench must measure routing, not validation.
func TestWorkloadsSendValidChat(t *testing.T) {
	o := DefaultOptions()
	o.DataDir = "../../data/traces"
	for _, w := range Workloads {
		src, _, err := w.build(o, 0)
		if err != nil {
			if strings.Contains(err.Error(), "no such file") {
				continue
			}
			t.Fatal(err)
		}
		for _, r := range workload.Slice(src, 4000) {
			for {
				for _, m := range r.Messages {
					if m.Content == "" || m.Role == "tool" {
						t.Fatalf("%s: request %d turn %d has a %q message with %d bytes", w.Name, r.Index, r.Turn, m.Role, len(m.Content))
					}
				}
				f, ok := src.(workload.FollowUper)
				if !ok {
					break
				}
				if r, ok = f.FollowUp(r, "an answer"); !ok {
					break
				}
			}
		}
	}
}
