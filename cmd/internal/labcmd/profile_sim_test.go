//go:build !race

// The sweeps simulate about two million requests; under the race detector
// that takes minutes and proves nothing the race-enabled tests do not.

package labcmd

import (
	"bytes"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane"
	"github.com/inferlb/inferlb/optimizer"
)

// TestProfileEngineSimWithin15Percent: `inferlb-lab profile --engine-sim`'s fit
// of the engine simulator reproduces the simulator's mean TTFT at 20, 50,
// 80 and 95% of capacity within 15%, for both GPUs of the example fleet at
// its reference request (200/200 tokens) and for a prefill-heavy request
// (1,000/100), whose TTFT the curves derived from the step model
// (optimizer.NewProfile) miss by 20–70% from half load up: prompts queue
// for the step's token budget, which the derivation does not model. The
// profile the control plane builds from the written entry
// (controlplane.ProfileFromFleet) predicts the same TTFT as the fit.
func TestProfileEngineSimWithin15Percent(t *testing.T) {
	spec, err := fleet.Load("../../../examples/fleet-3region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		gpu            string
		prompt, output int
	}{{"H100", 200, 200}, {"A100", 200, 200}, {"H100", 1000, 100}} {
		fp, ok := spec.Profile(tc.gpu, "llama-3.1-8b")
		if !ok {
			t.Fatalf("no %s profile", tc.gpu)
		}
		// A fifth of the command's requests: the fit is held to the
		// samples it was fitted to (their noise is not the fit's error).
		res, err := SimProfile(fp, tc.prompt, tc.output, simRequests/5, 0)
		if err != nil {
			t.Fatal(err)
		}
		fp.CapacityRPS = round3(res.Fit.CapacityRPS)
		fp.TTFTCurve, fp.TBOTCurve = fleetCurve(res.Fit.TTFT), fleetCurve(res.Fit.TBOT)
		prof, err := controlplane.ProfileFromFleet(fp, float64(tc.prompt), float64(tc.output))
		if err != nil {
			t.Fatal(err)
		}
		derived, err := optimizer.NewProfile(optimizer.StepModel{PrefillTokensPerS: fp.PrefillTokensPerS, OverheadMs: fp.OverheadMs,
			DecodeStepMs: fp.DecodeStepMs, DecodeStepPerSeqMs: fp.DecodeStepPerSeqMs, MaxRunning: fp.MaxRunning,
			KVCapacityTokens: fp.KVCapacityTokens}, float64(tc.prompt), float64(tc.output))
		if err != nil {
			t.Fatal(err)
		}
		for k, s := range res.Samples {
			load := simLoads[k]
			if load != 0.2 && load != 0.5 && load != 0.8 && load != 0.95 {
				continue
			}
			ttft, _ := prof.Latency(prof.Reference(), s.RatePerS/prof.CapacityRPS)
			dTTFT, _ := derived.Latency(derived.Reference(), s.RatePerS/derived.CapacityRPS)
			rel := ttft/s.TTFTMs - 1
			t.Logf("%s %d/%d at %2.0f%% (%.2f req/s): simulator %7.1f ms, profile %7.1f ms (%+.0f%%), derived %7.1f ms (%+.0f%%)",
				tc.gpu, tc.prompt, tc.output, 100*load, s.RatePerS, s.TTFTMs, ttft, 100*rel, dTTFT, 100*(dTTFT/s.TTFTMs-1))
			if math.Abs(rel) > 0.15 {
				t.Errorf("%s %d/%d at %.0f%% load: the profile predicts TTFT %.1f ms, the simulator measures %.1f ms (%+.0f%%, bound 15%%)",
					tc.gpu, tc.prompt, tc.output, 100*load, ttft, s.TTFTMs, 100*rel)
			}
		}
	}
}

