#!/usr/bin/env bash
# Builds the real etcd and kube-apiserver that the Kubernetes tests run
# (internal/k8stest), from the Go module proxy, and caches them:
#   - etcd from tools/k8srig/etcd (go.etcd.io/etcd/server/v3, a main calling
#     etcdmain.Main);
#   - kube-apiserver from tools/k8srig/apiserver (k8s.io/kubernetes with its
#     staging modules replaced by their published versions, a main running
#     app.NewAPIServerCommand).
# Each is its own Go module so the product's go.mod stays small. The binaries
# go to $INFERLB_K8S_CACHE (default ~/.cache/inferlb/k8s), one folder per
# version (etcd-v3.7.3/etcd, kube-apiserver-v1.37.2/kube-apiserver), so a
# second run, from any clone on the machine, returns at once. From an empty
# cache the builds take minutes (kube-apiserver: a 170 MB binary); they run
# under nice so they do not starve the rest of a shared machine.
# Called by scripts/setup.sh --k8s; `--print` prints the two paths and builds
# nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf 'setup-k8s: %s\n' "$*" >&2; }

print=0
for arg in "$@"; do
  case "$arg" in
    --print) print=1 ;;
    *) printf 'setup-k8s: unknown argument %q (want --print or nothing)\n' "$arg" >&2; exit 2 ;;
  esac
done

# The versions are the ones the nested modules pin: one source of truth.
modversion() { awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$1"; }
ETCD_VERSION="$(modversion tools/k8srig/etcd/go.mod go.etcd.io/etcd/server/v3)"
KUBE_VERSION="$(modversion tools/k8srig/apiserver/go.mod k8s.io/kubernetes)"
[ -n "$ETCD_VERSION" ] || { log "no go.etcd.io/etcd/server/v3 version in tools/k8srig/etcd/go.mod"; exit 1; }
[ -n "$KUBE_VERSION" ] || { log "no k8s.io/kubernetes version in tools/k8srig/apiserver/go.mod"; exit 1; }

CACHE="${INFERLB_K8S_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/inferlb/k8s}"
etcd_bin="$CACHE/etcd-$ETCD_VERSION/etcd"
apiserver_bin="$CACHE/kube-apiserver-$KUBE_VERSION/kube-apiserver"

if [ "$print" = 1 ]; then
  printf '%s\n%s\n' "$etcd_bin" "$apiserver_bin"
  exit 0
fi

command -v go >/dev/null || { log "go is not installed"; exit 1; }

# build DIR OUT: go build in the nested module into a temporary name, then
# rename, so an interrupted build never leaves a half-written binary that a
# later run would take as cached.
build() {
  local dir="$1" out="$2" ldflags="${3:-}" start
  if [ -x "$out" ]; then return 0; fi
  mkdir -p "$(dirname "$out")"
  log "building $out from $dir (minutes from an empty cache)"
  start=$(date +%s)
  (cd "$dir" && nice -n 10 go build -trimpath -ldflags "$ldflags" -o "$out.tmp.$$" .) || { rm -f "$out.tmp.$$"; log "building $dir failed"; exit 1; }
  mv -f "$out.tmp.$$" "$out"
  log "built $out in $(( $(date +%s) - start ))s"
}

build tools/k8srig/etcd "$etcd_bin"
# Outside Kubernetes' own build the version is not stamped: stamp it, so
# the server's /version says what it is.
kube_minor="${KUBE_VERSION#v1.}"; kube_minor="${kube_minor%%.*}"
build tools/k8srig/apiserver "$apiserver_bin" \
  "-X k8s.io/component-base/version.gitVersion=$KUBE_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$kube_minor"

log "ready: etcd $ETCD_VERSION, kube-apiserver $KUBE_VERSION in $CACHE"
