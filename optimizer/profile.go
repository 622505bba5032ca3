package optimizer

import (
	"fmt"
	"math"
)

// Curve is a latency in milliseconds as a function of utilization u ∈ [0, 1):
//
//	f(u) = Base + Linear·u + Queue·u/(1−u)
//
// With Linear ≥ 0 and Queue ≥ 0 it is convex and increasing on [0, 1). The
// Linear term models the running batch growing with load (every decode step
// gets slower by a constant per running sequence); the Queue term is the
// M/D/1 waiting time ρ·D/(2(1−ρ)) (Queue = D/2 for a deterministic service
// time D), which diverges at saturation.
type Curve struct {
	Base   float64 `json:"base_ms" yaml:"base_ms"`
	Linear float64 `json:"linear_ms" yaml:"linear_ms"`
	Queue  float64 `json:"queue_ms" yaml:"queue_ms"`
}

// At returns f(u). It returns +Inf for u ≥ 1 when Queue > 0.
func (c Curve) At(u float64) float64 {
	return c.Base + c.Linear*u + c.Queue*hq(u)
}

// hq is the queueing shape u/(1−u).
func hq(u float64) float64 {
	if u >= 1 {
		return math.Inf(1)
	}
	return u / (1 - u)
}

func (c Curve) check(what string) error {
	for _, v := range []float64{c.Base, c.Linear, c.Queue} {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return fmt.Errorf("%w: %s has a non-finite coefficient %+v", ErrNonConvexProfile, what, c)
		}
	}
	if c.Linear < 0 || c.Queue < 0 {
		return fmt.Errorf("%w: %s has linear %g ms and queue %g ms; both must be ≥ 0", ErrNonConvexProfile, what, c.Linear, c.Queue)
	}
	if c.Base < 0 {
		return fmt.Errorf("%w: %s has negative base %g ms", ErrNonConvexProfile, what, c.Base)
	}
	return nil
}

// Profile is the load-dependent latency of one replica of one (GPU type,
// model) pair, stated for a reference request of RefPromptTokens prompt and
// RefOutputTokens output tokens.
//
// Work model: a request of p prompt tokens, of which the share h is a
// prefix-cache hit, and o output tokens occupies the replica for
// p·(1−h)·PromptTokenSec + o·OutputTokenSecAt(p+o) seconds of its capacity
// (a cached token needs no prefill; see Shape and BatchModel), so its
// capacity for that shape is the inverse of that, and the utilization of an
// engine is the sum over its traffic of rate × work / (replicas available).
//
// Shape scaling: a request of another shape whose work is r times the
// reference work sees r times the reference's load-dependent delay (the
// Linear and Queue parts): continuous batching shares every step among the
// running sequences, which is processor sharing, and under processor sharing
// a job's congestion delay is proportional to its size. The zero-load part
// (Base) is adjusted for the prompt length with PrefillTokensPerS.
// See docs/optimizer.md for the derivation.
type Profile struct {
	// CapacityRPS is the reference requests per second one replica sustains
	// at utilization 1. It equals 1/(RefPromptTokens·PromptTokenSec +
	// RefOutputTokens·OutputTokenSec); NewProfile and Validate keep them
	// consistent.
	CapacityRPS float64 `json:"capacity_rps" yaml:"capacity_rps"`
	// PromptTokenSec and OutputTokenSec are the seconds of replica capacity
	// one prompt (prefill) token and one output (decode) token use.
	PromptTokenSec float64 `json:"prompt_token_sec" yaml:"prompt_token_sec"`
	OutputTokenSec float64 `json:"output_token_sec" yaml:"output_token_sec"`
	// RefPromptTokens and RefOutputTokens are the reference request shape.
	RefPromptTokens float64 `json:"ref_prompt_tokens" yaml:"ref_prompt_tokens"`
	RefOutputTokens float64 `json:"ref_output_tokens" yaml:"ref_output_tokens"`
	// PrefillTokensPerS adjusts the zero-load TTFT for prompts longer or
	// shorter than the reference; 0 means no adjustment.
	PrefillTokensPerS float64 `json:"prefill_tokens_per_s" yaml:"prefill_tokens_per_s"`
	// TTFT and TBOT are the reference request's time to first token and time
	// between output tokens, in milliseconds, against utilization.
	TTFT Curve `json:"ttft" yaml:"ttft"`
	TBOT Curve `json:"tbot" yaml:"tbot"`
	// Batch, when set (NewProfile sets it from the step model), makes the
	// cost of an output token depend on the request's context: a batch
	// bound by KV space (KVCapacityTokens / context < MaxRunning) runs
	// fewer sequences per step, so each token carries more of the step's
	// fixed cost. Zero: OutputTokenSec for every context.
	Batch BatchModel `json:"batch,omitzero" yaml:"batch,omitempty"`
}

