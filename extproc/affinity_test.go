package extproc

import (
	"fmt"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/inferlb/inferlb/api/headers"
	policyv1 "github.com/inferlb/inferlb/api/policy/v1"
	"github.com/inferlb/inferlb/extproc/body"
)

// conversation builds the chat bodies of a conversation's turns: the first
// user message is preamble + question, then answers and follow-ups.
func conversation(preamble string, id, turns int) []string {
	var out []string
	msgs := []string{fmt.Sprintf(`{"role":"user","content":%q}`, preamble+fmt.Sprintf("question %d about topic %d", id, id*7))}
	for t := 1; t <= turns; t++ {
		out = append(out, `{"model":"m","messages":[`+strings.Join(msgs, ",")+`]}`)
		msgs = append(msgs, fmt.Sprintf(`{"role":"assistant","content":"answer %d of conversation %d"}`, t, id),
			fmt.Sprintf(`{"role":"user","content":"follow-up %d of conversation %d"}`, t, id))
	}
	return out
}

var testPreamble = strings.Repeat("These shared instructions open every request of the application. ", 70) // ~4.6 KB

func parse(t testing.TB, b string) *body.Request {
	t.Helper()
	var r body.Request
	if err := body.Parse([]byte(b), body.Chat, &r); err != nil {
		t.Fatal(err)
	}
	return &r
}

