package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/inferlb/inferlb/api/fleet"
	"github.com/inferlb/inferlb/internal/envoytest"
	"github.com/inferlb/inferlb/internal/syncbuf"
	"github.com/inferlb/inferlb/tools/fixedports"
)

// docCmd is one documented command and what running it must give. Adding a
// command to the docs or to a --help Example means adding one line here;
// TestDocumentedCommands fails naming any shown command without one.
type docCmd struct {
	cmd string
	// exit is the expected exit status (after SIGINT, for a server).
	exit int
	// want is a fragment the output (stdout and stderr) must contain.
	want string
	// serve marks a command that runs until stopped: it is ready when each
	// of its conditions (joined by " && ") holds: a URL (http://...)
	// answers 200, or a text is in its output; then it gets SIGINT, as from
	// Ctrl-C, and must exit with exit.
	serve string
	// with names a fixture (below, or one an entry before hosts) that runs
	// meanwhile.
	with string
	// hosts makes this serving command, once ready, the fixture of that
	// name for the entries right after it that run with it; it gets its
	// SIGINT after them.
	hosts string
	// parallel runs the command at the same time as the parallel entries
	// next to it (clients of one fixture).
	parallel bool
	// check, if set, asserts more of the output and of what the command
	// left in the directory it ran in.
	check func(t *testing.T, out, dir string)
	// skip is why the command is not run (kept rare: say what covers it).
	skip string
}

// fixture is a server a documented command needs (an engine at the
// address the docs use, a control plane).
type fixture struct{ cmd, ready string }

var fixtures = map[string]fixture{
	"engine-18100":        {"inferlb-lab engine-sim --listen 127.0.0.1:18100 --model m --max-context-tokens 32768", "http://127.0.0.1:18100/health"},
	"h100-18100":          {"inferlb-lab engine-sim --listen 127.0.0.1:18100 --gpu H100 --model llama-3.1-8b --fleet examples/fleet-3region.yaml --time-scale 2", "http://127.0.0.1:18100/health"},
	"control-plane":       {"inferlb control-plane --fleet examples/fleet-3region.yaml --insecure", "http://127.0.0.1:18080/healthz"},
	"control-plane-token": {"inferlb control-plane --fleet examples/fleet-3region.yaml --token-file xds-token", "http://127.0.0.1:18080/healthz"},
	"fleet-admin-18090":   {"inferlb-lab engine-sim --fleet examples/fleet-3region.yaml --admin-listen 127.0.0.1:18090", "http://127.0.0.1:18090/admin/engines"},
	"engines":             {"inferlb-lab engine-sim --fleet examples/fleet-engines.yaml --time-scale 0.1", "http://127.0.0.1:18402/health_generate"},
}

const (
	solve3 = "inferlb solve --fleet examples/fleet-3region.yaml --demand examples/demand-3region.yaml"
	fleet3 = "examples/fleet-3region.yaml"
)

