package controlplane

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane/signals"
)

// testFleetYAML is two regions 60 ms apart, a frontend and two H100
// engines in each.
func testFleetYAML(addrs [4]string) string {
	return fmt.Sprintf(`name: test
regions: [{name: east, residency: us}, {name: west, residency: us}]
network: {same_region_rtt_ms: 1, links: [{a: east, b: west, rtt_ms: 60}]}
frontends:
  - {name: fe-east, region: east, node_id: fe-east}
  - {name: fe-west, region: west, node_id: fe-west}
models: [{name: m, max_context_tokens: 8192}]
profiles:
  - {gpu: H100, model: m, prefill_tokens_per_s: 25000, overhead_ms: 10, decode_step_ms: 6.5, decode_step_per_seq_ms: 0.055, kv_capacity_tokens: 450000}
classes: [{name: chat, model: m, mean_prompt_tokens: 200, mean_output_tokens: 200}]
priorities: [{name: high, level: 0, shed_cost: 10000}, {name: low, level: 1, shed_cost: 100}]
engines:
  - {id: e-east-1, address: %q, region: east, gpu: H100, model: m}
  - {id: e-east-2, address: %q, region: east, gpu: H100, model: m}
  - {id: e-west-1, address: %q, region: west, gpu: H100, model: m}
  - {id: e-west-2, address: %q, region: west, gpu: H100, model: m}
`, addrs[0], addrs[1], addrs[2], addrs[3])
}

func testFleet(t testing.TB) *fleet.Spec {
	t.Helper()
	s, err := fleet.Parse([]byte(testFleetYAML([4]string{"127.0.0.1:19001", "127.0.0.1:19002", "127.0.0.1:19003", "127.0.0.1:19004"})))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// fake describes an engine's last second.
type fake struct {
	down       bool
	reqPerS    float64
	promptTokS float64
	cachedTokS float64 // prompt tokens/s served from the prefix cache
	genTokS    float64
	ttftMs     float64
	tbotMs     float64
	// waiting is the queue gauge at the scrapes; queueMs the mean wait of
	// the requests the engine's queue-time histogram timed (0: none).
	waiting float64
	queueMs float64
	// ttftIn is the scrape's first tokens per bucket of testBounds (the
	// overflow last; nil: the scrape has no buckets).
	ttftIn []float64
}

// testBounds are the TTFT histogram bounds (s) of the fakes' scrapes.
var testBounds = []float64{0.02, 0.04, 0.1, 0.25, 0.5}

// engines runs a tracker over two synthetic scrapes one second apart.
func engines(now time.Time, f map[string]fake) []signals.Engine {
	ids := []string{"e-east-1", "e-east-2", "e-west-1", "e-west-2"}
	tr := signals.NewTracker(signals.TrackerOptions{StaleAfter: 5 * time.Second}, ids)
	for _, id := range ids {
		x := f[id]
		tr.Observe(signals.Sample{ID: id, At: now.Add(-time.Second), Healthy: true})
		m0 := signals.Metrics{Success: 1000, PromptTokens: 1e5, GenTokens: 1e5, TTFTSum: 10, TTFTCount: 1000, ITLSum: 10, ITLCount: 1e5,
			PrefixQueries: 1e5, Waiting: x.waiting}
		tr.Observe(signals.Sample{ID: id, At: now.Add(-time.Second), Healthy: true, Metrics: m0})
		m1 := m0
		m1.Success += x.reqPerS
		m1.PromptTokens += x.promptTokS
		m1.PrefixQueries += x.promptTokS
		m1.PrefixHits += x.cachedTokS
		m1.GenTokens += x.genTokS
		m1.TTFTCount += x.reqPerS
		m1.TTFTSum += x.reqPerS * x.ttftMs / 1000
		if x.ttftIn != nil {
			m0.TTFTBuckets = &signals.Buckets{Bounds: testBounds, Cumulative: make([]float64, len(testBounds))}
			m1.TTFTBuckets = &signals.Buckets{Bounds: testBounds}
			c := 0.0
			for _, n := range x.ttftIn[:len(testBounds)] {
				c += n
				m1.TTFTBuckets.Cumulative = append(m1.TTFTBuckets.Cumulative, c)
			}
			tr.Observe(signals.Sample{ID: id, At: now.Add(-time.Second), Healthy: true, Metrics: m0})
		}
		m1.ITLCount += x.genTokS
		m1.ITLSum += x.genTokS * x.tbotMs / 1000
		if x.queueMs > 0 {
			m1.QueueCount = m0.QueueCount + x.reqPerS
			m1.QueueSum = m0.QueueSum + x.reqPerS*x.queueMs/1000
		}
		tr.Observe(signals.Sample{ID: id, At: now, Healthy: !x.down, Metrics: m1})
	}
	return tr.Engines(now)
}

func demand(east, west float64) map[signals.DemandKey]signals.DemandRate {
	return map[signals.DemandKey]signals.DemandRate{
		{Node: "fe-east", Class: "chat", Priority: "high"}: {RequestsPerS: east, PromptTokens: 200, OutputTokens: 200},
		{Node: "fe-west", Class: "chat", Priority: "high"}: {RequestsPerS: west, PromptTokens: 200, OutputTokens: 200},
	}
}

func share(r *Result, node string, ids ...string) float64 {
	s := 0.0
	for _, id := range ids {
		s += r.Nodes[node].Classes["chat"].Weights[id]
	}
	return s
}

func TestCycleRegionalWeightsAndDeadband(t *testing.T) {
	c, err := NewController(testFleet(t), DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	r, err := c.Step(ctx, Inputs{Now: now, Engines: engines(now, nil), Demand: demand(40, 20)})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Publish) != 2 || r.Fallback != "" {
		t.Fatalf("first cycle published %d nodes (fallback %q)", len(r.Publish), r.Fallback)
	}
	east, west := share(r, "fe-east", "e-east-1", "e-east-2"), share(r, "fe-west", "e-west-1", "e-west-2")
	t.Logf("fe-east keeps %.3f in east, fe-west keeps %.3f in west", east, west)
	if east < 0.5 || west < 0.5 {
		t.Errorf("frontends do not prefer their own region: east %.3f, west %.3f", east, west)
	}
	if r.Nodes["fe-east"].Resources.EndpointVersion == r.Nodes["fe-west"].Resources.EndpointVersion {
		t.Error("both nodes got the same EDS")
	}
	// ext_proc's stand-in for requests without max_tokens: the spec's mean.
	if cl := r.Nodes["fe-east"].Resources.Policy.GetClasses(); len(cl) != 1 || cl[0].GetMeanOutputTokens() != 200 {
		t.Errorf("policy classes %v, want chat with mean_output_tokens 200", cl)
	}
	// Steady demand, small jitter: nothing is republished.
	for i := 1; i <= 5; i++ {
		now = now.Add(5 * time.Second)
		j := 1 + 0.01*float64(i%2)
		r, err = c.Step(ctx, Inputs{Now: now, Engines: engines(now, nil), Demand: demand(40*j, 20*j)})
		if err != nil {
			t.Fatal(err)
		}
		if len(r.Publish) != 0 {
			t.Fatalf("cycle %d republished at steady demand: tv %.4f", i, r.Nodes[r.Publish[0].NodeID].Classes["chat"].TVDistance)
		}
	}
	// An engine going down is out at once, everywhere.
	now = now.Add(time.Second)
	r, err = c.Step(ctx, Inputs{Now: now, Engines: engines(now, map[string]fake{"e-east-1": {down: true}}), Demand: demand(40, 20)})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Publish) != 2 {
		t.Fatalf("health change published %d nodes", len(r.Publish))
	}
	for _, n := range []string{"fe-east", "fe-west"} {
		if w := share(r, n, "e-east-1"); w != 0 {
			t.Errorf("%s still sends %.3f to the down engine", n, w)
		}
	}
}

