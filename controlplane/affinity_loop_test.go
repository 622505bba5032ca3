package controlplane

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/extproc"
	"github.com/inferlb/inferlb/extproc/body"
)

// The learning loop in process, with the real parts on both sides:
// ext_proc's Decider keys requests and fills its prefix sketch, its report
// goes through the Reports intake into the prefix view, the cycle turns the
// view into the split table, and the Decider applies the policy. Two kinds
// of traffic in one class (4 engines: hot above 12.5% of the class):
//
//   - shared documents: 10 documents of ~1,300 tokens, each the system
//     message of 3 conversations (5% of the class each: cold, shared), must
//     become GROUP rules, after which a document's conversations share one
//     key, every turn;
//   - one preamble opening the first user message of 60 more conversations
//     (half the class: hot, shared) must become a DEEPER rule, which keeps
//     each of them on its own key.
func TestLearnedSplitTableRoundTrip(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	in, err := signals.NewIntake(signals.IntakeOptions{Window: 10 * time.Second, Nodes: []string{"fe-east", "fe-west"},
		Classes: []string{"chat"}, Priorities: []string{"high", "low"}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewController(testFleet(t), DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	dec := extproc.NewDecider(now)
	step := func() *Result {
		t.Helper()
		dem, ev := in.Snapshot(now)
		r, err := c.Step(ctx, Inputs{Now: now, Engines: engines(now, nil), Demand: dem, Evidence: ev, Prefixes: in.Prefixes(now)})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := dec.SetPolicy(r.Nodes["fe-east"].Resources.Policy); err != nil {
			t.Fatal(err)
		}
		return r
	}
	step() // the first policy: no table yet

	words := func(seed, n int) string {
		var sb strings.Builder
		for i := 0; i < n; i++ {
			fmt.Fprintf(&sb, "w%d ", (seed*7919+i*104729)%100003)
		}
		return sb.String()
	}
	preamble := words(1, 900)
	type conv struct {
		msgs  []string
		doc   int // -1: the preamble's
		keys  []uint64
		kinds []string
	}
	var convs []*conv
	for d := 0; d < 10; d++ {
		doc := words(100+d, 1300)
		for q := 0; q < 3; q++ {
			convs = append(convs, &conv{doc: d, msgs: []string{
				fmt.Sprintf(`{"role":"system","content":%q}`, doc),
				fmt.Sprintf(`{"role":"user","content":"question %d about document %d"}`, q, d)}})
		}
	}
	for i := 0; i < 60; i++ {
		convs = append(convs, &conv{doc: -1, msgs: []string{fmt.Sprintf(`{"role":"user","content":%q}`, preamble+fmt.Sprintf("my own question %d", i))}})
	}
	// send sends every conversation's next turn and records its key.
	send := func(turn int) {
		for i, cv := range convs {
			if turn > 0 {
				cv.msgs = append(cv.msgs, fmt.Sprintf(`{"role":"assistant","content":"answer %d to %d"}`, turn, i),
					fmt.Sprintf(`{"role":"user","content":"follow-up %d of %d"}`, turn, i))
			}
			var dc extproc.Decision
			b := `{"model":"m","max_tokens":50,"messages":[` + strings.Join(cv.msgs, ",") + `]}`
			if rej := dec.Decide(extproc.Input{Kind: body.Chat, Priority: "high", Body: []byte(b)}, &dc); rej != nil {
				t.Fatalf("conversation %d: %v", i, rej)
			}
			dec.Release(&dc.Held)
			cv.keys, cv.kinds = append(cv.keys, dc.KeyHash), append(cv.kinds, dc.Key.Kind)
		}
	}
	report := func() {
		now = now.Add(time.Second)
		rep := dec.Observer().Flush(now)
		rep.NodeId, rep.Instance = "fe-east", "t"
		if err := in.Report(ctx, rep); err != nil {
			t.Fatal(err)
		}
	}
	send(0)
	send(1)
	report()
	r := step()
	av := r.Affinity["chat"]
	groups, deeper := 0, 0
	for _, rule := range av.Rules {
		switch rule.Action {
		case "group":
			groups++
		case "deeper":
			deeper++
		}
	}
	for _, rule := range av.Rules {
		t.Logf("%s %s: %.1f%% of the class, %d tokens, %.0f continuations: %s", rule.Action, rule.Prefix, 100*rule.Share, rule.DepthTokens, rule.Continuations, rule.Why)
	}
	if groups != 10 || deeper != 1 || len(av.Rules) != 11 {
		t.Fatalf("table: %d groups, %d deeper, rules %+v", groups, deeper, av.Rules)
	}
	if rules := r.Nodes["fe-west"].Resources.Policy.GetClasses()[0].GetAffinity().GetTable(); rules.GetVersion() != r.Nodes["fe-east"].Resources.Policy.GetClasses()[0].GetAffinity().GetTable().GetVersion() {
		t.Fatal("the two frontends got different tables")
	}
	// Under the table: a document's conversations share its key from the
	// next turn on, and keep it; the preamble's conversations keep their
	// own keys.
	send(2)
	send(3)
	docKey := map[int]uint64{}
	seen := map[uint64]bool{}
	for i, cv := range convs {
		if cv.doc < 0 {
			if cv.kinds[2] != "conversation" || cv.keys[2] != cv.keys[0] || cv.keys[3] != cv.keys[0] || seen[cv.keys[2]] {
				t.Fatalf("preamble conversation %d: kinds %v keys %x", i, cv.kinds, cv.keys)
			}
			seen[cv.keys[2]] = true
			continue
		}
		if cv.kinds[2] != "group" || cv.keys[3] != cv.keys[2] {
			t.Fatalf("document conversation %d: kinds %v keys %x", i, cv.kinds, cv.keys)
		}
		if k, ok := docKey[cv.doc]; ok && k != cv.keys[2] {
			t.Fatalf("document %d's conversations have different keys", cv.doc)
		}
		docKey[cv.doc] = cv.keys[2]
	}
	if len(docKey) != 10 {
		t.Fatalf("%d group keys for 10 documents", len(docKey))
	}
	// The traffic goes on alike: the table stands.
	report()
	if r := step(); r.Affinity["chat"].Changed != 0 || len(r.Affinity["chat"].Rules) != 11 {
		t.Fatalf("the table moved at steady traffic: %+v", r.Affinity["chat"])
	}
}

// The shared-prefix depth learned in the loop, with the real parts: ext_proc
// keys Mooncake-shaped prompts (one user message each, no boundary where
// they diverge) on their anchors, reports them, and the cycle publishes a
// depth once pairs of them are seen sharing ~1,700 tokens; from then on, a
// new prompt family that nobody has seen lands on one key from its first
// request, and prompts that share nothing keep keys of their own.
func TestLearnedSharedDepthRoundTrip(t *testing.T) {
	ctx := context.Background()
	now := time.Unix(1_800_000_000, 0)
	in, err := signals.NewIntake(signals.IntakeOptions{Window: 10 * time.Second, Nodes: []string{"fe-east", "fe-west"},
		Classes: []string{"chat"}, Priorities: []string{"high", "low"}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	c, err := NewController(testFleet(t), DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	dec := extproc.NewDecider(now)
	step := func() *Result {
		t.Helper()
		dem, ev := in.Snapshot(now)
		r, err := c.Step(ctx, Inputs{Now: now, Engines: engines(now, nil), Demand: dem, Evidence: ev, Prefixes: in.Prefixes(now)})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := dec.SetPolicy(r.Nodes["fe-east"].Resources.Policy); err != nil {
			t.Fatal(err)
		}
		return r
	}
	step()
	words := func(seed, n int) string {
		var sb strings.Builder
		for i := 0; i < n; i++ {
			fmt.Fprintf(&sb, "w%d ", (seed*7919+i*104729)%100003)
		}
		return sb.String()
	}
	key := func(text string) extproc.KeyDecision {
		t.Helper()
		var dc extproc.Decision
		b := fmt.Sprintf(`{"model":"m","max_tokens":20,"messages":[{"role":"user","content":%q}]}`, text)
		if rej := dec.Decide(extproc.Input{Kind: body.Chat, Priority: "high", Body: []byte(b)}, &dc); rej != nil {
			t.Fatal(rej)
		}
		dec.Release(&dc.Held)
		return dc.Key
	}
	// 10 families of 2 rows sharing 1,700 words (the second extends the
	// first, as a Mooncake row extends an earlier one), 20 rows alone.
	for f := 0; f < 10; f++ {
		base := words(1000+f, 1700)
		if k := key(base + words(2000+f, 200)); k.Kind != "conversation" {
			t.Fatalf("before the table: %+v", k)
		}
		key(base + words(3000+f, 600))
	}
	for i := 0; i < 20; i++ {
		key(words(4000+i, 2000))
	}
	now = now.Add(time.Second)
	rep := dec.Observer().Flush(now)
	rep.NodeId, rep.Instance = "fe-east", "t"
	if err := in.Report(ctx, rep); err != nil {
		t.Fatal(err)
	}
	r := step()
	av := r.Affinity["chat"]
	t.Logf("depth %d: %s", av.SharedDepthBytes, av.SharedWhy)
	if av.SharedDepthBytes == 0 {
		t.Fatalf("no shared-prefix depth learned: %+v", av)
	}
	east := r.Nodes["fe-east"].Resources.Policy.GetClasses()[0].GetAffinity().GetTable()
	west := r.Nodes["fe-west"].Resources.Policy.GetClasses()[0].GetAffinity().GetTable()
	if east.GetSharedDepthBytes() != av.SharedDepthBytes || west.GetSharedDepthBytes() != av.SharedDepthBytes || east.GetVersion() != west.GetVersion() {
		t.Fatalf("published tables: east %v, west %v", east, west)
	}
	// A family never seen: one key from its first row.
	base := words(9000, 1700)
	var fam []uint64
	for i := 0; i < 3; i++ {
		k := key(base + words(9100+i, 300*(i+1)))
		if k.Kind != "group" || !k.Shared {
			t.Fatalf("new family row %d: %+v", i, k)
		}
		fam = append(fam, k.Key)
	}
	if fam[0] != fam[1] || fam[1] != fam[2] {
		t.Fatalf("a new family's rows got keys %x", fam)
	}
	seen := map[uint64]bool{fam[0]: true}
	for i := 0; i < 20; i++ {
		k := key(words(5000+i, 2000))
		if seen[k.Key] {
			t.Fatalf("unshared row %d shares a key", i)
		}
		seen[k.Key] = true
	}
}
