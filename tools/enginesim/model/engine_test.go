package model

import (
	"math/rand/v2"
	"path/filepath"
	"testing"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
)

type rec struct {
	tokens   map[*Request][]time.Duration
	finished map[*Request]time.Duration
	order    []*Request
}

func newRec() *rec {
	return &rec{tokens: map[*Request][]time.Duration{}, finished: map[*Request]time.Duration{}}
}

func (l *rec) Token(r *Request, t time.Duration) { l.tokens[r] = append(l.tokens[r], t) }
func (l *rec) Finished(r *Request, t time.Duration) {
	l.finished[r] = t
	l.order = append(l.order, r)
}

// run drives e until no event remains or until limit.
func run(e *Engine, limit time.Duration) {
	for {
		t, ok := e.NextEvent()
		if !ok || t > limit {
			return
		}
		e.Advance(t)
	}
}

func ms(f float64) time.Duration { return time.Duration(f * float64(time.Millisecond)) }

// testCfg has round numbers: a step is 10 ms + 1 ms per decoding sequence +
// 1 ms per 10 prefilled tokens; a request pays 5 ms overhead.
func testCfg() Config {
	return Config{
		PrefillTokensPerS: 10000, OverheadMs: 5, DecodeStepMs: 10, DecodeStepPerSeqMs: 1,
		MaxRunning: 4, MaxBatchedTokens: 1000, KVCapacityTokens: 16 * 100, BlockSize: 16,
	}
}

func prompt(seed uint64, n int) []uint64 {
	p := make([]uint64, n)
	rng := rand.New(rand.NewPCG(seed, 1))
	for i := range p {
		p[i] = rng.Uint64()
	}
	return p
}

func near(t *testing.T, what string, got, want time.Duration) {
	t.Helper()
	if d := got - want; d < -time.Microsecond || d > time.Microsecond {
		t.Errorf("%s = %v, want %v", what, got, want)
	}
}

func TestIdleRequestFollowsStepModel(t *testing.T) {
	l := newRec()
	e, err := New(testCfg(), l)
	if err != nil {
		t.Fatal(err)
	}
	r := &Request{Prompt: prompt(1, 200), MaxTokens: 3}
	if err := e.Submit(r, ms(100)); err != nil {
		t.Fatal(err)
	}
	run(e, time.Hour)
	toks := l.tokens[r]
	if len(toks) != 3 {
		t.Fatalf("got %d tokens, want 3", len(toks))
	}
	// overhead 5 + prefill step (10 + 0·1 + 200/10) = 35 ms after arrival.
	near(t, "first token", toks[0], ms(100+5+30))
	// then decode steps of 10 + 1·1 ms each.
	near(t, "second token", toks[1], ms(135+11))
	near(t, "third token", toks[2], ms(146+11))
	near(t, "finished", l.finished[r], ms(157))
	if r.Reason != FinishLength || r.Generated != 3 {
		t.Errorf("reason %v generated %d", r.Reason, r.Generated)
	}
	s := e.Stats()
	if s.Running != 0 || s.Waiting != 0 || s.KVUsage != 0 || s.PromptTokens != 200 || s.GenerationTokens != 3 {
		t.Errorf("stats after finish: %+v", s)
	}
}

func TestDecodeStepGrowsWithBatch(t *testing.T) {
	l := newRec()
	cfg := testCfg()
	cfg.OverheadMs = 0
	e, _ := New(cfg, l)
	var rs []*Request
	for i := range 4 {
		r := &Request{Prompt: prompt(uint64(i), 10), MaxTokens: 3}
		rs = append(rs, r)
		if err := e.Submit(r, 0); err != nil {
			t.Fatal(err)
		}
	}
	run(e, time.Hour)
	// First step prefills only the first request (submitted alone at t=0):
	// 10 + 10/10 = 11 ms. The other three join the next step together with
	// the first's decode: 10 + 1·1 + 30/10 = 14 ms.
	near(t, "r0 first token", l.tokens[rs[0]][0], ms(11))
	near(t, "r1 first token", l.tokens[rs[1]][0], ms(25))
	// Then all four decode together: 10 + 4 ms per step.
	near(t, "r1 second token", l.tokens[rs[1]][1], ms(25+14))
	near(t, "r0 third token", l.tokens[rs[0]][2], ms(25+14))
}

