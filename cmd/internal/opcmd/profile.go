package opcmd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/internal/llmclient"
	"github.com/inferlb/inferlb/internal/tokens"
	"github.com/inferlb/inferlb/internal/words"
	"github.com/inferlb/inferlb/optimizer"
)

func newProfileCmd() *cobra.Command {
	var o profileCmdFlags
	cmd := &cobra.Command{
		Use:   "profile --target URL --model MODEL --max-rate RPS",
		Short: "Measure an engine's latency profile with a load sweep and fit it",
		Long: `profile sends Poisson load of one request shape (--prompt-tokens,
--output-tokens; every prompt different, so no prefix-cache hits) to one engine
(a vLLM or SGLang server, or the lab's engine simulator) at --points rates
from 10% to 80% of --max-rate (your estimate of its saturation rate),
measures mean TTFT and TBOT at each, and fits the optimizer's queueing form
(docs/optimizer.md):

  TTFT(u) = base + linear·u + queue·u/(1−u),  u = rate / capacity   (same for TBOT)

It prints the samples, the fitted capacity and curves with R² and RMSE, and a
fleet-spec "profiles:" entry: with --fleet and --gpu, the fleet's profile for
(--gpu, --model) with capacity_rps set to the fitted capacity,
decode_step_ms to the fitted zero-load TBOT, and ttft_curve and tbot_curve to
the fitted curves, which the optimizer and the control plane then use instead
of the curves they derive from the step model. Capacity and curves are for
the measured request shape: choose --prompt-tokens and --output-tokens near
the mean shape of the model's first class (the optimizer's reference
request). The other step-model fields cannot be identified from one request
shape.

After the sweep it reads the engine's /metrics with --server's mapping
(vllm, sglang, generic or llamacpp) and GET /v1/models: the KV cache size
(vllm:cache_config_info's block_size × num_gpu_blocks, or SGLang's
max_total_num_tokens) and the context limit (max_model_len) go into the
entry as block_size, kv_capacity_tokens and max_context_tokens. Without
--fleet, the entry is built from the measurement alone (prefill throughput
from the zero-load TTFT, decode_step_per_seq_ms 0: the curves carry the load
dependence), and needs --gpu and a KV size from /metrics.`,
		Example: `  inferlb-lab engine-sim --listen 127.0.0.1:18100 --gpu H100 --model llama-3.1-8b --fleet examples/fleet-3region.yaml --time-scale 2 &
  inferlb profile --target http://127.0.0.1:18100 --model llama-3.1-8b --max-rate 40 --time-scale 2 \
      --points 4 --requests 40 --fleet examples/fleet-3region.yaml --gpu H100`,
		Args: cobra.NoArgs,
		RunE: o.run,
	}
	fl := cmd.Flags()
	fl.StringVar(&o.target, "target", "", "engine base URL, e.g. http://127.0.0.1:8000")
	fl.StringVar(&o.modelName, "model", "", "model name to request (and to look up in --fleet)")
	fl.StringVar(&o.gpu, "gpu", "", "GPU type of the engine (with --fleet: whose profile to update)")
	fl.StringVar(&o.fleetPath, "fleet", "", "fleet spec whose (--gpu, --model) profile the output updates")
	fl.StringVar(&o.server, "server", fleet.ServerVLLM, "the engine's server kind, for its /metrics names: vllm, sglang, generic or llamacpp")
	fl.IntVar(&o.prompt, "prompt-tokens", 200, "prompt tokens per request")
	fl.IntVar(&o.output, "output-tokens", 200, "output tokens per request (ignore_eos)")
	fl.Float64Var(&o.maxRate, "max-rate", 0, "estimated saturation rate (req/s, target time); the sweep covers 10%–80% of it")
	fl.IntVar(&o.points, "points", 8, "number of load levels")
	fl.IntVar(&o.requests, "requests", 300, "requests per load level")
	fl.Float64Var(&o.timeScale, "time-scale", 0, "target's time scale (engine-sim --time-scale); rates and latencies are in target time")
	fl.DurationVar(&o.timeout, "timeout", 5*time.Minute, "bound on one request")
	return cmd
}