// TestProfileEngineSimWrite: --write puts the fitted capacity and curves
// into the fleet file's entry, keeps the step model the simulator runs and
// the file's comments, and the file still loads with them.
func TestProfileEngineSimWrite(t *testing.T) {
	src, err := os.ReadFile("../../../examples/sim/fleet-gorgo.yaml")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "fleet.yaml")
	if err := os.WriteFile(path, src, 0o644); err != nil {
		t.Fatal(err)
	}
	before, err := fleet.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	h0, _ := before.Profile("H100", "llama-3.1-8b")
	var out bytes.Buffer
	rootCmd.SetOut(&out)
	rootCmd.SetArgs([]string{"profile", "--engine-sim", "--write", "--fleet", path, "--gpu", "A100", "--model", "llama-3.1-8b", "--requests", "8000"})
	defer rootCmd.SetArgs(nil)
	if err := rootCmd.Execute(); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
	spec, err := fleet.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := spec.Profile("A100", "llama-3.1-8b")
	h, _ := spec.Profile("H100", "llama-3.1-8b")
	if a.TTFTCurve == nil || a.TBOTCurve == nil || !(a.CapacityRPS > 0) {
		t.Fatalf("A100 entry after --write: %+v", a)
	}
	if a.DecodeStepMs != 13 || a.PrefillTokensPerS != 11000 || a.DecodeStepPerSeqMs != 0.09 {
		t.Errorf("--write changed the step model the simulator runs: %+v", a)
	}
	if !reflect.DeepEqual(h, h0) {
		t.Errorf("--write touched the H100 entry: %+v, was %+v", h, h0)
	}
	got, _ := os.ReadFile(path)
	if !strings.Contains(string(got), "# GORGO's setup") {
		t.Errorf("--write dropped the file's comments:\n%s", got)
	}
}

// TestSetFleetCurvesKeepsTheFile: the fitted values go into the entry, in
// its style, and every other byte stays (blank lines, comment alignment,
// the other entry); writing again replaces the values in place.
func TestSetFleetCurvesKeepsTheFile(t *testing.T) {
	const src = `name: t

# profiles, one block entry and one flow entry
profiles:
  - gpu: H100
    model: m
    prefill_tokens_per_s: 25000   # aligned comment
    decode_step_per_seq_ms: 0.055
    kv_capacity_tokens: 450000
    decode_step_ms: 6.5

  - {gpu: A100, model: m, prefill_tokens_per_s: 11000, decode_step_per_seq_ms: 0.09, kv_capacity_tokens: 450000,
     decode_step_ms: 13}
models:
  - {name: m, max_context_tokens: 8192}
regions: [{name: r}]
frontends:
  - {name: f, region: r}
classes:
  - {name: c, model: m}
engines:
  - {id: e, address: "127.0.0.1:1", region: r, gpu: H100, model: m}
  - {id: a, address: "127.0.0.1:2", region: r, gpu: A100, model: m}
`
	fit := optimizer.Fit{CapacityRPS: 40.4791, TTFT: optimizer.Curve{Base: 27.5, Linear: 11.3, Queue: 1.5}, TBOT: optimizer.Curve{Base: 4.4, Linear: 14.6, Queue: 0.2}}
	out, err := setFleetCurves([]byte(src), "H100", "m", fit)
	if err != nil {
		t.Fatal(err)
	}
	wantBlock := strings.Replace(src, "    decode_step_ms: 6.5\n", "    decode_step_ms: 6.5\n    capacity_rps: 40.479\n"+
		"    ttft_curve: {base_ms: 27.5, linear_ms: 11.3, queue_ms: 1.5}\n    tbot_curve: {base_ms: 4.4, linear_ms: 14.6, queue_ms: 0.2}\n", 1)
	if string(out) != wantBlock {
		t.Fatalf("block entry:\n%s\nwant\n%s", out, wantBlock)
	}
	out, err = setFleetCurves(out, "A100", "m", fit)
	if err != nil {
		t.Fatal(err)
	}
	wantFlow := strings.Replace(wantBlock, "     decode_step_ms: 13}", "     decode_step_ms: 13,\n     capacity_rps: 40.479, "+
		"ttft_curve: {base_ms: 27.5, linear_ms: 11.3, queue_ms: 1.5}, tbot_curve: {base_ms: 4.4, linear_ms: 14.6, queue_ms: 0.2}}", 1)
	if string(out) != wantFlow {
		t.Fatalf("flow entry:\n%s\nwant\n%s", out, wantFlow)
	}
	// Again, with other values: replaced where they stand.
	fit2 := fit
	fit2.CapacityRPS, fit2.TTFT.Base = 41, 30
	again, err := setFleetCurves(out, "H100", "m", fit2)
	if err != nil {
		t.Fatal(err)
	}
	again, err = setFleetCurves(again, "A100", "m", fit2)
	if err != nil {
		t.Fatal(err)
	}
	want2 := strings.ReplaceAll(strings.ReplaceAll(wantFlow, "capacity_rps: 40.479", "capacity_rps: 41"), "ttft_curve: {base_ms: 27.5,", "ttft_curve: {base_ms: 30,")
	if string(again) != want2 {
		t.Fatalf("rewritten:\n%s\nwant\n%s", again, want2)
	}
	if _, err := setFleetCurves([]byte(src), "B200", "m", fit); err == nil || !strings.Contains(err.Error(), `no profile for gpu "B200"`) {
		t.Errorf("unknown profile: %v", err)
	}
}