func TestRunningSlotsAndWaitingQueue(t *testing.T) {
	l := newRec()
	e, _ := New(testCfg(), l)
	var rs []*Request
	for i := range 6 {
		r := &Request{Prompt: prompt(uint64(i), 10), MaxTokens: 50}
		rs = append(rs, r)
		e.Submit(r, 0)
	}
	e.Advance(ms(100))
	s := e.Stats()
	if s.Running != 4 || s.Waiting != 2 {
		t.Fatalf("running %d waiting %d, want 4 and 2", s.Running, s.Waiting)
	}
	run(e, time.Hour)
	if len(l.order) != 6 {
		t.Fatalf("%d finished", len(l.order))
	}
	// The queued two were scheduled only after the first ones finished.
	if rs[4].Scheduled < l.finished[rs[0]] {
		t.Errorf("r4 scheduled at %v before r0 finished at %v", rs[4].Scheduled, l.finished[rs[0]])
	}
	if q := rs[4].Scheduled - rs[4].Arrival; q <= 0 {
		t.Errorf("r4 queue time %v", q)
	}
}

func TestChunkedPrefill(t *testing.T) {
	l := newRec()
	cfg := testCfg()
	cfg.OverheadMs = 0
	cfg.MaxBatchedTokens = 100
	e, _ := New(cfg, l)
	r := &Request{Prompt: prompt(1, 250), MaxTokens: 1}
	e.Submit(r, 0)
	run(e, time.Hour)
	// 100 + 100 + 50 tokens: (10+10) + (10+10) + (10+5) ms.
	near(t, "first token", l.tokens[r][0], ms(55))
	if s := e.Stats(); s.Steps != 3 {
		t.Errorf("steps %d, want 3", s.Steps)
	}
}

func TestPrefixCacheHitsSkipPrefill(t *testing.T) {
	l := newRec()
	cfg := testCfg()
	cfg.OverheadMs = 0
	e, _ := New(cfg, l)
	p := prompt(7, 100) // 6 full blocks + 4 tokens
	r1 := &Request{Prompt: p, MaxTokens: 1}
	e.Submit(r1, 0)
	run(e, time.Hour)
	if r1.CachedTokens != 0 {
		t.Fatalf("cold request cached %d", r1.CachedTokens)
	}
	// A longer prompt with the same first 100 tokens (a conversation's next
	// turn) reuses the 6 full blocks: 96 tokens.
	p2 := append(append([]uint64{}, p...), prompt(8, 60)...)
	r2 := &Request{Prompt: p2, MaxTokens: 1}
	e.Submit(r2, ms(1000))
	run(e, time.Hour)
	if r2.CachedTokens != 96 {
		t.Errorf("cached %d, want 96", r2.CachedTokens)
	}
	near(t, "warm TTFT", r2.FirstToken-r2.Arrival, cfg.StepDuration(0, 160-96))
	// The identical prompt again hits all full blocks but still computes
	// one token: 100 tokens → 6 blocks = 96 cached.
	r3 := &Request{Prompt: p, MaxTokens: 1}
	e.Submit(r3, ms(2000))
	run(e, time.Hour)
	if r3.CachedTokens != 96 {
		t.Errorf("identical prompt cached %d, want 96", r3.CachedTokens)
	}
	// A prompt of exactly 6 blocks cannot use its last block.
	r4 := &Request{Prompt: p[:96], MaxTokens: 1}
	e.Submit(r4, ms(3000))
	run(e, time.Hour)
	if r4.CachedTokens != 80 {
		t.Errorf("block-aligned prompt cached %d, want 80", r4.CachedTokens)
	}
	s := e.Stats()
	if s.PrefixQueries != 100+160+100+96 || s.PrefixHits != 96+96+80 {
		t.Errorf("queries %d hits %d", s.PrefixQueries, s.PrefixHits)
	}
	// A different first token changes every block hash.
	p5 := append([]uint64{42}, p[1:]...)
	r5 := &Request{Prompt: p5, MaxTokens: 1}
	e.Submit(r5, ms(4000))
	run(e, time.Hour)
	if r5.CachedTokens != 0 {
		t.Errorf("different first token cached %d", r5.CachedTokens)
	}
}

