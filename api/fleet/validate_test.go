package fleet

import (
	"slices"
	"strings"
	"testing"
)

// base is a small valid spec; each rule's test edits one spot of it.
const base = `name: t
regions:
  - {name: r1, residency: us}
  - {name: r2, residency: eu}
network:
  links:
    - {a: r1, b: r2, rtt_ms: 80}
frontends:
  - {name: f1, region: r1, node_id: node-1}
  - {name: f2, region: r2}
models:
  - {name: m, max_context_tokens: 131072}
profiles:
  - {gpu: H100, model: m, prefill_tokens_per_s: 25000, overhead_ms: 10, decode_step_ms: 6.5, decode_step_per_seq_ms: 0.055, kv_capacity_tokens: 450000}
  - {gpu: A100, model: m, prefill_tokens_per_s: 11000, overhead_ms: 15, decode_step_ms: 13, decode_step_per_seq_ms: 0.09, kv_capacity_tokens: 450000, max_context_tokens: 32768}
classes:
  - {name: general, model: m}
  - {name: eu, model: m, residency: eu}
  - {name: long, model: m, min_context_tokens: 65536}
priorities:
  - {name: critical, level: 0, shed_cost: 1000}
  - {name: batch, level: 1, shed_cost: 100}
engines:
  - {id: e1, address: "127.0.0.1:9001", region: r1, gpu: H100, model: m}
  - {id: e2, address: "127.0.0.1:9002", region: r1, gpu: A100, model: m}
  - {id: e3, address: "127.0.0.1:9003", region: r2, gpu: A100, model: m}
  - {id: e4, address: "[::1]:9004", region: r2, gpu: H100, model: m, replicas: 2, labels: {zone: b}}
`

// edit applies old→new replacements to base, failing if one does not apply.
func edit(t testing.TB, pairs ...string) string {
	t.Helper()
	s := base
	for i := 0; i+1 < len(pairs); i += 2 {
		if !strings.Contains(s, pairs[i]) {
			t.Fatalf("edit: %q not in base spec", pairs[i])
		}
		s = strings.Replace(s, pairs[i], pairs[i+1], 1)
	}
	return s
}

func errorLines(err error) []string {
	var out []string
	for _, fe := range Errors(err) {
		out = append(out, fe.Error())
	}
	return out
}

func TestBaseIsValid(t *testing.T) {
	if _, err := Parse([]byte(base)); err != nil {
		t.Fatalf("base spec: %v", err)
	}
}

// ruleCase is one rule's test: edits to base, and exactly the errors they
// must give (nil: the edited spec is valid).
type ruleCase struct {
	name  string
	edits []string
	want  []string
}