func compiled(t testing.TB, a *policyv1.Affinity) affinity {
	t.Helper()
	out, err := compileAffinity(a)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// points returns the chain point hashes of a body shallower than its anchor.
func preAnchor(t testing.TB, b string) []uint64 {
	r := parse(t, b)
	var out []uint64
	for _, p := range r.Chain.At()[:r.Chain.Anchor] {
		out = append(out, p.Hash)
	}
	return out
}

func table(rules ...*policyv1.PrefixRule) *policyv1.Affinity {
	return &policyv1.Affinity{Table: &policyv1.PrefixTable{Version: "t1", Rules: rules}}
}

func TestKeySourcesInClassOrder(t *testing.T) {
	br := parse(t, `{"model":"m","user":"u1","prompt_cache_key":"pk","messages":[{"role":"user","content":"hello"}]}`)
	for _, c := range []struct {
		keys []policyv1.KeySource
		sess string
		want string
	}{
		{nil, "s1", "session"},
		{nil, "", "prompt_cache_key"},
		{[]policyv1.KeySource{policyv1.KeySource_KEY_SOURCE_USER, policyv1.KeySource_KEY_SOURCE_SESSION}, "s1", "user"},
		{[]policyv1.KeySource{policyv1.KeySource_KEY_SOURCE_PREFIX, policyv1.KeySource_KEY_SOURCE_SESSION}, "s1", "prefix"},
		{[]policyv1.KeySource{policyv1.KeySource_KEY_SOURCE_SESSION}, "", ""},
	} {
		a := compiled(t, &policyv1.Affinity{Keys: c.keys})
		d := a.key(c.sess, br, nil)
		if d.Source != c.want || (c.want == "") != (d.Key == 0) {
			t.Errorf("keys %v session %q: source %q key %x, want %q", c.keys, c.sess, d.Source, d.Key, c.want)
		}
	}
	// Equal values from different sources are different keys.
	a := compiled(t, nil)
	same := parse(t, `{"model":"m","user":"x","messages":[{"role":"user","content":"hello"}]}`)
	if a.key("x", same, nil).Key == a.key("", same, nil).Key {
		t.Fatal("session x and user x share a key")
	}
}

// The failure: every prompt begins with one long preamble inside
// the first user message. Without a table each conversation is keyed on its
// own first turn: distinct across conversations, the same on every turn;
// with the preamble's points hot (DEEPER), nothing changes; with them
// SPREAD over 4, conversations share 4 keys and still keep theirs.
func TestPrefixKeysUnderASharedPreamble(t *testing.T) {
	shared := preAnchor(t, conversation(testPreamble, 0, 1)[0])
	if len(shared) < 3 {
		t.Fatalf("%d points inside the preamble", len(shared))
	}
	deeper, spread := []*policyv1.PrefixRule{}, []*policyv1.PrefixRule{}
	for _, h := range shared {
		deeper = append(deeper, &policyv1.PrefixRule{Prefix: h, Action: policyv1.PrefixRule_ACTION_DEEPER, Spread: 4})
	}
	// Only the deepest hot point needs the rule for SPREAD.
	spread = append(spread, &policyv1.PrefixRule{Prefix: shared[len(shared)-1], Action: policyv1.PrefixRule_ACTION_SPREAD, Spread: 4})
	for _, c := range []struct {
		name     string
		aff      *policyv1.Affinity
		distinct int // keys over 200 conversations (0: one per conversation)
		kind     string
	}{
		{"no table", nil, 0, "conversation"},
		{"deeper", table(deeper...), 0, "conversation"},
		{"spread", table(spread...), 4, "spread"},
	} {
		t.Run(c.name, func(t *testing.T) {
			a := compiled(t, c.aff)
			keys := map[uint64]int{}
			for id := 0; id < 200; id++ {
				var first uint64
				for turn, b := range conversation(testPreamble, id, 4) {
					d := a.key("", parse(t, b), nil)
					if d.Kind != c.kind {
						t.Fatalf("conversation %d turn %d: kind %q, want %q", id, turn+1, d.Kind, c.kind)
					}
					if turn == 0 {
						first = d.Key
						keys[first]++
					} else if d.Key != first {
						t.Fatalf("conversation %d: turn %d moved from key %x to %x", id, turn+1, first, d.Key)
					}
				}
			}
			want := c.distinct
			if want == 0 {
				want = 200
			}
			if len(keys) != want {
				t.Fatalf("%d distinct keys over 200 conversations, want %d", len(keys), want)
			}
			for k, n := range keys {
				if c.distinct > 0 && (n < 200/c.distinct/2 || n > 2*200/c.distinct) {
					t.Errorf("spread key %x carries %d of 200 conversations", k, n)
				}
			}
		})
	}
}

// A GROUP rule on a shared cold prefix keys every conversation that shares
// it on that prefix; others keep their own.
func TestGroupRule(t *testing.T) {
	doc := strings.Repeat("a long shared document that several conversations discuss ", 40)
	g := preAnchor(t, conversation(doc, 0, 1)[0])
	a := compiled(t, table(&policyv1.PrefixRule{Prefix: g[len(g)-1], Action: policyv1.PrefixRule_ACTION_GROUP}))
	var groupKey uint64
	for id := 0; id < 20; id++ {
		for _, b := range conversation(doc, id, 3) {
			d := a.key("", parse(t, b), nil)
			if d.Kind != "group" {
				t.Fatalf("kind %q, want group", d.Kind)
			}
			if groupKey == 0 {
				groupKey = d.Key
			}
			if d.Key != groupKey {
				t.Fatalf("conversation %d left the group", id)
			}
		}
	}
	other := a.key("", parse(t, conversation("unrelated ", 1, 1)[0]), nil)
	if other.Kind != "conversation" || other.Key == groupKey {
		t.Fatalf("an unrelated conversation: %+v", other)
	}
}

// Few-shot prompts: the first user message (the anchor) is shared by all.
// With the shared messages hot, the key is the first point past them, the
// same on every later turn. Identical prompts (every point hot) spread over
// the rule's R keys.
func TestHotAnchorWalksDeeper(t *testing.T) {
	fewShot := `{"role":"system","content":"classify"},{"role":"user","content":"example one"},{"role":"assistant","content":"label one"},{"role":"user","content":"example two"},{"role":"assistant","content":"label two"}`
	body := func(id, turns int) []string {
		var out []string
		msgs := fewShot + fmt.Sprintf(`,{"role":"user","content":"real input %d"}`, id)
		for t := 0; t < turns; t++ {
			out = append(out, `{"model":"m","messages":[`+msgs+`]}`)
			msgs += fmt.Sprintf(`,{"role":"assistant","content":"out %d"},{"role":"user","content":"more %d"}`, t, t)
		}
		return out
	}
	r := parse(t, body(0, 1)[0])
	var rules []*policyv1.PrefixRule
	for _, p := range r.Chain.At()[:r.Chain.N-1] { // all but the conversation's own last message
		rules = append(rules, &policyv1.PrefixRule{Prefix: p.Hash, Action: policyv1.PrefixRule_ACTION_DEEPER, Spread: 3})
	}
	a := compiled(t, table(rules...))
	seen := map[uint64]bool{}
	for id := 0; id < 50; id++ {
		var first uint64
		for turn, b := range body(id, 3) {
			d := a.key("", parse(t, b), nil)
			if d.Kind != "conversation" || d.Point <= r.Chain.Anchor {
				t.Fatalf("conversation %d turn %d: %+v", id, turn, d)
			}
			if turn == 0 {
				first = d.Key
			} else if d.Key != first {
				t.Fatalf("conversation %d moved at turn %d", id, turn+1)
			}
		}
		seen[first] = true
	}
	if len(seen) != 50 {
		t.Fatalf("%d keys for 50 conversations", len(seen))
	}
	// Identical prompts: all points hot.
	rules = append(rules, &policyv1.PrefixRule{Prefix: r.Chain.Points[r.Chain.N-1].Hash, Action: policyv1.PrefixRule_ACTION_DEEPER, Spread: 3})
	a = compiled(t, table(rules...))
	n := uint64(0)
	fresh := func() uint64 { n++; return mix(n) }
	keys := map[uint64]int{}
	for i := 0; i < 300; i++ {
		d := a.key("", r, fresh)
		if d.Kind != "spread" || d.Spread != 3 {
			t.Fatalf("identical prompts: %+v", d)
		}
		keys[d.Key]++
	}
	if len(keys) != 3 {
		t.Fatalf("identical prompts spread over %d keys, want 3", len(keys))
	}
}

// decide runs one request through a Server's state machine and returns
// the affinity key header and whether it was admitted.
func decide(t testing.TB, s *Server, session, b string) (key string, admitted bool) {
	t.Helper()
	hs := []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/chat/completions")}}
	if session != "" {
		hs = append(hs, &corev3.HeaderValue{Key: headers.SessionID, RawValue: []byte(session)})
	}
	st := &stream{}
	if _, err := s.step(st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{
		RequestHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: hs}}}}); err != nil {
		t.Fatal(err)
	}
	r, err := s.step(st, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: []byte(b), EndOfStream: true}}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.abandon(st.id)
	if im := r.GetImmediateResponse(); im != nil {
		if im.GetStatus().GetCode() != 429 {
			t.Fatalf("status %v: %s", im.GetStatus().GetCode(), im.GetBody())
		}
		return "", false
	}
	for _, h := range r.GetRequestBody().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == headers.AffinityKey {
			return string(h.GetHeader().GetRawValue()), true
		}
	}
	t.Fatalf("no affinity key in %v", r)
	return "", false
}

