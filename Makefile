# inferlb — see README.md. Every target that needs tools runs scripts/setup.sh
# first, so a fresh clone works with `make demo` and `make test`.
SHELL := /bin/bash
VENV  ?= $(CURDIR)/.venv
export PATH := $(VENV)/bin:$(PATH)
export INFERLB_VENV := $(VENV)
GO    ?= go
# The operator's binary (cmd/inferlb: what the Helm chart's image runs) and
# the lab's (cmd/inferlb-lab: the simulators, the load generator, the demo
# and the benches, beside the operator's commands). Every target that runs
# a lab command runs the lab's.
BIN   := bin/inferlb
LAB   := bin/inferlb-lab
# The race detector and Envoy make the suite heavy on 2 cores: at most two
# packages at a time, each with a deadline.
TESTFLAGS ?= -race -p 2 -timeout 25m

.PHONY: setup build test test-short demo bench bench-rivals lint fmt clean sim-report profiles

setup:
	@scripts/setup.sh

# The version printed by `inferlb --version` (and inferlb-lab's): the
# checkout's describe string.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)

build:
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/inferlb
	$(GO) build -ldflags "-X main.version=$(VERSION)" -o $(LAB) ./cmd/inferlb-lab

# The tests also need a headless Chromium (the dashboard test); the demo does not.
# The drills (test/drills) run the real processes in real time against bars
# on throughput (the overload drill: admitted at least 90% of capacity), so
# they run alone, after the rest: on 2 cores with two busy loops beside it
# the overload drill admitted 87-98%, quiet 96-97%;
# CI, with another race-built package beside it, once saw 89.7%. The simulator's bar test
# (TestAffinityBar) skips itself under the race detector, where its 24
# full-length simulations take minutes; the last run has it without (about
# 40 s). The sim-vs-real comparison (TestSimAgainstReal) also runs alone and
# without the race detector, which would slow the real request path it
# measures several-fold (about two minutes). So does the hostile-body drill
# (TestDrillHostileBodies, about 35 s): under the race detector its own
# client and engines, in the test's process, would be what its latency
# ratio measured.
# --engines: llama.cpp's llama-server, built from source on the
# first run (cached under $(VENV)/llama.cpp), and its tiny model, for the
# tests that put a real engine behind the stack (test/drills, llamacpp_test.go).
test:
	@scripts/setup.sh --browser --engines --k8s --rivals
	$(GO) vet ./...
	pkgs=$$($(GO) list ./...) || exit 1; $(GO) test $(TESTFLAGS) $$(grep -v '/test/drills$$' <<<"$$pkgs")
	$(GO) test $(TESTFLAGS) ./test/drills
	$(GO) test -run 'TestDrillHostileBodies' ./test/drills
	$(GO) test -run 'TestAffinityBar' ./tools/fleetsim
	$(GO) test -run 'TestSimAgainstReal' ./tools/simreal
	$(GO) test -run 'TestMooncakeThroughEnvoyMatchesTheSimulator' ./tools/affinitybench
	$(MAKE) test-helm

# The Helm chart's test lives in its own module (deploy/helm/charttest):
# helm.sh/helm/v3's dependency tree stays out of the product's go.mod. It
# renders the chart and applies it to a real kube-apiserver (setup --k8s).
.PHONY: test-helm
test-helm:
	cd deploy/helm/charttest && $(GO) test $(TESTFLAGS) ./...

test-short: setup
	pkgs=$$($(GO) list ./...) || exit 1; $(GO) test -short -race $$(grep -v '/test/drills$$' <<<"$$pkgs")
	$(GO) test -short -race ./test/drills
	$(GO) test -short -run 'TestDrillHostileBodies' ./test/drills

demo: setup build
	$(LAB) demo $(DEMOFLAGS)

bench: setup
	$(GO) test -run '^$$' -bench . -benchmem -count 1 ./...

# inferlb beside the real SGLang and vLLM routers (installed from PyPI,
# pinned, by setup --rivals), medians of 3 runs: every router and workload in
# one region; the SGLang routers deployed per region against inferlb in three
# regions, with balanced demand and with us-east short of capacity. Tables,
# JSON and charts into docs/results/rivals (docs/rivals.md). About an hour.
RIVALFLAGS ?=
REGIONAL_ROUTERS := inferlb,smg-cache_aware,sglang-router-cache_aware,round-robin
bench-rivals: build
	@scripts/setup.sh --rivals
	$(LAB) bench rivals --results docs/results/rivals/one-region $(RIVALFLAGS)
	$(LAB) bench rivals --results docs/results/rivals/three-regions --regions 3 --routers $(REGIONAL_ROUTERS) \
	    --duration 45s $(RIVALFLAGS)
	$(LAB) bench rivals --results docs/results/rivals/three-regions-hot --regions 3 --routers $(REGIONAL_ROUTERS) \
	    --workloads multiturn --shares us-east=4,us-west=1,eu-west=1 --load 3 $(RIVALFLAGS)

# Every simulation scenario with every policy, from the scenarios' pinned
# seeds: tables and charts into docs/results (docs/sim.md). A few minutes.
sim-report: build
	$(LAB) sim --parallel 2 --out docs/results --header docs/results/header.md $$(ls examples/sim/*.yaml | grep -v '/fleet-')

# The example fleets' optimizer profiles (capacity_rps, ttft_curve,
# tbot_curve of every profiles: entry) fitted to the engine simulator
# running each entry's step model, at the fleet's reference request
# (docs/optimizer.md, "Profiles fitted to the engine"). A minute or two.
PROFILE_FLEETS ?= examples/fleet-3region.yaml examples/fleet-demo.yaml examples/fleet-engines.yaml examples/fleet-minimal.yaml examples/simreal/fleet.yaml $(wildcard examples/sim/fleet-*.yaml)
profiles: build
	for f in $(PROFILE_FLEETS); do $(LAB) profile --engine-sim --write --fleet $$f || exit 1; done

# Linters at pinned versions, run through the module proxy like any module
# (go.sum-checked, cached after the first run), so a clean clone needs no
# install step. staticcheck 2026.2.2 (v0.8.2) reads go 1.26 modules;
# unparam has no tagged releases, so it is pinned to a commit.
STATICCHECK ?= honnef.co/go/tools/cmd/staticcheck@v0.8.2
UNPARAM     ?= mvdan.cc/unparam@v0.0.0-20260823230713-2fa3d841b0c8

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt would change:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) run $(STATICCHECK) ./...
	$(GO) run $(UNPARAM) ./...

fmt:
	gofmt -w $$(git ls-files '*.go')

clean:
	rm -rf bin .setup-go.stamp
