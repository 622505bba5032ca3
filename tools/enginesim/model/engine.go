package model

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/inferlb/inferlb/internal/hashmix"
)

// FinishReason says why a request ended.
type FinishReason uint8

// Finish reasons, named as vLLM's finished_reason label values.
const (
	// FinishLength: the request produced MaxTokens tokens (max_tokens reached).
	FinishLength FinishReason = iota
	// FinishStop: the request produced MaxTokens tokens and the owner chose
	// to report them as a natural end (an EOS token).
	FinishStop
	// FinishAbort: the owner aborted the request.
	FinishAbort
)

func (f FinishReason) String() string {
	switch f {
	case FinishLength:
		return "length"
	case FinishStop:
		return "stop"
	case FinishAbort:
		return "abort"
	}
	return fmt.Sprintf("FinishReason(%d)", uint8(f))
}

type reqState uint8

const (
	stateNew reqState = iota
	statePending
	stateWaiting
	stateRunning
	stateDone
)

// Request is one generation request. The owner fills Prompt, MaxTokens,
// EndReason and Tag before Submit; the engine fills the rest. Read the result
// fields only from a Listener callback or after the request finished.
type Request struct {
	// Prompt holds the prompt's token ids (package tokens). At least one.
	Prompt []uint64
	// MaxTokens is the exact number of tokens to generate (ignore_eos style).
	MaxTokens int
	// EndReason is reported when MaxTokens tokens were generated: FinishLength
	// or FinishStop.
	EndReason FinishReason
	// Tag is the owner's; the engine never reads it.
	Tag any
	// Hashes, optional, are the chained hashes of Prompt's full blocks
	// (ChainHashes(Prompt, BlockSize)) if the owner has them, e.g. from
	// the previous turn of a conversation (ExtendChain); the engine
	// computes them when they are missing or of the wrong length.
	Hashes []uint64
	// Output, optional, is the token ids the generated text will have when
	// a follow-up prompt repeats it (for chat: the assistant's role marker,
	// then the text's tokens). When the request finishes, the engine keeps
	// the full KV blocks of Prompt followed by Output in its prefix cache,
	// as vLLM keeps the KV of generated tokens, so the next turn of a
	// conversation finds its previous answer cached too.
	Output []uint64

	// Arrival is the virtual time of Submit.
	Arrival time.Duration
	// Scheduled is when the request was first admitted to the running batch.
	Scheduled time.Duration
	// FirstToken and LastToken are the times of the first and latest token.
	FirstToken, LastToken time.Duration
	// Finished is when the request ended; Reason why.
	Finished time.Duration
	Reason   FinishReason
	// CachedTokens is the number of prompt tokens served from the prefix cache.
	CachedTokens int
	// Generated is the number of tokens generated so far.
	Generated int

	state reqState
	// Queued is Arrival plus the overhead: when it joined the waiting queue.
	Queued time.Duration

	prefilled  int      // prompt tokens computed or cached
	hashes     []uint64 // chained hashes of the prompt's full blocks
	blocks     []int32  // pinned cached blocks (arena indexes), a prefix of hashes
	anon       int      // pinned blocks not (yet) in the cache
	stepChunk  int      // prompt tokens prefilled in the current step
	stepDecode bool     // decodes in the current step
}

// Listener receives a request's events, in virtual-time order, from inside
// Submit, Advance, Abort and SetHang. It must not call back into the Engine.
// A Listener that also implements TokenBatcher lets the engine collapse
// runs of identical decode-only steps.
type Listener interface {
	// Token reports that r produced a token at t; r.Generated counts it, so
	// r.Generated == 1 is the first token.
	Token(r *Request, t time.Duration)
	// Finished reports that r ended at t, with r.Reason.
	Finished(r *Request, t time.Duration)
}

