package fleet

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/lni/goutils/leaktest"
	"gopkg.in/yaml.v3"
)

func mustParse(t testing.TB, src string) *Spec {
	t.Helper()
	s, err := Parse([]byte(src))
	if err != nil {
		t.Fatalf("parse: %v", err)
	}
	return s
}

func TestNormalize(t *testing.T) {
	s := mustParse(t, base)
	if *s.Network.SameRegionRTTMs != 1 {
		t.Errorf("same_region_rtt_ms = %v, want default 1", *s.Network.SameRegionRTTMs)
	}
	h, _ := s.Profile("H100", "m")
	a, _ := s.Profile("A100", "m")
	if h.MaxContextTokens != 131072 || a.MaxContextTokens != 32768 {
		t.Errorf("profile context limits %d, %d; want the model's 131072 and the given 32768", h.MaxContextTokens, a.MaxContextTokens)
	}
	if h.MaxRunning != 256 || h.MaxBatchedTokens != 8192 || h.BlockSize != 16 || h.CapacityRPS != 0 {
		t.Errorf("profile defaults: %+v", h)
	}
	limits := map[string]int{}
	for _, c := range s.Classes {
		limits[c.Name] = c.ContextLimit
	}
	if want := map[string]int{"general": 32768, "eu": 32768, "long": 131072}; !reflect.DeepEqual(limits, want) {
		t.Errorf("class context limits %v, want %v", limits, want)
	}
	if c, _ := s.ClassByName("long"); c.MeanPromptTokens != 32768 || c.MeanOutputTokens != 200 {
		t.Errorf("long class means %v/%v, want defaults 32768/200", c.MeanPromptTokens, c.MeanOutputTokens)
	}
	if e, _ := s.EngineByID("e1"); e.Replicas != 1 {
		t.Errorf("e1 replicas %d, want default 1", e.Replicas)
	}
	if e, _ := s.EngineByID("e4"); e.Replicas != 2 || e.Labels["zone"] != "b" {
		t.Errorf("e4 %+v", e)
	}
	if p, _ := s.PriorityByName("batch"); p.Level != 1 || p.ShedCost != 100 {
		t.Errorf("batch priority %+v", p)
	}
}

func TestRTT(t *testing.T) {
	s := mustParse(t, base)
	cases := []struct {
		from, to string
		want     time.Duration
		ok       bool
	}{
		{"r1", "r2", 80 * time.Millisecond, true},
		{"r2", "r1", 80 * time.Millisecond, true},
		{"r1", "r1", time.Millisecond, true},
		{"r1", "zz", 0, false},
		{"zz", "zz", 0, false},
	}
	for _, c := range cases {
		if got, ok := s.RTT(c.from, c.to); got != c.want || ok != c.ok {
			t.Errorf("RTT(%s, %s) = %v, %v; want %v, %v", c.from, c.to, got, ok, c.want, c.ok)
		}
	}
	s = mustParse(t, edit(t, "network:\n", "network:\n  same_region_rtt_ms: 0.25\n"))
	if got, _ := s.RTT("r2", "r2"); got != 250*time.Microsecond {
		t.Errorf("same-region RTT %v, want 250µs", got)
	}
}

func ids(es []Engine) string {
	var out []string
	for _, e := range es {
		out = append(out, e.ID)
	}
	return strings.Join(out, ",")
}

func TestEligibleEngines(t *testing.T) {
	s := mustParse(t, base)
	for class, want := range map[string]string{
		"general": "e1,e2,e3,e4", // any engine of the model
		"eu":      "e3,e4",       // regions of residency eu
		"long":    "e1,e4",       // context limit ≥ 65536: the H100s
		"nope":    "",
	} {
		if got := ids(s.EligibleEngines(class)); got != want {
			t.Errorf("EligibleEngines(%s) = %s, want %s", class, got, want)
		}
	}
	// The result is the caller's: changing it changes nothing in the spec.
	es := s.EligibleEngines("eu")
	es[0].ID = "changed"
	if got := ids(s.EligibleEngines("eu")); got != "e3,e4" {
		t.Errorf("after modifying a result: %s", got)
	}
	if !s.IsEligible("long", "e4") || s.IsEligible("long", "e2") || s.IsEligible("nope", "e1") || s.IsEligible("eu", "zz") {
		t.Error("IsEligible disagrees with EligibleEngines")
	}
}