// BatchModel is the part of the step model that sets the batch size at
// saturation: Beff = min(MaxRunning, KVCapacityTokens / context), and one
// output token costs DecodeStepMs/Beff + DecodeStepPerSeqMs of the step.
type BatchModel struct {
	DecodeStepMs       float64 `json:"decode_step_ms" yaml:"decode_step_ms"`
	DecodeStepPerSeqMs float64 `json:"decode_step_per_seq_ms" yaml:"decode_step_per_seq_ms"`
	MaxRunning         int     `json:"max_running" yaml:"max_running"`
	KVCapacityTokens   int     `json:"kv_capacity_tokens" yaml:"kv_capacity_tokens"`
}

// tokenMs is the step time per output token at saturation for a context of
// the given tokens (0 when the model is unset).
func (b BatchModel) tokenMs(context float64) float64 {
	if b.MaxRunning <= 0 {
		return 0
	}
	beff := float64(b.MaxRunning)
	if b.KVCapacityTokens > 0 && context > 0 {
		if kv := float64(b.KVCapacityTokens) / context; kv < beff {
			beff = math.Max(1, kv)
		}
	}
	return b.DecodeStepMs/beff + b.DecodeStepPerSeqMs
}

// Shape is a request's mean work: its prompt and output tokens, and the
// share of the prompt that the engine's prefix cache already holds.
type Shape struct {
	PromptTokens, OutputTokens float64
	// CachedShare in [0, 1] is the share of the prompt tokens served from
	// the prefix cache. A cached token costs no prefill, neither engine
	// time nor time to first token; its KV still occupies the batch (the
	// whole context, prompt and output, sets the KV-bound batch size).
	CachedShare float64
}

// UncachedPromptTokens is the prompt the engine has to prefill.
func (s Shape) UncachedPromptTokens() float64 { return s.PromptTokens * (1 - s.CachedShare) }

// ContextTokens is the KV the request holds at its end.
func (s Shape) ContextTokens() float64 { return s.PromptTokens + s.OutputTokens }

// Reference is the profile's reference request (nothing cached).
func (p *Profile) Reference() Shape {
	return Shape{PromptTokens: p.RefPromptTokens, OutputTokens: p.RefOutputTokens}
}

// Validate checks that the profile is convex, increasing and consistent.
func (p *Profile) Validate() error {
	if err := p.TTFT.check("TTFT curve"); err != nil {
		return err
	}
	if err := p.TBOT.check("TBOT curve"); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		v    float64
	}{
		{"capacity_rps", p.CapacityRPS}, {"ref_prompt_tokens+ref_output_tokens", p.RefPromptTokens + p.RefOutputTokens},
	} {
		if !(f.v > 0) || math.IsInf(f.v, 0) {
			return fmt.Errorf("%w: %s is %g, must be > 0", ErrNonConvexProfile, f.name, f.v)
		}
	}
	if p.PromptTokenSec < 0 || p.OutputTokenSec < 0 || math.IsNaN(p.PromptTokenSec) || math.IsNaN(p.OutputTokenSec) ||
		p.RefPromptTokens < 0 || p.RefOutputTokens < 0 || p.PrefillTokensPerS < 0 {
		return fmt.Errorf("%w: per-token costs, reference shape and prefill rate must be ≥ 0 (got %g s, %g s, %g, %g, %g)",
			ErrNonConvexProfile, p.PromptTokenSec, p.OutputTokenSec, p.RefPromptTokens, p.RefOutputTokens, p.PrefillTokensPerS)
	}
	if p.TTFT.Linear+p.TTFT.Queue+p.TBOT.Linear+p.TBOT.Queue <= 0 {
		return fmt.Errorf("%w: latency does not grow with load (all linear and queue terms are 0)", ErrNonConvexProfile)
	}
	if b := p.Batch; b.MaxRunning < 0 || b.KVCapacityTokens < 0 || !(b.DecodeStepMs >= 0) || !(b.DecodeStepPerSeqMs >= 0) ||
		!finite(b.DecodeStepMs+b.DecodeStepPerSeqMs) {
		return fmt.Errorf("%w: batch model %+v needs non-negative, finite values", ErrNonConvexProfile, b)
	}
	w := p.work(p.Reference())
	if !(w > 0) {
		return fmt.Errorf("%w: reference request has zero work (prompt_token_sec %g, output_token_sec %g)",
			ErrNonConvexProfile, p.PromptTokenSec, p.OutputTokenSec)
	}
	if got := 1 / w; math.Abs(got-p.CapacityRPS) > 1e-6*p.CapacityRPS {
		return fmt.Errorf("%w: capacity_rps %g disagrees with per-token costs (which give %g); use WithCapacity",
			ErrNonConvexProfile, p.CapacityRPS, got)
	}
	return nil
}