// TokenBatcher is implemented by listeners that take decode tokens in
// batches. With one, a step that only decodes (no prefill, no admission)
// is followed without wake-ups by the identical steps until the first
// request would finish, a pending request would become schedulable, or the
// owner intervenes (Submit, Abort, SetHang, SetSlowdown): the same steps,
// times and outcomes as step by step, but one event instead of many.
// Tokens reports that r produced n tokens in such silent steps, one every
// step, the last at last (r.Generated and r.LastToken count them). Tokens of different
// requests are then reported request by request, not in time order; the
// first token and the step that finishes a request always come through
// Token and Finished.
type TokenBatcher interface {
	Tokens(r *Request, n int, last, step time.Duration)
}

// Stats is a snapshot of an engine's state and counters.
type Stats struct {
	// Running is the number of requests holding a running slot.
	Running int
	// Waiting is the number of requests in the scheduler's waiting queue.
	Waiting int
	// Pending is the number of requests still paying their overhead.
	Pending int
	// KVUsage is the fraction of KV blocks pinned by running requests.
	KVUsage float64
	// KVBlocks is the number of KV blocks; CachedBlocks how many hold a
	// cached prefix block (pinned or evictable).
	KVBlocks, CachedBlocks int
	// PrefixQueries and PrefixHits count prompt tokens looked up in, and
	// found in, the prefix cache.
	PrefixQueries, PrefixHits uint64
	// PromptTokens counts prompt tokens of requests that finished prefill;
	// GenerationTokens counts generated tokens.
	PromptTokens, GenerationTokens uint64
	// Steps counts scheduler steps.
	Steps uint64
}

// Engine is one simulated inference engine.
type Engine struct {
	cfg      Config
	listener Listener
	clock    time.Duration

	slowdown float64
	hung     bool

	pending queue
	waiting queue
	nPend   int
	nWait   int
	running []*Request

	inStep  bool
	stepEnd time.Duration
	// silent steps of length runStep precede the current step, the first
	// starting at runStart (TokenBatcher); batcher is the listener as one.
	silent   int
	runStart time.Duration
	runStep  time.Duration
	batcher  TokenBatcher

	cache       blockIndex // hash → arena index
	lru         blockArena
	totalBlocks int
	usedBlocks  int // pinned: anonymous + cached with ref > 0

	stats Stats
}

// New returns an idle engine at virtual time 0.
func New(cfg Config, l Listener) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if l == nil {
		return nil, errors.New("model: nil Listener")
	}
	b, _ := l.(TokenBatcher)
	return &Engine{
		cfg:         cfg,
		listener:    l,
		batcher:     b,
		slowdown:    1,
		cache:       newBlockIndex(),
		lru:         newBlockArena(),
		totalBlocks: cfg.KVCapacityTokens / cfg.BlockSize,
	}, nil
}

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// Now returns the latest virtual time the engine has processed.
func (e *Engine) Now() time.Duration { return e.clock }

// Submit adds r at virtual time now (not before the engine's Now). It first
// advances to now. It fails if r can never run: an empty prompt, MaxTokens
// below 1, or more KV blocks than the engine has.
func (e *Engine) Submit(r *Request, now time.Duration) error {
	if r.state != stateNew {
		return errors.New("model: request submitted twice")
	}
	if len(r.Prompt) == 0 {
		return errors.New("model: empty prompt")
	}
	if r.MaxTokens < 1 {
		return fmt.Errorf("model: max tokens must be at least 1, got %d", r.MaxTokens)
	}
	if need := e.blocksFor(r); need > e.totalBlocks {
		return fmt.Errorf("model: request needs %d KV blocks (%d prompt + %d output tokens), engine has %d",
			need, len(r.Prompt), r.MaxTokens, e.totalBlocks)
	}
	e.Advance(now)
	e.cut()
	r.Arrival = now
	r.Queued = now + e.cfg.Overhead()
	if r.Queued <= now {
		r.state = stateWaiting
		e.waiting.push(r)
		e.nWait++
		e.tryStartStep(now)
		return nil
	}
	r.state = statePending
	e.pending.push(r)
	e.nPend++
	return nil
}

func (e *Engine) blocksFor(r *Request) int {
	bs := e.cfg.BlockSize
	return (len(r.Prompt) + r.MaxTokens + bs - 1) / bs
}