// docCommands are every command README.md, docs/*.md and the --help texts
// show, in the order they run (consecutive commands with one fixture share
// it).
var docCommands = []docCmd{
	// Make targets. The demo with its default flags runs until Ctrl-C: it
	// is the running demo the commands after it are pointed at. Ctrl-C
	// stops it cleanly (its summary); make, interrupted too, then dies of
	// the SIGINT itself, as make does (status 130).
	{cmd: "make demo", serve: "(Ctrl-C stops the demo) && http://127.0.0.1:17001/readyz", hosts: "demo", exit: 130,
		want: "inferlb demo: stopped.", check: checkDemoUntilInterrupted},
	// Against the running demo.
	{cmd: "inferlb-lab loadgen --url http://127.0.0.1:17010 --model llama-3.1-70b-fp8 --workload mooncake --trace tools/workload/testdata/mooncake_head.jsonl --block-tokens 16 --speedup 20", with: "demo", want: "requests: 40 sent, 40 ok"},
	{cmd: "inferlb-lab view --fleet examples/fleet-demo.yaml --envoy-admin frontend-us-east=http://127.0.0.1:17020", with: "demo", serve: "inferlb live view"},
	{cmd: "curl -s http://127.0.0.1:17001/weights", with: "demo", want: `"envoy_weights"`},
	{cmd: `curl -s "http://127.0.0.1:17001/explain?node=frontend-us-east&class=general"`, with: "demo", want: `"explanations"`},
	{cmd: "curl -s http://127.0.0.1:17001/dashboard/", with: "demo", want: "<title>inferlb control plane</title>"},
	// These only check what they print whatever the load, so they share the
	// demo at once (the mooncake replay above wants every request ok: it
	// runs alone).
	{cmd: "inferlb-lab loadgen --model llama-3.1-70b-fp8 --url http://127.0.0.1:17010 --region-url us-east=http://127.0.0.1:17010 --region-url eu-west=http://127.0.0.1:17012 --workload multiturn --arrival poisson --rate 2 --duration 40s --priority-mix critical=1,batch=3 --region-shares us-east=0.5,eu-west=0.5 --region-shares 20s:us-east=0.1,eu-west=0.9", with: "demo", parallel: true, want: "region=eu-west"},
	{cmd: "inferlb-lab loadgen --url http://127.0.0.1:17010 --model llama-3.1-70b-fp8 --workload multiturn --arrival poisson --rate 2 --duration 40s --priority-mix critical=1,batch=3 --region-url eu-west=http://127.0.0.1:17012 --region-shares us-east=0.5,eu-west=0.5 --region-shares 20s:us-east=0.1,eu-west=0.9 --slo-ttft 500ms --slo-tpot 50ms --json-out report.json", with: "demo", parallel: true, want: "goodput:"},
	{cmd: "inferlb-lab loadgen --model llama-3.1-70b-fp8 --url http://127.0.0.1:17010 --workload multiturn --arrival poisson --rate 2 --rate-at 10s:6 --rate-at 20s:2 --until-interrupted", with: "demo", parallel: true, serve: "loadgen    12s", want: "(interrupted)"},
	{cmd: `make demo DEMOFLAGS="--duration 20s --time-scale 0.5"`, want: "inferlb demo: stopped.", check: checkDemoBounded},
	{cmd: "make build", skip: "make demo runs it (its prerequisite) in the first entry"},
	{cmd: "make test", skip: "it is this suite (CI runs it)"},
	{cmd: "make lint", skip: "CI runs it before make test (.ci/run)"},
	{cmd: "make profiles", skip: "refits every example fleet's profiles against the engine simulator (minutes) and rewrites the fleet files; TestProfileEngineSimWithin15Percent holds the fit"},
	{cmd: "inferlb-lab profile --engine-sim", skip: "named in docs/optimizer.md's prose; make profiles runs it (with --write --fleet) over every example fleet"},
	{cmd: "make bench", skip: "every benchmark, minutes; go vet in make test compiles them"},
	// The binaries' own help.
	{cmd: "bin/inferlb --help", want: "Available Commands:"},
	{cmd: "bin/inferlb-lab --help", want: "engine-sim"},
	{cmd: "bin/inferlb-lab demo --help", want: "--duration"},
	// Fleet specs and the optimizer.
	{cmd: "inferlb validate " + fleet3, want: `ok: fleet "demo-3region"`},
	{cmd: "inferlb validate examples/*.yaml", want: "demand-3region.yaml: ok: demand file"},
	{cmd: "inferlb validate --fleet " + fleet3 + " examples/demand-3region.yaml", want: `consistent with fleet "demo-3region"`},
	{cmd: "inferlb validate examples/invalid/fleet-mistakes.yaml", exit: 1, want: `fleet-mistakes.yaml:23: engines[0].region: unknown region "locl"`},
	{cmd: solve3, want: "frontend-us-east / general"},
	{cmd: solve3 + " --json", want: `"method": "fast"`},
	{cmd: solve3 + " --explain frontend-us-east us-west-h100-1", want: "= marginal price of the flow"},
	{cmd: "inferlb solve --explain FRONTEND ENGINE", skip: "synopsis; the concrete command is the entry above"},
	// Components as servers.
	{cmd: "inferlb control-plane --fleet " + fleet3 + " --insecure", serve: "http://127.0.0.1:18080/healthz"},
	{cmd: "inferlb control-plane --fleet " + fleet3 + " --xds-listen 127.0.0.1:18000 --admin-listen 127.0.0.1:18080 --interval 5s --state-file cp-state.json --insecure", serve: "http://127.0.0.1:18080/healthz"},
	{cmd: "inferlb control-plane --config examples/config/control-plane.yaml --insecure", serve: "http://127.0.0.1:18080/healthz"},
	{cmd: "inferlb-lab engine-sim --fleet " + fleet3, serve: "http://127.0.0.1:18012/health"},
	{cmd: "inferlb-lab engine-sim --fleet " + fleet3 + " --time-scale 0.1", serve: "http://127.0.0.1:18012/health"},
	{cmd: "inferlb-lab engine-sim --fleet " + fleet3 + " --engines us-east-h100-1,eu-west-a100-1 --time-scale 0.1", serve: "http://127.0.0.1:18011/health"},
	{cmd: "inferlb-lab engine-sim --fleet " + fleet3 + " --admin-listen 127.0.0.1:18090", serve: "http://127.0.0.1:18090/admin/engines"},
	{cmd: `curl -s -X POST -d '{"slowdown": 5}' http://127.0.0.1:18090/admin/engines/us-east-h100-1/faults`, with: "fleet-admin-18090", want: `"slowdown":5`},
	{cmd: "inferlb-lab engine-sim --listen 127.0.0.1:18100 --gpu H100 --model llama-3.1-8b --fleet " + fleet3, serve: "http://127.0.0.1:18100/health"},
	{cmd: "inferlb-lab engine-sim --listen 127.0.0.1:18100 --gpu H100 --model llama-3.1-8b --fleet " + fleet3 + " --time-scale 2", serve: "http://127.0.0.1:18100/health"},
	{cmd: "inferlb-lab engine-sim --listen 127.0.0.1:18100 --model m --decode-step-ms 13 --decode-step-per-seq-ms 0.09", serve: "http://127.0.0.1:18100/health"},
	{cmd: "inferlb-lab engine-sim --listen 127.0.0.1:18100 --model m --prefill-tokens-per-s 25000 --decode-step-ms 6.5 --max-running 128", serve: "http://127.0.0.1:18100/health"},
	{cmd: "inferlb-lab engine-sim --listen 127.0.0.1:18100 --model m --max-context-tokens 32768", serve: "http://127.0.0.1:18100/health"},
	// Real engines (docs/engines.md): server kinds, loading, tokenizers.
	{cmd: "inferlb-lab engine-sim --listen 127.0.0.1:18100 --model m --server sglang --loading-for 2s", serve: "http://127.0.0.1:18100/health_generate"},
	{cmd: "inferlb validate examples/fleet-engines.yaml", want: `ok: fleet "engines"`},
	{cmd: "inferlb-lab engine-sim --fleet examples/fleet-engines.yaml --time-scale 0.1", serve: "http://127.0.0.1:18404/health"},
	{cmd: "inferlb profile --target http://127.0.0.1:18402 --model Qwen/Qwen3-8B --server sglang --gpu H100 --max-rate 40 --time-scale 0.1 --points 4 --requests 40", with: "engines", want: "kv_capacity_tokens: 450000"},
	{cmd: "inferlb extproc --policy-file examples/policy-eu-west.json --node-id frontend-eu-west --region eu-west --tokenizer internal/tokens/hf/testdata/qwen3.tokenizer.json.gz", serve: "tokenizer loaded"},
	{cmd: "inferlb extproc --control-plane 127.0.0.1:18000 --node-id frontend-eu-west --region eu-west --insecure", with: "control-plane", serve: "http://127.0.0.1:9102/healthz"},
	{cmd: "inferlb extproc --policy-file examples/policy-eu-west.json --node-id frontend-eu-west --region eu-west", serve: "routing policy applied"},
	{cmd: "inferlb extproc --config examples/config/extproc.yaml", serve: "routing policy applied"},
	{cmd: "inferlb extproc --print-bootstrap fail-closed --node-id frontend-eu-west --region eu-west --control-plane 127.0.0.1:18000 --envoy-port 10000 --insecure", want: "node:"},
	{cmd: "inferlb extproc --print-bootstrap fail-closed --node-id frontend-eu-west --region eu-west --control-plane 127.0.0.1:18000 --envoy-port 10000 --insecure > envoy.yaml"},
	// Securing the control plane's port (docs/operations.md).
	{cmd: "inferlb token > xds-token"},
	{cmd: "inferlb control-plane --fleet " + fleet3 + " --token-file xds-token", serve: "http://127.0.0.1:18080/healthz"},
	{cmd: "inferlb extproc --control-plane 127.0.0.1:18000 --node-id frontend-us-east --region us-east --control-plane-token-file xds-token", with: "control-plane-token", serve: "http://127.0.0.1:9102/healthz"},
	{cmd: "inferlb extproc --print-bootstrap fail-closed --node-id frontend-us-east --region us-east --control-plane 127.0.0.1:18000 --control-plane-token-file xds-token > envoy.yaml"},
	{cmd: "inferlb control-plane --inference-pool llm/llama --fleet-configmap inferlb-fleet --token-file /etc/inferlb/token/token", skip: "in a pod (in-cluster credentials); TestKubernetesDiscoveryFollowsThePool (controlplane/discovery/kube) runs discovery and the control plane against a real kube-apiserver"},
	{cmd: "inferlb control-plane --inference-pool llm/llama --kubeconfig ~/.kube/config --insecure", skip: "needs a cluster; TestKubernetesDiscoveryFollowsThePool runs the same against a real kube-apiserver, TestControlPlaneKubernetesFlags the flags' errors"},
	{cmd: "make test-helm", skip: "make test runs it (deploy/helm/charttest: a real kube-apiserver)"},
	{cmd: "inferlb control-plane --fleet " + fleet3 + " --tls-cert /etc/inferlb/cp.crt --tls-key /etc/inferlb/cp.key --tls-client-ca /etc/inferlb/clients-ca.crt", skip: "needs a PKI; TestDrillMutualTLS (test/drills) runs these flags with certificates it makes"},
	{cmd: "inferlb extproc --control-plane cp.inferlb.internal:18000 --node-id frontend-us-east --region us-east --control-plane-ca /etc/inferlb/cp-ca.crt --control-plane-cert /etc/inferlb/fe.crt --control-plane-key /etc/inferlb/fe.key --control-plane-server-name cp.inferlb.internal", skip: "needs a PKI; TestDrillMutualTLS (test/drills) runs these flags with certificates it makes"},
	{cmd: "inferlb extproc --print-bootstrap fail-closed --node-id frontend-us-east --region us-east --control-plane 127.0.0.1:18000 --insecure --client-priorities examples/auth/client-priorities.yaml --auth-filters examples/auth/envoy-jwt-auth.yaml", want: "envoy.filters.http.jwt_authn"},
	// The endpoint picker (docs/endpoint-picker.md) and Envoy's credentials over SDS (docs/operations.md).
	{cmd: "inferlb extproc --mode endpoint-picker", skip: "the mode's name in prose; TestRunEndpointPicker (extproc/service) runs the service in it, and extproc/picker's TestEndpointPicker* behind real gateway Envoys"},
	{cmd: "inferlb extproc --mode endpoint-picker --listen 0.0.0.0:9002 --control-plane cp.inferlb:18000 --node-id gateway-eu-west --region eu-west --control-plane-ca /etc/inferlb/ca.crt --control-plane-cert ... --control-plane-key ...", skip: "needs a PKI and a control plane; TestRunEndpointPicker runs the mode"},
	{cmd: "inferlb extproc --print-bootstrap fail-closed --node-id fe --region eu-west --control-plane cp.inferlb:18000 --control-plane-ca /etc/inferlb/tls/ca.crt --control-plane-cert /etc/inferlb/tls/tls.crt --control-plane-key /etc/inferlb/tls/tls.key --envoy-sds-dir /etc/envoy/sds > envoy.yaml", skip: "needs a PKI; TestPrintBootstrapSDS runs these flags, TestDrillEnvoyCredentialsRotateLive (test/drills) the bootstrap they print"},
	// Load against one engine.
	{cmd: "inferlb-lab loadgen --url http://127.0.0.1:18100 --model m --workload azure --trace tools/workload/testdata/azure_code_head.csv --speedup 20 --max-requests 100 --slo-ttft 300ms --slo-tpot 30ms --json-out azure.json", with: "engine-18100", want: "requests: 100 sent, 100 ok"},
	{cmd: "inferlb-lab loadgen --url URL --model NAME --workload mooncake|azure|multiturn [flags]", skip: "synopsis; the entries around it are concrete"},
	{cmd: "inferlb profile --target http://127.0.0.1:18100 --model llama-3.1-8b --max-rate 40 --time-scale 2 --points 4 --requests 40 --fleet " + fleet3 + " --gpu H100", with: "h100-18100", want: "profiles:"},
	{cmd: "inferlb profile --target http://127.0.0.1:18100 --model llama-3.1-8b --max-rate 80 --prompt-tokens 200 --output-tokens 50 --time-scale 2 --points 4 --requests 40 --fleet " + fleet3 + " --gpu H100", with: "h100-18100", want: "profiles:"},
	// The demo itself.
	{cmd: "inferlb-lab demo --duration 20s --time-scale 0.5", want: "inferlb demo: stopped."},
	{cmd: "inferlb-lab demo --time-scale 2 --rate 2 --plain > demo.log", serve: "http://127.0.0.1:17001/readyz"},
	// Real llama.cpp servers (scripts/setup.sh --engines builds them; make
	// test does); skipped without them outside CI (llamaDemoSkip).
	{cmd: "inferlb-lab demo --engines llamacpp --duration 40s", want: "inferlb demo: stopped.", check: checkDemoLlama},
	// The fleet simulator.
	{cmd: "inferlb-lab sim --duration 60s examples/sim/steady-3region.yaml", want: "| inferlb |"},
	{cmd: "inferlb-lab sim --duration 60s --policy inferlb,session_hash examples/sim/shared-preamble.yaml", want: "| session_hash |"},
	{cmd: "inferlb-lab sim --duration 60s --json --policy inferlb examples/sim/hot-region.yaml", want: `"best_achievable_hit_rate"`},
	{cmd: "inferlb-lab sim --duration 60s --out sim-out examples/sim/engine-failure.yaml", want: "Best achievable hit rate"},
	{cmd: "inferlb-lab sim --duration 60s --seeds 3 --policy inferlb,random_key examples/sim/steady-3region.yaml", want: "Medians over 3 seeds (1–3)"},
	{cmd: "inferlb-lab sim --policy sglang_cache_aware,round_robin,session_hash examples/sim/rivals-multiturn.yaml", want: "| sglang_cache_aware |"},
	{cmd: "inferlb-lab sim --seeds 3 --json --policy inferlb,random_key,llm_d,sglang_cache_aware,session_hash examples/sim/shared-preamble.yaml", skip: "the measurement behind the cache-affinity bar's tables (docs/sim.md, docs/results/sim-measured.md; several minutes); the --seeds 3 entry above runs the same flags at 60 s"},
	{cmd: "inferlb-lab sim --seeds 3 --json --policy inferlb,random_key,llm_d,sglang_cache_aware,session_hash examples/sim/steady-3region.yaml", skip: "the measurement behind the cache-affinity bar's tables (docs/sim.md, docs/results/sim-measured.md; several minutes); the --seeds 3 entry above runs the same flags at 60 s"},
	{cmd: "inferlb-lab sim --seeds 3 --policy inferlb --prefill-placement examples/sim/mooncake.yaml", skip: "the measurement behind the prefill-placement figures (docs/decisions/prefill-placement-off.md, docs/results/sim-measured.md; a minute; every scenario took two); TestPlacement and TestDecidePlacesALongPrompt hold the rule"},
	{cmd: "inferlb-lab sim --seeds 3 --policy inferlb --idle-placement=false examples/sim/mooncake.yaml", skip: "the off side of the idle-placement figures (docs/decisions/idle-placement-on.md) since it is on by default (20 s; every scenario took two minutes); TestIdlePlacement and TestSharedTokensCreditsTheHotPrefix hold the rule, TestAffinityBar the balance with it on"},
	{cmd: "inferlb-lab sim --seeds 3 --policy inferlb --idle-placement examples/sim/mooncake.yaml", skip: "the measurement behind the idle-placement figures (docs/results/sim-measured.md; 20 s; every scenario took two minutes); TestIdlePlacement and TestDecideIdlePlacementCountsTheRequest hold the rule"},
	{cmd: "inferlb-lab sim --seeds 3 --json --policy inferlb --balance-factor 0 examples/sim/hetero-gpus.yaml", skip: "the measurement behind the balance-cost table (docs/results/sim-measured.md; a minute under the race detector); the --seeds 3 entry above runs the same code at 60 s"},
	{cmd: "inferlb-lab sim --bench --engines 100 --requests 20000", want: "req/CPU-s"},
	{cmd: "make sim-report", skip: "every scenario with every policy (minutes); its output is docs/results, and the sim entries above run the same code"},
	// Benchmarks.
	{cmd: "inferlb-lab bench extproc --duration 1s --concurrency 16 --sizes 8192", want: "+ inferlb ext_proc"},
	{cmd: "inferlb-lab bench extproc --duration 3s --concurrency 1,16,150 --sizes 8192,225280", skip: "the measurement behind docs/results/extproc-bench.md's tables (minutes); the entry above runs the same command on one cell"},
	{cmd: "inferlb-lab bench extproc --protocol-only --key prefix --duration 3s --concurrency 150 --sizes 8192,225280", want: "220 KB"},
	{cmd: "inferlb-lab bench extproc --protocol-only --duration 3s --concurrency 1,150 --sizes 8192,225280 --extproc-binary /tmp/inferlb-base", skip: "the before/after measurement behind docs/results/extproc-bench.md's memory tables (a build of main as /tmp/inferlb-base, minutes); TestBenchExtProcSmoke checks the memory columns"},
	{cmd: "make bench-rivals", skip: "every workload beside every real rival, one region and three, medians of 3 runs (about an hour); its output is docs/results/rivals, and tools/rivalbench's TestSmokeInferlbBesideARealRival runs the same code small"},
	{cmd: "inferlb-lab bench rivals --workloads multiturn --runs 1 --duration 30s", skip: "seven routers for 30 s (a minute with the start); TestSmokeInferlbBesideARealRival runs two for 4 s"},
	{cmd: "inferlb-lab bench rivals --routers inferlb,sglang-router-cache_aware,round-robin --workloads mooncake", skip: "three runs of a minute on the shared Mooncake trace, outside the repository; the smoke test covers the command's code"},
	{cmd: "inferlb-lab bench rivals --regions 3 --shares us-east=3,us-west=1,eu-west=1 --workloads multiturn", skip: "three regions of seven routers, three runs of a minute; the smoke test covers the code in one region"},
	{cmd: "inferlb-lab bench affinity", skip: "the measurement behind docs/results/extproc-bench.md's affinity figures (1,000 requests per mode, minutes); the entry below runs it small, and so does tools/affinitybench's TestSharedPreambleThroughEnvoy"},
	{cmd: "inferlb-lab bench affinity --requests 100 --modes prefix,random,session --json-out affinity.json", want: "prefix vs random: TTFT p50"},
	{cmd: "inferlb-lab bench affinity --modes prefix --hash-balance-factor 300 --mooncake mooncake_synthetic_trace.jsonl --mooncake-rows 600", skip: "the Mooncake trace lives in the shared data directory, outside the repository (docs/sim.md's --data-dir); a minute of a real rig"},
	{cmd: "inferlb-lab bench affinity --modes prefix --mooncake mooncake_synthetic_trace.jsonl --mooncake-rows 600", skip: "the same, with the default hash_balance_factor of the bench"},
	{cmd: "inferlb-lab bench simreal", skip: "the sim-vs-real comparison behind docs/sim.md (two minutes of traffic at time scale 2: about six minutes); tools/simreal's TestSimAgainstReal runs it short in make test"},
	{cmd: "inferlb-lab bench simreal --duration 60s --seed 7 --json-out simreal.json", skip: "three minutes of a real stack; tools/simreal's TestSimAgainstReal runs the same path short in make test"},
	// Cache-affinity keys.
	{cmd: "inferlb explain-key --policy-file examples/policy-affinity.json examples/request-shared-preamble.json", want: "x-inferlb-affinity-key: bb34053ccb15de80"},
	{cmd: "inferlb explain-key --control-plane 127.0.0.1:18000 --node-id frontend-us-east --insecure --session s-42 < examples/request-shared-preamble.json", with: "control-plane", want: "why: keyed on the session"},
	{cmd: "curl -s http://127.0.0.1:18080/affinity", with: "control-plane", want: `"hot_share_of_class"`},
	{cmd: "inferlb-lab bench extproc --protocol-only --duration 3s --concurrency 1,150 --sizes 8192,225280", skip: "the measurement behind docs/results/extproc-bench.md's streamed-body tables (minutes, with --extproc-binary and --body-mode per build); the bench extproc entry above covers the command"},
	{cmd: "inferlb-lab bench extproc --envoy-only --duration 3s --concurrency 1,150 --sizes 8192,225280", skip: "the measurement behind docs/results/extproc-bench.md's streamed-body table behind Envoy (minutes); the bench extproc entry above covers the command"},
	{cmd: "inferlb-lab bench extproc --envoy-only --concurrency 150 --sizes 225280,8192", skip: "the measurement behind docs/results/extproc-bench.md's Envoy table (minutes); the bench extproc entry above covers the command"},
}

