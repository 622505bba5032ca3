package extproc

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc/body"
	"github.com/inferlb/inferlb/internal/envoylb"
)

// placementPolicy: one class on a slow engine (10,000 prompt tokens/s), a
// fast one (25,000) in region r, and a fastest one (100,000) in region
// far, equal weights.
func placementPolicy(t *testing.T) *Policy {
	t.Helper()
	rp := &policyv1.RoutingPolicy{NodeId: "n", Region: "r", Version: "1", DefaultPriority: "p",
		Priorities:   []*policyv1.Priority{{Name: "p", Level: 0}},
		LoadBalancer: &policyv1.LoadBalancer{MaglevTableSize: 307, HashBalanceFactor: 150},
		Engines: []*policyv1.EngineRef{{Id: "slow", Address: "10.0.0.1:80", Region: "r"},
			{Id: "fast", Address: "10.0.0.2:80", Region: "r"}, {Id: "far", Address: "10.0.0.3:80", Region: "far"}},
		Classes: []*policyv1.ClassPolicy{{Name: "c", Cluster: "class-c", Model: "m",
			Endpoints: []*policyv1.Endpoint{
				{EngineId: "slow", Address: "10.0.0.1:80", Weight: 1, Healthy: true, PrefillTokensPerS: 10000, Exclusive: true},
				{EngineId: "fast", Address: "10.0.0.2:80", Weight: 1, Healthy: true, PrefillTokensPerS: 25000, Exclusive: true},
				{EngineId: "far", Address: "10.0.0.3:80", Weight: 1, Healthy: true, PrefillTokensPerS: 100000, Exclusive: true},
			}}}}
	p, err := Compile(rp, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// landsOn is the address a key's header lands on, with no load.
func landsOn(t *testing.T, p *Policy, key uint64) string {
	t.Helper()
	tabs, err := BuildTables(p)
	if err != nil {
		t.Fatal(err)
	}
	tab := tabs["c"]
	return tab.Hosts[tab.LB.Choose(envoylb.HeaderHash(hex16(key)), zeroLoad{}, nil, 0)].Key
}

// keyOn is some key that lands on addr.
func keyOn(t *testing.T, p *Policy, addr string, from uint64) uint64 {
	t.Helper()
	for k := from; k < from+10000; k++ {
		if landsOn(t, p, mix(k)) == addr {
			return mix(k)
		}
	}
	t.Fatalf("no key lands on %s", addr)
	return 0
}

const (
	slowAddr = "10.0.0.1:80"
	fastAddr = "10.0.0.2:80"
)

func TestPlacement(t *testing.T) {
	p := placementPolicy(t)
	t0 := time.Unix(1000, 0)
	t.Run("a long prompt leaves a slow engine", func(t *testing.T) {
		pl := newPlacer()
		k := keyOn(t, p, slowAddr, 1)
		// 7,000 tokens: 0.70 s on the slow engine, 0.28 s on the fast
		// one; the far one (0.07 s) is in another region.
		got, _ := pl.place(p, "c", k, nil, 7000, 0, true, t0)
		if got == k || landsOn(t, p, got) != fastAddr {
			t.Fatalf("placed key %x lands on %s, want a new key on %s", got, landsOn(t, p, got), fastAddr)
		}
		// Its next request keeps to the fast engine, with what it left
		// cached there: 500 new tokens.
		if got2, _ := pl.place(p, "c", k, nil, 7500, 0, true, t0.Add(time.Second)); landsOn(t, p, got2) != fastAddr {
			t.Fatalf("the key's next request lands on %s, want %s (where its cache is)", landsOn(t, p, got2), fastAddr)
		}
	})
	t.Run("a short prompt stays", func(t *testing.T) {
		pl := newPlacer()
		// 200 tokens: 20 ms against 8 ms, under PlacementSlack; the
		// engines have had their shares of the tokens.
		for i, addr := range []string{slowAddr, fastAddr, slowAddr, fastAddr} {
			k := keyOn(t, p, addr, uint64(1+1000*i))
			if got, _ := pl.place(p, "c", k, nil, 200, 0, true, t0.Add(time.Duration(i)*time.Second)); got != k {
				t.Fatalf("a 200-token prompt was moved off %s (key %x → %x)", addr, k, got)
			}
		}
	})
	t.Run("a short prompt leaves an engine busy with a long prefill", func(t *testing.T) {
		pl := newPlacer()
		long := keyOn(t, p, fastAddr, 1)
		// 24,000 tokens on the fast engine: busy for 0.96 s (the slow one
		// would take 2.4 s).
		if got, _ := pl.place(p, "c", long, nil, 24000, 0, true, t0); got != long {
			t.Fatalf("the long prompt was moved off the faster engine")
		}
		short := keyOn(t, p, fastAddr, 5000)
		got, _ := pl.place(p, "c", short, nil, 300, 0, true, t0.Add(100*time.Millisecond))
		if landsOn(t, p, got) != slowAddr {
			t.Fatalf("a short prompt 0.1 s into a 0.96-s prefill lands on %s, want %s", landsOn(t, p, got), slowAddr)
		}
		// Once the prefill is over, a short prompt whose key lands on the
		// slow engine stays there: nothing is sooner by the slack, and the
		// slow engine has had less than its share of the tokens.
		later := keyOn(t, p, slowAddr, 9000)
		if got, _ := pl.place(p, "c", later, nil, 300, 0, true, t0.Add(2*time.Second)); got != later {
			t.Fatalf("after the prefill ended a short prompt was moved off the slow engine")
		}
		// One whose key lands on the fast engine, which had 24,000 of the
		// 24,600 tokens (weights 1:1), trades places: it loses under the
		// slack on the slow engine (30 against 12 ms).
		onFast := keyOn(t, p, fastAddr, 13000)
		if got, _ := pl.place(p, "c", onFast, nil, 300, 0, true, t0.Add(2*time.Second)); landsOn(t, p, got) != slowAddr {
			t.Fatalf("a short prompt stayed on the engine over its share of the tokens (%s)", landsOn(t, p, got))
		}
	})
	t.Run("a shared prefix is credited to its engine", func(t *testing.T) {
		pl := newPlacer()
		k := keyOn(t, p, slowAddr, 1)
		// 7,000 tokens of which 6,800 are the key's shared prefix: 20 ms
		// on the slow engine that holds it, 280 ms on the fast one.
		if got, _ := pl.place(p, "c", k, nil, 7000, 6800, true, t0); got != k {
			t.Fatalf("a prompt whose shared prefix is cached where its key lands was moved")
		}
	})
	t.Run("without prefill rates nothing moves", func(t *testing.T) {
		rp := proto.Clone(p.Source()).(*policyv1.RoutingPolicy)
		for _, e := range rp.GetClasses()[0].GetEndpoints() {
			e.PrefillTokensPerS = 0
		}
		q, err := Compile(rp, nil)
		if err != nil {
			t.Fatal(err)
		}
		pl := newPlacer()
		k := keyOn(t, q, slowAddr, 1)
		if got, _ := pl.place(q, "c", k, nil, 7000, 0, true, t0); got != k {
			t.Fatalf("moved without rates")
		}
	})
	t.Run("the memory is bounded", func(t *testing.T) {
		pl := newPlacer()
		for i := uint64(0); i < maxPlacements+10; i++ {
			pl.place(p, "c", mix(i+1), nil, 100, 0, true, t0)
		}
		if len(pl.last) != maxPlacements || len(pl.ring) != maxPlacements {
			t.Fatalf("%d keys remembered (ring %d), want %d", len(pl.last), len(pl.ring), maxPlacements)
		}
		if _, ok := pl.last[mix(1)]; ok {
			t.Fatalf("the oldest key is still remembered")
		}
	})
}

// Through Decide: a long prompt whose session key lands on the slow engine
// is routed (AffinityHeader) to the fast one; its affinity key
// (UnplacedHeader) is the one the rules derived. Off, the header is the
// affinity key.
func TestDecidePlacesALongPrompt(t *testing.T) {
	p := placementPolicy(t)
	chat := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("lorem ipsum dolor sit amet ", 1500) + `"}]}`)
	lands := func(h string) string {
		tabs, _ := BuildTables(p)
		tab := tabs["c"]
		return tab.Hosts[tab.LB.Choose(envoylb.HeaderHash(h), zeroLoad{}, nil, 0)].Key
	}
	decider := func(on bool) *Decider {
		d := NewDecider(time.Unix(0, 0))
		if _, _, err := d.SetPolicy(p.Source()); err != nil {
			t.Fatal(err)
		}
		d.SetPrefillPlacement(on)
		return d
	}
	decide := func(d *Decider, session string) *Decision {
		var dc Decision
		if rej := d.Decide(Input{Kind: body.Chat, Session: session, Body: chat, Now: time.Unix(100, 0)}, &dc); rej != nil {
			t.Fatal(rej)
		}
		return &dc
	}
	off := decider(false)
	session := ""
	for i := 0; i < 200 && session == ""; i++ {
		if dc := decide(off, fmt.Sprintf("s%d", i)); lands(dc.AffinityHeader()) == slowAddr {
			session = fmt.Sprintf("s%d", i)
			if dc.AffinityHeader() != dc.UnplacedHeader() {
				t.Fatalf("without placement the header %s is not the affinity key %s", dc.AffinityHeader(), dc.UnplacedHeader())
			}
		}
	}
	if session == "" {
		t.Fatal("no session key lands on the slow engine")
	}
	dc := decide(decider(true), session)
	if dc.Body.PromptTokens < 5000 {
		t.Fatalf("the prompt counts %d tokens, want a long one", dc.Body.PromptTokens)
	}
	if got := lands(dc.UnplacedHeader()); got != slowAddr {
		t.Errorf("the affinity key lands on %s, want %s (the same as without placement)", got, slowAddr)
	}
	if got := lands(dc.AffinityHeader()); got != fastAddr {
		t.Errorf("with placement the request is routed to %s, want %s", got, fastAddr)
	}
}

// idlePolicy: one class on two engines of one speed (11,000 prompt
// tokens/s) and a faster one (25,000) in region r, all exclusive; a third
// of the first speed in r that another frontend also sends to; one in
// region far. Equal weights.
func idlePolicy(t testing.TB) *Policy {
	t.Helper()
	eps := []*policyv1.Endpoint{
		{EngineId: "a", Address: idleA, Weight: 1, Healthy: true, PrefillTokensPerS: 11000, Exclusive: true},
		{EngineId: "b", Address: idleB, Weight: 1, Healthy: true, PrefillTokensPerS: 11000, Exclusive: true},
		{EngineId: "f", Address: idleF, Weight: 1, Healthy: true, PrefillTokensPerS: 25000, Exclusive: true},
		{EngineId: "shared", Address: idleShared, Weight: 1, Healthy: true, PrefillTokensPerS: 11000},
		{EngineId: "far", Address: idleFar, Weight: 1, Healthy: true, PrefillTokensPerS: 100000, Exclusive: true},
	}
	rp := &policyv1.RoutingPolicy{NodeId: "n", Region: "r", Version: "1", DefaultPriority: "p",
		Priorities:   []*policyv1.Priority{{Name: "p", Level: 0}},
		LoadBalancer: &policyv1.LoadBalancer{MaglevTableSize: 307, HashBalanceFactor: 150},
		Classes:      []*policyv1.ClassPolicy{{Name: "c", Cluster: "class-c", Model: "m", Endpoints: eps}}}
	for _, e := range eps {
		region := "r"
		if e.GetEngineId() == "far" {
			region = "far"
		}
		rp.Engines = append(rp.Engines, &policyv1.EngineRef{Id: e.GetEngineId(), Address: e.GetAddress(), Region: region})
	}
	p, err := Compile(rp, nil)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

const (
	idleA      = "10.0.1.1:80"
	idleB      = "10.0.1.2:80"
	idleF      = "10.0.1.3:80"
	idleShared = "10.0.1.4:80"
	idleFar    = "10.0.1.5:80"
)

// TestIdlePlacement holds the idle rule (placement.go): a request waiting
// behind this service's prefills at home moves to an exclusive engine of
// home's region that is idle, or faster with fewer of its requests and
// none of its prefills; nowhere else, and only for more than the slack.
func TestIdlePlacement(t *testing.T) {
	p := idlePolicy(t)
	t0 := time.Unix(1000, 0)
	newIdle := func() *placer {
		pl := newPlacer()
		pl.idleOnly = true
		return pl
	}
	// place puts a request of prompt tokens keyed to home's engine (the
	// from-th such key) at t0+at and says where it went.
	place := func(pl *placer, home string, from uint64, prompt int, at time.Duration) (key, placed uint64, addr string) {
		k := keyOn(t, p, home, from)
		got, a := pl.place(p, "c", k, nil, prompt, 0, true, t0.Add(at))
		if a != landsOn(t, p, got) {
			t.Fatalf("place counted the request at %s, its key lands on %s", a, landsOn(t, p, got))
		}
		return k, got, a
	}

	t.Run("a short prompt leaves a long prefill for the soonest idle engine", func(t *testing.T) {
		pl := newIdle()
		// 24,000 tokens on a: 2.2 s of prefill there, 0.96 s on f, but
		// f is faster: the long prompt itself goes there (idle, faster).
		if _, _, a := place(pl, idleA, 1, 24000, 0); a != idleF {
			t.Fatalf("a 24,000-token prompt on an idle fleet went to %s, want the faster idle %s", a, idleF)
		}
		// Another long prompt keyed to a: f is now busy with the first,
		// b is idle and as fast as a, and a is idle too: it stays.
		if k, got, a := place(pl, idleA, 100, 24000, 10*time.Millisecond); got != k || a != idleA {
			t.Fatalf("a long prompt keyed to an idle engine moved to %s", a)
		}
		// A 300-token prompt keyed to a, 0.1 s in: 2.1 s behind the
		// prefill there; b is idle (27 ms).
		if _, _, a := place(pl, idleA, 5000, 300, 100*time.Millisecond); a != idleB {
			t.Fatalf("a short prompt behind a 2.2-s prefill went to %s, want the idle %s", a, idleB)
		}
	})

	t.Run("an engine with requests in flight of home's speed takes none", func(t *testing.T) {
		pl := newIdle()
		place(pl, idleF, 1, 300, 0) // f: two requests in flight, their prefills over by 24 ms
		place(pl, idleF, 2, 300, 0)
		place(pl, idleB, 1, 300, 0) // b: one, over at 27 ms
		if _, _, a := place(pl, idleA, 100, 24000, time.Second); a != idleA {
			t.Fatalf("a long prompt moved to %s, where requests of this service are in flight and a is idle", a)
		}
		// 0.1 s into a's 2.2-s prefill: b has a request in flight and is
		// of a's speed; f is faster but has more in flight than a; the
		// shared engine and the far one are not candidates.
		k, got, a := place(pl, idleA, 5000, 300, 1100*time.Millisecond)
		if got != k || a != idleA {
			t.Fatalf("a short prompt moved to %s: not idle, not faster with fewer in flight, or not exclusive", a)
		}
		// b's request ends: b is idle, and the next one goes there (f has
		// as many in flight as a now).
		pl.done(idleB)
		if _, _, a := place(pl, idleA, 9000, 300, 1200*time.Millisecond); a != idleB {
			t.Fatalf("after b's request ended a short prompt behind a's prefill went to %s, want %s", a, idleB)
		}
	})

	t.Run("a faster engine with fewer requests and no prefill of ours takes it", func(t *testing.T) {
		pl := newIdle()
		place(pl, idleB, 1, 300, 0) // b busy with a request
		place(pl, idleF, 1, 300, 0) // f: one request, prefill over at 12 ms
		place(pl, idleA, 1, 300, 0) // a: two requests in flight ...
		place(pl, idleA, 100, 24000, 20*time.Millisecond)
		if _, _, a := place(pl, idleA, 5000, 300, 120*time.Millisecond); a != idleF {
			t.Fatalf("a short prompt behind a's prefill went to %s, want the faster %s (1 in flight against 2)", a, idleF)
		}
	})

	t.Run("the slack and the prefill backlog decide", func(t *testing.T) {
		pl := newIdle()
		// 300 tokens on a (27 ms), then another 1 ms later: its first
		// token 53 ms away at a, 12 ms on the idle f: 41 ms saved, under
		// the slack.
		place(pl, idleA, 1, 300, 0)
		if k, got, a := place(pl, idleA, 100, 300, time.Millisecond); got != k || a != idleA {
			t.Fatalf("a prompt that waits under the slack moved to %s", a)
		}
	})

	t.Run("a prefix credited at home keeps a long prompt there", func(t *testing.T) {
		// 4,000 tokens keyed to a (idle, 364 ms) against the idle faster
		// f (160 ms): it moves. With 3,500 of them credited as cached at
		// home (a hot preamble, sharedTokens) a takes 45 ms: it stays.
		pl := newIdle()
		k := keyOn(t, p, idleA, 1)
		if _, a := pl.place(p, "c", k, nil, 4000, 0, true, t0); a != idleF {
			t.Fatalf("an uncached 4,000-token prompt went to %s, want the faster idle %s", a, idleF)
		}
		pl = newIdle()
		if got, a := pl.place(p, "c", k, nil, 4000, 3500, true, t0); got != k || a != idleA {
			t.Fatalf("a 4,000-token prompt with 3,500 cached at home moved to %s", a)
		}
	})

	t.Run("ends are counted", func(t *testing.T) {
		pl := newIdle()
		_, _, a := place(pl, idleA, 1, 300, 0)
		_, _, b := place(pl, idleA, 2, 300, 0)
		if pl.inflight[idleA] != 2 || a != idleA || b != idleA {
			t.Fatalf("in flight at a: %d (placed at %s, %s)", pl.inflight[idleA], a, b)
		}
		pl.done(a)
		pl.done(b)
		if len(pl.inflight) != 0 {
			t.Fatalf("in flight after both ended: %v", pl.inflight)
		}
	})
}

// TestDecideIdlePlacementCountsTheRequest: with idle placement a decision
// counts its request in flight where it was placed until Release (once),
// and the switches choose the rule.
func TestDecideIdlePlacementCountsTheRequest(t *testing.T) {
	p := idlePolicy(t)
	d := NewDecider(time.Unix(0, 0))
	if _, _, err := d.SetPolicy(p.Source()); err != nil {
		t.Fatal(err)
	}
	kind := func() string {
		switch pl := d.placer.Load(); {
		case pl == nil:
			return "off"
		case pl.idleOnly:
			return "idle"
		default:
			return "prefill"
		}
	}
	for _, step := range []struct {
		idle, prefill bool
		want          string
	}{{false, false, "off"}, {true, false, "idle"}, {true, true, "prefill"}, {false, true, "prefill"}, {true, false, "idle"}} {
		d.SetIdlePlacement(step.idle)
		d.SetPrefillPlacement(step.prefill)
		if got := kind(); got != step.want {
			t.Fatalf("idle %v, prefill %v: placement %s, want %s", step.idle, step.prefill, got, step.want)
		}
	}
	pl := d.placer.Load()
	chat := []byte(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`)
	var dc Decision
	if rej := d.Decide(Input{Kind: body.Chat, Session: "s1", Body: chat, Now: time.Unix(100, 0)}, &dc); rej != nil {
		t.Fatal(rej)
	}
	tabs, _ := BuildTables(p)
	tab := tabs["c"]
	at := tab.Hosts[tab.LB.Choose(envoylb.HeaderHash(dc.AffinityHeader()), zeroLoad{}, nil, 0)].Key
	if n := pl.inflight[at]; n != 1 || len(pl.inflight) != 1 {
		t.Fatalf("after one decision the placer counts %v in flight, want 1 at %s", pl.inflight, at)
	}
	d.Release(&dc.Held)
	d.Release(&dc.Held)
	if len(pl.inflight) != 0 {
		t.Fatalf("after Release the placer counts %v in flight", pl.inflight)
	}
}

// TestSharedTokensCreditsTheHotPrefix: placement credits home with the
// request's deepest hot prefix whatever its key (a preamble the table keys
// deeper), with a group or spread key's prefix, and with nothing when the
// table knows no point of the prompt.
func TestSharedTokensCreditsTheHotPrefix(t *testing.T) {
	b := conversation(testPreamble, 0, 1)[0]
	hot := preAnchor(t, b)
	if len(hot) < 3 {
		t.Fatalf("%d points inside the preamble", len(hot))
	}
	var deeper []*policyv1.PrefixRule
	for _, h := range hot {
		deeper = append(deeper, &policyv1.PrefixRule{Prefix: h, Action: policyv1.PrefixRule_ACTION_DEEPER, Spread: 4})
	}
	br := parse(t, b)
	deepest := int(br.Chain.Points[len(hot)-1].Tokens)
	for _, c := range []struct {
		name string
		aff  *policyv1.Affinity
		kind string
		want int
	}{
		{"no table", nil, "conversation", 0},
		{"hot preamble keyed deeper", table(deeper...), "conversation", deepest},
		// A spread key is credited with its conversation's point, past
		// the hot one.
		{"spread", table(&policyv1.PrefixRule{Prefix: hot[len(hot)-1], Action: policyv1.PrefixRule_ACTION_SPREAD, Spread: 4}), "spread", int(br.Chain.Points[len(hot)].Tokens)},
		{"group", table(&policyv1.PrefixRule{Prefix: hot[1], Action: policyv1.PrefixRule_ACTION_GROUP}), "group", int(br.Chain.Points[1].Tokens)},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := compiled(t, c.aff)
			kd := a.key("", br, nil)
			if kd.Kind != c.kind {
				t.Fatalf("kind %q, want %q", kd.Kind, c.kind)
			}
			if got := sharedTokens(&kd, br); got != c.want {
				t.Errorf("credited %d tokens, want %d", got, c.want)
			}
		})
	}
	if deepest <= 0 || deepest >= br.PromptTokens {
		t.Fatalf("the preamble's deepest point has %d of the prompt's %d tokens", deepest, br.PromptTokens)
	}
}

// BenchmarkDecidePlacement is a decision's cost with idle placement off
// and on (the default of `inferlb extproc`), on a class of five engines
// with prefill rates (idlePolicy), 8 KB chat bodies of distinct sessions
// whose requests end at once: where a key lands is looked up on the
// class's Maglev table, and nothing moves.
func BenchmarkDecidePlacement(b *testing.B) {
	chat := []byte(strings.Replace(string(benchBody(8<<10)), `"llama-3-8b"`, `"m"`, 1))
	for _, mode := range []string{"off", "idle", "cache"} {
		b.Run("placement="+mode, func(b *testing.B) {
			d := NewDecider(time.Unix(0, 0))
			if _, _, err := d.SetPolicy(idlePolicy(b).Source()); err != nil {
				b.Fatal(err)
			}
			d.SetIdlePlacement(mode == "idle")
			d.SetCachePlacement(mode == "cache")
			sessions := make([]string, 1024)
			for i := range sessions {
				sessions[i] = fmt.Sprintf("s%d", i)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				var dc Decision
				if rej := d.Decide(Input{Kind: body.Chat, Session: sessions[i%len(sessions)], Body: chat, Now: time.Unix(100, 0)}, &dc); rej != nil {
					b.Fatal(rej)
				}
				d.Release(&dc.Held)
				i++
			}
		})
	}
}