// NextEvent returns the virtual time of the engine's next internal event (a
// step ending or a request becoming schedulable); ok is false when nothing
// will happen until the next Submit or SetHang(false).
func (e *Engine) NextEvent() (t time.Duration, ok bool) {
	t = time.Duration(math.MaxInt64)
	if e.inStep {
		t, ok = e.stepEnd, true
	}
	if r := e.pending.peek(); r != nil && r.Queued < t {
		t, ok = r.Queued, true
	}
	return t, ok
}

// Advance processes every event up to and including virtual time now.
func (e *Engine) Advance(now time.Duration) {
	for {
		// A run planned at a step start before now has silent steps
		// that ended by now, too.
		e.applySilent(now)
		t, ok := e.NextEvent()
		if !ok || t > now {
			break
		}
		e.clock = t
		if r := e.pending.peek(); r != nil && r.Queued == t {
			e.pending.pop()
			e.nPend--
			r.state = stateWaiting
			e.waiting.push(r)
			e.nWait++
		} else {
			e.completeStep(t)
		}
		e.tryStartStep(t)
	}
	if now > e.clock {
		e.clock = now
	}
}

// Abort ends r at virtual time now with FinishAbort, freeing its slot and KV
// blocks. Aborting a finished request does nothing.
func (e *Engine) Abort(r *Request, now time.Duration) {
	e.Advance(now)
	e.cut()
	switch r.state {
	case statePending:
		e.nPend--
	case stateWaiting:
		e.nWait--
	case stateRunning:
		for i, x := range e.running {
			if x == r {
				e.running = append(e.running[:i], e.running[i+1:]...)
				break
			}
		}
		e.release(r)
	default:
		return
	}
	// Pending and waiting queues drop done requests lazily.
	r.state = stateDone
	r.Reason = FinishAbort
	r.Finished = now
	e.listener.Finished(r, now)
	if !e.inStep {
		e.tryStartStep(now)
	}
}

// SetSlowdown multiplies the duration of steps that start from now on.
func (e *Engine) SetSlowdown(f float64) error {
	if !(f > 0) || math.IsInf(f, 0) {
		return fmt.Errorf("model: slowdown must be a positive number, got %v", f)
	}
	e.cut()
	e.slowdown = f
	return nil
}

// SetHang stops (true) or resumes (false) starting new steps, at virtual
// time now. A step already running completes.
func (e *Engine) SetHang(hang bool, now time.Duration) {
	e.Advance(now)
	e.cut()
	e.hung = hang
	if !hang {
		e.tryStartStep(now)
	}
}

// Stats returns the current state and counters.
func (e *Engine) Stats() Stats {
	s := e.stats
	s.Running = len(e.running)
	s.Waiting = e.nWait
	s.Pending = e.nPend
	s.KVBlocks = e.totalBlocks
	s.CachedBlocks = e.cache.len()
	s.KVUsage = float64(e.usedBlocks) / float64(e.totalBlocks)
	return s
}

func (e *Engine) tryStartStep(t time.Duration) {
	if e.inStep || e.hung {
		return
	}
	budget := e.cfg.MaxBatchedTokens
	decodes, prefill := 0, 0
	for _, r := range e.running {
		if r.prefilled == len(r.Prompt) && budget > 0 {
			r.stepDecode = true
			decodes++
			budget--
		}
	}
	for _, r := range e.running {
		if rem := len(r.Prompt) - r.prefilled; rem > 0 && budget > 0 {
			c := min(rem, budget)
			r.stepChunk = c
			prefill += c
			budget -= c
		}
	}
	for budget > 0 && len(e.running) < e.cfg.MaxRunning {
		r := e.waiting.peek()
		if r == nil || !e.admit(r, t) {
			break
		}
		e.waiting.pop()
		e.nWait--
		r.state = stateRunning
		e.running = append(e.running, r)
		c := min(len(r.Prompt)-r.prefilled, budget)
		r.stepChunk = c
		prefill += c
		budget -= c
	}
	if decodes == 0 && prefill == 0 {
		return
	}
	d := time.Duration(float64(e.cfg.StepDuration(decodes, prefill)) * e.slowdown)
	if d <= 0 {
		d = 1
	}
	e.inStep = true
	e.stepEnd = t + d
	e.stats.Steps++
	if e.batcher != nil && prefill == 0 && decodes == len(e.running) {
		e.planRun(t, d)
	}
}