func TestCyclePenaltyFromOwnProfileDecays(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Penalty.HalfLife = 10 * time.Second
	c, err := NewController(testFleet(t), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	normal := func(ttft float64) map[string]fake {
		m := map[string]fake{}
		for _, id := range []string{"e-east-1", "e-east-2", "e-west-1", "e-west-2"} {
			m[id] = fake{reqPerS: 10, promptTokS: 2000, genTokS: 2000, ttftMs: 30, tbotMs: 8}
		}
		x := m["e-east-1"]
		x.ttftMs = ttft
		m["e-east-1"] = x
		return m
	}
	r0, _ := c.Step(ctx, Inputs{Now: now, Engines: engines(now, normal(30)), Demand: demand(40, 20)})
	base := share(r0, "fe-east", "e-east-1")
	if v := view(r0, "e-east-1"); v.Penalty != 0 {
		t.Fatalf("penalty %v on a normal engine (residual %.2f)", v.Penalty, v.TTFTResidual)
	}
	now = now.Add(5 * time.Second)
	r1, _ := c.Step(ctx, Inputs{Now: now, Engines: engines(now, normal(300)), Demand: demand(40, 20)})
	v := view(r1, "e-east-1")
	t.Logf("slow engine: residual %.2f penalty %.2f (%s); share %.3f → %.3f", v.TTFTResidual, v.Penalty, v.PenaltyWhy, base, share(r1, "fe-east", "e-east-1"))
	if v.Penalty < 0.5 || share(r1, "fe-east", "e-east-1") >= base {
		t.Fatalf("a 10× slower engine: penalty %.2f, share %.3f (was %.3f)", v.Penalty, share(r1, "fe-east", "e-east-1"), base)
	}
	// Recovery: the penalty halves every half-life.
	p1 := v.Penalty
	now = now.Add(10 * time.Second)
	r2, _ := c.Step(ctx, Inputs{Now: now, Engines: engines(now, normal(30)), Demand: demand(40, 20)})
	if p2 := view(r2, "e-east-1").Penalty; math.Abs(p2-p1/2) > 1e-6 {
		t.Errorf("penalty after one half-life %.4f, want %.4f", p2, p1/2)
	}
	// Errors reported by ext_proc count too.
	now = now.Add(time.Second)
	r3, _ := c.Step(ctx, Inputs{Now: now, Engines: engines(now, normal(30)), Demand: demand(40, 20),
		Evidence: map[string]signals.Evidence{"127.0.0.1:19002": {Responses: 100, Errors: 50}}})
	if v := view(r3, "e-east-2"); v.Penalty < 0.8 || v.ErrorRate != 0.5 {
		t.Errorf("50%% errors: %+v", v)
	}
}

// stepWithOneEngine runs one cycle of a fresh controller over four engines
// at 10 requests/s, e-east-1's scrape changed by set, and returns
// e-east-1's view.
func stepWithOneEngine(t *testing.T, set func(*fake)) EngineView {
	t.Helper()
	c, err := NewController(testFleet(t), DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	f := map[string]fake{}
	for _, id := range []string{"e-east-1", "e-east-2", "e-west-1", "e-west-2"} {
		f[id] = fake{reqPerS: 10, promptTokS: 2000, genTokS: 2000, ttftMs: 30, tbotMs: 8}
	}
	x := f["e-east-1"]
	set(&x)
	f["e-east-1"] = x
	r, err := c.Step(context.Background(), Inputs{Now: now, Engines: engines(now, f), Demand: demand(40, 20)})
	if err != nil {
		t.Fatal(err)
	}
	return view(r, "e-east-1")
}

// An engine whose queue burst between scrapes (the gauge read 0.2 waiting
// at both) while its requests waited 260 ms on average, as its queue-time
// histogram says, is slow by queueing, not faulty: no latency penalty. The
// same TTFT without that queue time, measured or by the gauge, is a fault.
func TestCycleMeasuredQueueingIsNotAFault(t *testing.T) {
	for _, tc := range []struct {
		name     string
		queueMs  float64
		waiting  float64
		penalize bool
	}{
		{"measured queue explains the TTFT", 260, 0.2, false},
		{"measured queue is short", 5, 0.2, true},
		{"no queue histogram: the gauge's Little's law", 0, 0.2, true},
		// The histogram times a request's queue wait at its finish, its
		// TTFT at its first token: at a burst's onset the queued requests
		// have first tokens while the histogram has timed only the first,
		// unqueued ones. The queue gauges (3 waiting at 10 done/s: 300 ms
		// by Little's law) explain the TTFT.
		{"a burst's onset: the gauges show the queue the histogram has not timed yet", 5, 3, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := stepWithOneEngine(t, func(x *fake) { x.ttftMs, x.waiting, x.queueMs = 300, tc.waiting, tc.queueMs })
			t.Logf("TTFT residual %.2f (predicted %.0f ms), penalty %.2f %s", v.TTFTResidual, v.TTFTPredMs, v.Penalty, v.PenaltyWhy)
			if got := v.Penalty > 0; got != tc.penalize {
				t.Errorf("penalized %v, want %v: residual %.2f, predicted %.0f ms", got, tc.penalize, v.TTFTResidual, v.TTFTPredMs)
			}
		})
	}
}

// A queue that ended just after a scrape (its clients went away: the
// requests it delayed record first tokens but no queue time, and the
// gauges read idle at every later scrape) is judged with its first
// tokens while they are in the window, even once the scrape that saw it
// has left: the window's gauges cover the intervals its counters do.
// Judged against an idle prediction instead, a few such first tokens
// would give a healthy engine a large penalty.
func TestCycleQueueBeforeTheWindowIsNotAFault(t *testing.T) {
	c, err := NewController(testFleet(t), DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	ids := []string{"e-east-1", "e-east-2", "e-west-1", "e-west-2"}
	tr := signals.NewTracker(signals.TrackerOptions{StaleAfter: 5 * time.Second, EvidenceWindow: 10 * time.Second}, ids)
	idle := signals.Metrics{Success: 1000, PromptTokens: 2e5, GenTokens: 1e5, TTFTSum: 30, TTFTCount: 1000, ITLSum: 800, ITLCount: 1e5, PrefixQueries: 2e5}
	for s := -12; s <= 0; s++ {
		at := now.Add(time.Duration(s) * time.Second)
		for _, id := range ids {
			m := idle
			switch {
			case id == "e-east-1" && s == -11:
				// The scrape that sees the queue: just outside the window at now.
				m.Running, m.Waiting = 1, 3
			case id == "e-east-1" && s > -11:
				// Its three requests got their first tokens after 400 ms
				// and were cancelled before the next scrape.
				m.Success, m.TTFTCount, m.TTFTSum = idle.Success+3, idle.TTFTCount+3, idle.TTFTSum+3*0.4
				m.PromptTokens = idle.PromptTokens + 3*200
			}
			tr.Observe(signals.Sample{ID: id, At: at, Healthy: true, Metrics: m})
		}
	}
	r, err := c.Step(context.Background(), Inputs{Now: now, Engines: tr.Engines(now), Demand: demand(40, 20)})
	if err != nil {
		t.Fatal(err)
	}
	v := view(r, "e-east-1")
	t.Logf("window %+v; predicted %.0f ms, residual %.2f, penalty %.2f %s", v.Window, v.TTFTPredMs, v.TTFTResidual, v.Penalty, v.PenaltyWhy)
	if v.Window.TTFTCount != 3 || v.Window.Waiting <= 0 {
		t.Errorf("window %+v: want the 3 first tokens and the queue that delayed them", v.Window)
	}
	if v.Penalty > 0 {
		t.Errorf("penalized %.2f (%s): the queue explains its first tokens", v.Penalty, v.PenaltyWhy)
	}
}

// A window's mean TTFT is judged on what it proves: with prompts of very
// different lengths, ten first tokens whose mean is 2× the prediction but
// which the histogram shows spread (eight fast, two behind a long prefill)
// are noise, not a fault; the same mean with every sample in one bucket,
// or with no buckets to tell the spread, is a fault, and so is an engine
// whose first tokens all took 260 ms, at the low edge of vLLM's wide
// 250-500 ms bucket (its midpoint would have made them look spread).
// False penalties on such noise remap an engine's long shared prefixes
// and lose their cache hits.
func TestCycleNoisyTTFTIsNotAFault(t *testing.T) {
	for _, tc := range []struct {
		name     string
		ttftMs   float64
		in       []float64 // per bucket of testBounds, the overflow last
		penalize bool
	}{
		{"no buckets: the mean", 60, nil, true},
		{"every first token in the mean's bucket", 60, []float64{0, 0, 10, 0, 0, 0}, true},
		{"eight fast, two behind a long prefill: noise", 60, []float64{8, 0, 0, 2, 0, 0}, false},
		{"all slow at a wide bucket's low edge", 260, []float64{0, 0, 0, 0, 10, 0}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := stepWithOneEngine(t, func(x *fake) { x.ttftMs, x.ttftIn = tc.ttftMs, tc.in }) // 60 ms: about 2× the prediction
			t.Logf("TTFT residual %.2f, proven %.2f, penalty %.2f %s", v.TTFTResidual, v.TTFTResidualLow, v.Penalty, v.PenaltyWhy)
			if got := v.Penalty > 0; got != tc.penalize {
				t.Errorf("penalized %v, want %v: residual %.2f, proven %.2f", got, tc.penalize, v.TTFTResidual, v.TTFTResidualLow)
			}
			if tc.in == nil && v.TTFTResidualLow != v.TTFTResidual {
				t.Errorf("without buckets the proven residual %.3f is not the mean's %.3f", v.TTFTResidualLow, v.TTFTResidual)
			}
		})
	}
}

func TestCycleBackgroundLoadShiftsWeight(t *testing.T) {
	c, err := NewController(testFleet(t), DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	r0, _ := c.Step(ctx, Inputs{Now: now, Engines: engines(now, nil), Demand: demand(40, 20)})
	base := share(r0, "fe-east", "e-east-1")
	// Someone else loads e-east-1 to ~90% of its capacity.
	now = now.Add(5 * time.Second)
	hot := map[string]fake{"e-east-1": {reqPerS: 37, promptTokS: 7400, genTokS: 7400, ttftMs: 40, tbotMs: 10}}
	r1, _ := c.Step(ctx, Inputs{Now: now, Engines: engines(now, hot), Demand: demand(40, 20)})
	v := view(r1, "e-east-1")
	t.Logf("loaded engine: observed %.2f planned %.2f background %.2f; share %.3f → %.3f", v.ObservedUtilization, v.PlannedUtilization, v.BackgroundLoad, base, share(r1, "fe-east", "e-east-1"))
	// The objective prices TTFT, which grows slowly below the headroom:
	// the background load moves the split until both engines' marginal
	// TTFT agree, 0.08 here (0 when background load is ignored).
	if share(r1, "fe-east", "e-east-1") > base-0.05 {
		t.Errorf("loaded engine keeps its share: %.3f (was %.3f)", share(r1, "fe-east", "e-east-1"), base)
	}
}

func TestCycleSeedHoldsPublishedWeights(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	a, _ := NewController(testFleet(t), DefaultConfig(), nil)
	ra, err := a.Step(ctx, Inputs{Now: now, Engines: engines(now, nil), Demand: demand(40, 20)})
	if err != nil {
		t.Fatal(err)
	}
	// A restarted control plane, seeded from the state file, sees slightly
	// different demand and still publishes the very same EDS.
	b, _ := NewController(testFleet(t), DefaultConfig(), nil)
	if ignored, err := b.Seed(a.Published(), a.Version()); err != nil || len(ignored) != 0 {
		t.Fatalf("seed from the same fleet: ignored %v, err %v", ignored, err)
	}
	now = now.Add(30 * time.Second)
	rb, err := b.Step(ctx, Inputs{Now: now, Engines: engines(now, nil), Demand: demand(41, 19.5)})
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"fe-east", "fe-west"} {
		if ra.Nodes[n].Resources.EndpointVersion != rb.Nodes[n].Resources.EndpointVersion {
			t.Errorf("%s: EDS version %s after restart, was %s", n, rb.Nodes[n].Resources.EndpointVersion, ra.Nodes[n].Resources.EndpointVersion)
		}
	}
}

// A restarted control plane, seeded from the state file, sees the engines
// carrying the traffic its published weights send them. That load is its own
// frontends', not background: the first cycle must not shrink the busy
// engines' capacity and move the weights away from the warm caches.
func TestCycleSeededRestartDoesNotTakeItsOwnTrafficForBackground(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	a, _ := NewController(testFleet(t), DefaultConfig(), nil)
	if _, err := a.Step(ctx, Inputs{Now: now, Engines: engines(now, nil), Demand: demand(40, 20)}); err != nil {
		t.Fatal(err)
	}
	// The engines now carry what a planned: their observed utilization is
	// the planned one (as decode work).
	busy := map[string]fake{}
	for id, load := range a.planned {
		prof := a.profiles[id]
		util := load / prof.CapacityRPS
		busy[id] = fake{reqPerS: load, genTokS: util / prof.OutputTokenSec}
	}
	now = now.Add(5 * time.Second)
	ra, err := a.Step(ctx, Inputs{Now: now, Engines: engines(now, busy), Demand: demand(40, 20)})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewController(testFleet(t), DefaultConfig(), nil)
	if _, err := b.Seed(a.Published(), a.Version()); err != nil {
		t.Fatal(err)
	}
	now = now.Add(5 * time.Second)
	rb, err := b.Step(ctx, Inputs{Now: now, Engines: engines(now, busy), Demand: demand(40, 20)})
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rb.Engines {
		if v.BackgroundLoad > 0.02 {
			t.Errorf("restarted: %s background load %.3f (observed %.3f, planned %.3f): its own traffic", v.ID, v.BackgroundLoad, v.ObservedUtilization, v.PlannedUtilization)
		}
	}
	for _, n := range []string{"fe-east", "fe-west"} {
		if ra.Nodes[n].Resources.EndpointVersion != rb.Nodes[n].Resources.EndpointVersion {
			t.Errorf("%s: restart moved the weights %v → %v", n, ra.Nodes[n].Classes["chat"].Weights, rb.Nodes[n].Classes["chat"].Weights)
		}
	}
}

// A state file is outside input: a share that would break every cycle's
// translation is refused, and what the fleet no longer has is named, not
// silently kept.
func TestCycleSeedRejectsBadStateAndNamesStaleEntries(t *testing.T) {
	c, err := NewController(testFleet(t), DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, bad := range []float64{-0.5, math.Inf(1), math.NaN()} {
		w := map[string]map[string]map[string]float64{"fe-east": {"chat": {"e-east-1": 1, "e-east-2": bad}}}
		if _, err := c.Seed(w, 7); err == nil || !strings.Contains(err.Error(), `engine "e-east-2": share`) {
			t.Errorf("share %v: err = %v, want a share error naming the engine", bad, err)
		}
	}
	if _, err := c.Seed(nil, -1); err == nil {
		t.Error("negative version accepted")
	}
	if len(c.Published()) != 0 || c.Version() != 0 {
		t.Fatalf("a refused seed left state: %v, version %d", c.Published(), c.Version())
	}
	ignored, err := c.Seed(map[string]map[string]map[string]float64{
		"fe-east": {"chat": {"e-east-1": 0.7, "e-gone": 0.3}, "old-class": {"e-east-1": 1}},
		"fe-gone": {"chat": {"e-east-1": 1}},
	}, 7)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`node "fe-east" class "chat" engine "e-gone"`, `node "fe-east" class "old-class"`, `node "fe-gone"`}
	if fmt.Sprint(ignored) != fmt.Sprint(want) {
		t.Errorf("ignored %q, want %q", ignored, want)
	}
	if got := c.Published(); len(got) != 1 || fmt.Sprint(got["fe-east"]) != "map[chat:map[e-east-1:0.7]]" || c.Version() != 7 {
		t.Errorf("seeded %v version %d", got, c.Version())
	}
}

func TestProportionalFallback(t *testing.T) {
	c, err := NewController(testFleet(t), DefaultConfig(), ProportionalAllocator{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Unix(1_800_000_000, 0)
	r, err := c.Step(context.Background(), Inputs{Now: now, Engines: engines(now, map[string]fake{"e-west-2": {down: true}}), Demand: demand(10, 10)})
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"e-east-1", "e-east-2", "e-west-1"} {
		if w := share(r, "fe-east", id); math.Abs(w-1.0/3) > 1e-9 {
			t.Errorf("%s share %v, want 1/3", id, w)
		}
	}
}

func TestConfigValidation(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Headroom = 1.2
	cfg.Translate.MaglevTableSize = 100
	_, err := NewController(testFleet(t), cfg, nil)
	if err == nil {
		t.Fatal("bad config accepted")
	}
	for _, want := range []string{"headroom: must be in (0, 1), got 1.2", "maglev_table_size"} {
		if !contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && (s[:len(sub)] == sub || contains(s[1:], sub)))
}

func view(r *Result, id string) EngineView {
	for _, v := range r.Engines {
		if v.ID == id {
			return v
		}
	}
	return EngineView{}
}

// BenchmarkCycle3Region is one control cycle's logic (engine view,
// penalties, optimizer, deadband, translation of 3 nodes × 3 classes) on the
// example 3-region fleet with 12 engines, demand changing every cycle.
func BenchmarkCycle3Region(b *testing.B) {
	spec, err := fleet.Load("../examples/fleet-3region.yaml")
	if err != nil {
		b.Fatal(err)
	}
	c, err := NewController(spec, DefaultConfig(), nil)
	if err != nil {
		b.Fatal(err)
	}
	var ids []string
	for _, e := range spec.Engines {
		ids = append(ids, e.ID)
	}
	now := time.Unix(1_800_000_000, 0)
	tr := signals.NewTracker(signals.TrackerOptions{StaleAfter: time.Hour}, ids)
	for _, id := range ids {
		tr.Observe(signals.Sample{ID: id, At: now, Healthy: true, Metrics: signals.Metrics{}})
	}
	eng := tr.Engines(now)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		now = now.Add(5 * time.Second)
		d := map[signals.DemandKey]signals.DemandRate{}
		for k, f := range spec.Frontends {
			for _, cl := range spec.Classes {
				d[signals.DemandKey{Node: f.NodeID, Class: cl.Name, Priority: "standard"}] = signals.DemandRate{
					RequestsPerS: 20 + float64((i+k)%7), PromptTokens: cl.MeanPromptTokens, OutputTokens: cl.MeanOutputTokens}
			}
		}
		if _, err := c.Step(context.Background(), Inputs{Now: now, Engines: eng, Demand: d}); err != nil {
			b.Fatal(err)
		}
	}
}

// Each engine's profile is built for its own model's reference request (the
// first class of that model), as FromFleet builds it, so a
// capacity and curves measured at that shape mean the same in both.
func TestProfilesUseTheirModelsReferenceShape(t *testing.T) {
	spec, err := fleet.Parse([]byte(`name: two-models
regions: [{name: r}]
frontends: [{name: fe, region: r}]
models: [{name: a, max_context_tokens: 16384}, {name: b, max_context_tokens: 16384}]
profiles:
  - {gpu: H100, model: a, prefill_tokens_per_s: 25000, overhead_ms: 10, decode_step_ms: 6.5, decode_step_per_seq_ms: 0.055, kv_capacity_tokens: 450000}
  - {gpu: H100, model: b, prefill_tokens_per_s: 25000, overhead_ms: 10, decode_step_ms: 6.5, decode_step_per_seq_ms: 0.055, kv_capacity_tokens: 450000,
     capacity_rps: 2, ttft_curve: {base_ms: 400, linear_ms: 50, queue_ms: 20}}
classes:
  - {name: chat-a, model: a, mean_prompt_tokens: 200, mean_output_tokens: 200}
  - {name: long-b, model: b, mean_prompt_tokens: 8000, mean_output_tokens: 100}
priorities: [{name: p, level: 0, shed_cost: 1000}]
engines:
  - {id: ea, address: "127.0.0.1:19101", region: r, gpu: H100, model: a}
  - {id: eb, address: "127.0.0.1:19102", region: r, gpu: H100, model: b}
`))
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewController(spec, DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"ea", "eb"} {
		e, _ := spec.EngineByID(id)
		fp, _ := spec.ProfileOf(e)
		refP, refO, ok := ReferenceShape(spec, e.Model)
		want, err := ProfileFromFleet(fp, refP, refO)
		if !ok || err != nil {
			t.Fatalf("%s: reference shape %v, %v", id, ok, err)
		}
		if got := c.profiles[id]; got != want {
			t.Errorf("%s: control plane profile %+v, want %+v", id, got, want)
		}
	}
	if p := c.profiles["eb"]; p.RefPromptTokens != 8000 || p.CapacityRPS != 2 || p.TTFT.Base != 400 {
		t.Errorf("eb's profile %+v: want model b's shape 8000/100, capacity 2 and the measured TTFT curve", p)
	}
}

// Under overload, Envoy's uneven spread of our own requests (more to one
// engine than its weight, less to another) is our traffic, not someone
// else's: read as background, it cut the favoured engine's capacity and the
// plan shed more of what the fleet could serve. ext_proc's response counts
// show the spread. While nothing sheds, the plan alone stands (the spread
// read as background only moves weight, which shortens the tail), and so
// it does for a Reports window after the weights moved.
func TestCycleOwnSpreadUnderOverloadIsNotBackground(t *testing.T) {
	ctx := context.Background()
	addr := map[string]string{"e-east-1": "127.0.0.1:19001", "e-east-2": "127.0.0.1:19002",
		"e-west-1": "127.0.0.1:19003", "e-west-2": "127.0.0.1:19004"}
	dem := func(perFrontend float64) map[signals.DemandKey]signals.DemandRate {
		m := map[signals.DemandKey]signals.DemandRate{}
		for _, n := range []string{"fe-east", "fe-west"} {
			for _, p := range []string{"high", "low"} {
				m[signals.DemandKey{Node: n, Class: "chat", Priority: p}] = signals.DemandRate{RequestsPerS: perFrontend / 2, PromptTokens: 200, OutputTokens: 200}
			}
		}
		return m
	}
	// second runs a first cycle at the demand (load × the fleet's capacity),
	// then, 5 s later, one where Envoy sent e-east-1 25% more than planned
	// and e-east-2 25% less, with or without ext_proc's evidence of it (and
	// errors on top, which are no work), over a Reports window of window.
	// It returns the two engines' views and whether the first plan shed.
	second := func(t *testing.T, load float64, withEvidence bool, window time.Duration) (hot, cold EngineView, sheds bool) {
		c, err := NewController(testFleet(t), DefaultConfig(), nil)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Unix(1_800_000_000, 0)
		d := dem(load * c.CapacityRPS() / 2)
		if _, err := c.Step(ctx, Inputs{Now: now, Engines: engines(now, nil), Demand: d, DemandWindow: window}); err != nil {
			t.Fatal(err)
		}
		sheds = c.publishedSheds()
		skew := map[string]float64{"e-east-1": 1.25, "e-east-2": 0.75, "e-west-1": 1, "e-west-2": 1}
		busy, ev := map[string]fake{}, map[string]signals.Evidence{}
		for id, planned := range c.planned {
			prof := c.profiles[id]
			got := planned * skew[id]
			busy[id] = fake{reqPerS: got, genTokS: got / prof.CapacityRPS / prof.OutputTokenSec}
			if withEvidence {
				answered := 4 * c.plannedReq[id] * skew[id]
				ev[addr[id]] = signals.Evidence{Responses: answered + 30, Errors: 30}
			}
		}
		now = now.Add(5 * time.Second)
		r, err := c.Step(ctx, Inputs{Now: now, Engines: engines(now, busy), Demand: d, Evidence: ev, DemandWindow: window})
		if err != nil {
			t.Fatal(err)
		}
		return view(r, "e-east-1"), view(r, "e-east-2"), sheds
	}
	hot, cold, sheds := second(t, 1.3, true, 4*time.Second)
	if !sheds {
		t.Fatal("1.3× the fleet's capacity: the plan sheds nothing")
	}
	if hot.BackgroundLoad != 0 || math.Abs(hot.OwnUtilization-hot.ObservedUtilization) > 0.01 {
		t.Errorf("overload, spread shown by ext_proc: observed %.3f, planned %.3f, own %.3f, background %.3f; want own = observed, no background",
			hot.ObservedUtilization, hot.PlannedUtilization, hot.OwnUtilization, hot.BackgroundLoad)
	}
	if cold.OwnUtilization != cold.PlannedUtilization {
		t.Errorf("overload, the engine Envoy underfed: own %.3f, planned %.3f; the estimate only rises above the plan",
			cold.OwnUtilization, cold.PlannedUtilization)
	}
	if hot, _, _ := second(t, 1.3, false, 4*time.Second); hot.BackgroundLoad < 0.05 {
		t.Errorf("overload, no evidence: background %.3f (observed %.3f, planned %.3f); the plan alone reads the excess as background",
			hot.BackgroundLoad, hot.ObservedUtilization, hot.PlannedUtilization)
	}
	// A 10-s Reports window: the weights moved 5 s ago, the counts are
	// still partly the old weights'.
	if hot, _, _ := second(t, 1.3, true, 10*time.Second); hot.OwnUtilization != hot.PlannedUtilization || hot.BackgroundLoad < 0.05 {
		t.Errorf("overload, weights moved within the window: own %.3f, planned %.3f, background %.3f; want the plan alone",
			hot.OwnUtilization, hot.PlannedUtilization, hot.BackgroundLoad)
	}
	hot, _, sheds = second(t, 0.7, true, 4*time.Second)
	if sheds || hot.OwnUtilization != hot.PlannedUtilization || hot.BackgroundLoad < 0.02 {
		t.Errorf("0.7× capacity (sheds %v): observed %.3f, planned %.3f, own %.3f, background %.3f; want the plan alone",
			sheds, hot.ObservedUtilization, hot.PlannedUtilization, hot.OwnUtilization, hot.BackgroundLoad)
	}
}

// TestQueueOurTrafficLeftIsNotBackground: an engine's queue and token
// rates cover the tracker's evidence window. When the plan has just moved
// our traffic off a full engine, what that traffic left (a queue, rates at
// the old load) is ours, not another tenant's: no background load, and
// the engine keeps its place in the plan. The same queue lasting a whole
// window after our traffic left is someone else's.
func TestQueueOurTrafficLeftIsNotBackground(t *testing.T) {
	for _, tc := range []struct {
		name    string
		gap     time.Duration // from the last cycle at full load to the one that reads the queue
		foreign bool
	}{
		{"queue within the window of our load", 5 * time.Second, false},
		{"queue a window after our load left", 30 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewController(testFleet(t), DefaultConfig(), nil)
			if err != nil {
				t.Fatal(err)
			}
			ids := []string{"e-east-1", "e-east-2", "e-west-1", "e-west-2"}
			tr := signals.NewTracker(signals.TrackerOptions{StaleAfter: 5 * time.Second, Smoothing: time.Second, EvidenceWindow: 10 * time.Second}, ids)
			counters := map[string]*signals.Metrics{}
			for _, id := range ids {
				counters[id] = &signals.Metrics{Success: 1000, PromptTokens: 1e5, GenTokens: 1e5, TTFTSum: 10, TTFTCount: 1000, ITLSum: 10, ITLCount: 1e5, PrefixQueries: 1e5}
			}
			now := time.Unix(1_800_000_000, 0)
			// scrape feeds a scrape a second until to: every engine at
			// utilization u[id] (by its generated tokens), queue waiting.
			scrape := func(to time.Time, u map[string]float64, waiting float64) {
				for ; !now.After(to); now = now.Add(time.Second) {
					for _, id := range ids {
						m := counters[id]
						gen := u[id] / c.profiles[id].OutputTokenSec
						m.Success += gen / 200
						m.TTFTCount += gen / 200
						m.TTFTSum += gen / 200 * 0.05
						m.GenTokens += gen
						m.ITLCount += gen
						m.ITLSum += gen * 0.02
						m.Running, m.Waiting = 4, waiting
						tr.Observe(signals.Sample{ID: id, At: now, Healthy: true, Metrics: *m})
					}
				}
				now = to
			}
			capacity := c.profiles["e-east-1"].CapacityRPS
			high := demand(1.8*capacity, 1.8*capacity) // 90% of the fleet
			full := map[string]float64{"e-east-1": 0.9, "e-east-2": 0.9, "e-west-1": 0.9, "e-west-2": 0.9}
			step := func(d map[signals.DemandKey]signals.DemandRate) *Result {
				r, err := c.Step(context.Background(), Inputs{Now: now, Engines: tr.Engines(now), Demand: d})
				if err != nil {
					t.Fatal(err)
				}
				return r
			}
			start := now
			scrape(start.Add(10*time.Second), full, 2)
			step(high)
			scrape(now.Add(5*time.Second), full, 2)
			before := view(step(high), "e-east-1")
			if before.OwnUtilization < ownQueue {
				t.Fatalf("setup: our traffic loads e-east-1 to %.2f, want ≥ %.2f", before.OwnUtilization, ownQueue)
			}
			// Our demand falls to a tenth; e-east-1's queue stays.
			low := demand(0.18*capacity, 0.18*capacity)
			loads := map[string]float64{"e-east-1": 0.9, "e-east-2": 0.1, "e-west-1": 0.1, "e-west-2": 0.1}
			scrape(now.Add(tc.gap), loads, 2)
			step(low)
			scrape(now.Add(time.Second), loads, 2)
			v := view(step(low), "e-east-1")
			t.Logf("own %.2f, over the window %.2f, observed %.2f, background %.2f", v.OwnUtilization, v.OwnWindowUtilization, v.ObservedUtilization, v.BackgroundLoad)
			if tc.foreign {
				if v.BackgroundLoad < 0.5 {
					t.Errorf("a queue a window after our traffic left: background %.2f, want it counted (≥ 0.5)", v.BackgroundLoad)
				}
				return
			}
			if v.OwnWindowUtilization < ownQueue || v.BackgroundLoad != 0 {
				t.Errorf("a queue our traffic left within the window: own over the window %.2f, background %.2f; want ≥ %.2f and none",
					v.OwnWindowUtilization, v.BackgroundLoad, ownQueue)
			}
		})
	}
}