func affinityPolicy(aff *policyv1.Affinity, shed float64) *policyv1.RoutingPolicy {
	cp := &policyv1.ClassPolicy{Name: "chat", Cluster: "c", Model: "m", Affinity: aff}
	if shed > 0 {
		cp.ShedFractionByLevel = map[uint32]float64{0: shed}
	}
	return &policyv1.RoutingPolicy{NodeId: "n", Version: "1", Priorities: []*policyv1.Priority{{Name: "p", Level: 0}},
		DefaultPriority: "p", Classes: []*policyv1.ClassPolicy{cp}}
}

// Active-active replicas: two ext_proc instances with the same policy give
// every request the same key, whatever each has seen before (their fresh
// counters differ: one replica has decided other requests first).
func TestReplicasAgree(t *testing.T) {
	shared := preAnchor(t, conversation(testPreamble, 0, 1)[0])
	pol := affinityPolicy(table(
		&policyv1.PrefixRule{Prefix: shared[0], Action: policyv1.PrefixRule_ACTION_DEEPER, Spread: 2},
		&policyv1.PrefixRule{Prefix: shared[len(shared)-1], Action: policyv1.PrefixRule_ACTION_SPREAD, Spread: 6}), 0)
	var reps [2]*Server
	for i := range reps {
		reps[i] = New(Options{Registry: prometheus.NewRegistry()})
		if err := reps[i].SetPolicy(pol); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 17; i++ { // replica 1 has history
		decide(t, reps[1], "", `{"model":"m","messages":[{"role":"system","content":"no user message"}]}`)
	}
	bodies := append(conversation(testPreamble, 1, 3), conversation("another preamble", 2, 2)...)
	bodies = append(bodies, `{"model":"m","user":"alice","messages":[{"role":"user","content":"x"}]}`)
	for _, b := range bodies {
		k0, _ := decide(t, reps[0], "", b)
		k1, _ := decide(t, reps[1], "", b)
		if k0 != k1 {
			t.Fatalf("replicas disagree: %s vs %s for %.80s", k0, k1, b)
		}
	}
	if k0, _ := decide(t, reps[0], "sess-9", bodies[0]); k0 != func() string { k, _ := decide(t, reps[1], "sess-9", bodies[0]); return k }() {
		t.Fatal("replicas disagree on a session key")
	}
}

// Affinity off: every request gets a fresh key (Envoy spreads them), yet a
// conversation is shed or admitted as a whole.
func TestAffinityOff(t *testing.T) {
	s := New(Options{Registry: prometheus.NewRegistry()})
	if err := s.SetPolicy(affinityPolicy(&policyv1.Affinity{Off: true}, 0.5)); err != nil {
		t.Fatal(err)
	}
	keys := map[string]bool{}
	shed := 0
	for id := 0; id < 40; id++ {
		conv := conversation("p ", id, 3)
		var first bool
		for turn, b := range conv {
			k, ok := decide(t, s, "", b)
			if turn == 0 {
				first = ok
			} else if ok != first {
				t.Fatalf("conversation %d: turn %d admitted %v, turn 1 %v", id, turn+1, ok, first)
			}
			if ok {
				if keys[k] {
					t.Fatalf("key %s twice with affinity off", k)
				}
				keys[k] = true
			}
		}
		if !first {
			shed++
		}
	}
	if shed < 8 || shed > 32 {
		t.Fatalf("%d of 40 conversations shed at fraction 0.5", shed)
	}
}

func TestCompileAffinityRejects(t *testing.T) {
	for _, c := range []struct {
		aff  *policyv1.Affinity
		want string
	}{
		{&policyv1.Affinity{Keys: []policyv1.KeySource{9}}, "affinity.keys[0]: unknown key source"},
		{&policyv1.Affinity{Keys: []policyv1.KeySource{policyv1.KeySource_KEY_SOURCE_USER, policyv1.KeySource_KEY_SOURCE_USER}}, "affinity.keys[1]: user listed twice"},
		{table(&policyv1.PrefixRule{Prefix: 1, Action: policyv1.PrefixRule_ACTION_SPREAD}), "affinity.table.rules[0] (0000000000000001): spread 0"},
		{table(&policyv1.PrefixRule{Prefix: 1}), "unknown action"},
		{table(&policyv1.PrefixRule{Prefix: 1, Action: policyv1.PrefixRule_ACTION_GROUP}, &policyv1.PrefixRule{Prefix: 1, Action: policyv1.PrefixRule_ACTION_DEEPER}), "rules[1]: prefix 0000000000000001 listed twice"},
		{table(&policyv1.PrefixRule{Prefix: 2, Action: policyv1.PrefixRule_ACTION_SPREAD, Spread: 5000}), "spread 5000 above 1024"},
	} {
		_, err := Compile(affinityPolicy(c.aff, 0), func(string) *classState { return newClassState() })
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), `classes[0] ("chat")`) {
			t.Errorf("%v: error %v, want %q", c.aff, err, c.want)
		}
	}
}