var ruleCases = []ruleCase{
	// regions
	{"region name required", []string{"{name: r1, residency: us}", "{residency: us}"},
		// References to the region it was meant to be cannot resolve.
		[]string{"regions[0].name: required", `network.links[0].a: unknown region "r1" (known: "r2")`,
			`frontends[0].region: unknown region "r1" (known: "r2")`, `engines[0].region: unknown region "r1" (known: "r2")`,
			`engines[1].region: unknown region "r1" (known: "r2")`}},
	{"region name charset", []string{"{name: r1, residency: us}", "{name: 'r 1', residency: us}"},
		[]string{`regions[0].name: "r 1" is not a valid name (letters, digits, '.', '_' and '-'; at most 128 characters)`,
			`network.links[0].a: unknown region "r1" (known: "r2")`, `frontends[0].region: unknown region "r1" (known: "r2")`,
			`engines[0].region: unknown region "r1" (known: "r2")`, `engines[1].region: unknown region "r1" (known: "r2")`}},
	{"duplicate region", []string{"{name: r2, residency: eu}", "{name: r2, residency: eu}\n  - {name: r2}"},
		[]string{`regions[2].name: duplicate region "r2" (also regions[1])`}},
	{"no regions", []string{"regions:\n  - {name: r1, residency: us}\n  - {name: r2, residency: eu}\n", "regions: []\n"},
		[]string{"regions: at least one region required"}}, // and no unresolved references
	{"residency charset", []string{"residency: eu}", "residency: 'e u'}"},
		[]string{`regions[1].residency: "e u" is not a valid name (letters, digits, '.', '_' and '-'; at most 128 characters)`,
			`classes[1].residency: unknown residency "eu": no region has it (known: "us")`}},

	// network
	{"link unknown region", []string{"{a: r1, b: r2, rtt_ms: 80}", "{a: r1, b: r2, rtt_ms: 80}\n    - {a: r1, b: eu-wst, rtt_ms: 9}"},
		[]string{`network.links[1].b: unknown region "eu-wst" (known: "r1", "r2")`}},
	{"link to itself", []string{"{a: r1, b: r2, rtt_ms: 80}", "{a: r1, b: r2, rtt_ms: 80}\n    - {a: r1, b: r1, rtt_ms: 9}"},
		[]string{`network.links[1].b: link from region "r1" to itself (use network.same_region_rtt_ms)`}},
	{"duplicate link reversed", []string{"{a: r1, b: r2, rtt_ms: 80}", "{a: r1, b: r2, rtt_ms: 80}\n    - {a: r2, b: r1, rtt_ms: 81}"},
		[]string{`network.links[1]: duplicate link between "r2" and "r1" (also network.links[0])`}},
	{"rtt zero", []string{"rtt_ms: 80", "rtt_ms: 0"},
		[]string{"network.links[0].rtt_ms: must be positive, got 0"}},
	{"rtt missing", []string{", rtt_ms: 80", ""},
		[]string{"network.links[0].rtt_ms: required"}},
	{"rtt too large", []string{"rtt_ms: 80", "rtt_ms: 60001"},
		[]string{"network.links[0].rtt_ms: must be at most 60000, got 60001"}},
	{"same region rtt negative", []string{"network:\n", "network:\n  same_region_rtt_ms: -1\n"},
		[]string{"network.same_region_rtt_ms: must not be negative, got -1"}},
	{"missing link for used pair", []string{"    - {a: r1, b: r2, rtt_ms: 80}\n", ""},
		[]string{`network.links: no link between frontend region "r1" (frontends[0]) and engine region "r2" (engines[2])`}},

	// models
	{"model max context missing", []string{"{name: m, max_context_tokens: 131072}", "{name: m}"},
		[]string{"models[0].max_context_tokens: required"}},
	{"model max context zero", []string{"{name: m, max_context_tokens: 131072}", "{name: m, max_context_tokens: 0}"},
		[]string{"models[0].max_context_tokens: must be positive, got 0"}},
	{"duplicate model", []string{"{name: m, max_context_tokens: 131072}", "{name: m, max_context_tokens: 131072}\n  - {name: m, max_context_tokens: 8192}"},
		[]string{`models[1].name: duplicate model "m" (also models[0])`}},
	{"model name with slash ok", []string{"{name: m, max_context_tokens: 131072}", "{name: m, max_context_tokens: 131072}\n  - {name: meta-llama/Llama-3.1-8B:v1, max_context_tokens: 8192}"},
		nil},
	{"model name bad", []string{"{name: m, max_context_tokens: 131072}", "{name: m, max_context_tokens: 131072}\n  - {name: 'a b', max_context_tokens: 8192}"},
		[]string{`models[1].name: "a b" is not a valid name (letters, digits, '.', '_', '-', '/' and ':'; at most 128 characters)`}},

	// profiles
	{"profile unknown model", []string{"{gpu: A100, model: m,", "{gpu: A100, model: mm,"},
		[]string{`profiles[1].model: unknown model "mm" (known: "m")`, `engines[1].gpu: no profile for gpu "A100" and model "m"`, `engines[2].gpu: no profile for gpu "A100" and model "m"`}},
	{"duplicate profile", []string{"{gpu: H100, model: m,", "{gpu: H100, model: m, prefill_tokens_per_s: 1, decode_step_ms: 1, decode_step_per_seq_ms: 0, kv_capacity_tokens: 450000}\n  - {gpu: H100, model: m,"},
		[]string{`profiles[1]: duplicate profile for gpu "H100" and model "m" (also profiles[0])`}},
	{"prefill zero", []string{"prefill_tokens_per_s: 25000", "prefill_tokens_per_s: 0"},
		[]string{"profiles[0].prefill_tokens_per_s: must be positive, got 0"}},
	{"prefill missing", []string{"prefill_tokens_per_s: 25000, ", ""},
		[]string{"profiles[0].prefill_tokens_per_s: required"}},
	{"overhead negative", []string{"overhead_ms: 10", "overhead_ms: -1"},
		[]string{"profiles[0].overhead_ms: must not be negative, got -1"}},
	{"decode step zero", []string{"decode_step_ms: 6.5", "decode_step_ms: 0"},
		[]string{"profiles[0].decode_step_ms: must be positive, got 0"}},
	{"decode slope negative", []string{"decode_step_per_seq_ms: 0.055", "decode_step_per_seq_ms: -0.1"},
		[]string{"profiles[0].decode_step_per_seq_ms: must not be negative, got -0.1"}},
	{"max running zero", []string{"kv_capacity_tokens: 450000}", "kv_capacity_tokens: 450000, max_running: 0}"},
		[]string{"profiles[0].max_running: must be positive, got 0"}},
	{"batched below running", []string{"kv_capacity_tokens: 450000}", "kv_capacity_tokens: 450000, max_running: 512, max_batched_tokens: 256}"},
		[]string{"profiles[0].max_batched_tokens: 256 is less than max_running 512 (every running sequence needs a token per step)"}},
	{"block size zero", []string{"kv_capacity_tokens: 450000}", "kv_capacity_tokens: 450000, block_size: 0}"},
		[]string{"profiles[0].block_size: must be positive, got 0"}},
	{"kv below context", []string{"kv_capacity_tokens: 450000}", "kv_capacity_tokens: 100000}"},
		[]string{"profiles[0].kv_capacity_tokens: 100000 cannot hold one request of max_context_tokens 131072"}},
	{"kv below block", []string{"kv_capacity_tokens: 450000}", "kv_capacity_tokens: 8, block_size: 16, max_context_tokens: 8}"},
		[]string{"profiles[0].kv_capacity_tokens: 8 is less than one block (block_size 16)",
			`classes[2]: class "long" has no eligible engine (model "m", context limit at least 65536)`}},
	{"profile context above model", []string{"max_context_tokens: 32768}", "max_context_tokens: 200000}"},
		[]string{`profiles[1].max_context_tokens: 200000 exceeds model "m"'s max_context_tokens 131072`}},
	{"capacity zero", []string{"kv_capacity_tokens: 450000}", "kv_capacity_tokens: 450000, capacity_rps: 0}"},
		[]string{"profiles[0].capacity_rps: must be positive, got 0"}},
	{"fitted curves valid", []string{"kv_capacity_tokens: 450000}", "kv_capacity_tokens: 450000, capacity_rps: 12, ttft_curve: {base_ms: 40, linear_ms: 5, queue_ms: 2}, tbot_curve: {base_ms: 7, linear_ms: 3, queue_ms: 0}}"},
		nil},
	{"fitted curves without capacity", []string{"kv_capacity_tokens: 450000}", "kv_capacity_tokens: 450000, tbot_curve: {base_ms: 7, linear_ms: 3, queue_ms: 0}}"},
		[]string{"profiles[0].tbot_curve: measured curves need the capacity they were measured against (capacity_rps)"}},
	{"fitted curves flat", []string{"kv_capacity_tokens: 450000}", "kv_capacity_tokens: 450000, capacity_rps: 12, ttft_curve: {base_ms: 40, linear_ms: 0, queue_ms: 0}, tbot_curve: {base_ms: 7, linear_ms: 0, queue_ms: 0}}"},
		[]string{"profiles[0].ttft_curve: latency does not grow with load (linear_ms and queue_ms are 0 in both curves)"}},
	{"fitted curve bad values", []string{"kv_capacity_tokens: 450000}", "kv_capacity_tokens: 450000, capacity_rps: 12, ttft_curve: {base_ms: 0, linear_ms: -1}, tbot_curve: {base_ms: 7, linear_ms: 3, queue_ms: 0, tail_ms: 1}}"},
		[]string{"profiles[0].tbot_curve.tail_ms: unknown key", "profiles[0].ttft_curve.base_ms: must be positive, got 0",
			"profiles[0].ttft_curve.linear_ms: must not be negative, got -1", "profiles[0].ttft_curve.queue_ms: required"}},

	// classes
	{"affinity valid", []string{"{name: general, model: m}", "{name: general, model: m, affinity: {mode: 'off', keys: [prefix, session], hot_share: 0.25, spread_min_prefix_tokens: 20000, group_min_prefix_tokens: 512}}"},
		nil},
	{"affinity bad values", []string{"{name: general, model: m}", "{name: general, model: m, affinity: {mode: of, keys: [prefix, header, prefix], hot_share: 0, spread_min_prefix_tokens: 0, group_min_prefix_tokens: -1}}"},
		[]string{`classes[0].affinity.mode: must be "on" or "off", got "of"`,
			`classes[0].affinity.keys[1]: unknown key source "header" (known: session, prompt_cache_key, user, prefix)`,
			`classes[0].affinity.keys[2]: "prefix" listed twice (also keys[0])`,
			"classes[0].affinity.hot_share: must be positive, got 0",
			"classes[0].affinity.spread_min_prefix_tokens: must be positive, got 0",
			"classes[0].affinity.group_min_prefix_tokens: must be positive, got -1"}},
	{"affinity no keys", []string{"{name: general, model: m}", "{name: general, model: m, affinity: {keys: []}}"},
		[]string{"classes[0].affinity.keys: must not be empty (mode: off turns affinity off)"}},
	{"affinity unknown key", []string{"{name: general, model: m}", "{name: general, model: m, affinity: {order: [user]}}"},
		[]string{"classes[0].affinity.order: unknown key"}},
	{"class unknown model", []string{"{name: general, model: m}", "{name: general, model: mx}"},
		[]string{`classes[0].model: unknown model "mx" (known: "m")`}},
	{"duplicate class", []string{"{name: eu, model: m, residency: eu}", "{name: general, model: m, residency: eu}"},
		[]string{`classes[1].name: duplicate class "general" (also classes[0])`}},
	{"class unknown residency", []string{"residency: eu}\n  - {name: long", "residency: europe}\n  - {name: long"},
		[]string{`classes[1].residency: unknown residency "europe": no region has it (known: "eu", "us")`}},
	{"class min context negative", []string{"min_context_tokens: 65536", "min_context_tokens: -1"},
		[]string{"classes[2].min_context_tokens: must not be negative, got -1"}},
	{"class min context above model", []string{"min_context_tokens: 65536", "min_context_tokens: 200000"},
		[]string{`classes[2].min_context_tokens: 200000 exceeds model "m"'s max_context_tokens 131072`}},
	{"class mean prompt zero", []string{"{name: general, model: m}", "{name: general, model: m, mean_prompt_tokens: 0}"},
		[]string{"classes[0].mean_prompt_tokens: must be positive, got 0"}},
	{"class mean output negative", []string{"{name: general, model: m}", "{name: general, model: m, mean_output_tokens: -5}"},
		[]string{"classes[0].mean_output_tokens: must be positive, got -5"}},
	{"class means exceed context", []string{"{name: general, model: m}", "{name: general, model: m, mean_prompt_tokens: 131000, mean_output_tokens: 1000}"},
		[]string{`classes[0].mean_prompt_tokens: 131000 plus mean_output_tokens 1000 exceeds model "m"'s max_context_tokens 131072`}},
	{"class without eligible engine (residency)", []string{"region: r2, gpu: A100", "region: r1, gpu: A100", "region: r2, gpu: H100", "region: r1, gpu: H100"},
		[]string{`classes[1]: class "eu" has no eligible engine (model "m", residency "eu")`}},
	{"class without eligible engine (context)", []string{"gpu: H100, model: m}", "gpu: A100, model: m}", "gpu: H100, model: m, replicas", "gpu: A100, model: m, replicas"},
		[]string{`classes[2]: class "long" has no eligible engine (model "m", context limit at least 65536)`}},
	{"empty classes list", []string{"classes:\n  - {name: general, model: m}\n  - {name: eu, model: m, residency: eu}\n  - {name: long, model: m, min_context_tokens: 65536}\n", "classes: []\n"},
		[]string{"classes: must not be empty (omit the key for one class per model)"}},

	// priorities
	{"duplicate level", []string{"{name: batch, level: 1,", "{name: batch, level: 0,"},
		[]string{`priorities[1].level: duplicate level 0 (also priorities[0] "critical")`}},
	{"duplicate priority", []string{"{name: batch, level: 1,", "{name: critical, level: 1,"},
		[]string{`priorities[1].name: duplicate priority "critical" (also priorities[0])`}},
	{"level missing", []string{"{name: batch, level: 1,", "{name: batch,"},
		[]string{"priorities[1].level: required"}},
	{"level negative", []string{"{name: batch, level: 1,", "{name: batch, level: -1,"},
		[]string{"priorities[1].level: must not be negative, got -1"}},
	{"shed cost zero", []string{"shed_cost: 100}", "shed_cost: 0}"},
		[]string{"priorities[1].shed_cost: must be positive, got 0"}},
	{"shed cost inverted", []string{"shed_cost: 100}", "shed_cost: 5000}"},
		[]string{`priorities[1].shed_cost: 5000 is higher than the shed_cost 1000 of the more important priority "critical" (level 0)`}},
	{"empty priorities", []string{"priorities:\n  - {name: critical, level: 0, shed_cost: 1000}\n  - {name: batch, level: 1, shed_cost: 100}\n", "priorities: []\n"},
		[]string{"priorities: must not be empty (omit the key for one default priority)"}},

	// frontends
	{"frontend unknown region", []string{"{name: f2, region: r2}", "{name: f2, region: eu-wst}"},
		[]string{`frontends[1].region: unknown region "eu-wst" (known: "r1", "r2")`}},
	{"duplicate frontend", []string{"{name: f2, region: r2}", "{name: f1, region: r2, node_id: node-2}"},
		[]string{`frontends[1].name: duplicate frontend "f1" (also frontends[0])`}},
	{"duplicate node id", []string{"{name: f2, region: r2}", "{name: f2, region: r2, node_id: node-1}"},
		[]string{`frontends[1].node_id: duplicate node id "node-1" (also frontends[0])`}},
	{"default node id collides", []string{"{name: f2, region: r2}", "{name: node-1, region: r2}"},
		[]string{`frontends[1].node_id: duplicate node id "node-1" (also frontends[0])`}},
	{"bad node id", []string{"node_id: node-1}", "node_id: 'node 1'}"},
		[]string{`frontends[0].node_id: "node 1" is not a valid node id (printable ASCII without spaces, at most 256 characters)`}},
	{"no frontends", []string{"frontends:\n  - {name: f1, region: r1, node_id: node-1}\n  - {name: f2, region: r2}\n", "frontends: []\n"},
		[]string{"frontends: at least one frontend required"}},

	// engines
	{"engine unknown region", []string{"{id: e4, address: \"[::1]:9004\", region: r2", "{id: e4, address: \"[::1]:9004\", region: eu-wst"},
		[]string{`engines[3].region: unknown region "eu-wst" (known: "r1", "r2")`}},
	{"duplicate engine id", []string{"{id: e2,", "{id: e1,"},
		[]string{`engines[1].id: duplicate engine id "e1" (also engines[0])`}},
	{"duplicate address", []string{"127.0.0.1:9002", "127.0.0.1:9001"},
		[]string{`engines[1].address: duplicate address "127.0.0.1:9001" (also engines[0] "e1")`}},
	{"address without port", []string{"127.0.0.1:9002", "127.0.0.1"},
		[]string{`engines[1].address: "127.0.0.1" is not host:port`}},
	{"address with scheme", []string{"127.0.0.1:9002", "http://h:80"},
		[]string{`engines[1].address: "http://h:80" is not host:port`}},
	{"address port zero", []string{"127.0.0.1:9002", "127.0.0.1:0"},
		[]string{`engines[1].address: "127.0.0.1:0": port "0" is not a number from 1 to 65535`}},
	{"address port name", []string{"127.0.0.1:9002", "localhost:http"},
		[]string{`engines[1].address: "localhost:http": port "http" is not a number from 1 to 65535`}},
	{"address bad host", []string{"127.0.0.1:9002", "a_b:80"},
		[]string{`engines[1].address: "a_b:80": host "a_b" is not an IP address or DNS name`}},
	{"address hostname ok", []string{"127.0.0.1:9002", "engine-2.example.com:8000"},
		nil},
	{"address missing", []string{`address: "127.0.0.1:9002", `, ""},
		[]string{"engines[1].address: required"}},
	{"engine unknown model", []string{"gpu: A100, model: m}\n  - {id: e3", "gpu: A100, model: llama}\n  - {id: e3"},
		[]string{`engines[1].model: unknown model "llama" (known: "m")`}},
	{"engine without profile", []string{"gpu: A100, model: m}\n  - {id: e3", "gpu: L40S, model: m}\n  - {id: e3"},
		[]string{`engines[1].gpu: no profile for gpu "L40S" and model "m"`}},
	{"replicas zero", []string{"replicas: 2", "replicas: 0"},
		[]string{"engines[3].replicas: must be positive, got 0"}},
	{"no engines", []string{"engines:\n", "engines: []\nx_engines:\n"},
		[]string{"engines: at least one engine required", "x_engines: unknown key"}},
	{"long label", []string{"labels: {zone: b}", "labels: {zone: " + strings.Repeat("x", 257) + "}"},
		[]string{"engines[3].labels.zone: value longer than 256 bytes"}},
	{"empty label key", []string{"labels: {zone: b}", "labels: {'': b}"},
		[]string{`engines[3].labels: label key "" must be 1 to 256 bytes`}},

	// fleet name
	{"fleet name charset", []string{"name: t\n", "name: 't t'\n"},
		[]string{`name: "t t" is not a valid name (letters, digits, '.', '_' and '-'; at most 128 characters)`}},

	// decode: unknown keys and kinds, all reported, with validation
	{"unknown key", []string{"replicas: 2", "replicas: 2, colour: red"},
		[]string{"engines[3].colour: unknown key"}},
	{"unknown top-level key and a rule", []string{"name: t\n", "name: t\nenignes: []\n", "replicas: 2", "replicas: 0"},
		[]string{"enignes: unknown key", "engines[3].replicas: must be positive, got 0"}},
	{"string for integer", []string{"replicas: 2", "replicas: two"},
		[]string{`engines[3].replicas: must be an integer, got "two"`}},
	{"float for integer", []string{"replicas: 2", "replicas: 1.5"},
		[]string{`engines[3].replicas: must be an integer, got "1.5"`}},
	{"string for number", []string{"rtt_ms: 80", "rtt_ms: fast"},
		[]string{`network.links[0].rtt_ms: must be a number, got "fast"`}},
	{"infinite number", []string{"rtt_ms: 80", "rtt_ms: .inf"},
		[]string{`network.links[0].rtt_ms: must be a finite number, got .inf`}},
	{"nan", []string{"overhead_ms: 10", "overhead_ms: .nan"},
		[]string{`profiles[0].overhead_ms: must be a finite number, got .nan`}},
	{"integer overflow", []string{"replicas: 2", "replicas: 99999999999999999999"},
		[]string{`engines[3].replicas: must be an integer, got "99999999999999999999"`}},
	{"mapping for list", []string{"engines:\n", "engines: {a: 1}\nx:\n"},
		[]string{"engines: must be a list, got a mapping", "x: unknown key"}},
	{"list for string", []string{"{name: f2, region: r2}", "{name: f2, region: [r2]}"},
		[]string{`frontends[1].region: must be a string, got a list`}},
	{"scalar for mapping", []string{"labels: {zone: b}", "labels: zone"},
		[]string{`engines[3].labels: must be a mapping, got "zone"`}},
	// model servers and tokenizers
	{"server kinds", []string{"model: m, replicas: 2", "model: m, server: sglang, replicas: 2", "gpu: A100, model: m}\n  - {id: e3", "gpu: A100, model: m, server: generic}\n  - {id: e3"}, nil},
	{"llama.cpp server", []string{"model: m, replicas: 2", "model: m, server: llamacpp, replicas: 2"}, nil},
	{"unknown server kind", []string{"model: m, replicas: 2", "model: m, server: tgi, replicas: 2"},
		[]string{`engines[3].server: unknown server kind "tgi" (known: vllm, sglang, generic, llamacpp)`}},
	{"health path", []string{"model: m, replicas: 2", "model: m, health_path: /health/ready, replicas: 2"}, nil},
	{"health path not absolute", []string{"model: m, replicas: 2", "model: m, health_path: health, replicas: 2"},
		[]string{`engines[3].health_path: "health" must start with /`}},
	{"health path with a query", []string{"model: m, replicas: 2", "model: m, health_path: \"/health?x=1\", replicas: 2"},
		[]string{`engines[3].health_path: "/health?x=1" is not a plain URL path (printable ASCII without spaces, '?' or '#', at most 1024 bytes)`}},
	{"chat template tokens", []string{"max_context_tokens: 131072}", "max_context_tokens: 131072, chat_template_tokens: 1}"}, nil},
	{"chat template tokens zero", []string{"max_context_tokens: 131072}", "max_context_tokens: 131072, chat_template_tokens: 0}"},
		[]string{"models[0].chat_template_tokens: must be positive, got 0"}},
	{"tokenizer path given (Parse reads no files)", []string{"max_context_tokens: 131072}", "max_context_tokens: 131072, tokenizer: tok/tokenizer.json}"}, nil},
}

// TestRules checks each validation rule: the edit gives exactly these errors.
func TestRules(t *testing.T) {
	for _, tc := range ruleCases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(edit(t, tc.edits...)))
			got := errorLines(err)
			if !slices.Equal(got, tc.want) {
				t.Errorf("errors:\n got  %q\n want %q", got, tc.want)
			}
		})
	}
}
