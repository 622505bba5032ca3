package extproc

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc/body"
	"github.com/inferlb/inferlb/internal/envoylb"
)

// cachePolicy: one class on four engines of one speed in region r, with
// the weights given (equal when nil), all healthy at priority 0, the
// engines planned full (the budget binds at its tightest).
func cachePolicy(t testing.TB, version string, weights []uint32) *policyv1.RoutingPolicy {
	t.Helper()
	rp := &policyv1.RoutingPolicy{NodeId: "n", Region: "r", Version: version, DefaultPriority: "p",
		Priorities:   []*policyv1.Priority{{Name: "p", Level: 0}},
		LoadBalancer: &policyv1.LoadBalancer{MaglevTableSize: 307, HashBalanceFactor: 150},
		Classes:      []*policyv1.ClassPolicy{{Name: "c", Cluster: "class-c", Model: "m", Utilization: 1}}}
	for i := range 4 {
		id, addr := fmt.Sprintf("e%d", i), fmt.Sprintf("10.0.2.%d:80", i+1)
		w := uint32(1)
		if weights != nil {
			w = weights[i]
		}
		rp.Classes[0].Endpoints = append(rp.Classes[0].Endpoints, &policyv1.Endpoint{EngineId: id, Address: addr,
			Weight: w, Healthy: true, PrefillTokensPerS: 11000, Exclusive: true})
		rp.Engines = append(rp.Engines, &policyv1.EngineRef{Id: id, Address: addr, Region: "r"})
	}
	return rp
}

// cacheRig decides requests with cache-aware placement and says where
// Envoy's table sends each.
type cacheRig struct {
	t   *testing.T
	d   *Decider
	now time.Time
}

func newCacheRig(t *testing.T, rp *policyv1.RoutingPolicy) *cacheRig {
	d := NewDecider(time.Unix(0, 0))
	if _, _, err := d.SetPolicy(rp); err != nil {
		t.Fatal(err)
	}
	d.SetCachePlacement(true)
	return &cacheRig{t: t, d: d, now: time.Unix(100, 0)}
}

// chatBody is a chat request: the system prompt, then the user turns with
// an assistant answer between each.
func chatBody(system string, turns ...string) []byte {
	msgs := []map[string]string{{"role": "system", "content": system}}
	for i, u := range turns {
		if i > 0 {
			msgs = append(msgs, map[string]string{"role": "assistant", "content": "answer to " + turns[i-1]})
		}
		msgs = append(msgs, map[string]string{"role": "user", "content": u})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "messages": msgs})
	return b
}

// send decides a request 200 ms after the last one, ends it at once, and
// returns the engine address Envoy's table routes its header to.
func (r *cacheRig) send(b []byte) string {
	r.t.Helper()
	r.now = r.now.Add(200 * time.Millisecond)
	var dc Decision
	if rej := r.d.Decide(Input{Kind: body.Chat, Body: b, Now: r.now}, &dc); rej != nil {
		r.t.Fatal(rej)
	}
	defer r.d.Release(&dc.Held)
	tabs, err := BuildTables(dc.Policy)
	if err != nil {
		r.t.Fatal(err)
	}
	tab := tabs["c"]
	return tab.Hosts[tab.LB.Choose(envoylb.HeaderHash(dc.AffinityHeader()), zeroLoad{}, nil, 0)].Key
}

var longSystem = strings.Repeat("You are a careful assistant who answers in full sentences. ", 300)