// The sketch: heavy hitters are kept whatever the noise, with counts that
// overestimate by at most their error bound; its size is bounded.
func TestPrefixSketch(t *testing.T) {
	sk := newPrefixSketch(16)
	truth := map[uint64]uint64{}
	n := uint64(0)
	for i := 0; i < 20000; i++ {
		var h uint64
		switch {
		case i%4 == 0:
			h = 1 // a quarter of the stream
		case i%10 == 1:
			h = 2 // a tenth
		default:
			n++
			h = 1000 + n // unique noise
		}
		truth[h]++
		sk.add(&body.Point{Hash: h, Depth: uint32(h)}, 0, 10, bitOf(uint64(i)), bitOf(uint64(i)))
	}
	if len(sk.heap) != 16 {
		t.Fatalf("%d entries, want 16", len(sk.heap))
	}
	// The noise that replaced evicted entries once is not reported.
	rep := sk.report("c")
	if len(rep.Counts) != 2 {
		t.Fatalf("%d entries reported, want the 2 heavy hitters", len(rep.Counts))
	}
	for i, c := range rep.Counts {
		if i > 0 && c.Requests > rep.Counts[i-1].Requests {
			t.Fatal("counts not sorted")
		}
		if c.Requests < truth[c.Prefix] || c.Requests-c.RequestsError > truth[c.Prefix] {
			t.Fatalf("point %d: count %d (error %d), truth %d", c.Prefix, c.Requests, c.RequestsError, truth[c.Prefix])
		}
	}
	if rep.Counts[0].Prefix != 1 || rep.Counts[1].Prefix != 2 || rep.Counts[0].Requests != 5000 || rep.Counts[0].RequestsError != 0 {
		t.Fatalf("heavy hitters: %v %v", rep.Counts[0], rep.Counts[1])
	}
}