// planRun extends a decode-only step starting at t into a run of identical
// steps: until the first running request finishes, and ending no later
// than the first step boundary at which the next pending request could be
// admitted. Every step but the last is silent (see TokenBatcher).
func (e *Engine) planRun(t, d time.Duration) {
	k := math.MaxInt
	for _, r := range e.running {
		k = min(k, r.MaxTokens-r.Generated)
	}
	if r := e.pending.peek(); r != nil {
		k = min(k, int((r.Queued-t+d-1)/d))
	}
	if k <= 1 {
		return
	}
	e.silent, e.runStart, e.runStep = k-1, t, d
	e.stepEnd = t + time.Duration(k)*d
}

// applySilent applies the silent steps that ended by now.
func (e *Engine) applySilent(now time.Duration) {
	if e.silent == 0 || now < e.runStart+e.runStep {
		return
	}
	j := min(int((now-e.runStart)/e.runStep), e.silent)
	last := e.runStart + time.Duration(j)*e.runStep
	for _, r := range e.running {
		r.Generated += j
		r.LastToken = last
		e.batcher.Tokens(r, j, last, e.runStep)
	}
	e.stats.GenerationTokens += uint64(j * len(e.running))
	e.stats.Steps += uint64(j)
	e.runStart = last
	e.silent -= j
}

// cut ends a run at the step in progress (the owner changes something the
// next steps depend on); Advance has applied the silent steps before it.
func (e *Engine) cut() {
	if e.silent == 0 {
		return
	}
	e.stepEnd = e.runStart + e.runStep
	e.silent = 0
}

func (e *Engine) completeStep(t time.Duration) {
	e.inStep = false
	kept := e.running[:0]
	for _, r := range e.running {
		produced := false
		if r.stepDecode {
			r.stepDecode = false
			r.Generated++
			produced = true
		} else if r.stepChunk > 0 {
			r.prefilled += r.stepChunk
			r.stepChunk = 0
			e.registerBlocks(r)
			if r.prefilled == len(r.Prompt) {
				r.Generated = 1
				r.FirstToken = t
				e.stats.PromptTokens += uint64(len(r.Prompt))
				produced = true
			}
		}
		if produced {
			r.LastToken = t
			e.stats.GenerationTokens++
			e.listener.Token(r, t)
		}
		if r.Generated >= r.MaxTokens {
			e.cacheOutput(r)
			e.release(r)
			r.state = stateDone
			r.Reason = r.EndReason
			r.Finished = t
			e.listener.Finished(r, t)
			continue
		}
		kept = append(kept, r)
	}
	clear(e.running[len(kept):])
	e.running = kept
}

// admit finds r's cached prefix and reserves its KV blocks; false if the
// blocks do not fit now.
func (e *Engine) admit(r *Request, t time.Duration) bool {
	bs := e.cfg.BlockSize
	e.hashPrompt(r)
	// The cached prefix's blocks, looked up once (r.blocks is reused if
	// the request has to wait).
	if r.blocks == nil {
		r.blocks = make([]int32, 0, len(r.hashes))
	}
	found := r.blocks[:0]
	for _, h := range r.hashes {
		b, ok := e.cache.get(h)
		if !ok {
			break
		}
		found = append(found, b)
	}
	k := len(found)
	if k*bs >= len(r.Prompt) { // compute at least one token
		k = (len(r.Prompt) - 1) / bs
		found = found[:k]
	}
	need := e.blocksFor(r) - k
	evictable := e.lru.n
	for _, b := range found {
		if e.lru.b[b].ref == 0 {
			evictable--
		}
	}
	free := e.totalBlocks - e.usedBlocks - e.lru.n
	if need > free+evictable {
		r.blocks = found[:0]
		return false
	}
	for _, b := range found {
		e.pin(b)
	}
	r.blocks = found
	for e.totalBlocks-e.usedBlocks-e.lru.n < need {
		b := e.lru.popFront()
		e.cache.del(e.lru.b[b].hash)
		e.lru.drop(b)
	}
	e.usedBlocks += need
	r.anon = need
	r.prefilled = k * bs
	r.CachedTokens = k * bs
	r.Scheduled = t
	e.stats.PrefixQueries += uint64(len(r.Prompt))
	e.stats.PrefixHits += uint64(k * bs)
	return true
}

