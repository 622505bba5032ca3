package main

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"strconv"

	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane"
	"github.com/inferlb/inferlb/optimizer"
	"github.com/inferlb/inferlb/tools/enginesim/model"
)

// simLoads are the loads of an --engine-sim sweep, as shares of the
// capacity the step model implies: up to 95% (the optimizer plans engines
// to their headroom, 0.85 by default, and an engine's load is noisy around
// its plan), with the 20/50/80/95% points the fit is held to
// (TestProfileEngineSimWithin15Percent).
var simLoads = []float64{0.1, 0.2, 0.35, 0.5, 0.65, 0.8, 0.9, 0.95}

// simRequests is the requests per load level of an --engine-sim sweep when
// --requests is not given, run as simSeeds independent runs: virtual time
// is cheap, and near saturation the mean TTFT is heavy-tailed (a long busy
// period with the batch full queues hundreds of requests): at 95% load,
// means over 80,000 requests still differ by ±20% from one set of seeds to
// the next.
const (
	simRequests = 80000
	simSeeds    = 8
)

// simSweep is `inferlb profile --engine-sim`: the fleet's (GPU, model)
// step model run by the engine simulator's scheduler in virtual time at
// points loads from 10% to 95%, fitted like a real engine's sweep.
func (o *profileCmdFlags) simSweep(cmd *cobra.Command) error {
	if o.target != "" {
		return fmt.Errorf("profile: --engine-sim and --target are exclusive")
	}
	if o.fleetPath == "" {
		return fmt.Errorf("profile: --engine-sim needs --fleet (whose step model to simulate)")
	}
	spec, err := fleet.Load(o.fleetPath)
	if err != nil {
		return err
	}
	if o.write && o.gpu == "" && o.modelName == "" {
		// every profile of the fleet (make profiles)
		for _, fp := range spec.Profiles {
			one := *o
			one.gpu, one.modelName = fp.GPU, fp.Model
			if err := one.simSweep(cmd); err != nil {
				return err
			}
		}
		return nil
	}
	if o.gpu == "" || o.modelName == "" {
		return fmt.Errorf("profile: --engine-sim needs --gpu and --model (whose step model to simulate), or --write alone for every profile")
	}
	fp, ok := spec.Profile(o.gpu, o.modelName)
	if !ok {
		return fmt.Errorf("profile: fleet %s has no profile for gpu %q model %q", o.fleetPath, o.gpu, o.modelName)
	}
	prompt, output := o.prompt, o.output
	fl := cmd.Flags()
	if !fl.Changed("prompt-tokens") && !fl.Changed("output-tokens") {
		// The curves are for the optimizer's reference request.
		if p, q, ok := controlplane.ReferenceShape(spec, o.modelName); ok {
			prompt, output = max(int(math.Round(p)), 1), max(int(math.Round(q)), 2)
		}
	}
	requests := o.requests
	if !fl.Changed("requests") {
		requests = simRequests
	}
	if requests < 20*simSeeds || prompt < 1 || output < 2 {
		return fmt.Errorf("profile: --engine-sim needs --requests ≥ %d, --prompt-tokens ≥ 1, --output-tokens ≥ 2", 20*simSeeds)
	}
	res, err := SimProfile(fp, prompt, output, requests, o.maxRate)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	out := cmd.OutOrStdout()
	for _, s := range res.Samples {
		u := s.RatePerS / res.Fit.CapacityRPS
		fmt.Fprintf(out, "# rate %7.3f req/s (u %.2f): TTFT %8.2f ms (fit %8.2f)  TBOT %7.3f ms (fit %7.3f)\n",
			s.RatePerS, u, s.TTFTMs, res.Fit.TTFT.At(u), s.TBOTMs, res.Fit.TBOT.At(u))
	}
	target := fmt.Sprintf("the engine simulator (%s %s step model of %s)", o.gpu, o.modelName, o.fleetPath)
	if !o.write {
		// The step model stays as it is: it is what the simulator runs.
		base := fp
		return writeSimProfile(out, res.Fit, &base, target, o.modelName, prompt, output)
	}
	if err := writeFleetCurves(o.fleetPath, o.gpu, o.modelName, res.Fit); err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	fmt.Fprintf(out, "# wrote capacity_rps %.3f, ttft_curve and tbot_curve of %s/%s into %s (%d/%d-token requests)\n",
		res.Fit.CapacityRPS, o.gpu, o.modelName, o.fleetPath, prompt, output)
	return nil
}

// SimProfileResult is a simulated sweep and its fit.
type SimProfileResult struct {
	Samples []optimizer.Sample
	Fit     optimizer.Fit
}