// The Observer's report: one class's totals and, for prefix-keyed requests,
// the points their walks visited with a parent link and their
// continuations, the preamble's points counted once per request.
func TestPrefixReport(t *testing.T) {
	s := New(Options{Registry: prometheus.NewRegistry()})
	if err := s.SetPolicy(affinityPolicy(nil, 0)); err != nil {
		t.Fatal(err)
	}
	for id := 0; id < 30; id++ {
		for _, b := range conversation(testPreamble, id, 2) {
			decide(t, s, "", b)
		}
	}
	decide(t, s, "sess", conversation(testPreamble, 99, 1)[0]) // session-keyed: totals only
	rep := s.Observer().Flush(time.Now())
	if len(rep.Prefixes) != 1 || rep.Prefixes[0].Class != "chat" || rep.Prefixes[0].Requests != 61 {
		t.Fatalf("prefix reports %v", rep.Prefixes)
	}
	shared := preAnchor(t, conversation(testPreamble, 0, 1)[0])
	byHash := map[uint64]*policyv1.PrefixCount{}
	for _, c := range rep.Prefixes[0].Counts {
		byHash[c.Prefix] = c
	}
	for i, h := range shared {
		c := byHash[h]
		if c == nil || c.Requests != 60 || c.RequestsError != 0 || c.DepthBytes != uint32(body.FirstPointBytes<<i) {
			t.Fatalf("preamble point %d: %v", i, c)
		}
		if (i == 0) != (c.Parent == 0) || (i > 0 && c.Parent != shared[i-1]) {
			t.Fatalf("preamble point %d: parent %x", i, c.Parent)
		}
		// Each preamble point continues to the next; the last one to
		// every conversation's own first message.
		bits := popcount(c.Continuations)
		if last := i == len(shared)-1; last && bits < 15 || !last && bits != 1 {
			t.Fatalf("preamble point %d: %d continuation bits for 30 conversations", i, bits)
		}
		// Every preamble point is on 30 conversations' way (their
		// anchors differ), however it continues.
		if bits := popcount(c.Conversations); bits < 15 {
			t.Fatalf("preamble point %d: %d conversation bits for 30 conversations", i, bits)
		}
	}
	// A conversation's own points past the preamble: its two turns share
	// its anchor, one conversation bit.
	for _, c := range rep.Prefixes[0].Counts {
		if c.DepthBytes > uint32(len(testPreamble)) && c.Requests == 2 && popcount(c.Conversations) != 1 {
			t.Fatalf("a conversation's own point %x: %d conversation bits, want 1", c.Prefix, popcount(c.Conversations))
		}
	}
}