func TestClassify(t *testing.T) {
	s := mustParse(t, edit(t, "{name: m, max_context_tokens: 131072}", "{name: m, max_context_tokens: 131072}\n  - {name: unclassed, max_context_tokens: 8192}"))
	cases := []struct {
		model, residency string
		ctx              int
		want             string
		err              error
		msg              string
	}{
		{"m", "", 1000, "general", nil, ""},
		{"m", "", 0, "general", nil, ""},
		{"m", "", -5, "general", nil, ""},
		{"m", "", 32768, "general", nil, ""},
		{"m", "", 32769, "long", nil, ""}, // too long for the A100s
		{"m", "", 131072, "long", nil, ""},
		{"m", "", 131073, "", ErrNoClass, `no eligible class: model "m", 131073 context tokens; classes of the model: general (residency any, context up to 32768) long (residency any, context up to 131072) eu (residency eu, context up to 32768)`},
		{"m", "eu", 1000, "eu", nil, ""},
		{"m", "eu", 40000, "", ErrNoClass, `no eligible class: model "m", residency "eu", 40000 context tokens; classes`},
		{"m", "us", 100, "", ErrNoClass, `no eligible class: model "m", residency "us", 100 context tokens`},
		{"gpt-4", "", 1, "", ErrUnknownModel, `unknown model "gpt-4" (served: "m", "unclassed")`},
		{"unclassed", "", 1, "", ErrNoClass, `no eligible class: model "unclassed" has no class`},
	}
	for _, c := range cases {
		got, err := s.Classify(c.model, c.residency, c.ctx)
		if got.Name != c.want || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) {
			t.Errorf("Classify(%q, %q, %d) = %q, %v; want %q, %v", c.model, c.residency, c.ctx, got.Name, err, c.want, c.err)
		}
		if err != nil && !strings.HasPrefix(err.Error(), c.msg) {
			t.Errorf("Classify(%q, %q, %d) error %q, want it to start with %q", c.model, c.residency, c.ctx, err, c.msg)
		}
	}
}

func TestClassifyPreferences(t *testing.T) {
	// Only a residency class: a request without residency may use it.
	s := mustParse(t, edit(t, "  - {name: general, model: m}\n", "", "  - {name: long, model: m, min_context_tokens: 65536}\n", ""))
	if c, err := s.Classify("m", "", 10); err != nil || c.Name != "eu" {
		t.Errorf("no-residency request with only an eu class: %q %v", c.Name, err)
	}
	// Equal context limits: the first name wins, whatever the order given.
	s = mustParse(t, edit(t, "  - {name: general, model: m}\n", "  - {name: zeta, model: m}\n  - {name: alpha, model: m}\n"))
	if c, _ := s.Classify("m", "", 10); c.Name != "alpha" {
		t.Errorf("tie: got %q, want alpha", c.Name)
	}
	// A residency class with a smaller limit does not beat a class without
	// residency for a request that demands none.
	s = mustParse(t, edit(t, "{name: general, model: m}", "{name: general, model: m, min_context_tokens: 65536}"))
	if c, _ := s.Classify("m", "", 10); c.Name != "general" {
		t.Errorf("got %q, want general (no residency; ties long, wins by name)", c.Name)
	}
}

func TestLookups(t *testing.T) {
	s := mustParse(t, base)
	if f, ok := s.FrontendByNodeID("node-1"); !ok || f.Name != "f1" {
		t.Errorf("FrontendByNodeID(node-1) = %+v %v", f, ok)
	}
	if f, ok := s.FrontendByNodeID("f2"); !ok || f.Region != "r2" { // node id defaulted to the name
		t.Errorf("FrontendByNodeID(f2) = %+v %v", f, ok)
	}
	if _, ok := s.FrontendByNodeID("f1"); ok {
		t.Error("FrontendByNodeID found f1 by name")
	}
	if e, ok := s.EngineByID("e3"); !ok || e.Address != "127.0.0.1:9003" {
		t.Errorf("EngineByID(e3) = %+v %v", e, ok)
	}
	if _, ok := s.EngineByID("e9"); ok {
		t.Error("EngineByID(e9) found")
	}
	e, _ := s.EngineByID("e2")
	if p, ok := s.ProfileOf(e); !ok || p.GPU != "A100" || p.PrefillTokensPerS != 11000 {
		t.Errorf("ProfileOf(e2) = %+v %v", p, ok)
	}
	if _, ok := s.ProfileOf(Engine{GPU: "L4", Model: "m"}); ok {
		t.Error("ProfileOf(unknown) found")
	}
	if p, ok := s.PriorityByName("critical"); !ok || p.Level != 0 {
		t.Errorf("PriorityByName(critical) = %+v %v", p, ok)
	}
	if r, ok := s.RegionByName("r2"); !ok || r.Residency != "eu" {
		t.Errorf("RegionByName(r2) = %+v %v", r, ok)
	}
	if m, ok := s.ModelByName("m"); !ok || m.MaxContextTokens != 131072 {
		t.Errorf("ModelByName(m) = %+v %v", m, ok)
	}
	if _, ok := s.ClassByName("zz"); ok {
		t.Error("ClassByName(zz) found")
	}
}

