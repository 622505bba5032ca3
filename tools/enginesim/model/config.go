// Package model is the engine simulator's core: a vLLM-like scheduler with
// continuous batching, chunked prefill and a block-level prefix cache, in
// virtual time.
//
// The model has no clock, no goroutines and no locks. Its owner drives it:
// Submit a request at virtual time now, then call Advance(now) whenever the
// time returned by NextEvent has been reached; events (first token, tokens,
// finish) are reported to a Listener, stamped with the virtual time at which
// they happened, which may be earlier than the now passed to Advance. The HTTP
// shell (package enginesim) drives one Engine per served engine from a timer
// in real time; a discrete-event fleet simulator drives thousands of them from
// one event queue: after every Submit, Advance, Abort or SetHang, re-read
// NextEvent and (re)schedule the engine's wake-up there. An Engine is not
// safe for concurrent use. Per request the model allocates a few small
// objects; per step it does O(running) work.
//
// # Step model
//
// Each scheduler step, like vLLM V1's, forms a batch under a token budget of
// MaxBatchedTokens: first every running request that has finished its prefill
// decodes one token, then running requests still prefilling take chunks of
// their uncached prompt, then waiting requests are admitted in FIFO order while
// there is a free running slot (MaxRunning), budget left, and KV space. A step
// that decodes B sequences and prefills p uncached tokens lasts
//
//	(DecodeStepMs + DecodeStepPerSeqMs·B + 1000·p/PrefillTokensPerS) ms × slowdown
//
// (fleet.Profile documents the form; calibration in engine-calibration.md §5).
// The step that completes a request's prefill also samples its first token.
// Each request pays OverheadMs (API server, tokenization) between arrival and
// becoming schedulable; the overhead does not occupy the GPU.
//
// # Prefix cache and KV space
//
// The prompt's tokens are cut into blocks of BlockSize tokens. A full block's
// hash covers its tokens and the hash of the block before it, so equal hashes
// mean equal prefixes. On admission the longest cached chain of the prompt's
// full blocks is reused (at most promptLen−1 tokens, as vLLM always computes at
// least one token) and only the rest is prefilled. A block joins the cache at
// the end of the step that computed it. KV space is KVCapacityTokens/BlockSize
// blocks; a request reserves on admission the blocks for its whole prompt and
// max output (so there is no preemption), blocks used by running requests are
// pinned, and unpinned cached blocks are evicted least recently used first
// when space is needed. KVUsage is pinned blocks / all blocks, like vLLM's
// kv_cache_usage_perc. Prefix-cache queries and hits count prompt tokens, as
// vLLM's vllm:prefix_cache_queries/hits do. Output tokens are not cached.
package model

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
)

// Config holds the parameters of one engine. Field meanings follow
// fleet.Profile.
type Config struct {
	PrefillTokensPerS  float64
	OverheadMs         float64
	DecodeStepMs       float64
	DecodeStepPerSeqMs float64
	MaxRunning         int
	MaxBatchedTokens   int
	KVCapacityTokens   int
	BlockSize          int
}

// ConfigFromProfile turns a fleet profile into an engine configuration,
// filling vLLM's defaults for zero MaxRunning (256), MaxBatchedTokens (8192)
// and BlockSize (16). Validate the result.
func ConfigFromProfile(p fleet.Profile) Config {
	c := Config{
		PrefillTokensPerS:  p.PrefillTokensPerS,
		OverheadMs:         p.OverheadMs,
		DecodeStepMs:       p.DecodeStepMs,
		DecodeStepPerSeqMs: p.DecodeStepPerSeqMs,
		MaxRunning:         p.MaxRunning,
		MaxBatchedTokens:   p.MaxBatchedTokens,
		KVCapacityTokens:   p.KVCapacityTokens,
		BlockSize:          p.BlockSize,
	}
	if c.MaxRunning == 0 {
		c.MaxRunning = 256
	}
	if c.MaxBatchedTokens == 0 {
		c.MaxBatchedTokens = 8192
	}
	if c.BlockSize == 0 {
		c.BlockSize = 16
	}
	return c
}

// Validate reports the first invalid field, naming it and its value.
func (c Config) Validate() error {
	var errs []error
	pos := func(name string, v float64) {
		if !(v > 0) || math.IsInf(v, 0) {
			errs = append(errs, fmt.Errorf("%s: must be a positive number, got %v", name, v))
		}
	}
	nonneg := func(name string, v float64) {
		if !(v >= 0) || math.IsInf(v, 0) {
			errs = append(errs, fmt.Errorf("%s: must be a non-negative number, got %v", name, v))
		}
	}
	pos("prefill_tokens_per_s", c.PrefillTokensPerS)
	nonneg("overhead_ms", c.OverheadMs)
	nonneg("decode_step_ms", c.DecodeStepMs)
	nonneg("decode_step_per_seq_ms", c.DecodeStepPerSeqMs)
	if c.DecodeStepMs+c.DecodeStepPerSeqMs <= 0 {
		errs = append(errs, fmt.Errorf("decode_step_ms + decode_step_per_seq_ms: must be positive, got %v", c.DecodeStepMs+c.DecodeStepPerSeqMs))
	}
	if c.MaxRunning < 1 {
		errs = append(errs, fmt.Errorf("max_running: must be at least 1, got %d", c.MaxRunning))
	}
	if c.MaxBatchedTokens < 1 {
		errs = append(errs, fmt.Errorf("max_batched_tokens: must be at least 1, got %d", c.MaxBatchedTokens))
	}
	if c.BlockSize < 1 {
		errs = append(errs, fmt.Errorf("block_size: must be at least 1, got %d", c.BlockSize))
	}
	if c.BlockSize >= 1 && c.KVCapacityTokens < c.BlockSize {
		errs = append(errs, fmt.Errorf("kv_capacity_tokens: must hold at least one block of %d tokens, got %d", c.BlockSize, c.KVCapacityTokens))
	}
	return errors.Join(errs...)
}

// StepDuration is the length of a step decoding b sequences and prefilling p
// uncached tokens, before any slowdown.
func (c Config) StepDuration(b, p int) time.Duration {
	ms := c.DecodeStepMs + c.DecodeStepPerSeqMs*float64(b) + 1000*float64(p)/c.PrefillTokensPerS
	return time.Duration(ms * float64(time.Millisecond))
}

// Overhead is the per-request overhead as a duration.
func (c Config) Overhead() time.Duration {
	return time.Duration(c.OverheadMs * float64(time.Millisecond))
}
