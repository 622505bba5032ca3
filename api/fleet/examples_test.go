package fleet

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
)

// The example fleets are used by the demo and by other components' tests.
func TestExamplesParse(t *testing.T) {
	files, err := filepath.Glob("../../examples/fleet-*.yaml")
	if err != nil || len(files) < 2 {
		t.Fatalf("example fleets: %v %v", files, err)
	}
	for _, f := range files {
		if _, err := Load(f); err != nil {
			t.Errorf("%v", err)
		}
	}
}

// TestExample3Region pins what the demo relies on.
func TestExample3Region(t *testing.T) {
	s, err := Load("../../examples/fleet-3region.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Regions) != 3 || len(s.Frontends) != 3 || len(s.Engines) != 12 {
		t.Fatalf("got %d regions, %d frontends, %d engines", len(s.Regions), len(s.Frontends), len(s.Engines))
	}
	for i, e := range s.Engines {
		if want := "127.0.0.1:" + strconv.Itoa(18001+i); e.Address != want {
			t.Errorf("engines[%d].address = %s, want %s", i, e.Address, want)
		}
	}
	for _, c := range []struct {
		from, to string
		ms       float64
	}{{"us-east", "us-east", 1}, {"us-east", "us-west", 70}, {"eu-west", "us-east", 80}, {"us-west", "eu-west", 140}} {
		if got, ok := s.RTTMs(c.from, c.to); !ok || got != c.ms {
			t.Errorf("RTTMs(%s, %s) = %v %v, want %v", c.from, c.to, got, ok, c.ms)
		}
	}
	for _, node := range []string{"frontend-us-east", "frontend-us-west", "frontend-eu-west"} {
		if _, ok := s.FrontendByNodeID(node); !ok {
			t.Errorf("no frontend %s", node)
		}
	}
	gpus := map[string]int{}
	for _, e := range s.Engines {
		gpus[e.GPU]++
	}
	if gpus["H100"] == 0 || gpus["A100"] == 0 {
		t.Errorf("GPU mix %v", gpus)
	}
	h, _ := s.Profile("H100", "llama-3.1-8b")
	a, _ := s.Profile("A100", "llama-3.1-8b")
	if h.PrefillTokensPerS != 25000 || a.PrefillTokensPerS != 11000 || h.DecodeStepMs != 6.5 || a.DecodeStepMs != 13 ||
		h.DecodeStepPerSeqMs != 0.055 || a.DecodeStepPerSeqMs != 0.09 || h.OverheadMs != 10 || a.OverheadMs != 15 ||
		h.KVCapacityTokens != 450000 || h.BlockSize != 16 || h.MaxRunning != 256 || h.MaxBatchedTokens != 8192 {
		t.Errorf("profiles differ from calibration §5: %+v %+v", h, a)
	}
	if len(s.EligibleEngines("general")) != 12 || len(s.EligibleEngines("eu")) != 4 || len(s.EligibleEngines("long-context")) != gpus["H100"] {
		t.Errorf("eligible: general %d, eu %d, long-context %d", len(s.EligibleEngines("general")), len(s.EligibleEngines("eu")), len(s.EligibleEngines("long-context")))
	}
}

func readExample(name string) ([]byte, error) {
	return os.ReadFile(filepath.Join("..", "..", "examples", name))
}