// Every command the docs and the --help texts show is in docCommands, and
// every entry there is still shown somewhere; then each one runs, as a user
// would run it from the repository's root, and gives its exit status and
// output.
//
// The commands run in two lanes at the same time: the one of the demo's
// fixed ports and the other one (see demoLane); in each lane in table order.
func TestDocumentedCommands(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	shown := shownCommands(t, root)
	table := map[string]bool{}
	for _, e := range docCommands {
		if table[e.cmd] {
			t.Errorf("docCommands lists %q twice", e.cmd)
		}
		table[e.cmd] = true
	}
	seen := map[string]bool{}
	for _, c := range shown {
		seen[c.cmd] = true
		if !table[c.cmd] {
			t.Errorf("%s shows a command docCommands does not list (add a line with what it must give):\n\t%s", c.where, c.cmd)
		}
		if why := wrongBinary(c.cmd); why != "" {
			t.Errorf("%s: %s:\n\t%s", c.where, why, c.cmd)
		}
	}
	for _, e := range docCommands {
		if !seen[e.cmd] {
			t.Errorf("docCommands lists %q, which no doc or --help shows any more: remove it", e.cmd)
		}
	}
	if t.Failed() || testing.Short() {
		return
	}
	fixedports.Lock(t)
	r := newDocRunner(t, root)
	var lanes [2][]docCmd
	for _, e := range docCommands {
		if e.skip != "" {
			t.Logf("not run: %s (%s)", e.cmd, e.skip)
			continue
		}
		k := 1
		if demoLane(t, root, e) {
			k = 0
		}
		lanes[k] = append(lanes[k], e)
	}
	for k, name := range []string{"demo ports", "other ports"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			l := &docLane{r: r, t: t}
			defer l.stopFixture()
			l.runAll(lanes[k])
		})
	}
}

