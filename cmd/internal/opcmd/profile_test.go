package opcmd

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/controlplane"
	"github.com/inferlb/inferlb/controlplane/signals"
	"github.com/inferlb/inferlb/optimizer"
	"github.com/inferlb/inferlb/tools/enginesim"
)

// The profiles entry `inferlb profile` prints carries the fitted capacity and
// curves, and pasted into the fleet spec it parses and drives the optimizer's
// profile.
func TestWriteProfileEntryRoundTrips(t *testing.T) {
	spec, err := fleet.Load("../../../examples/fleet-minimal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	base := spec.Profiles[0]
	fit := optimizer.Fit{CapacityRPS: 9.87654, TTFT: optimizer.Curve{Base: 41.23456, Linear: 5.5, Queue: 2.0004},
		TBOT: optimizer.Curve{Base: 7.1111, Linear: 3, Queue: 0.25}}
	var out bytes.Buffer
	if err := writeProfile(&out, fit, &base, "http://127.0.0.1:1", base.Model, 1000, 200); err != nil {
		t.Fatal(err)
	}
	entry := out.String()[strings.Index(out.String(), "profiles:"):]
	src, err := os.ReadFile("../../../examples/fleet-minimal.yaml")
	if err != nil {
		t.Fatal(err)
	}
	// Replace the spec's profiles (up to the next top-level key) with the
	// printed entry.
	s := string(src)
	i := strings.Index(s, "\nprofiles:") + 1
	j := i + 1 + regexp.MustCompile(`\n[a-z]`).FindStringIndex(s[i+1:])[0]
	updated, err := fleet.Parse([]byte(s[:i] + entry + s[j+1:]))
	if err != nil {
		t.Fatalf("printed entry does not parse into the spec: %v\n%s", err, entry)
	}
	p := updated.Profiles[0]
	if p.CapacityRPS != 9.877 || *p.TTFTCurve != (fleet.Curve{BaseMs: 41.235, LinearMs: 5.5, QueueMs: 2}) ||
		*p.TBOTCurve != (fleet.Curve{BaseMs: 7.111, LinearMs: 3, QueueMs: 0.25}) || p.DecodeStepMs != 7.111 {
		t.Fatalf("profile after the round trip: %+v (curves %+v, %+v)", p, p.TTFTCurve, p.TBOTCurve)
	}
	op, err := controlplane.ProfileFromFleet(p, 1000, 200)
	if err != nil || op.TTFT.Base != 41.235 || op.CapacityRPS != 9.877 {
		t.Fatalf("optimizer profile %+v, %v", op, err)
	}
}

// TestProfileReadsEngineConfig: against a running engine (engine-sim as
// vLLM and as SGLang), profile reads the KV cache size and block size from
// /metrics and the context limit from /v1/models, and a profile built from
// the measurement alone carries them.
func TestProfileReadsEngineConfig(t *testing.T) {
	for _, server := range []string{"vllm", "sglang"} {
		t.Run(server, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			e, err := enginesim.Start(ctx, enginesim.Options{Model: "m", Profile: enginesim.H100Llama8B, Server: server})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			// SGLang's series exist from the first request on.
			resp, err := http.Post(e.URL()+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":1}`))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			got, err := readEngineConfig(ctx, e.URL(), "m", signals.MappingFor(server))
			if err != nil {
				t.Fatal(err)
			}
			want := engineConfig{blockSize: 16, kvTokens: 450000, maxModelLen: 8192}
			if server == "sglang" {
				want.blockSize = 0 // SGLang reports its pool in tokens
			}
			if got != want {
				t.Fatalf("engine config %+v, want %+v", got, want)
			}
			p := fleet.Profile{GPU: "H100", Model: "m"}
			got.apply(&p, optimizer.Fit{CapacityRPS: 10, TTFT: optimizer.Curve{Base: 40}, TBOT: optimizer.Curve{Base: 7}}, 1000, true)
			p.CapacityRPS, p.DecodeStepMs = 10, 7
			if p.KVCapacityTokens != 450000 || p.MaxContextTokens != 8192 || p.PrefillTokensPerS != 25000 || p.BlockSize != 16 {
				t.Fatalf("profile %+v", p)
			}
		})
	}
}
