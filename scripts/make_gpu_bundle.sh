#!/usr/bin/env bash
# Make build/gpu-bundle/: what scripts/gpu_check.sh needs on an offline GPU machine, small enough to travel with the
# working tree to a machine without network (about 30 MiB; copy it along with the repository).
#
#   scripts/make_gpu_bundle.sh              # -> build/gpu-bundle (about 30 MiB), prints its size
#   BUNDLE=/tmp/b scripts/make_gpu_bundle.sh
#
# Contents:
#   llama-cpp-python/   the llama-cpp-python 0.3.36 sdist, trimmed to what a CUDA wheel build needs: the Python
#                       package, its CMakeLists/pyproject, and vendor/llama.cpp without models/, docs/, tools/,
#                       examples/, tests/, benches/, media/, the web UI, and every ggml backend but CPU and CUDA.
#                       gguf-py stays (the synthetic models are written with it).
#   wheels/             pure-Python wheels edgespec imports that the GPU machine's image lacks (platformdirs,
#                       prompt_toolkit + wcwidth, diskcache for llama_cpp), the versions of this .venv.
#   MANIFEST            what is where, with sizes.
#
# The sdist comes from /work/ref/llama_cpp_python-<version> when it is there, else from
# ~/.cache/edgespec/llamacpp/sdist (downloaded once with `pip download --no-binary :all:`, as llamacpp_compare.py
# does). The sources themselves are never committed: build/ is ignored.
set -euo pipefail

VERSION="${EDGESPEC_LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUNDLE="${BUNDLE:-$ROOT/build/gpu-bundle}"
PY="${PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || PY=python3
CACHE="${EDGESPEC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/edgespec}"
LIMIT_MIB="${BUNDLE_LIMIT_MIB:-48}"

log() { printf '[bundle] %s\n' "$*" >&2; }

find_sdist() {  # the sdist's root, downloaded and unpacked once (llamacpp_compare.py's cache, shared with it)
  "$PY" -c 'import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1])
from llamacpp_compare import fetch_sources
print(fetch_sources(Path(sys.argv[2]), sys.argv[3]).parent.parent)' "$ROOT/scripts" "$CACHE/llamacpp" "$VERSION" | tail -n 1
}

SRC="$(find_sdist)"
log "sources: $SRC"
rm -rf "$BUNDLE.tmp"
mkdir -p "$BUNDLE.tmp/llama-cpp-python"
DST="$BUNDLE.tmp/llama-cpp-python"

# the Python package and the top-level build files
cp "$SRC"/{pyproject.toml,CMakeLists.txt,README.md,LICENSE.md} "$DST/"
cp -r "$SRC/llama_cpp" "$DST/"
rm -rf "$DST/llama_cpp/lib" "$DST/llama_cpp/server"
find "$DST" -name __pycache__ -prune -exec rm -rf {} +

# vendor/llama.cpp: the library (src, include, common, ggml CPU + CUDA), its cmake files and vendored headers
V="$SRC/vendor/llama.cpp"
VD="$DST/vendor/llama.cpp"
mkdir -p "$VD"
cp "$V"/{CMakeLists.txt,LICENSE} "$VD/"
cp -r "$V"/{cmake,include,src,common,vendor,licenses,gguf-py} "$VD/"
# (vendor/ stays whole: its CMakeLists adds every folder in it)
mkdir -p "$VD/ggml/src"
cp "$V/ggml/CMakeLists.txt" "$VD/ggml/"
cp -r "$V/ggml"/{cmake,include} "$VD/ggml/"
find "$V/ggml/src" -maxdepth 1 -type f -exec cp {} "$VD/ggml/src/" \;
cp -r "$V/ggml/src"/{ggml-cpu,ggml-cuda} "$VD/ggml/src/"
# the gguf-py tests, examples and scripts are not needed to import it
rm -rf "$VD/gguf-py/tests" "$VD/gguf-py/examples" "$VD/gguf-py/gguf/scripts"
find "$VD" -name __pycache__ -prune -exec rm -rf {} +

# wheels the GPU machine's image lacks (pure Python), the versions installed here
mkdir -p "$BUNDLE.tmp/wheels"
WHEELS=(platformdirs prompt_toolkit wcwidth diskcache)
specs=()
for name in "${WHEELS[@]}"; do
  v="$("$PY" -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || true)"
  specs+=("$name${v:+==$v}")
done
if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
      -d "$BUNDLE.tmp/wheels" "${specs[@]}" >&2; then
  log "warning: could not download ${specs[*]} (no network?); gpu_check.sh will do without them"
fi

{
  echo "llama-cpp-python $VERSION, trimmed from $SRC on $(date -u +%Y-%m-%dT%H:%MZ)"
  (cd "$BUNDLE.tmp" && du -sh ./* llama-cpp-python/vendor/llama.cpp/* llama-cpp-python/vendor/llama.cpp/ggml/src/ggml-* 2>/dev/null)
  ls "$BUNDLE.tmp/wheels"
} > "$BUNDLE.tmp/MANIFEST"

rm -rf "$BUNDLE"
mv "$BUNDLE.tmp" "$BUNDLE"
size_kib="$(du -sk "$BUNDLE" | cut -f1)"
log "wrote $BUNDLE: $((size_kib / 1024)) MiB"
if [ "$size_kib" -gt $((LIMIT_MIB * 1024)) ]; then
  log "error: the bundle is larger than $LIMIT_MIB MiB; the working tree that travels is limited to 64 MiB"
  exit 1
fi
echo "$BUNDLE"