// work is the replica-seconds one request of the given shape uses: its
// uncached prompt at PromptTokenSec, its output at OutputTokenSec scaled by
// the batch model for its context (the reference context costs exactly
// OutputTokenSec).
func (p *Profile) work(s Shape) float64 {
	return s.UncachedPromptTokens()*p.PromptTokenSec + s.OutputTokens*p.OutputTokenSecAt(s.ContextTokens())
}

// OutputTokenSecAt is the replica-seconds one output token of a request
// with the given context (prompt + output tokens) uses: OutputTokenSec at
// the reference context, more where the context is long enough that KV
// space, not MaxRunning, bounds the batch (see BatchModel).
func (p *Profile) OutputTokenSecAt(context float64) float64 {
	ref := p.Batch.tokenMs(p.RefPromptTokens + p.RefOutputTokens)
	if !(ref > 0) {
		return p.OutputTokenSec
	}
	return p.OutputTokenSec * p.Batch.tokenMs(context) / ref
}

// Capacity returns the requests per second of the given shape one replica
// sustains at utilization 1.
func (p *Profile) Capacity(s Shape) float64 {
	return 1 / p.work(s)
}

// WithCapacity returns a copy whose reference capacity is rps, scaling both
// per-token costs (the prompt/output cost ratio is kept).
func (p Profile) WithCapacity(rps float64) Profile {
	w := p.work(p.Reference())
	k := 1 / (rps * w)
	p.PromptTokenSec *= k
	p.OutputTokenSec *= k
	p.CapacityRPS = rps
	return p
}

// Ratio is the work of a request of the given shape relative to the
// reference request: the factor on its load (in reference requests) and on
// its congestion delay.
func (p *Profile) Ratio(s Shape) float64 {
	return p.work(s) / p.work(p.Reference())
}

// Latency returns the predicted TTFT and TBOT (ms) of a request with the
// given shape at utilization u. Its zero-load TTFT counts the prefill of
// its uncached prompt only.
func (p *Profile) Latency(s Shape, u float64) (ttft, tbot float64) {
	r := p.Ratio(s)
	ttft = p.baseTTFT(s.UncachedPromptTokens()) + r*(p.TTFT.Linear*u+p.TTFT.Queue*hq(u))
	tbotScale := r
	if s.OutputTokens > p.RefOutputTokens && p.RefOutputTokens > 0 {
		// n·ΔTBOT scales with r, so ΔTBOT scales with r·n_ref/n. Not
		// beyond r for answers shorter than the reference: their work is
		// mostly prefill, which slows the steps of a batch as r says, and
		// spread over a handful of tokens the congestion would read as a
		// decode step several times what the engine runs.
		tbotScale = r * p.RefOutputTokens / s.OutputTokens
	}
	tbot = p.TBOT.Base + tbotScale*(p.TBOT.Linear*u+p.TBOT.Queue*hq(u))
	return ttft, tbot
}

