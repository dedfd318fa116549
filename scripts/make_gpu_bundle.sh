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
#   prebuilt/           when setup.sh has built a CUDA wheel for compute capability $EDGESPEC_CUDA_ARCH (default 90,
#                       the H100/H200) and it fits: its llama_cpp package (llama_cpp.tar.gz, each library once), its CUDA_ARCH, the CPU flags it needs (CPU_FLAGS) and
#                       its CMAKE_ARGS; gpu_check.sh installs it instead of building when the GPU and CPU match.
#                       Built here, on any machine with nvcc (no GPU needed):
#                         EDGESPEC_CUDA_ARCH=90 PYTHON=python3.12 EDGESPEC_VENV=/tmp/cuda-venv scripts/setup.sh
#                       (PYTHON: the GPU machine's Python; the wheel's libraries do not depend on it, its tag does).
#   MANIFEST            what is where, with sizes.
#
# The sdist comes from /work/ref/llama_cpp_python-<version> when it is there, else from
# ~/.cache/edgespec/llamacpp/sdist (downloaded once with `pip download --no-binary :all:`, as edgespec/bench/llamacpp.py
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

find_sdist() {  # the sdist's root, downloaded and unpacked once (bench/llamacpp_compare.py's cache, shared with it)
  PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" "$PY" -c 'import sys; from pathlib import Path
from edgespec.bench.llamacpp import fetch_sources
print(fetch_sources(Path(sys.argv[1]), sys.argv[2]).parent.parent)' "$CACHE/llamacpp" "$VERSION" | tail -n 1
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

# a prebuilt CUDA wheel from setup.sh's cache (EDGESPEC_CUDA_ARCH builds), newest first, when it fits
ARCH="${EDGESPEC_CUDA_ARCH:-90}"
PREBUILT=""
for d in $(ls -dt "$CACHE"/wheels/llama-cpp-python-"$VERSION"-* 2>/dev/null); do
  [ -f "$d/CMAKE_ARGS" ] && grep -q -- "-DCMAKE_CUDA_ARCHITECTURES=${ARCH}-real" "$d/CMAKE_ARGS" || continue
  PREBUILT="$(ls "$d"/llama_cpp_python-*.whl 2>/dev/null | head -1)"
  [ -n "$PREBUILT" ] && break
done
if [ -n "$PREBUILT" ]; then
  # the wheel repeats each library under every one of its names (145 MiB for sm_90); the package is repacked with
  # each library once and its other names as symbolic links (about 23 MiB as .tar.gz)
  REPACK="$BUNDLE.tmp/repack"
  mkdir -p "$REPACK"
  "$PY" - "$PREBUILT" "$REPACK" <<'PYEOF'
import hashlib, os, sys, zipfile
z, out, seen = zipfile.ZipFile(sys.argv[1]), sys.argv[2], {}
for i in z.infolist():
    if not i.filename.startswith("llama_cpp/") or i.is_dir():
        continue
    data, path = z.read(i), os.path.join(out, i.filename)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    h = hashlib.sha256(data).hexdigest()
    if h in seen and os.path.dirname(seen[h]) == os.path.dirname(path) and len(data) > 4096:
        os.symlink(os.path.basename(seen[h]), path)
    else:
        seen[h] = path
        with open(path, "wb") as f:
            f.write(data)
        os.chmod(path, 0o755 if ".so" in path else 0o644)
PYEOF
  mkdir -p "$BUNDLE.tmp/prebuilt"
  tar czf "$BUNDLE.tmp/prebuilt/llama_cpp.tar.gz" -C "$REPACK" llama_cpp
  rm -rf "$REPACK"
  have_kib="$(du -sk "$BUNDLE.tmp" | cut -f1)"
  if [ "$have_kib" -le $((LIMIT_MIB * 1024)) ]; then
    cp "$(dirname "$PREBUILT")/CMAKE_ARGS" "$BUNDLE.tmp/prebuilt/"
    echo "$ARCH" > "$BUNDLE.tmp/prebuilt/CUDA_ARCH"
    # the /proc/cpuinfo flags its CPU code was built for (GGML_<FLAG>=ON)
    tr ' ' '\n' < "$BUNDLE.tmp/prebuilt/CMAKE_ARGS" | sed -n 's/^-DGGML_\(AVX\|AVX2\|FMA\|F16C\|BMI2\|AVX512\)=ON$/\1/p' \
      | tr 'A-Z' 'a-z' | sed 's/^avx512$/avx512f/' | tr '\n' ' ' > "$BUNDLE.tmp/prebuilt/CPU_FLAGS"
    log "prebuilt CUDA build for sm_$ARCH from $(basename "$PREBUILT"): $(du -k "$BUNDLE.tmp/prebuilt/llama_cpp.tar.gz" | cut -f1) KiB"
  else
    rm -rf "$BUNDLE.tmp/prebuilt"
    log "prebuilt CUDA build from $(basename "$PREBUILT") does not fit $LIMIT_MIB MiB with the sources: left out"
  fi
else
  log "no prebuilt CUDA wheel for sm_$ARCH in $CACHE/wheels (EDGESPEC_CUDA_ARCH=$ARCH scripts/setup.sh makes one): gpu_check.sh will build"
fi

{
  echo "llama-cpp-python $VERSION, trimmed from $SRC on $(date -u +%Y-%m-%dT%H:%MZ)"
  (cd "$BUNDLE.tmp" && du -sh ./* llama-cpp-python/vendor/llama.cpp/* llama-cpp-python/vendor/llama.cpp/ggml/src/ggml-* 2>/dev/null)
  ls "$BUNDLE.tmp/wheels"
  ls -l "$BUNDLE.tmp/prebuilt" 2>/dev/null
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
