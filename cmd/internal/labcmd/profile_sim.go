package labcmd

import (
	"errors"
	"fmt"
	"math"
	"os"
	"sort"
	"strconv"
	"strings"

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
// period with the batch full queues hundreds of requests), so near
// saturation even means over this many requests still differ from one set
// of seeds to the next (docs/optimizer.md, "Latency profiles").
const (
	simRequests = 80000
	simSeeds    = 8
)

// simProfileLong is what the lab's profile adds to the operator's --help.
const simProfileLong = `

In the lab (inferlb-lab), --engine-sim measures the engine simulator's
scheduler in virtual time instead of --target: the (--gpu, --model) step
model of --fleet, fitted the same way; --write puts the fit into --fleet's
profile entry in place (make profiles).`

// addEngineSim gives the operator's profile command the lab's --engine-sim
// mode: the fleet's step models measured with the engine simulator's
// scheduler (tools/enginesim/model), which the operator's binary does not
// link. Without --engine-sim the command is the operator's.
func addEngineSim(profile *cobra.Command) {
	var o simProfileFlags
	fl := profile.Flags()
	fl.BoolVar(&o.engineSim, "engine-sim", false, "measure the engine simulator's scheduler in virtual time instead of --target: the (--gpu, --model) step model of --fleet, at the fleet's reference request shape unless --prompt-tokens/--output-tokens are given, from 10% to 95% of the capacity the step model implies (or --max-rate)")
	fl.BoolVar(&o.write, "write", false, "with --engine-sim: write capacity_rps, ttft_curve and tbot_curve into --fleet's profile entry in place (make profiles)")
	profile.Long += simProfileLong
	measure := profile.RunE
	profile.RunE = func(cmd *cobra.Command, args []string) error {
		if !o.engineSim {
			if o.write {
				return fmt.Errorf("profile: --write needs --engine-sim (a measured engine's entry is printed for you to review)")
			}
			return measure(cmd, args)
		}
		fl := cmd.Flags()
		o.target, _ = fl.GetString("target")
		o.fleetPath, _ = fl.GetString("fleet")
		o.gpu, _ = fl.GetString("gpu")
		o.modelName, _ = fl.GetString("model")
		o.prompt, _ = fl.GetInt("prompt-tokens")
		o.output, _ = fl.GetInt("output-tokens")
		o.requests, _ = fl.GetInt("requests")
		o.maxRate, _ = fl.GetFloat64("max-rate")
		return o.simSweep(cmd)
	}
}

// simProfileFlags are the settings of profile --engine-sim: its own flags
// and the operator's profile's it reads.
type simProfileFlags struct {
	engineSim, write                  bool
	target, fleetPath, gpu, modelName string
	prompt, output, requests          int
	maxRate                           float64
}

// simSweep is `inferlb-lab profile --engine-sim`: the fleet's (GPU, model)
// step model run by the engine simulator's scheduler in virtual time at
// points loads from 10% to 95%, fitted like a real engine's sweep.
func (o *simProfileFlags) simSweep(cmd *cobra.Command) error {
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
// fleet file's (gpu, model) profile entry and leaves every other byte of
// the file as it was (comments, blank lines, alignment, the step model the
// engine simulator runs): the entry's existing values are replaced where
// they stand, missing keys are added after its last key, in its style
// (block or flow). Re-encoding the parsed document instead dropped every
// blank line and comment alignment and folded flow entries into one line.
// The result must load, with the fitted values.
func writeFleetCurves(path, gpu, modelName string, f optimizer.Fit) error {
	src, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	out, err := setFleetCurves(src, gpu, modelName, f)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return os.WriteFile(path, out, 0o644)
}

// setFleetCurves is writeFleetCurves on the file's text.
func setFleetCurves(src []byte, gpu, modelName string, f optimizer.Fit) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(src, &doc); err != nil {
		return nil, err
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("not a mapping")
	}
	profiles := mapValue(doc.Content[0], "profiles")
	if profiles == nil || profiles.Kind != yaml.SequenceNode {
		return nil, errors.New("no profiles list")
	}
	num := func(v float64) string { return strconv.FormatFloat(round3(v), 'f', -1, 64) }
	curve := func(c optimizer.Curve) string {
		return fmt.Sprintf("{base_ms: %s, linear_ms: %s, queue_ms: %s}", num(c.Base), num(c.Linear), num(c.Queue))
	}
	values := []struct{ key, text string }{
		{"capacity_rps", num(f.CapacityRPS)}, {"ttft_curve", curve(f.TTFT)}, {"tbot_curve", curve(f.TBOT)},
	}
	lines := strings.SplitAfter(string(src), "\n")
	// offset is the byte offset of a node's (1-based) line and column.
	offset := func(line, col int) int {
		o := 0
		for _, l := range lines[:line-1] {
			o += len(l)
		}
		return o + col - 1
	}
	type edit struct {
		at, end int // replace src[at:end]
		text    string
	}
	var edits []edit
	found := false
	for _, e := range profiles.Content {
		if e.Kind != yaml.MappingNode {
			continue
		}
		if g, m := mapValue(e, "gpu"), mapValue(e, "model"); g == nil || m == nil || g.Value != gpu || m.Value != modelName {
			continue
		}
		found = true
		var add []string
		for _, v := range values {
			old := mapValue(e, v.key)
			if old == nil {
				add = append(add, v.key+": "+v.text)
				continue
			}
			at := offset(old.Line, old.Column)
			end, err := valueEnd(src, at, old)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v.key, err)
			}
			edits = append(edits, edit{at, end, v.text})
		}
		if len(add) == 0 {
			continue
		}
		last := e.Content[len(e.Content)-1]
		lastEnd, err := valueEnd(src, offset(last.Line, last.Column), last)
		if err != nil {
			return nil, err
		}
		if e.Style&yaml.FlowStyle != 0 {
			// {..., last: v} → {..., last: v,
			//  <indent of the last line>capacity_rps: ..., ...}
			indent := leadingSpace(lines[last.Line-1])
			if last.Line == e.Line {
				indent = strings.Repeat(" ", e.Column) // just inside the brace
			}
			edits = append(edits, edit{lastEnd, lastEnd, ",\n" + indent + strings.Join(add, ", ")})
			continue
		}
		// Block style: new lines after the last key's line, at the
		// entry's key indentation.
		eol := strings.IndexByte(string(src[lastEnd:]), '\n')
		at := len(src)
		if eol >= 0 {
			at = lastEnd + eol + 1
		}
		indent := strings.Repeat(" ", e.Content[0].Column-1)
		text := ""
		if eol < 0 {
			text = "\n"
		}
		for _, a := range add {
			text += indent + a + "\n"
		}
		edits = append(edits, edit{at, at, text})
	}
	if !found {
		return nil, fmt.Errorf("no profile for gpu %q model %q", gpu, modelName)
	}
	sort.Slice(edits, func(a, b int) bool { return edits[a].at > edits[b].at })
	out := append([]byte(nil), src...)
	for _, ed := range edits {
		out = append(out[:ed.at], append([]byte(ed.text), out[ed.end:]...)...)
	}
	spec, err := fleet.Parse(out)
	if err != nil {
		return nil, fmt.Errorf("with the fitted curves the file does not load: %w", err)
	}
	if p, ok := spec.Profile(gpu, modelName); !ok || p.CapacityRPS != round3(f.CapacityRPS) || p.TTFTCurve == nil || p.TBOTCurve == nil {
		return nil, errors.New("the fitted values did not land in the profile entry")
	}
	return out, nil
}