func TestUnbuiltSpecPanics(t *testing.T) {
	defer func() {
		if r := recover(); r == nil || !strings.Contains(r.(string), "fleet.New") {
			t.Errorf("recover() = %v", r)
		}
	}()
	(&Spec{}).RTT("a", "b")
}

func TestNew(t *testing.T) {
	parsed := mustParse(t, base)
	again, err := New(*parsed)
	if err != nil {
		t.Fatalf("New(parsed): %v", err)
	}
	if !equalSpecs(parsed, again) {
		t.Errorf("New(parsed) differs from parsed")
	}
	// A Spec written in Go, zero optional fields meaning "omitted".
	s, err := New(Spec{
		Regions:   []Region{{Name: "r"}},
		Frontends: []Frontend{{Name: "f", Region: "r"}},
		Models:    []Model{{Name: "m", MaxContextTokens: 4096}},
		Profiles:  []Profile{{GPU: "g", Model: "m", PrefillTokensPerS: 1000, DecodeStepMs: 10, KVCapacityTokens: 100000}},
		Engines:   []Engine{{ID: "e", Address: "127.0.0.1:1", Region: "r", GPU: "g", Model: "m"}},
	})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if c, err := s.Classify("m", "", 100); err != nil || c.Name != "m" {
		t.Errorf("default class: %+v %v", c, err)
	}
	if p, _ := s.PriorityByName("default"); p.ShedCost != DefaultShedCost {
		t.Errorf("default priority %+v", p)
	}
	// Required fields are checked as given.
	_, err = New(Spec{Regions: []Region{{Name: "r"}}, Priorities: []Priority{{Name: "p"}}})
	if got := errorLines(err); !strings.Contains(strings.Join(got, "\n"), "priorities[0].shed_cost: must be positive, got 0") {
		t.Errorf("New with zero shed cost: %q", got)
	}
}

// equalSpecs compares two Specs' contents, ignoring their indexes.
func equalSpecs(a, b *Spec) bool {
	x, y := *a, *b
	x.ix, y.ix = nil, nil
	return reflect.DeepEqual(x, y)
}

// TestMarshalRoundTrip: a parsed spec written back as YAML parses to itself.
func TestMarshalRoundTrip(t *testing.T) {
	for _, src := range []string{base} {
		s := mustParse(t, src)
		out, err := yaml.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("re-parse: %v\n%s", err, out)
		}
		if !equalSpecs(s, again) {
			t.Errorf("round trip differs:\n%s", out)
		}
	}
}

// TestConcurrentReads: a parsed Spec is shared by goroutines without locks
// (run with -race).
func TestConcurrentReads(t *testing.T) {
	defer leaktest.AfterTest(t)()
	s := mustParse(t, base)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 200 {
				if _, err := s.Classify("m", "", i*300); err != nil {
					t.Error(err)
					return
				}
				s.RTT("r1", "r2")
				for _, e := range s.EligibleEngines("general") {
					s.ProfileOf(e)
				}
				s.FrontendByNodeID("node-1")
				_ = s.Summary()
			}
		}()
	}
	wg.Wait()
}

func TestSummary(t *testing.T) {
	want := `fleet "t": 2 regions, 2 frontends, 4 engines (2 A100, 2 H100, 5 replicas), 3 classes, 1 model (m), 2 priorities`
	if got := mustParse(t, base).Summary(); got != want {
		t.Errorf("Summary() =\n %s\nwant\n %s", got, want)
	}
}

func BenchmarkClassify(b *testing.B) {
	s := mustParse(b, base)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		if _, err := s.Classify("m", "", i%100000); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParse3Region(b *testing.B) {
	data, err := readExample("fleet-3region.yaml")
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}

// bigSpec is a generated fleet of n engines over 3 regions, as YAML.
func bigSpec(n int) []byte {
	var b strings.Builder
	b.WriteString(strings.Split(base, "engines:\n")[0])
	b.WriteString("engines:\n")
	gpus := []string{"H100", "A100"}
	for i := range n {
		fmt.Fprintf(&b, "  - {id: e%d, address: \"10.0.%d.%d:8000\", region: r%d, gpu: %s, model: m}\n", i, i/250, i%250, 1+i%2, gpus[i/2%2])
	}
	return []byte(b.String())
}

func BenchmarkParse10kEngines(b *testing.B) {
	data := bigSpec(10000)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}