func TestKVUsageAndLRUEviction(t *testing.T) {
	l := newRec()
	cfg := testCfg()
	cfg.OverheadMs = 0
	cfg.KVCapacityTokens = 16 * 10 // 10 blocks
	e, _ := New(cfg, l)
	a := &Request{Prompt: prompt(1, 64), MaxTokens: 16} // 5 blocks
	e.Submit(a, 0)
	e.Advance(ms(1))
	if u := e.Stats().KVUsage; u != 0.5 {
		t.Errorf("usage while running %v, want 0.5", u)
	}
	run(e, time.Hour)
	if s := e.Stats(); s.KVUsage != 0 || s.CachedBlocks != 4 {
		t.Errorf("after finish: usage %v cached blocks %d, want 0 and 4", s.KVUsage, s.CachedBlocks)
	}
	// b needs 8 blocks: 6 free, 2 evicted from a's cached tail.
	b := &Request{Prompt: prompt(2, 100), MaxTokens: 28}
	e.Submit(b, ms(1000))
	run(e, time.Hour)
	// a's first two blocks survive (tails are evicted first): a again hits 32.
	a2 := &Request{Prompt: a.Prompt, MaxTokens: 1}
	e.Submit(a2, ms(2000))
	run(e, time.Hour)
	if a2.CachedTokens != 32 {
		t.Errorf("after eviction cached %d, want 32", a2.CachedTokens)
	}
	// A request that does not fit waits until another finishes.
	big := &Request{Prompt: prompt(3, 100), MaxTokens: 60} // 10 blocks
	small := &Request{Prompt: prompt(4, 10), MaxTokens: 20}
	e.Submit(small, ms(3000))
	e.Submit(big, ms(3000))
	e.Advance(ms(3001))
	if s := e.Stats(); s.Running != 1 || s.Waiting != 1 {
		t.Errorf("running %d waiting %d, want 1 and 1", s.Running, s.Waiting)
	}
	run(e, time.Hour)
	if big.Scheduled < small.Finished {
		t.Errorf("big scheduled %v before small finished %v", big.Scheduled, small.Finished)
	}
	if err := e.Submit(&Request{Prompt: prompt(5, 100), MaxTokens: 100}, ms(9000)); err == nil {
		t.Error("request larger than the KV cache accepted")
	}
}

func TestAbortHangSlowdown(t *testing.T) {
	l := newRec()
	cfg := testCfg()
	cfg.OverheadMs = 0
	e, _ := New(cfg, l)
	r := &Request{Prompt: prompt(1, 10), MaxTokens: 1000}
	e.Submit(r, 0)
	e.Advance(ms(50))
	e.Abort(r, ms(50))
	if r.Reason != FinishAbort || e.Stats().Running != 0 || e.Stats().KVUsage != 0 {
		t.Fatalf("after abort: reason %v stats %+v", r.Reason, e.Stats())
	}
	if _, ok := e.NextEvent(); ok {
		// the step in flight may still end; after it nothing remains
		run(e, time.Hour)
	}
	if _, ok := e.NextEvent(); ok {
		t.Error("events remain after abort")
	}

	e.SetHang(true, ms(100))
	h := &Request{Prompt: prompt(2, 10), MaxTokens: 2}
	e.Submit(h, ms(100))
	run(e, time.Hour)
	if len(l.tokens[h]) != 0 {
		t.Fatal("hung engine produced tokens")
	}
	if err := e.SetSlowdown(2); err != nil {
		t.Fatal(err)
	}
	e.SetHang(false, ms(200))
	run(e, time.Hour)
	// (10 + 1) ms prefill step, doubled, from 200 ms.
	near(t, "first token after unhang", l.tokens[h][0], ms(222))
	if e.SetSlowdown(0) == nil {
		t.Error("slowdown 0 accepted")
	}
}

func TestConfigValidate(t *testing.T) {
	for name, mod := range map[string]func(*Config){
		"prefill":  func(c *Config) { c.PrefillTokensPerS = 0 },
		"running":  func(c *Config) { c.MaxRunning = 0 },
		"batched":  func(c *Config) { c.MaxBatchedTokens = -1 },
		"block":    func(c *Config) { c.BlockSize = 0 },
		"kv":       func(c *Config) { c.KVCapacityTokens = 3 },
		"overhead": func(c *Config) { c.OverheadMs = -1 },
		"step":     func(c *Config) { c.DecodeStepMs, c.DecodeStepPerSeqMs = 0, 0 },
	} {
		c := testCfg()
		mod(&c)
		if c.Validate() == nil {
			t.Errorf("%s: invalid config accepted", name)
		}
	}
	if err := testCfg().Validate(); err != nil {
		t.Error(err)
	}
}

