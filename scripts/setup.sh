#!/usr/bin/env bash
# Set up edgespec in a virtual environment with a llama-cpp-python build that fits this machine.
#
#   scripts/setup.sh            # venv at .venv (override with EDGESPEC_VENV)
#
# * Linux x86-64: GGML_NATIVE=OFF and the SIMD flags this CPU really reports (AVX2, AVX512, VNNI...),
#   never AMX (some VMs advertise AMX but fault on `tilezero`, killing decode with SIGILL).
# * NVIDIA (nvcc on PATH and a GPU visible to nvidia-smi): -DGGML_CUDA=on.
# * macOS: Metal (llama.cpp's default there; made explicit with -DGGML_METAL=on on arm64).
# * EDGESPEC_CMAKE_ARGS replaces the detected flags entirely.
#
# pip's wheel cache ignores CMAKE_ARGS, so this script never uses it for llama-cpp-python: the wheel it
# builds is kept in $EDGESPEC_CACHE_DIR/wheels/<key>/ (default ~/.cache/edgespec), where <key> hashes the
# version, the CMake flags, the Python version and the platform. A second run with the same configuration
# reuses that wheel (seconds); a different configuration builds its own.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="${EDGESPEC_LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${EDGESPEC_VENV:-$ROOT/.venv}"
CACHE="${EDGESPEC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/edgespec}"
PY="${PYTHON:-python3}"

log() { printf '[setup] %s\n' "$*" >&2; }

. "$ROOT/scripts/cmake_args.sh"  # cpu_cmake_args, detect_cmake_args

CMAKE_FLAGS="${EDGESPEC_CMAKE_ARGS:-$(detect_cmake_args)}"
PYVER="$("$PY" -c 'import sys,platform; print(f"{sys.version_info[0]}.{sys.version_info[1]}-{platform.machine()}-{sys.platform}")')"
KEY="$(printf '%s|%s|%s' "$LLAMA_CPP_PYTHON_VERSION" "$CMAKE_FLAGS" "$PYVER" | sha256sum | cut -c1-16)"
WHEELDIR="$CACHE/wheels/llama-cpp-python-$LLAMA_CPP_PYTHON_VERSION-$KEY"

log "llama-cpp-python $LLAMA_CPP_PYTHON_VERSION, CMAKE_ARGS: ${CMAKE_FLAGS:-<llama.cpp defaults>}"
if ! ls "$WHEELDIR"/llama_cpp_python-*.whl >/dev/null 2>&1; then
  log "building llama-cpp-python wheel (several minutes, once per configuration) into $WHEELDIR"
  mkdir -p "$WHEELDIR.tmp"
  rm -f "$WHEELDIR.tmp"/*.whl
  CMAKE_ARGS="$CMAKE_FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc 2>/dev/null || sysctl -n hw.ncpu)" \
    "$PY" -m pip wheel --no-deps --no-cache-dir --no-binary llama-cpp-python \
    "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" -w "$WHEELDIR.tmp" >&2
  printf '%s\n' "$CMAKE_FLAGS" > "$WHEELDIR.tmp/CMAKE_ARGS"
  rm -rf "$WHEELDIR"; mv "$WHEELDIR.tmp" "$WHEELDIR"
else
  log "reusing wheel in $WHEELDIR"
fi

# The chat page's browser tests (tests/server/test_page.py) drive Debian's Chromium: installed here where it is missing
# and this script can (root, apt-get); otherwise one line says so, and those tests skip (CI requires them).
if ! command -v chromium >/dev/null 2>&1 || ! command -v chromedriver >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing chromium and chromium-driver (the chat page's browser tests)"
    { DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >&2 \
      || { apt-get update -q >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium chromium-driver >&2; }; } \
      || log "could not install chromium and chromium-driver with apt-get: the browser tests will skip"
  else
    log "no chromium/chromedriver: the browser tests will skip (install them: sudo apt-get install chromium chromium-driver)"
  fi
fi

if [ ! -x "$VENV/bin/python" ]; then
  log "creating virtual environment $VENV"
  "$PY" -m venv "$VENV"
fi
# What this venv was last set up from: the wheel, the checkout and its dependencies. The same again (and both
# packages importable): nothing to install, so `make test` and friends do not reinstall on every run.
STAMP="$VENV/.edgespec-setup"
WANT="$(printf '%s|%s|%s' "$WHEELDIR" "$ROOT" "$(sha256sum "$ROOT/pyproject.toml" | cut -c1-64)")"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] \
   && (cd / && "$VENV/bin/python" -c 'import llama_cpp, edgespec') >/dev/null 2>&1; then
  log "ready (up to date): $VENV/bin/edgespec"
  exit 0
fi
rm -f "$STAMP"
"$VENV/bin/python" -m pip install -q --upgrade pip >&2 || true
# --force-reinstall --no-deps on the wheel: whatever llama-cpp-python was in the venv is replaced by this build.
"$VENV/bin/python" -m pip install -q --no-deps --force-reinstall "$WHEELDIR"/llama_cpp_python-*.whl >&2
"$VENV/bin/python" -m pip install -q -e "$ROOT[test]" >&2
printf '%s' "$WANT" > "$STAMP"
log "ready: $VENV/bin/edgespec"
