package model

import (
	"fmt"
	"math/rand/v2"
	"time"
)

// Load is a steady load of one request shape for Measure: Poisson arrivals
// at RatePerS of Requests requests of PromptTokens (every prompt different:
// no prefix-cache hit) and OutputTokens each.
type Load struct {
	RatePerS                   float64
	PromptTokens, OutputTokens int
	Requests                   int
	Seed                       uint64
}

// Measured is the mean latency of the requests Measure counted.
type Measured struct {
	TTFTMs, TBOTMs float64
	Requests       int
}

// Measure runs the load through an engine of cfg in virtual time and
// returns the mean TTFT (arrival to first token, overhead included) and
// TBOT (first to last token over the tokens between) of the requests that
// arrived after the first fifth of the load (the warm-up, while the batch
// fills) and generated at least two tokens. It is the engine simulator's
// answer to "what does this engine do at this load", which `inferlb-lab
// profile --engine-sim` fits and the optimizer's tests hold profiles to.
func Measure(cfg Config, l Load) (Measured, error) {
	if !(l.RatePerS > 0) || l.PromptTokens < 1 || l.OutputTokens < 2 || l.Requests < 10 {
		return Measured{}, fmt.Errorf("model: measure needs rate > 0, a prompt, ≥ 2 output tokens and ≥ 10 requests (got %+v)", l)
	}
	c := &meanCollector{warm: time.Duration(float64(l.Requests) / 5 / l.RatePerS * 1e9)}
	e, err := New(cfg, c)
	if err != nil {
		return Measured{}, err
	}
	rng := rand.New(rand.NewPCG(l.Seed, 99))
	gap := func() time.Duration { return time.Duration(rng.ExpFloat64() / l.RatePerS * 1e9) }
	next := gap()
	sent := 0
	for {
		ev, ok := e.NextEvent()
		if sent < l.Requests && (!ok || next <= ev) {
			e.Advance(next)
			toks := make([]uint64, l.PromptTokens)
			for k := range toks {
				toks[k] = rng.Uint64()
			}
			if err := e.Submit(&Request{Prompt: toks, MaxTokens: l.OutputTokens}, next); err != nil {
				return Measured{}, err
			}
			sent++
			next += gap()
			continue
		}
		if !ok {
			break
		}
		e.Advance(ev)
	}
	if c.n == 0 {
		return Measured{}, fmt.Errorf("model: no request finished after the warm-up")
	}
	return Measured{TTFTMs: c.ttft / float64(c.n), TBOTMs: c.tbot / float64(c.n), Requests: c.n}, nil
}

type meanCollector struct {
	warm       time.Duration
	ttft, tbot float64
	n          int
}

func (c *meanCollector) Token(*Request, time.Duration) {}

// Tokens makes the collector a TokenBatcher: runs of decode-only steps
// come as one event (the same times as step by step).
func (c *meanCollector) Tokens(*Request, int, time.Duration, time.Duration) {}

func (c *meanCollector) Finished(r *Request, _ time.Duration) {
	if r.Arrival < c.warm || r.Generated < 2 {
		return
	}
	c.ttft += float64(r.FirstToken-r.Arrival) / 1e6
	c.tbot += float64(r.LastToken-r.FirstToken) / 1e6 / float64(r.Generated-1)
	c.n++
}