// demoLane says whether a command runs in the lane of the demo's ports:
// it, or its fixture, listens on the demo's ports (17000..) or on the demo
// fleet's engine addresses (18001–18012: engine-sim of a fleet with engines
// there), or it runs bin/inferlb or bin/inferlb-lab, which make demo
// rebuilds. Every other
// command (ports 18000, 18080, 18100, 184xx, 9002, 9102 or ephemeral ones)
// runs in the other lane, at the same time.
func demoLane(t *testing.T, root string, e docCmd) bool {
	if e.with == "demo" || e.hosts != "" {
		return true
	}
	for _, c := range []string{e.cmd, fixtures[e.with].cmd} {
		if strings.Contains(c, "make ") || strings.Contains(c, "bin/inferlb") || strings.Contains(c, "inferlb-lab demo") {
			return true
		}
		m := regexp.MustCompile(`engine-sim .*--fleet (\S+)`).FindStringSubmatch(c)
		if m == nil || strings.Contains(c, "--listen") {
			continue
		}
		spec, err := fleet.Load(filepath.Join(root, m[1]))
		if err != nil {
			t.Fatalf("%s: %v", c, err)
		}
		for _, eng := range spec.Engines {
			if _, port, _ := strings.Cut(eng.Address, ":"); port >= "18001" && port <= "18012" && len(port) == 5 {
				return true
			}
		}
	}
	return false
}