// hashPrompt sets r's chained block hashes once: the owner's if they fit.
func (e *Engine) hashPrompt(r *Request) {
	if r.hashes != nil {
		return
	}
	if bs := e.cfg.BlockSize; len(r.Hashes) == len(r.Prompt)/bs {
		r.hashes = r.Hashes
	} else {
		r.hashes = chainHashes(r.Prompt, bs)
	}
}

func (e *Engine) pin(b int32) {
	if e.lru.b[b].ref == 0 {
		e.lru.remove(b)
		e.usedBlocks++
	}
	e.lru.b[b].ref++
}

// registerBlocks adds r's newly computed full prompt blocks to the cache.
func (e *Engine) registerBlocks(r *Request) {
	full := min(r.prefilled/e.cfg.BlockSize, len(r.hashes))
	for i := len(r.blocks); i < full; i++ {
		h := r.hashes[i]
		if b, ok := e.cache.get(h); ok {
			// Computed concurrently by another request: share it and give
			// back the block this request had reserved for it.
			e.pin(b)
			r.anon--
			e.usedBlocks--
			r.blocks = append(r.blocks, b)
			continue
		}
		b := e.lru.alloc(h, 1)
		e.cache.put(h, b)
		r.anon--
		r.blocks = append(r.blocks, b)
	}
}

// cacheOutput turns the KV blocks r reserved for its output into cached
// prefix blocks of Prompt+Output (full blocks only, and no more than r
// reserved), before release unpins the rest. They are made evictable ahead
// of the prompt's blocks, the last first, like a longer prompt tail.
func (e *Engine) cacheOutput(r *Request) {
	if len(r.Output) == 0 || r.anon == 0 {
		return
	}
	// The prompt's full blocks are hashed already: continue their chain
	// over the rest of the prompt and the output (only that tail is
	// copied: a long conversation's prompt is not).
	bs := e.cfg.BlockSize
	k := len(r.hashes)
	tail := make([]uint64, 0, len(r.Prompt)-k*bs+len(r.Output))
	tail = append(append(tail, r.Prompt[k*bs:]...), r.Output...)
	// The chain's block i is r.hashes[i] below k, more[i−k] from k on.
	last := chainSeed
	if k > 0 {
		last = r.hashes[k-1]
	}
	more := chainFrom(make([]uint64, 0, len(tail)/bs), last, k, tail, bs)
	var add []uint64
	for i := len(r.blocks); i < k+len(more) && len(add) < r.anon; i++ {
		var h uint64
		if i < k {
			h = r.hashes[i]
		} else {
			h = more[i-k]
		}
		if _, ok := e.cache.get(h); ok {
			continue // cached already (another request computed it)
		}
		add = append(add, h)
	}
	for i := len(add) - 1; i >= 0; i-- {
		b := e.lru.alloc(add[i], 0)
		e.cache.put(add[i], b)
		e.lru.pushBack(b)
	}
	r.anon -= len(add)
	e.usedBlocks -= len(add)
}

// release unpins r's blocks. Cached blocks stay evictable, the tail of the
// prompt first, so a shared head outlives the tails that hang off it.
func (e *Engine) release(r *Request) {
	for i := len(r.blocks) - 1; i >= 0; i-- {
		b := r.blocks[i]
		e.lru.b[b].ref--
		if e.lru.b[b].ref == 0 {
			e.usedBlocks--
			e.lru.pushBack(b)
		}
	}
	r.blocks = nil
	e.usedBlocks -= r.anon
	r.anon = 0
}