// mooncakePrompt is a single-message prompt (no chat structure to split
// on): a shared opening of shared bytes, then text of its own.
func mooncakePrompt(shared, own string) string {
	return fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":%q}]}`, shared+own)
}

// The table's shared-prefix depth keys single-message prompts that share
// an opening on their first point before the anchor that deep, from the
// first request; a hot rule there sends the walk deeper; without the depth
// (or for a prompt whose anchor comes first) every prompt keeps its own
// conversation key, exactly as without a table.
func TestSharedDepthKeysSharedOpenings(t *testing.T) {
	doc := strings.Repeat("a long retrieved document that many prompts open with, ", 200) // ~11 KB
	rows := []string{
		mooncakePrompt(doc, "first question"),
		mooncakePrompt(doc, "second question, a different one"),
		mooncakePrompt(doc+strings.Repeat("more context ", 800), "a third, longer"),
	}
	none := compiled(t, table())
	depth := compiled(t, &policyv1.Affinity{Table: &policyv1.PrefixTable{Version: "d", SharedDepthBytes: 8192}})
	var keys []uint64
	for i, b := range rows {
		r := parse(t, b)
		own := none.key("", r, nil)
		if own.Kind != "conversation" || own.Point != r.Chain.Anchor {
			t.Fatalf("row %d without a depth: %+v, want its anchor", i, own)
		}
		d := depth.key("", r, nil)
		pt := r.Chain.Points[d.Point]
		if d.Kind != "group" || !d.Shared || pt.Depth != 8192 || d.Point >= r.Chain.Anchor || d.Walked != d.Point+1 {
			t.Fatalf("row %d with depth 8192: %+v (point at %d bytes)", i, d, pt.Depth)
		}
		keys = append(keys, d.Key)
		if i > 0 && own.Key == keys[0] {
			t.Fatal("the conversation key is the group key")
		}
	}
	if keys[0] != keys[1] || keys[1] != keys[2] {
		t.Fatalf("rows sharing 11 KB got keys %x", keys)
	}
	// The same key a GROUP rule at that point gives: a rule learned later
	// does not move them.
	r := parse(t, rows[0])
	g := compiled(t, table(&policyv1.PrefixRule{Prefix: r.Chain.Points[depth.key("", r, nil).Point].Hash, Action: policyv1.PrefixRule_ACTION_GROUP}))
	if k := g.key("", r, nil).Key; k != keys[0] {
		t.Fatalf("GROUP rule key %x, depth key %x", k, keys[0])
	}
	// A hot point at the depth: the walk passes it, to the next point that
	// deep before the anchor (the third row's 16 KB point), or the anchor.
	hot := compiled(t, &policyv1.Affinity{Table: &policyv1.PrefixTable{Version: "h", SharedDepthBytes: 8192,
		Rules: []*policyv1.PrefixRule{{Prefix: r.Chain.Points[depth.key("", r, nil).Point].Hash, Action: policyv1.PrefixRule_ACTION_DEEPER, Spread: 4}}}})
	if d := hot.key("", parse(t, rows[0]), nil); d.Kind != "conversation" || d.Point != parse(t, rows[0]).Chain.Anchor {
		t.Fatalf("row 0 past a hot depth point: %+v", d)
	}
	if d, r2 := hot.key("", parse(t, rows[2]), nil), parse(t, rows[2]); d.Kind != "group" || r2.Chain.Points[d.Point].Depth != 16384 {
		t.Fatalf("row 2 past a hot depth point: %+v", d)
	}
	// A prompt whose anchor comes before the depth keeps its own key.
	short := parse(t, mooncakePrompt("a short prompt ", "of its own"))
	if d, o := depth.key("", short, nil), none.key("", short, nil); d.Kind != "conversation" || d.Key != o.Key {
		t.Fatalf("a short prompt: %+v, without the depth %+v", d, o)
	}
	// A chat conversation with a long first message: every turn keeps the
	// one key (the depth point is inside the first message, which every
	// turn repeats).
	var first uint64
	for i, b := range conversation(doc, 3, 4) {
		d := depth.key("", parse(t, b), nil)
		if i == 0 {
			first = d.Key
		}
		if d.Key != first {
			t.Fatalf("turn %d moved", i)
		}
	}
}