// profileCmdFlags are inferlb profile's flags.
type profileCmdFlags struct {
	target, modelName, gpu, fleetPath string
	server                            string
	prompt, output, points, requests  int
	maxRate, timeScale                float64
	timeout                           time.Duration
}

// run carries out the command.
func (o *profileCmdFlags) run(cmd *cobra.Command, args []string) error {
	if o.target == "" || o.modelName == "" || !(o.maxRate > 0) {
		return fmt.Errorf("profile: --target, --model and --max-rate > 0 are required")
	}
	if o.points < 4 || o.requests < 20 || o.prompt < 2 || o.output < 2 {
		return fmt.Errorf("profile: need --points ≥ 4, --requests ≥ 20, --prompt-tokens ≥ 2, --output-tokens ≥ 2")
	}
	var base *fleet.Profile
	if o.fleetPath != "" {
		spec, err := fleet.Load(o.fleetPath)
		if err != nil {
			return err
		}
		fp, ok := spec.Profile(o.gpu, o.modelName)
		if !ok {
			return fmt.Errorf("profile: fleet %s has no profile for gpu %q model %q", o.fleetPath, o.gpu, o.modelName)
		}
		base = &fp
	}
	mp := signals.MappingFor(o.server)
	if mp == nil {
		return fmt.Errorf("profile: --server %q is not one of %s", o.server, strings.Join(fleet.ServerKinds, ", "))
	}
	if base == nil && o.gpu != "" {
		base = &fleet.Profile{GPU: o.gpu, Model: o.modelName}
	}
	return o.sweep(cmd, base, mp)
}

// sweep measures the load levels, fits the profile and writes the entry.
func (o *profileCmdFlags) sweep(cmd *cobra.Command, base *fleet.Profile, mp *signals.Mapping) error {
	out := cmd.OutOrStdout()
	client := &llmclient.Client{BaseURL: strings.TrimRight(o.target, "/"), Model: o.modelName, IgnoreEOS: true, Timeout: o.timeout}
	defer client.CloseIdleConnections()
	var samples []optimizer.Sample
	for k := 0; k < o.points; k++ {
		rate := o.maxRate * (0.1 + 0.7*float64(k)/float64(o.points-1))
		lv, err := o.level(cmd.Context(), client, rate, uint64(k+1))
		if err != nil {
			return fmt.Errorf("profile: load at %.3g req/s: %w", rate, err)
		}
		if lv.ok < o.requests*9/10 {
			return fmt.Errorf("profile: at %.3g req/s only %d of %d requests succeeded (first error: %v)", rate, lv.ok, o.requests, lv.firstErr)
		}
		s := optimizer.Sample{RatePerS: rate, TTFTMs: lv.ttftMs, TBOTMs: lv.tbotMs}
		fmt.Fprintf(out, "# rate %7.3f req/s: TTFT %8.2f ms  TBOT %7.3f ms  (%d ok)\n", rate, s.TTFTMs, s.TBOTMs, lv.ok)
		samples = append(samples, s)
	}
	f, err := optimizer.FitProfile(samples)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	// After the sweep: some servers (SGLang) create their series
	// at the first request.
	eng, err := readEngineConfig(cmd.Context(), strings.TrimRight(o.target, "/"), o.modelName, mp)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	fmt.Fprintf(out, "# engine config: %s\n", eng)
	if base != nil {
		eng.apply(base, f, o.prompt, o.fleetPath == "")
		if base.KVCapacityTokens == 0 {
			fmt.Fprintln(out, "# WARNING: kv_capacity_tokens unknown (the engine's /metrics has no cache config): fill it in below")
		}
	}
	return writeProfile(out, f, base, o.target, o.modelName, o.prompt, o.output)
}

// levelResult is what one load level measured: the requests that completed,
// their mean time to first token and mean time between output tokens (ms,
// in the target's time), and the first failure.
type levelResult struct {
	ok             int
	ttftMs, tbotMs float64
	firstErr       error
}

