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
		got := pl.place(p, "c", k, 7000, 0, true, t0)
		if got == k || landsOn(t, p, got) != fastAddr {
			t.Fatalf("placed key %x lands on %s, want a new key on %s", got, landsOn(t, p, got), fastAddr)
		}
		// Its next request keeps to the fast engine, with what it left
		// cached there: 500 new tokens.
		if got2 := pl.place(p, "c", k, 7500, 0, true, t0.Add(time.Second)); landsOn(t, p, got2) != fastAddr {
			t.Fatalf("the key's next request lands on %s, want %s (where its cache is)", landsOn(t, p, got2), fastAddr)
		}
	})
	t.Run("a short prompt stays", func(t *testing.T) {
		pl := newPlacer()
		// 200 tokens: 20 ms against 8 ms, under PlacementSlack; the
		// engines have had their shares of the tokens.
		for i, addr := range []string{slowAddr, fastAddr, slowAddr, fastAddr} {
			k := keyOn(t, p, addr, uint64(1+1000*i))
			if got := pl.place(p, "c", k, 200, 0, true, t0.Add(time.Duration(i)*time.Second)); got != k {
				t.Fatalf("a 200-token prompt was moved off %s (key %x → %x)", addr, k, got)
			}
		}
	})
	t.Run("a short prompt leaves an engine busy with a long prefill", func(t *testing.T) {
		pl := newPlacer()
		long := keyOn(t, p, fastAddr, 1)
		// 24,000 tokens on the fast engine: busy for 0.96 s (the slow one
		// would take 2.4 s).
		if got := pl.place(p, "c", long, 24000, 0, true, t0); got != long {
			t.Fatalf("the long prompt was moved off the faster engine")
		}
		short := keyOn(t, p, fastAddr, 5000)
		got := pl.place(p, "c", short, 300, 0, true, t0.Add(100*time.Millisecond))
		if landsOn(t, p, got) != slowAddr {
			t.Fatalf("a short prompt 0.1 s into a 0.96-s prefill lands on %s, want %s", landsOn(t, p, got), slowAddr)
		}
		// Once the prefill is over, a short prompt whose key lands on the
		// slow engine stays there: nothing is sooner by the slack, and the
		// slow engine has had less than its share of the tokens.
		later := keyOn(t, p, slowAddr, 9000)
		if got := pl.place(p, "c", later, 300, 0, true, t0.Add(2*time.Second)); got != later {
			t.Fatalf("after the prefill ended a short prompt was moved off the slow engine")
		}
		// One whose key lands on the fast engine, which had 24,000 of the
		// 24,600 tokens (weights 1:1), trades places: it loses under the
		// slack on the slow engine (30 against 12 ms).
		onFast := keyOn(t, p, fastAddr, 13000)
		if got := pl.place(p, "c", onFast, 300, 0, true, t0.Add(2*time.Second)); landsOn(t, p, got) != slowAddr {
			t.Fatalf("a short prompt stayed on the engine over its share of the tokens (%s)", landsOn(t, p, got))
		}
	})
	t.Run("a shared prefix is credited to its engine", func(t *testing.T) {
		pl := newPlacer()
		k := keyOn(t, p, slowAddr, 1)
		// 7,000 tokens of which 6,800 are the key's shared prefix: 20 ms
		// on the slow engine that holds it, 280 ms on the fast one.
		if got := pl.place(p, "c", k, 7000, 6800, true, t0); got != k {
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
		if got := pl.place(q, "c", k, 7000, 0, true, t0); got != k {
			t.Fatalf("moved without rates")
		}
	})
	t.Run("the memory is bounded", func(t *testing.T) {
		pl := newPlacer()
		for i := uint64(0); i < maxPlacements+10; i++ {
			pl.place(p, "c", mix(i+1), 100, 0, true, t0)
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