func popcount(x uint64) int {
	n := 0
	for ; x != 0; x &= x - 1 {
		n++
	}
	return n
}

// Going from R to R+1 slots moves about 1/(R+1) of the conversations, and
// slots are used evenly.
func TestJumpHash(t *testing.T) {
	const n = 20000
	moved := 0
	count := make([]int, 8)
	for i := uint64(0); i < n; i++ {
		k := mix(i)
		a, b := jump(k, 7), jump(k, 8)
		if a != b {
			moved++
			if b != 7 {
				t.Fatalf("key moved from slot %d to %d, not to the new slot", a, b)
			}
		}
		count[b]++
	}
	if f := float64(moved) / n; f < 0.1 || f > 0.15 {
		t.Fatalf("%.3f of keys moved from 7 to 8 slots, want about 1/8", f)
	}
	for s, c := range count {
		if c < n/8*9/10 || c > n/8*11/10 {
			t.Fatalf("slot %d holds %d of %d keys", s, c, n)
		}
	}
}

// ExplainKey agrees with the server's decision and says why.
func TestExplainKey(t *testing.T) {
	shared := preAnchor(t, conversation(testPreamble, 0, 1)[0])
	pol := affinityPolicy(table(&policyv1.PrefixRule{Prefix: shared[len(shared)-1], Action: policyv1.PrefixRule_ACTION_DEEPER, Spread: 4}), 0)
	s := New(Options{Registry: prometheus.NewRegistry()})
	if err := s.SetPolicy(pol); err != nil {
		t.Fatal(err)
	}
	b := conversation(testPreamble, 3, 2)[1]
	x, err := s.Policy().ExplainKey("/v1/chat/completions", "", "", []byte(b))
	if err != nil {
		t.Fatal(err)
	}
	want, _ := decide(t, s, "", b)
	if x.Header != want || x.Class != "chat" || x.Kind != "conversation" || x.Hot != len(shared)-1 || !x.Points[x.Point].Anchor {
		t.Fatalf("explanation %+v, server's key %s", x, want)
	}
	if !strings.Contains(x.Why, "is hot, so the key goes deeper") || !strings.Contains(x.Why, "the anchor") || !strings.HasPrefix(x.Why, "no x-session-id header; no prompt_cache_key; no user; ") {
		t.Fatalf("why: %s", x.Why)
	}
	if x.Points[x.Hot].Rule == "" || x.TableRules != 1 {
		t.Fatalf("rules not shown: %+v", x.Points)
	}
	x, err = s.Policy().ExplainKey("/v1/chat/completions", "s-1", "", []byte(b))
	if want, _ := decide(t, s, "s-1", b); err != nil || x.Source != "session" || x.Header != want {
		t.Fatalf("session: %+v %v", x, err)
	}
	for _, c := range []struct{ path, body, want string }{
		{"/v1/embeddings", b, `path "/v1/embeddings"`},
		{"/v1/chat/completions", `{"model":"other","messages":[{"role":"user","content":"x"}]}`, `model "other": no class`},
		{"/v1/chat/completions", `{"model":`, "body: invalid JSON"},
	} {
		if _, err := s.Policy().ExplainKey(c.path, "", "", []byte(c.body)); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %s: %v, want %q", c.path, c.body, err, c.want)
		}
	}
}