// TestDeterministic: the same inputs give the same event times.
func TestDeterministic(t *testing.T) {
	sim := func() []time.Duration {
		l := newRec()
		e, _ := New(testCfg(), l)
		rng := rand.New(rand.NewPCG(3, 4))
		var rs []*Request
		now := time.Duration(0)
		for i := range 200 {
			now += time.Duration(rng.IntN(20)) * time.Millisecond
			e.Advance(now)
			r := &Request{Prompt: prompt(uint64(rng.IntN(5)), 20+rng.IntN(200)), MaxTokens: 1 + rng.IntN(30)}
			if i%7 == 0 {
				r.EndReason = FinishStop
			}
			rs = append(rs, r)
			if err := e.Submit(r, now); err != nil {
				t.Fatal(err)
			}
		}
		run(e, time.Hour)
		var out []time.Duration
		for _, r := range rs {
			out = append(out, r.FirstToken, r.Finished)
		}
		return out
	}
	a, b := sim(), sim()
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("run differs at %d: %v vs %v", i, a[i], b[i])
		}
	}
}

func BenchmarkEngine(b *testing.B) {
	l := nopListener{}
	cfg := Config{PrefillTokensPerS: 25000, OverheadMs: 10, DecodeStepMs: 6.5, DecodeStepPerSeqMs: 0.055,
		MaxRunning: 256, MaxBatchedTokens: 8192, KVCapacityTokens: 450000, BlockSize: 16}
	e, _ := New(cfg, l)
	prompts := make([][]uint64, 64)
	for i := range prompts {
		prompts[i] = prompt(uint64(i), 512)
	}
	now := time.Duration(0)
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		now += 5 * time.Millisecond
		e.Advance(now)
		e.Submit(&Request{Prompt: prompts[i%64], MaxTokens: 100}, now)
	}
}

type nopListener struct{}

func (nopListener) Token(*Request, time.Duration)    {}
func (nopListener) Finished(*Request, time.Duration) {}

// TestExampleFleetProfiles: every profile of the example fleets is a valid
// engine configuration, and its idle TTFT and step times follow the form.
func TestExampleFleetProfiles(t *testing.T) {
	for _, f := range []string{"fleet-3region.yaml", "fleet-minimal.yaml"} {
		spec, err := fleet.Load(filepath.Join("..", "..", "..", "examples", f))
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range spec.Profiles {
			cfg := ConfigFromProfile(p)
			if err := cfg.Validate(); err != nil {
				t.Errorf("%s %s/%s: %v", f, p.GPU, p.Model, err)
				continue
			}
			l := newRec()
			e, _ := New(cfg, l)
			r := &Request{Prompt: prompt(1, 1000), MaxTokens: 2}
			if err := e.Submit(r, 0); err != nil {
				t.Fatal(err)
			}
			run(e, time.Hour)
			near(t, p.GPU+" idle TTFT", r.FirstToken, cfg.Overhead()+cfg.StepDuration(0, 1000))
			near(t, p.GPU+" second token", l.tokens[r][1]-l.tokens[r][0], cfg.StepDuration(1, 0))
		}
	}
}