// A conversation's follow-up turns go where its first turn went, and a
// change of the plan's weights moves none of them (while their engine
// stays inside its stay bound); with the key alone, Envoy's table moves
// some conversations when the weights change.
func TestCachePlacementKeepsConversations(t *testing.T) {
	const n = 24
	convs := make([][]string, n)
	for i := range convs {
		convs[i] = []string{fmt.Sprintf("conversation %d opens with its own question about topic %d", i, i*7)}
	}
	r := newCacheRig(t, cachePolicy(t, "1", nil))
	first := make([]string, n)
	for i := range convs {
		first[i] = r.send(chatBody(longSystem+fmt.Sprint(i), convs[i]...))
	}
	for turn := 1; turn < 3; turn++ {
		if turn == 2 { // the plan moves a fifth of the weight
			if _, _, err := r.d.SetPolicy(cachePolicy(t, "2", []uint32{2, 1, 1, 1})); err != nil {
				t.Fatal(err)
			}
		}
		for i := range convs {
			convs[i] = append(convs[i], fmt.Sprintf("follow-up %d of conversation %d", turn, i))
			if got := r.send(chatBody(longSystem+fmt.Sprint(i), convs[i]...)); got != first[i] {
				t.Errorf("turn %d of conversation %d went to %s, its history is at %s", turn, i, got, first[i])
			}
		}
	}
	// The same conversations keyed alone: Envoy's table moves some.
	off := NewDecider(time.Unix(0, 0))
	moved := 0
	for i := range convs {
		at := func(rp *policyv1.RoutingPolicy) string {
			if _, _, err := off.SetPolicy(rp); err != nil {
				t.Fatal(err)
			}
			var dc Decision
			if rej := off.Decide(Input{Kind: body.Chat, Body: chatBody(longSystem+fmt.Sprint(i), convs[i]...)}, &dc); rej != nil {
				t.Fatal(rej)
			}
			defer off.Release(&dc.Held)
			tabs, _ := BuildTables(dc.Policy)
			return tabs["c"].Hosts[tabs["c"].LB.Choose(envoylb.HeaderHash(dc.AffinityHeader()), zeroLoad{}, nil, 0)].Key
		}
		if at(cachePolicy(t, "1", nil)) != at(cachePolicy(t, "2", []uint32{2, 1, 1, 1})) {
			moved++
		}
	}
	if moved == 0 {
		t.Errorf("with the key alone no conversation moved when the weights changed: the test shows nothing")
	}
	t.Logf("a weight change moved %d of %d conversations keyed alone, none with cache-aware placement", moved, n)
}

// Requests sharing a long system prompt go to the engines that were sent
// it, each up to its budget (half again its share), and spill to one that
// was not only when those are all over it: the prompt is prefilled afresh
// at most once per engine, and no engine takes more than its budget.
func TestCachePlacementFollowsThePrefixWithinTheBudget(t *testing.T) {
	r := newCacheRig(t, cachePolicy(t, "1", nil))
	count := map[string]int{}
	holds := map[string]bool{r.send(chatBody(longSystem, "first question")): true}
	const n = 200
	cold := 0
	for i := range n {
		at := r.send(chatBody(longSystem, fmt.Sprintf("question %d", i)))
		count[at]++
		if !holds[at] {
			cold++
			holds[at] = true
		}
	}
	if cold > 3 {
		t.Errorf("%d of %d requests went to an engine that was not sent their prompt before; want at most one per engine", cold, n)
	}
	for a, c := range count {
		if share := float64(c) / n; share > 0.25*(1+budgetSlack)+0.03 {
			t.Errorf("%s took %.2f of the requests (%v); its budget is %.3f", a, share, count, 0.25*(1+budgetSlack))
		}
	}
	// With room in the plan (utilization 0.2) the budget binds loosely: the
	// engine that holds the prompt keeps taking it.
	rp := cachePolicy(t, "1", nil)
	rp.Classes[0].Utilization = 0.2
	light := newCacheRig(t, rp)
	holder := light.send(chatBody(longSystem, "first question"))
	kept := 0
	for i := range n {
		if light.send(chatBody(longSystem, fmt.Sprintf("question %d", i))) == holder {
			kept++
		}
	}
	if kept < n*8/10 {
		t.Errorf("at utilization 0.2 the engine holding the prompt took %d of %d requests; want at least 80%%", kept, n)
	}
	// A request with a prefix nobody was sent follows no one: with every
	// engine as soon, it goes where its key lands (the same at every
	// replica).
	other := chatBody("an unrelated system prompt", "an unrelated question")
	fresh := newCacheRig(t, cachePolicy(t, "1", nil))
	fresh.send(chatBody(longSystem, "first question"))
	var dc Decision
	fresh.now = fresh.now.Add(10 * time.Second) // the prefill long done
	if rej := fresh.d.Decide(Input{Kind: body.Chat, Body: other, Now: fresh.now}, &dc); rej != nil {
		t.Fatal(rej)
	}
	fresh.d.Release(&dc.Held)
	if dc.AffinityHeader() != dc.UnplacedHeader() {
		t.Errorf("a request with no cached prefix anywhere and idle engines was moved off its key")
	}
}