// level sends --requests chat requests of the --prompt-tokens/--output-tokens
// shape at Poisson times of mean rate rate (per second of the target's time,
// --time-scale), each prompt different (so the prefix cache does not help),
// and measures them as they stream. seed makes the level's arrival times and
// prompts.
func (o *profileCmdFlags) level(ctx context.Context, client *llmclient.Client, rate float64, seed uint64) (levelResult, error) {
	scale := o.timeScale
	if scale == 0 {
		scale = 1
	}
	// The role marker is one token of the prompt; each word is one more.
	prompt := max(o.prompt-1, 1)
	rng := rand.New(rand.NewPCG(seed, 0x706f6973736f6e))
	var (
		lv               levelResult
		ttftSum, tbotSum float64
		ttftN, tbotN     int
		mu               sync.Mutex
		wg               sync.WaitGroup
		at               time.Duration // target time of the next arrival
		start            = time.Now()
		targetMs         = func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / scale }
	)
	for i := 0; i < o.requests; i++ {
		at += time.Duration(rng.ExpFloat64() / rate * float64(time.Second))
		if !sleepUntil(ctx, start.Add(time.Duration(float64(at)*scale))) {
			break
		}
		req := &llmclient.Request{MaxTokens: o.output, Messages: []tokens.Message{
			{Role: "user", Content: words.Words(seed<<32+uint64(i)*7919, prompt)}}}
		wg.Add(1)
		go func() {
			defer wg.Done()
			res := client.Do(ctx, req, false)
			mu.Lock()
			defer mu.Unlock()
			if res.Outcome != llmclient.OK {
				if lv.firstErr == nil {
					lv.firstErr = fmt.Errorf("%s: %v", res.Outcome, res.Err)
				}
				return
			}
			lv.ok++
			if res.TTFT > 0 {
				ttftSum += targetMs(res.TTFT)
				ttftN++
			}
			if d, ok := res.TPOT(); ok {
				tbotSum += targetMs(d)
				tbotN++
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil {
		return lv, errors.New("interrupted")
	}
	if ttftN > 0 {
		lv.ttftMs = ttftSum / float64(ttftN)
	}
	if tbotN > 0 {
		lv.tbotMs = tbotSum / float64(tbotN)
	}
	return lv, nil
}

// sleepUntil waits until t; false if ctx ends first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// engineConfig is what an engine says about itself: KV cache and context
// limit (0 where it does not say).
type engineConfig struct {
	blockSize, kvTokens, maxModelLen int
}

func (e engineConfig) String() string {
	parts := []string{}
	if e.blockSize > 0 {
		parts = append(parts, fmt.Sprintf("block_size %d", e.blockSize))
	}
	if e.kvTokens > 0 {
		parts = append(parts, fmt.Sprintf("KV cache %d tokens", e.kvTokens))
	}
	if e.maxModelLen > 0 {
		parts = append(parts, fmt.Sprintf("max_model_len %d", e.maxModelLen))
	}
	if len(parts) == 0 {
		return "none reported (no cache config in /metrics, no max_model_len in /v1/models)"
	}
	return strings.Join(parts, ", ")
}

// readEngineConfig reads the engine's cache configuration from /metrics
// (with the server kind's mapping) and its context limit from /v1/models.
func readEngineConfig(ctx context.Context, base, model string, mp *signals.Mapping) (engineConfig, error) {
	var e engineConfig
	get := func(path string) ([]byte, error) {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+path, nil)
		if err != nil {
			return nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(io.LimitReader(resp.Body, 8<<20))
		if err == nil && resp.StatusCode/100 != 2 {
			err = fmt.Errorf("GET %s: %s", base+path, resp.Status)
		}
		return b, err
	}
	b, err := get("/metrics")
	if err != nil {
		return e, err
	}
	m, err := mp.Parse(bytes.NewReader(b))
	if err != nil {
		return e, fmt.Errorf("%s/metrics: %w", base, err)
	}
	positive := func(v float64) int {
		if v > 0 && v < 1<<40 {
			return int(v)
		}
		return 0
	}
	e.blockSize = positive(m.BlockSize)
	if blocks := positive(m.KVBlocks); blocks > 0 && e.blockSize > 0 {
		e.kvTokens = blocks * e.blockSize
	} else {
		e.kvTokens = positive(m.KVTokens)
	}
	if b, err := get("/v1/models"); err == nil {
		var list struct {
			Data []struct {
				ID          string  `json:"id"`
				MaxModelLen float64 `json:"max_model_len"`
			} `json:"data"`
		}
		if json.Unmarshal(b, &list) == nil {
			for _, d := range list.Data {
				if d.ID == model {
					e.maxModelLen = positive(d.MaxModelLen)
				}
			}
		}
	}
	return e, nil
}

// apply writes what the engine reported into p; fresh (no fleet profile to
// start from) also fills the step-model fields from the fit.
func (e engineConfig) apply(p *fleet.Profile, f optimizer.Fit, prompt int, fresh bool) {
	if e.blockSize > 0 {
		p.BlockSize = e.blockSize
	}
	if e.kvTokens > 0 {
		p.KVCapacityTokens = e.kvTokens
	}
	if e.maxModelLen > 0 {
		p.MaxContextTokens = e.maxModelLen
	}
	if fresh {
		// The zero-load TTFT is overhead plus prefill; all of it is
		// charged to prefill here (a lower, safe throughput).
		if f.TTFT.Base > 0 {
			p.PrefillTokensPerS = math.Round(float64(prompt) / (f.TTFT.Base / 1000))
		}
		p.DecodeStepPerSeqMs = 0
		if p.MaxRunning == 0 {
			p.MaxRunning, p.MaxBatchedTokens = fleet.DefaultMaxRunning, fleet.DefaultMaxBatchedTokens
		}
		if p.BlockSize == 0 {
			p.BlockSize = fleet.DefaultBlockSize
		}
	}
}

func writeProfile(out io.Writer, f optimizer.Fit, base *fleet.Profile, target, modelName string, prompt, output int) error {
	fmt.Fprintf(out, "# inferlb profile against %s, model %s, %d/%d-token requests\n", target, modelName, prompt, output)
	fmt.Fprintf(out, "#   capacity %.3f req/s\n", f.CapacityRPS)
	fmt.Fprintf(out, "#   TTFT(u) = %.3f + %.3f·u + %.3f·u/(1−u) ms   R² %.4f  RMSE %.3f ms\n", f.TTFT.Base, f.TTFT.Linear, f.TTFT.Queue, f.TTFTR2, f.TTFTRMSE)
	fmt.Fprintf(out, "#   TBOT(u) = %.3f + %.3f·u + %.3f·u/(1−u) ms   R² %.4f  RMSE %.3f ms\n", f.TBOT.Base, f.TBOT.Linear, f.TBOT.Queue, f.TBOTR2, f.TBOTRMSE)
	if base == nil {
		fmt.Fprintln(out, "# (no --fleet/--gpu: no profiles entry to update)")
		return nil
	}
	round := func(x float64) float64 { return math.Round(x*1000) / 1000 }
	curve := func(c optimizer.Curve) *fleet.Curve {
		return &fleet.Curve{BaseMs: round(c.Base), LinearMs: round(c.Linear), QueueMs: round(c.Queue)}
	}
	if round(f.TTFT.Base) <= 0 || round(f.TBOT.Base) <= 0 {
		fmt.Fprintln(out, "# WARNING: a fitted zero-load latency is not positive (too few or too noisy samples?);")
		fmt.Fprintln(out, "#          the fleet spec refuses the entry below until base_ms and decode_step_ms are > 0")
	}
	p := *base
	p.CapacityRPS = round(f.CapacityRPS)
	p.DecodeStepMs = round(f.TBOT.Base)
	p.TTFTCurve, p.TBOTCurve = curve(f.TTFT), curve(f.TBOT)
	doc := struct {
		Profiles []fleet.Profile `yaml:"profiles"`
	}{[]fleet.Profile{p}}
	enc := yaml.NewEncoder(out)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return err
	}
	return enc.Close()
}