// SimProfile measures fp's step model with the engine simulator at the
// simLoads shares of maxRate (0: the capacity the step model implies for
// prompt/output-token requests), requests per load over simSeeds runs,
// and fits it.
func SimProfile(fp fleet.Profile, prompt, output, requests int, maxRate float64) (SimProfileResult, error) {
	cfg := model.ConfigFromProfile(fp)
	if maxRate <= 0 {
		d, err := optimizer.NewProfile(optimizer.StepModel{PrefillTokensPerS: fp.PrefillTokensPerS, OverheadMs: fp.OverheadMs,
			DecodeStepMs: fp.DecodeStepMs, DecodeStepPerSeqMs: fp.DecodeStepPerSeqMs, MaxRunning: cfg.MaxRunning,
			KVCapacityTokens: fp.KVCapacityTokens}, float64(prompt), float64(output))
		if err != nil {
			return SimProfileResult{}, err
		}
		maxRate = d.CapacityRPS
	}
	var res SimProfileResult
	for k, u := range simLoads {
		s := optimizer.Sample{RatePerS: u * maxRate}
		for r := 0; r < simSeeds; r++ {
			m, err := model.Measure(cfg, model.Load{RatePerS: s.RatePerS, PromptTokens: prompt, OutputTokens: output,
				Requests: requests / simSeeds, Seed: uint64(k*simSeeds + r + 1)})
			if err != nil {
				return SimProfileResult{}, err
			}
			s.TTFTMs += m.TTFTMs / simSeeds
			s.TBOTMs += m.TBOTMs / simSeeds
		}
		res.Samples = append(res.Samples, s)
	}
	f, err := optimizer.FitProfile(res.Samples)
	if err != nil {
		return SimProfileResult{}, err
	}
	res.Fit = f
	return res, nil
}

func writeSimProfile(out interface{ Write([]byte) (int, error) }, f optimizer.Fit, base *fleet.Profile, target, modelName string, prompt, output int) error {
	p := *base
	p.CapacityRPS = round3(f.CapacityRPS)
	p.TTFTCurve, p.TBOTCurve = fleetCurve(f.TTFT), fleetCurve(f.TBOT)
	fmt.Fprintf(out, "# inferlb profile against %s, model %s, %d/%d-token requests\n", target, modelName, prompt, output)
	fmt.Fprintf(out, "#   TTFT R² %.4f RMSE %.3f ms, TBOT R² %.4f RMSE %.3f ms\n", f.TTFTR2, f.TTFTRMSE, f.TBOTR2, f.TBOTRMSE)
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

func round3(x float64) float64 { return math.Round(x*1000) / 1000 }

func fleetCurve(c optimizer.Curve) *fleet.Curve {
	return &fleet.Curve{BaseMs: round3(c.Base), LinearMs: round3(c.Linear), QueueMs: round3(c.Queue)}
}

// writeFleetCurves sets capacity_rps, ttft_curve and tbot_curve of the
// fleet file's (gpu, model) profile entry, keeping the rest of the file
// (comments, the step model the engine simulator runs) as it is; the
// result must still load.
func writeFleetCurves(path, gpu, modelName string, f optimizer.Fit) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return fmt.Errorf("%s: not a mapping", path)
	}
	profiles := mapValue(doc.Content[0], "profiles")
	if profiles == nil || profiles.Kind != yaml.SequenceNode {
		return fmt.Errorf("%s: no profiles list", path)
	}
	found := false
	for _, e := range profiles.Content {
		if e.Kind != yaml.MappingNode {
			continue
		}
		if g, m := mapValue(e, "gpu"), mapValue(e, "model"); g == nil || m == nil || g.Value != gpu || m.Value != modelName {
			continue
		}
		found = true
		num := func(v float64) *yaml.Node {
			return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!float", Value: strconv.FormatFloat(round3(v), 'f', -1, 64)}
		}
		curve := func(c optimizer.Curve) *yaml.Node {
			n := &yaml.Node{Kind: yaml.MappingNode, Style: yaml.FlowStyle}
			for _, kv := range []struct {
				k string
				v float64
			}{{"base_ms", c.Base}, {"linear_ms", c.Linear}, {"queue_ms", c.Queue}} {
				n.Content = append(n.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: kv.k}, num(kv.v))
			}
			return n
		}
		setMapValue(e, "capacity_rps", num(f.CapacityRPS))
		setMapValue(e, "ttft_curve", curve(f.TTFT))
		setMapValue(e, "tbot_curve", curve(f.TBOT))
	}
	if !found {
		return fmt.Errorf("%s: no profile for gpu %q model %q", path, gpu, modelName)
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return err
	}
	if err := enc.Close(); err != nil {
		return err
	}
	if _, err := fleet.Parse(buf.Bytes()); err != nil {
		return fmt.Errorf("%s with the fitted curves does not load: %w", path, err)
	}
	return os.WriteFile(path, buf.Bytes(), 0o644)
}

func mapValue(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func setMapValue(m *yaml.Node, key string, v *yaml.Node) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content[i+1] = v
			return
		}
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: key}, v)
}