// docRunner runs commands in a copy of the repository's root made of
// symbolic links (so relative paths work and what a command writes stays out
// of the checkout), with the freshly built binaries, the operator's and the
// lab's, first on PATH as "inferlb" and "inferlb-lab" and in bin/ (which make
// demo rebuilds; PATH's copies are their own files, so no command starts a
// binary while make writes it).
type docRunner struct {
	dir string
	env []string
}

func newDocRunner(t *testing.T, root string) *docRunner {
	dir := t.TempDir()
	ents, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		switch e.Name() {
		case "bin", "demo-out":
			continue
		}
		if err := os.Symlink(filepath.Join(root, e.Name()), filepath.Join(dir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	bin, path := filepath.Join(dir, "bin"), filepath.Join(dir, ".path")
	for _, d := range []string{bin, path} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"inferlb", "inferlb-lab"} {
		build := exec.Command("go", "build", "-o", filepath.Join(path, name), "./cmd/"+name)
		build.Dir = root
		if out, err := build.CombinedOutput(); err != nil {
			t.Fatalf("go build: %v\n%s", err, out)
		}
		if b, err := os.ReadFile(filepath.Join(path, name)); err != nil {
			t.Fatal(err)
		} else if err := os.WriteFile(filepath.Join(bin, name), b, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	env := append(os.Environ(), "PATH="+path+string(os.PathListSeparator)+os.Getenv("PATH"))
	return &docRunner{dir: dir, env: env}
}

// docLane runs one lane's commands in order, with at most one fixture
// running at a time.
type docLane struct {
	r       *docRunner
	t       *testing.T
	fixName string
	fix     *docProc
	// host is the entry whose command is the running fixture (nil for a
	// fixture of the fixtures table): stopping it is its test.
	host *docCmd
}

func (l *docLane) runAll(entries []docCmd) {
	for i := 0; i < len(entries); i++ {
		e := entries[i]
		l.useFixture(e.with)
		if e.hosts != "" {
			l.startHost(e)
			continue
		}
		if !e.parallel {
			l.t.Run(e.cmd, func(t *testing.T) { l.r.run(t, e) })
			continue
		}
		j := i
		for j < len(entries) && entries[j].parallel && entries[j].with == e.with {
			j++
		}
		group := entries[i:j]
		l.t.Run("at once", func(t *testing.T) {
			for _, e := range group {
				t.Run(e.cmd, func(t *testing.T) {
					t.Parallel()
					l.r.run(t, e)
				})
			}
		})
		i = j - 1
	}
}

// docProc is a command running under bash in its own process group.
type docProc struct {
	cmd  *exec.Cmd
	out  *syncbuf.Buffer
	done chan struct{}
	err  error // set before done closes
}

func (r *docRunner) start(t *testing.T, command string) *docProc {
	p := &docProc{out: &syncbuf.Buffer{}, done: make(chan struct{})}
	p.cmd = exec.Command("bash", "-c", command)
	p.cmd.Dir, p.cmd.Env = r.dir, r.env
	p.cmd.Stdout, p.cmd.Stderr = p.out, p.out
	p.cmd.SysProcAttr = docProcAttr()
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("%s: %v", command, err)
	}
	go func() { p.err = p.cmd.Wait(); close(p.done) }()
	return p
}

// interrupt sends SIGINT to the command's process group, as Ctrl-C in a
// terminal does, and waits for it to exit; a command that does not exit in
// a minute is killed.
func (p *docProc) interrupt() error {
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGINT)
	select {
	case <-p.done:
		return nil
	case <-time.After(time.Minute):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
		return errors.New("still running a minute after SIGINT: killed")
	}
}

// exitCode is the status a shell reports: 128+N for a process killed by
// signal N (make, interrupted, re-raises SIGINT: 130).
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			return 128 + int(ws.Signal())
		}
		return ee.ExitCode()
	}
	if err != nil {
		return -1
	}
	return 0
}