// valueEnd returns the end offset of value node n starting at at: a plain
// or quoted scalar, or a one-line flow mapping.
func valueEnd(src []byte, at int, n *yaml.Node) (int, error) {
	switch {
	case n.Kind == yaml.ScalarNode && n.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0:
		q := src[at]
		for k := at + 1; k < len(src); k++ {
			if src[k] == q && (q != '"' || src[k-1] != '\\') {
				return k + 1, nil
			}
		}
	case n.Kind == yaml.ScalarNode && n.Style&(yaml.LiteralStyle|yaml.FoldedStyle) == 0:
		k := at
		for k < len(src) && !strings.ContainsRune(",}]\n#", rune(src[k])) {
			k++
		}
		for k > at && src[k-1] == ' ' {
			k--
		}
		return k, nil
	case n.Kind == yaml.MappingNode && n.Style&yaml.FlowStyle != 0:
		depth := 0
		for k := at; k < len(src); k++ {
			switch src[k] {
			case '{':
				depth++
			case '}':
				depth--
				if depth == 0 {
					return k + 1, nil
				}
			}
		}
	}
	return 0, fmt.Errorf("line %d: a value this writer cannot replace in place", n.Line)
}

func leadingSpace(s string) string { return s[:len(s)-len(strings.TrimLeft(s, " "))] }

func mapValue(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}