// chainHashes returns the chained hashes of toks' full blocks of size bs.
func chainHashes(toks []uint64, bs int) []uint64 {
	return extendChain(make([]uint64, 0, len(toks)/bs), toks, bs)
}

// extendChain appends to hs, the chained hashes of the first len(hs) full
// blocks of toks, the hashes of toks' remaining full blocks.
func extendChain(hs []uint64, toks []uint64, bs int) []uint64 {
	last := chainSeed
	if len(hs) > 0 {
		last = hs[len(hs)-1]
	}
	return chainFrom(hs, last, len(hs), toks[min(len(hs)*bs, len(toks)):], bs)
}

// chainSeed starts every chain.
const chainSeed uint64 = 0x9e3779b97f4a7c15

// chainFrom appends to out the chained hashes of tail's full blocks, the
// blocks numbered from i0 of a sequence whose block i0−1 hashed to last
// (chainSeed when i0 is 0).
func chainFrom(out []uint64, last uint64, i0 int, tail []uint64, bs int) []uint64 {
	h := last
	for b := 0; b < len(tail)/bs; b++ {
		for _, t := range tail[b*bs : (b+1)*bs] {
			h = hashmix.SplitMix64(h ^ t)
		}
		h = hashmix.SplitMix64(h + uint64(i0+b+1))
		out = append(out, h)
	}
	return out
}

// ChainHashes returns the chained block hashes the prefix cache uses for a
// prompt: element i covers tokens [0, (i+1)·blockSize).
func ChainHashes(toks []uint64, blockSize int) []uint64 { return chainHashes(toks, blockSize) }

// ExtendChain appends to hs, the chained hashes of the first len(hs) full
// blocks of toks, the hashes of toks' remaining full blocks: a prompt that
// extends another (the next turn of a conversation) costs only its new
// tokens.
func ExtendChain(hs, toks []uint64, blockSize int) []uint64 { return extendChain(hs, toks, blockSize) }

// CachedBlocks returns how many of the leading chained block hashes
// (ChainHashes of a prompt, in order) the prefix cache holds now: what a
// router that follows the engine's KV-cache events knows (Dynamo's KV
// router, for one). It changes nothing, not even the LRU order.
func (e *Engine) CachedBlocks(hashes []uint64) int {
	k := 0
	for k < len(hashes) {
		if _, ok := e.cache.get(hashes[k]); !ok {
			break
		}
		k++
	}
	return k
}

// Backlog is the prompt work queued in an engine (SGLang reports it in its
// /v1/loads as num_total_tokens' queued part and num_waiting_uncached_tokens).
type Backlog struct {
	// WaitingTokens are the prompt tokens of the requests in the waiting
	// queue.
	WaitingTokens int
	// UncachedTokens are the prompt tokens still to compute: those of
	// waiting requests that the prefix cache does not hold now (as
	// admission would find them, at least one token each), plus the rest
	// of the prompts of running requests still in prefill.
	UncachedTokens int
}

// Backlog returns the prompt work queued now. It looks the waiting prompts
// up in the prefix cache without touching the LRU order; the chained hashes
// it computes are the ones admission uses, so they are computed once.
func (e *Engine) Backlog() Backlog {
	var b Backlog
	bs := e.cfg.BlockSize
	for _, r := range e.waiting.items[e.waiting.head:] {
		if r == nil || r.state != stateWaiting {
			continue
		}
		e.hashPrompt(r)
		k := e.CachedBlocks(r.hashes)
		if k*bs >= len(r.Prompt) {
			k = (len(r.Prompt) - 1) / bs
		}
		b.WaitingTokens += len(r.Prompt)
		b.UncachedTokens += len(r.Prompt) - k*bs
	}
	for _, r := range e.running {
		b.UncachedTokens += len(r.Prompt) - r.prefilled
	}
	return b
}

// TTFTBuckets are vLLM's bucket bounds of vllm:time_to_first_token_seconds
// (vllm/v1/metrics/loggers.py), in seconds.
var TTFTBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
	0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