// An engine out of the plan (unhealthy, weight 0 at a lower priority)
// takes nothing; a conversation whose engine leaves the plan moves.
func TestCachePlacementStaysInThePlan(t *testing.T) {
	rp := cachePolicy(t, "1", nil)
	r := newCacheRig(t, rp)
	conv := []string{"a question"}
	at := r.send(chatBody(longSystem, conv...))
	rp2 := cachePolicy(t, "2", nil)
	for _, e := range rp2.Classes[0].Endpoints {
		if e.GetAddress() == at {
			e.Healthy = false
		}
	}
	rp2.Classes[0].Endpoints[(indexOf(rp2, at)+1)%4].Priority = 1 // another one failover only
	failover := rp2.Classes[0].Endpoints[(indexOf(rp2, at)+1)%4].GetAddress()
	if _, _, err := r.d.SetPolicy(rp2); err != nil {
		t.Fatal(err)
	}
	conv = append(conv, "a follow-up")
	for i := range 50 {
		got := r.send(chatBody(longSystem, append(conv, fmt.Sprint(i))...))
		if got == at || got == failover {
			t.Fatalf("request %d went to %s, out of the plan (unhealthy %s, failover-only %s)", i, got, at, failover)
		}
	}
}

func indexOf(rp *policyv1.RoutingPolicy, addr string) int {
	for i, e := range rp.Classes[0].Endpoints {
		if e.GetAddress() == addr {
			return i
		}
	}
	return -1
}

// The index holds at most maxIndexPoints points, oldest out first, and
// still finds the newest.
func TestPrefixIndexIsBounded(t *testing.T) {
	x := newPrefixIndex()
	now := time.Unix(100, 0)
	var c body.Chain
	c.N = 4
	for i := range maxIndexPoints/2 + 10 {
		for j := range c.N {
			c.Points[j] = body.Point{Hash: uint64(i*8 + j + 1), Tokens: uint32(100 * (j + 1))}
		}
		x.record(&c, fmt.Sprintf("10.0.0.%d:80", i%3), now)
	}
	if len(x.slots) > maxIndexPoints || len(x.ring) > maxIndexPoints {
		t.Fatalf("index holds %d points (ring %d), bound %d", len(x.slots), len(x.ring), maxIndexPoints)
	}
	hosts := []envoylb.Host{{Key: "10.0.0.0:80"}, {Key: "10.0.0.1:80"}, {Key: "10.0.0.2:80"}}
	cached, depth := make([]int, 3), make([]int, 3)
	x.cached(&c, hosts, cached, depth, now)
	last := (maxIndexPoints/2 + 9) % 3
	if cached[last] != 400 {
		t.Errorf("the newest chain's engine %d has %v cached, want its whole 400 tokens", last, cached)
	}
	x.cached(&c, hosts, cached, depth, now.Add(prefixMaxAge+time.Second))
	if cached[last] != 0 {
		t.Errorf("an entry older than prefixMaxAge is still believed: %v", cached)
	}
}

// A class with affinity off gets no prefix matching: requests sharing a
// long prompt spread by when each engine is free instead of following the
// engine that holds it.
func TestCachePlacementWithAffinityOff(t *testing.T) {
	for _, off := range []bool{false, true} {
		rp := cachePolicy(t, "1", nil)
		rp.Classes[0].Affinity = &policyv1.Affinity{Off: off}
		rp.Classes[0].Utilization = 0.2 // room: the budget lets a holder keep a hot prompt
		r := newCacheRig(t, rp)
		used := map[string]int{}
		for i := range 8 {
			used[r.send(chatBody(longSystem, fmt.Sprintf("question %d", i)))]++
		}
		switch {
		case off && len(used) < 3:
			t.Errorf("affinity off: 8 requests sharing a prompt went to %v; want them spread by when each engine is free", used)
		case !off && len(used) != 1:
			t.Errorf("affinity on: 8 requests sharing a prompt went to %v; want the engine that holds it", used)
		}
	}
}