// waitReady polls until every condition of ready (joined by " && ": a URL
// answering 200, or a text in the output) holds, or the command exits.
func waitReady(p *docProc, ready string, timeout time.Duration) error {
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	return envoytest.Poll(context.Background(), timeout, 200*time.Millisecond, func() error {
		select {
		case <-p.done:
			return backoffStop{fmt.Errorf("exited (%v) before it was ready", p.err)}
		default:
		}
		for _, cond := range strings.Split(ready, " && ") {
			if strings.HasPrefix(cond, "http") {
				resp, err := client.Get(cond)
				if err != nil {
					return err
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					return fmt.Errorf("%s: %s", cond, resp.Status)
				}
			} else if !strings.Contains(p.out.String(), cond) {
				return fmt.Errorf("no %q in the output yet", cond)
			}
		}
		return nil
	})
}

// backoffStop is an error that Poll keeps returning; the caller sees it.
type backoffStop struct{ error }

func (l *docLane) useFixture(name string) {
	if name == l.fixName {
		return
	}
	l.stopFixture()
	if name == "" {
		return
	}
	f, ok := fixtures[name]
	if !ok {
		l.t.Fatalf("no fixture %q: none in the fixtures table and no entry just before hosts it", name)
	}
	p := l.r.start(l.t, f.cmd)
	if err := waitReady(p, f.ready, 3*time.Minute); err != nil {
		p.interrupt()
		l.t.Fatalf("fixture %s (%s): %v\n%s", name, f.cmd, err, tailString(p.out.String(), 3000))
	}
	l.fixName, l.fix = name, p
}