// TestCycleExclusiveNeedsOneInstance: an engine only one node sends to is
// exclusive in that node's policy (ext_proc's placement may then treat it
// as idle when none of its own requests are there), unless the node's
// requests are split among several ext_proc instances (Inputs.Instances),
// none of which sees them all.
func TestCycleExclusiveNeedsOneInstance(t *testing.T) {
	exclusive := func(inst map[string]int) map[string]bool {
		t.Helper()
		c, err := NewController(testFleet(t), DefaultConfig(), nil)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Unix(1_800_000_000, 0)
		r, err := c.Step(context.Background(), Inputs{Now: now, Engines: engines(now, nil), Demand: demand(40, 20), Instances: inst})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, cl := range r.Nodes["fe-east"].Resources.Policy.GetClasses() {
			for _, e := range cl.GetEndpoints() {
				out[e.GetEngineId()] = out[e.GetEngineId()] || e.GetExclusive()
			}
		}
		return out
	}
	one := exclusive(nil)
	if !one["e-east-1"] && !one["e-east-2"] {
		t.Fatalf("one instance per node: no east engine is exclusive to fe-east (%v); the test shows nothing", one)
	}
	for id, ex := range exclusive(map[string]int{"fe-east": 2, "fe-west": 1}) {
		if ex {
			t.Errorf("fe-east has two ext_proc instances, yet %s is exclusive in its policy", id)
		}
	}
}
