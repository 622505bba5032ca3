package fleet_test

import (
	"errors"
	"fmt"

	"github.com/inferlb/inferlb/api/fleet"
)

func Example() {
	s, err := fleet.Load("../../examples/fleet-3region.yaml")
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(s.Summary())

	// Which class serves a request, and which engines may take it?
	for _, req := range []struct {
		model, residency string
		tokens           int
	}{
		{"llama-3.1-8b", "", 1200},
		{"llama-3.1-8b", "eu", 1200},
		{"llama-3.1-8b", "", 50000},
		{"llama-3.1-8b", "eu", 50000},
		{"gpt-4", "", 10},
	} {
		c, err := s.Classify(req.model, req.residency, req.tokens)
		switch {
		case errors.Is(err, fleet.ErrUnknownModel):
			fmt.Printf("%s: 404, unknown model\n", req.model)
		case errors.Is(err, fleet.ErrNoClass):
			fmt.Printf("%s/%q/%d: 400, no eligible class\n", req.model, req.residency, req.tokens)
		default:
			fmt.Printf("%s/%q/%d: class %s, %d engines\n", req.model, req.residency, req.tokens, c.Name, len(s.EligibleEngines(c.Name)))
		}
	}

	// Network distance and the profile of an engine.
	f, _ := s.FrontendByNodeID("frontend-us-west")
	e, _ := s.EngineByID("eu-west-h100-1")
	rtt, _ := s.RTT(f.Region, e.Region)
	p, _ := s.ProfileOf(e)
	fmt.Printf("%s → %s: %v, prefill %.0f tok/s\n", f.Name, e.ID, rtt, p.PrefillTokensPerS)
	// Output:
	// fleet "demo-3region": 3 regions, 3 frontends, 12 engines (7 A100, 5 H100), 3 classes, 1 model (llama-3.1-8b), 3 priorities
	// llama-3.1-8b/""/1200: class general, 12 engines
	// llama-3.1-8b/"eu"/1200: class eu, 4 engines
	// llama-3.1-8b/""/50000: class long-context, 5 engines
	// llama-3.1-8b/"eu"/50000: 400, no eligible class
	// gpt-4: 404, unknown model
	// frontend-us-west → eu-west-h100-1: 140ms, prefill 25000 tok/s
}

func ExampleParse_errors() {
	_, err := fleet.Parse([]byte(`
regions: [{name: eu-west}]
frontends: [{name: fe, region: eu-west}]
models: [{name: m, max_context_tokens: 8192}]
profiles: [{gpu: H100, model: m, prefill_tokens_per_s: 25000, decode_step_ms: 6.5, decode_step_per_seq_ms: 0.055, kv_capacity_tokens: 450000}]
engines:
  - {id: e1, address: "127.0.0.1:8001", region: eu-west, gpu: H100, model: m}
  - {id: e2, address: "127.0.0.1:8002", region: eu-wst, gpu: H100, model: m, replicas: 0}
`))
	for _, fe := range fleet.Errors(err) {
		fmt.Println(fe.WithLine())
	}
	// Output:
	// line 8: engines[1].region: unknown region "eu-wst" (known: "eu-west")
	// line 8: engines[1].replicas: must be positive, got 0
}