// startHost starts an entry that hosts a fixture; stopFixture ends it and
// checks it.
func (l *docLane) startHost(e docCmd) {
	l.stopFixture()
	p := l.r.start(l.t, e.cmd)
	if err := waitReady(p, e.serve, 3*time.Minute); err != nil {
		p.interrupt()
		l.t.Fatalf("%s (hosting fixture %s): %v\n%s", e.cmd, e.hosts, err, tailString(p.out.String(), 3000))
	}
	l.fixName, l.fix, l.host = e.hosts, p, &e
}

func (l *docLane) stopFixture() {
	if l.fix == nil {
		return
	}
	p, host, name := l.fix, l.host, l.fixName
	l.fix, l.fixName, l.host = nil, "", nil
	err := p.interrupt()
	if host == nil {
		if err != nil || exitCode(p.err) != 0 {
			l.t.Errorf("fixture %s: stopping: %v, exit %v\n%s", name, err, p.err, tailString(p.out.String(), 3000))
		}
		return
	}
	l.t.Run(host.cmd, func(t *testing.T) {
		if err != nil {
			t.Fatal(err)
		}
		l.r.judge(t, *host, p)
	})
}

func (r *docRunner) run(t *testing.T, e docCmd) {
	p := r.start(t, e.cmd)
	if e.serve != "" {
		if err := waitReady(p, e.serve, 3*time.Minute); err != nil {
			p.interrupt()
			t.Fatalf("%v\n%s", err, tailString(p.out.String(), 3000))
		}
		if err := p.interrupt(); err != nil {
			t.Fatal(err)
		}
	} else {
		select {
		case <-p.done:
		case <-time.After(4 * time.Minute):
			p.interrupt()
			t.Fatalf("still running after 4 minutes\n%s", tailString(p.out.String(), 3000))
		}
	}
	r.judge(t, e, p)
}

