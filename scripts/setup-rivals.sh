#!/usr/bin/env bash
# Installs the real routers `inferlb-lab bench rivals` measures inferlb against,
# each pinned, into a virtual environment of its own under
# ${INFERLB_RIVALS:-$VENV/rivals}: sglang-router installs a program named smg
# as well, so the two SGLang packages must not share one. All three are
# prebuilt Rust binaries on PyPI. Idempotent: a second run checks the
# installed versions and returns at once.
#   usage: scripts/setup-rivals.sh [VENV]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-${INFERLB_VENV:-.venv}}"
DIR="${INFERLB_RIVALS:-$VENV/rivals}"

log() { printf 'setup-rivals: %s\n' "$*" >&2; }
command -v python3 >/dev/null || { log "python3 is not installed; the rival routers come from PyPI"; exit 1; }

install() { # NAME PACKAGE==VERSION
  local name="$1" want="$2" env="$DIR/$1"
  local stamp="$env/.inferlb-setup"
  # A venv copied or moved from elsewhere keeps the old path in its
  # scripts' #! line and fails with "no such file": check the interpreter.
  local interp=""
  [ -f "$env/bin/$name" ] && interp="$(head -1 "$env/bin/$name" | sed -n 's/^#!//p')"
  if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && [ -x "$env/bin/$name" ] && [ -x "$interp" ]; then
    return
  fi
  log "installing $want into $env"
  rm -rf "$env"
  python3 -m venv "$env"
  "$env/bin/python" -m pip install --quiet --disable-pip-version-check "$want"
  [ -x "$env/bin/$name" ] || { log "$want installed no $name program in $env/bin"; exit 1; }
  echo "$want" > "$stamp"
}

mkdir -p "$DIR"
install smg "smg==${SMG_VERSION:-1.13.0}"
install sglang-router "sglang-router==${SGLANG_ROUTER_VERSION:-0.3.2}"
install vllm-router "vllm-router==${VLLM_ROUTER_VERSION:-0.1.17}"
log "ready: smg, sglang-router and vllm-router in $DIR"