// A finished request's output stays in the prefix cache (as vLLM keeps the
// KV of generated tokens): the next turn, whose prompt repeats the answer,
// finds prompt and answer cached up to the last full block. KV accounting
// holds: every block is free or evictable once nothing runs.
func TestOutputBlocksAreCached(t *testing.T) {
	l := newRec()
	e, err := New(testCfg(), l)
	if err != nil {
		t.Fatal(err)
	}
	p1 := prompt(1, 100)
	out := prompt(2, 41) // a marker and 40 answer tokens
	r1 := &Request{Prompt: p1, MaxTokens: 40, Output: out}
	if err := e.Submit(r1, 0); err != nil {
		t.Fatal(err)
	}
	run(e, time.Hour)
	if st := e.Stats(); st.KVUsage != 0 || st.CachedBlocks != (100+41)/16 {
		t.Fatalf("after turn 1: KV usage %v, %d cached blocks, want 0 and %d", st.KVUsage, st.CachedBlocks, (100+41)/16)
	}
	next := append(append(append([]uint64(nil), p1...), out...), prompt(3, 30)...)
	r2 := &Request{Prompt: next, MaxTokens: 1}
	if err := e.Submit(r2, e.Now()); err != nil {
		t.Fatal(err)
	}
	run(e, time.Hour)
	if want := (100 + 41) / 16 * 16; r2.CachedTokens != want {
		t.Fatalf("turn 2 cached %d tokens, want %d (prompt and answer of turn 1, full blocks)", r2.CachedTokens, want)
	}
	// Without Output only the prompt's blocks are cached.
	e2, _ := New(testCfg(), newRec())
	r3 := &Request{Prompt: p1, MaxTokens: 40}
	_ = e2.Submit(r3, 0)
	run(e2, time.Hour)
	r4 := &Request{Prompt: next, MaxTokens: 1}
	_ = e2.Submit(r4, e2.Now())
	run(e2, time.Hour)
	if r4.CachedTokens != 100/16*16 {
		t.Fatalf("without Output turn 2 cached %d tokens, want %d", r4.CachedTokens, 100/16*16)
	}
	// Fill the cache past capacity: blocks are reused, accounting stays exact.
	for i := range 200 {
		r := &Request{Prompt: prompt(uint64(10+i), 300), MaxTokens: 20, Output: prompt(uint64(1000+i), 21)}
		if err := e.Submit(r, e.Now()); err != nil {
			t.Fatal(err)
		}
	}
	run(e, 10*time.Hour)
	if st := e.Stats(); st.KVUsage != 0 || st.CachedBlocks > st.KVBlocks {
		t.Fatalf("after 200 more requests: KV usage %v, %d cached of %d blocks", st.KVUsage, st.CachedBlocks, st.KVBlocks)
	}
}

// TestBacklog: the waiting queue's prompt tokens, and those still to compute
// (what the prefix cache lacks, with at least one token each, plus the rest
// of running prompts), as SGLang's /v1/loads reports them; looking does not
// change what admission then finds.
func TestBacklog(t *testing.T) {
	e, err := New(testCfg(), newRec())
	if err != nil {
		t.Fatal(err)
	}
	warm := prompt(1, 64) // four full blocks
	if err := e.Submit(&Request{Prompt: warm, MaxTokens: 1}, 0); err != nil {
		t.Fatal(err)
	}
	run(e, time.Hour)
	if b := e.Backlog(); b != (Backlog{}) {
		t.Fatalf("idle backlog %+v", b)
	}
	e.SetHang(true, ms(1000))
	ext := append(append([]uint64{}, warm...), prompt(2, 10)...)
	same := append([]uint64{}, warm...)
	for i, p := range [][]uint64{ext, same, prompt(3, 30)} {
		if err := e.Submit(&Request{Prompt: p, MaxTokens: 1}, ms(1000)); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}
	e.Advance(ms(2000)) // past the overhead: all three wait
	want := Backlog{
		WaitingTokens: 74 + 64 + 30,
		// ext finds its 64 cached; same too, but computes its last block
		// again (at least one token); the third finds nothing.
		UncachedTokens: 10 + 16 + 30,
	}
	if b := e.Backlog(); b != want || e.Stats().Waiting != 3 {
		t.Fatalf("hung backlog %+v (waiting %d), want %+v", b, e.Stats().Waiting, want)
	}
	e.SetHang(false, ms(2000))
	e.Advance(ms(2000))
	// The step in flight prefills all three; until it ends they are
	// running with their uncached tokens left to compute.
	if b := e.Backlog(); b != (Backlog{UncachedTokens: want.UncachedTokens}) {
		t.Fatalf("backlog while prefilling %+v", b)
	}
	run(e, time.Hour)
	if b := e.Backlog(); b != (Backlog{}) {
		t.Fatalf("backlog after the run %+v", b)
	}
	if st := e.Stats(); st.PrefixHits != 64+48 {
		t.Errorf("prefix hits %d, want %d", st.PrefixHits, 64+48)
	}
}