// judge checks a finished command's exit status and output.
func (r *docRunner) judge(t *testing.T, e docCmd, p *docProc) {
	out := p.out.String()
	if got := exitCode(p.err); got != e.exit {
		t.Errorf("exit status %d (%v), want %d\n%s", got, p.err, e.exit, tailString(out, 3000))
	}
	if e.want != "" && !strings.Contains(out, e.want) {
		t.Errorf("output lacks %q:\n%s", e.want, tailString(out, 3000))
	}
	if e.check != nil {
		e.check(t, out, r.dir)
	}
	if t.Failed() {
		for _, name := range []string{"control-plane", "loadgen", "engines"} {
			if b, err := os.ReadFile(filepath.Join(r.dir, "demo-out", name+".log")); err == nil && strings.Contains(e.cmd, "demo") {
				t.Logf("demo-out/%s.log (last 3 KB):\n%s", name, tailString(string(b), 3000))
			}
		}
	}
}

func tailString(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// The docs link only to files of the repository, and name no path outside
// it (a reader of a clone has only the clone).
func TestDocsPointInsideTheRepository(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	files = append(files, filepath.Join(root, "README.md"))
	link := regexp.MustCompile(`\]\(([^)#\s]+)(#[^)]*)?\)`)
	outside := regexp.MustCompile("(^|[\\s`(\"'])(\\.\\./shared|/work/)[^\\s`)]*")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, f)
		for i, line := range strings.Split(string(b), "\n") {
			for _, m := range link.FindAllStringSubmatch(line, -1) {
				target := m[1]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				abs := filepath.Join(filepath.Dir(f), target)
				if r, err := filepath.Rel(root, abs); err != nil || strings.HasPrefix(r, "..") {
					t.Errorf("%s:%d: link %q leaves the repository", rel, i+1, target)
				} else if _, err := os.Stat(abs); err != nil {
					t.Errorf("%s:%d: link %q: no such file in the repository", rel, i+1, target)
				}
			}
			if m := outside.FindString(line); m != "" {
				t.Errorf("%s:%d: names a path outside the repository: %s", rel, i+1, strings.TrimSpace(m))
			}
		}
	}
}
