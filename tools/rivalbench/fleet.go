package rivalbench

import (
	"fmt"
	"strings"

	"github.com/inferlb/inferlb/internal/envoyrun"
)

// ModelName is the model every engine serves and every request names.
const ModelName = "llama-3.1-8b"

// profileYAML is the engines' profile: vLLM serving Llama-3.1-8B on one
// H100 (engine-calibration.md §5), as in the example fleets.
const profileYAML = `profiles:
  - gpu: H100
    model: llama-3.1-8b
    prefill_tokens_per_s: 25000
    overhead_ms: 10
    decode_step_ms: 6.5
    decode_step_per_seq_ms: 0.055
    max_running: 256
    max_batched_tokens: 8192
    kv_capacity_tokens: 450000
    block_size: 16
    capacity_rps: 40.479
    ttft_curve: {base_ms: 27.523, linear_ms: 11.305, queue_ms: 1.576}
    tbot_curve: {base_ms: 4.44, linear_ms: 14.656, queue_ms: 0.201}
`

// networkYAML is the three regions' round trips (engine-calibration.md §6,
// as in the demo's fleet).
const networkYAML = `network:
  same_region_rtt_ms: 1
  links:
    - {a: us-east, b: us-west, rtt_ms: 70}
    - {a: us-east, b: eu-west, rtt_ms: 80}
    - {a: us-west, b: eu-west, rtt_ms: 140}
`

// engine is one simulated engine of a router's fleet.
type engine struct {
	ID, Region string
	Port       int
}

func (e engine) url() string { return fmt.Sprintf("http://127.0.0.1:%d", e.Port) }

// fleetYAML is a fleet spec holding engines, with one frontend per region
// (frontend-REGION). Each router's fleet is one such spec; the engine
// simulator serves the union of them.
func fleetYAML(name string, regions []string, engines []engine) string {
	var b strings.Builder
	fmt.Fprintf(&b, "name: %s\nregions:\n", name)
	for _, r := range regions {
		fmt.Fprintf(&b, "  - {name: %s}\n", r)
	}
	if len(regions) > 1 {
		b.WriteString(networkYAML)
	}
	b.WriteString("frontends:\n")
	for _, r := range regions {
		fmt.Fprintf(&b, "  - {name: frontend-%s, region: %s}\n", r, r)
	}
	fmt.Fprintf(&b, "models:\n  - {name: %s, max_context_tokens: 131072}\n", ModelName)
	b.WriteString(profileYAML)
	b.WriteString("engines:\n")
	for _, e := range engines {
		fmt.Fprintf(&b, "  - {id: %s, address: \"127.0.0.1:%d\", region: %s, gpu: H100, model: %s}\n", e.ID, e.Port, e.Region, ModelName)
	}
	return b.String()
}

// freePorts returns n distinct loopback ports that were free a moment ago,
// below the kernel's ephemeral range (envoyrun.FreePort): the bench's own
// thousands of client connections take ephemeral ports, and a router
// given one that a connection took meanwhile fails to bind.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		p, err := envoyrun.FreePort()
		if err != nil {
			return nil, err
		}
		ports = append(ports, p)
	}
	return ports, nil
}