// FullUtilization is the utilization at which one more request of the
// given shape costs stretch times its zero-load latency: its own latency
// L(u) (TTFT + output × TBOT at the engine) plus the congestion it adds to
// every request there, d(u·L(u))/du = L(u) + u·L'(u), which is what the
// optimizer's objective charges at the margin. Past it the latency curves
// are in their hockey stick: a few more requests slow everyone down by
// seconds. A shape whose marginal cost stays below stretch × L(0) up to
// max gets max.
func (p *Profile) FullUtilization(s Shape, stretch, max float64) float64 {
	lat := func(u float64) float64 {
		ttft, tbot := p.Latency(s, u)
		return ttft + s.OutputTokens*tbot
	}
	const h = 1e-6
	marginal := func(u float64) float64 {
		return lat(u) + u*(lat(u+h)-lat(math.Max(0, u-h)))/(u+h-math.Max(0, u-h))
	}
	target := stretch * lat(0)
	if !(target > 0) || marginal(max) <= target {
		return max
	}
	lo, hi := 0.0, max
	for range 50 {
		mid := (lo + hi) / 2
		if marginal(mid) <= target {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

func (p *Profile) baseTTFT(prompt float64) float64 {
	b := p.TTFT.Base
	if p.PrefillTokensPerS > 0 {
		b += (prompt - p.RefPromptTokens) / p.PrefillTokensPerS * 1000
		if b < 0 {
			b = 0
		}
	}
	return b
}

// StepModel is the engine step-time model of the fleet spec (see
// fleet.Profile and engine-calibration.md §5): a scheduler step that
// prefills p uncached tokens and decodes for B running sequences takes
// DecodeStepMs + DecodeStepPerSeqMs·B + p/PrefillTokensPerS.
type StepModel struct {
	PrefillTokensPerS  float64
	OverheadMs         float64
	DecodeStepMs       float64
	DecodeStepPerSeqMs float64
	MaxRunning         int
	KVCapacityTokens   int
}

// NewProfile derives the queueing-form profile of a step model for a
// reference request of prompt and output tokens (a, b: decode step and its
// per-sequence cost; P: prefill tokens/s):
//
//	Beff     = min(MaxRunning, KVCapacityTokens/(prompt+output))   (batch at saturation)
//	work     = prompt/P + output·(a/Beff + b)                       (replica-seconds per request)
//	capacity = 1/work
//
// Below saturation the running batch follows Little's law, B = λ·output·TBOT,
// and prefill takes the share u·φ of engine time (φ = (prompt/P)/work), so
//
//	TBOT(u) = a / (1 − u·(φ + κ)),   κ = b·capacity·output
//	TTFT(u) = overhead + prompt/P + 1.5·TBOT(u)
//
// (the prefill step plus, on average, half of the step in progress). These
// are projected onto the Curve family by least squares with non-negative
// coefficients on u ∈ [0, 0.95]. Against the engine simulator's scheduler
// (TestFitRecoversSimulator) the capacity is within 2% and both curves
// within 8% up to u = 0.8.
func NewProfile(m StepModel, prompt, output float64) (Profile, error) {
	if !(m.PrefillTokensPerS > 0) || m.DecodeStepMs < 0 || m.DecodeStepPerSeqMs < 0 || m.OverheadMs < 0 || m.MaxRunning <= 0 {
		return Profile{}, fmt.Errorf("%w: step model needs prefill_tokens_per_s > 0, max_running > 0 and non-negative step times (got %+v)",
			ErrNonConvexProfile, m)
	}
	if prompt < 0 || output < 0 || prompt+output <= 0 {
		return Profile{}, fmt.Errorf("%w: reference shape %g prompt / %g output tokens", ErrInvalidProblem, prompt, output)
	}
	beff := float64(m.MaxRunning)
	if m.KVCapacityTokens > 0 {
		if kv := float64(m.KVCapacityTokens) / (prompt + output); kv < beff {
			beff = math.Max(1, kv)
		}
	}
	a, b := m.DecodeStepMs/1000, m.DecodeStepPerSeqMs/1000
	pSec := 1 / m.PrefillTokensPerS
	oSec := a/beff + b
	work := prompt*pSec + output*oSec
	if !(work > 0) {
		return Profile{}, fmt.Errorf("%w: step model gives zero work per request", ErrNonConvexProfile)
	}
	phi := prompt * pSec / work
	mu := 1 / work
	c := phi + b*mu*output
	tbot := func(u float64) float64 { return m.DecodeStepMs / (1 - u*c) }
	ttft := func(u float64) float64 { return m.OverheadMs + prompt*pSec*1000 + 1.5*tbot(u) }
	var samples []Sample
	var yT, yB []float64
	for k := 0; k <= 95; k++ {
		u := float64(k) / 100
		samples = append(samples, Sample{RatePerS: u * mu})
		yT = append(yT, ttft(u))
		yB = append(yB, tbot(u))
	}
	ct, _ := fitCurve(samples, mu, yT)
	cb, _ := fitCurve(samples, mu, yB)
	if c >= 1 || ct.Linear+ct.Queue+cb.Linear+cb.Queue <= 0 {
		// degenerate step model (no growth with load): M/D/1 wait only
		ct = Curve{Base: ttft(0), Queue: work * 1000 / 2}
		cb = Curve{Base: m.DecodeStepMs}
	}
	p := Profile{
		CapacityRPS:       mu,
		PromptTokenSec:    pSec,
		OutputTokenSec:    oSec,
		RefPromptTokens:   prompt,
		RefOutputTokens:   output,
		PrefillTokensPerS: m.PrefillTokensPerS,
		TTFT:              ct,
		TBOT:              cb,
		Batch: BatchModel{DecodeStepMs: m.DecodeStepMs, DecodeStepPerSeqMs: m.DecodeStepPerSeqMs,
			MaxRunning: m.MaxRunning, KVCapacityTokens: m.KVCapacityTokens},
	}
	return p, p.Validate()
}
