#!/usr/bin/env bash
# The device check for an offline NVIDIA GPU machine, in one run (issue 14): build, synthetic pair, exactness tests
# with full GPU offload, the verify curve, the speedup prediction. Everything lands in one JSON + a text summary.
#
#   scripts/make_gpu_bundle.sh                        # here, once: build/gpu-bundle (trimmed sources + wheels)
#   device run, carry ["build/gpu-bundle"]:  bash scripts/gpu_check.sh
#   on any machine (no GPU: the CUDA step is skipped, the rest runs on the CPU build in .venv):
#   GPU_CHECK_QUICK=1 bash scripts/gpu_check.sh       # plumbing only: tiny models, a few sizes, one test file
#
# Steps (each one's status, seconds and result go into the JSON; a failed step does not stop the later ones):
#   1 build    with nvcc and a GPU (nvidia-smi -L): the bundle's prebuilt/ wheel when it was made for this GPU's compute
#              capability and this CPU has the flags it needs (no build: seconds); else pip wheel of the carried llama-cpp-python with -DGGML_CUDA=on for
#              the GPU's compute capability only (nvidia-smi --query-gpu=compute_cap), no tests/examples/tools/llava,
#              no NCCL, Ninja, all cores; --no-build-isolation --no-deps (scikit-build-core, cmake and ninja must be
#              there: the machine has no network). cuBLAS is looked up in the CUDA toolkit, then in Python's nvidia
#              wheels (nvidia/cu13). The wheel is kept in $WORK (a warm machine reuses it) and installed with the
#              carried wheels into $WORK/site, which goes first on PYTHONPATH.
#   2 synth    the synthetic Qwen2.5-Coder 1.5B and 0.5B (research/synth_model.py, spec in research/data): random
#              weights written as F16 while the build runs, then quantized to Q4_K_M with the freshly built llama.cpp.
#   3 tests    the tiny-model tests (tests/llama/test_backend.py, tests/runtime/test_speculate.py and test_engine.py by
#              default, not real, not slow) with every model fully offloaded (a pytest plugin forces n_gpu_layers=-1):
#              exactness on the CUDA kernels.
#   4 curve    research/predict_speedup.py measure: the synthetic target's verify curve (1..64 tokens), the synthetic
#              draft's per-token cost and small-batch curve, and both again at context depths 256 and 640
#              (depth_scale), full offload.
#   5 predict  research/predict_speedup.py on that curve (and the flat example), recorded CPU traces of the real pair.
#
# Environment: OUT (results folder; default build/gpu-check-out), GPU_CHECK_WORK (default build/gpu-check),
# GPU_CHECK_BUDGET (seconds for the whole run, default 540), GPU_CHECK_QUICK=1, GPU_CHECK_SIZES (default 1-64 on a
# GPU, 1-9,12,16,17 without), GPU_CHECK_TESTS (test files), GPU_CHECK_PYTEST (extra pytest args), PYTHON.
set -uo pipefail

T0=$(date +%s)
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUTDIR="${OUT:-$ROOT/build/gpu-check-out}"
WORK="${GPU_CHECK_WORK:-$ROOT/build/gpu-check}"
BUNDLE="${GPU_CHECK_BUNDLE:-$ROOT/build/gpu-bundle}"
BUDGET="${GPU_CHECK_BUDGET:-540}"
QUICK="${GPU_CHECK_QUICK:-0}"
mkdir -p "$OUTDIR" "$WORK" "$WORK/steps"
rm -f "$WORK"/steps/*.json
LOG="$OUTDIR/gpu_check.log"
: > "$LOG"
NPROC="$(nproc 2>/dev/null || echo 4)"

if [ -n "${PYTHON:-}" ]; then PY="$PYTHON"
elif [ -x "$ROOT/.venv/bin/python" ]; then PY="$ROOT/.venv/bin/python"
else PY="$(command -v python3)"; fi

log() { printf '[gpu_check %4ss] %s\n' "$(( $(date +%s) - T0 ))" "$*" | tee -a "$LOG" >&2; }
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
# step NAME STATUS SECONDS [JSON-FILE-WITH-RESULT] [NOTE]
step() {
  "$PY" - "$WORK/steps/$1.json" "$1" "$2" "$3" "${4:-}" "${5:-}" <<'EOF'
import json, os, sys
path, name, status, secs, res, note = sys.argv[1:7]
out = {"step": name, "status": status, "seconds": int(secs)}
if note:
    out["note"] = note
if res and os.path.exists(res):
    try:
        out["result"] = json.load(open(res))
    except ValueError:
        out["result"] = open(res).read()[-4000:]
json.dump(out, open(path, "w"), indent=1)
EOF
}

# ------------------------------------------------------------------------------------------- 0. the machine
HAVE_GPU=0
if command -v nvcc >/dev/null 2>&1 && command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  HAVE_GPU=1
fi
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "cpu: $(grep -m1 'model name' /proc/cpuinfo 2>/dev/null | cut -d: -f2 | sed 's/^ //'), $NPROC cores"
  echo "python: $PY ($("$PY" -c 'import sys; print(sys.version.split()[0])'))"
  echo "cmake: $(cmake --version 2>/dev/null | head -1)"
  echo "ninja: $(ninja --version 2>/dev/null || echo none)"
  echo "nvcc: $(nvcc --version 2>/dev/null | tail -1 || echo none)"
  if [ "$HAVE_GPU" = 1 ]; then
    echo "gpu: $(nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader | head -1)"
  else
    echo "gpu: none ($(command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>&1 | head -1 || echo 'no nvidia-smi'))"
  fi
  echo "quick: $QUICK; budget: ${BUDGET}s"
} > "$WORK/machine.txt" 2>&1
cat "$WORK/machine.txt" | tee -a "$LOG" >&2

# ------------------------------------------------------------------------------------------- 2a. F16 in the background
SPEC="$ROOT/research/data/qwen2.5-coder-pair.spec.json.xz"
MODELS="$WORK/models"
mkdir -p "$MODELS"
F16_PIDS=()
GGUF_PY="$BUNDLE/llama-cpp-python/vendor/llama.cpp/gguf-py"
if ! "$PY" -c "import gguf" >/dev/null 2>&1 && [ -d "$GGUF_PY" ]; then
  export GGUF_PY
  export PYTHONPATH="$GGUF_PY${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$ROOT:$ROOT/tests${PYTHONPATH:+:$PYTHONPATH}"  # edgespec from here; tests/support/tiny.py for QUICK
export PYTHONUNBUFFERED=1
S2=$(date +%s)
if [ "$QUICK" = 1 ]; then
  # tiny stand-ins: a spec read from tests/support/tiny.py's models, so the same spec -> F16 -> quantize path runs
  SPEC="$WORK/tiny.spec.json.xz"
  "$PY" - "$WORK/tiny" >>"$LOG" 2>&1 <<'EOF'
import sys
from support.tiny import write_tiny_model
write_tiny_model(sys.argv[1] + "-target.gguf", seed=1, d_model=256, n_layers=2, d_ff=512, extra_tokens=200)
write_tiny_model(sys.argv[1] + "-draft.gguf", seed=2, d_model=256, n_layers=1, d_ff=512, extra_tokens=200)
EOF
  "$PY" research/synth_model.py spec "$WORK/tiny-target.gguf" "$WORK/tiny-draft.gguf" --out "$SPEC" >>"$LOG" 2>&1
fi
for role in target draft; do
  if [ ! -s "$MODELS/$role.gguf" ] || [ "$QUICK" = 1 ]; then
    rm -f "$MODELS/$role.gguf"
    nice -n 5 "$PY" research/synth_model.py make --spec "$SPEC" --model "$role" --ftype F16 --out "$MODELS/$role-f16.gguf" \
      >>"$WORK/synth-$role.log" 2>&1 &
    F16_PIDS+=($!)
  fi
done

# ------------------------------------------------------------------------------------------- 1. build
S1=$(date +%s)
SITE="$WORK/site"
CUDA_NOTE=""
if [ "$HAVE_GPU" = 1 ]; then
  CC="$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d ' .')"
  ARGS="-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES=${CC}-real -DGGML_CUDA_NCCL=OFF -DLLAVA_BUILD=OFF"
  ARGS+=" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
  ARGS+=" -DLLAMA_OPENSSL=OFF $(. scripts/cmake_args.sh; echo "$(cpu_cmake_args) $(rpc_cmake_args)")"  # as setup.sh sets them
  # cuBLAS: in the toolkit, or in Python's nvidia wheels (the toolkit of a pip-built image may lack it)
  NVCC_DIR="$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")"
  CUBLAS="$(ls "$NVCC_DIR"/lib64/libcublas.so* "$NVCC_DIR"/targets/*/lib/libcublas.so* /usr/local/cuda/lib64/libcublas.so* 2>/dev/null | head -1)"
  if [ -z "$CUBLAS" ]; then
    for sp in $("$PY" -c 'import site, sys; print(" ".join(site.getsitepackages() + sys.path))' 2>/dev/null) $(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null); do
      [ -d "$sp/nvidia" ] || continue
      CUBLAS="$(find "$sp/nvidia" -name 'libcublas.so*' 2>/dev/null | head -1)"
      [ -n "$CUBLAS" ] && break
    done
    if [ -n "$CUBLAS" ]; then
      LIBDIR="$(dirname "$CUBLAS")"; INCDIR="$(dirname "$LIBDIR")/include"
      SHIM="$WORK/cublas"; mkdir -p "$SHIM"
      ln -sf "$(ls "$LIBDIR"/libcublas.so* | head -1)" "$SHIM/libcublas.so"
      ln -sf "$(ls "$LIBDIR"/libcublasLt.so* | head -1)" "$SHIM/libcublasLt.so"
      ARGS+=" -DCUDA_cublas_LIBRARY=$SHIM/libcublas.so -DCUDA_cublasLt_LIBRARY=$SHIM/libcublasLt.so"
      ARGS+=" -DCMAKE_CUDA_FLAGS=-I$INCDIR -DCMAKE_CXX_FLAGS=-I$INCDIR"
      export LD_LIBRARY_PATH="$LIBDIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      CUDA_NOTE="cuBLAS from $LIBDIR"
    fi
  fi
  # the driver library (CUDA::cuda_driver, for CUDA VMM): the toolkit's stub, else the driver's own; else no VMM
  if ! ls "$NVCC_DIR"/lib64/stubs/libcuda.so "$NVCC_DIR"/targets/*/lib/stubs/libcuda.so >/dev/null 2>&1; then
    LIBCUDA="$(ls /usr/local/nvidia/lib64/libcuda.so* /usr/lib/x86_64-linux-gnu/libcuda.so* /usr/lib64/libcuda.so* 2>/dev/null | head -1)"
    [ -z "$LIBCUDA" ] && LIBCUDA="$(ldconfig -p 2>/dev/null | awk '/libcuda\.so/ {print $NF; exit}')"
    if [ -n "$LIBCUDA" ]; then
      ARGS+=" -DCUDA_cuda_driver_LIBRARY=$LIBCUDA"
    else
      ARGS+=" -DGGML_CUDA_NO_VMM=ON"; CUDA_NOTE+="${CUDA_NOTE:+; }no libcuda to link: GGML_CUDA_NO_VMM"
    fi
  fi
  for d in "$NVCC_DIR/lib64" /usr/local/nvidia/lib64; do
    [ -d "$d" ] && export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
  KEY="$(printf '%s|%s' "$ARGS" "$("$PY" -c 'import sys; print(sys.version_info[:2])')" | sha256sum | cut -c1-12)"
  WHEELDIR="$WORK/wheel-$KEY"
  # a wheel built ahead (make_gpu_bundle.sh's prebuilt/) for this GPU's compute capability and CPU flags this CPU has
  PRE="$BUNDLE/prebuilt"
  PRE_OK=0
  if [ -f "$PRE/CUDA_ARCH" ] && [ -f "$PRE/llama_cpp.tar.gz" ]; then
    if [ "$(cat "$PRE/CUDA_ARCH")" = "$CC" ]; then
      PRE_OK=1
      CPUFLAGS=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
      for f in $(cat "$PRE/CPU_FLAGS" 2>/dev/null); do
        case "$CPUFLAGS" in *" $f "*) ;; *) PRE_OK=0; log "build: prebuilt wheel needs CPU flag $f, which this CPU lacks";; esac
      done
    else
      log "build: prebuilt wheel is for sm_$(cat "$PRE/CUDA_ARCH"), this GPU is sm_$CC"
    fi
  fi
  if [ "$PRE_OK" = 1 ]; then
    log "build: using the prebuilt build ($(cat "$PRE/CMAKE_ARGS"))"
    ARGS="$(cat "$PRE/CMAKE_ARGS")"
    STATUS=prebuilt
  elif ls "$WHEELDIR"/llama_cpp_python-*.whl >/dev/null 2>&1; then
    log "build: reusing $WHEELDIR"
    STATUS=cached
  elif [ ! -f "$BUNDLE/llama-cpp-python/pyproject.toml" ]; then
    log "build: no sources at $BUNDLE (run scripts/make_gpu_bundle.sh and carry build/gpu-bundle)"
    STATUS=failed
  else
    log "build: CMAKE_ARGS=$ARGS ${CUDA_NOTE:+($CUDA_NOTE)}"
    command -v ninja >/dev/null 2>&1 && export CMAKE_GENERATOR=Ninja
    rm -rf "$WHEELDIR.tmp"; mkdir -p "$WHEELDIR.tmp"
    if CMAKE_ARGS="$ARGS" CMAKE_BUILD_PARALLEL_LEVEL="$NPROC" timeout $(( $(left) - 150 )) \
        "$PY" -m pip wheel --no-build-isolation --no-deps --no-index --no-cache-dir \
        --config-settings=build-dir="$WORK/cmake-build" -w "$WHEELDIR.tmp" "$BUNDLE/llama-cpp-python" > "$WORK/build.log" 2>&1; then
      rm -rf "$WHEELDIR"; mv "$WHEELDIR.tmp" "$WHEELDIR"; STATUS=ok
    else
      STATUS=failed
    fi
    tail -40 "$WORK/build.log" >> "$LOG"
  fi
  if [ "$STATUS" = prebuilt ]; then
    rm -rf "$SITE"; mkdir -p "$SITE"
    tar xzf "$PRE/llama_cpp.tar.gz" -C "$SITE" >>"$LOG" 2>&1 || STATUS=failed
    for w in "$BUNDLE"/wheels/*.whl; do [ -f "$w" ] && "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$w" >>"$LOG" 2>&1; done
    export PYTHONPATH="$SITE:$PYTHONPATH"
  elif [ "$STATUS" != failed ]; then
    rm -rf "$SITE"
    if ! "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$WHEELDIR"/llama_cpp_python-*.whl $(ls "$BUNDLE"/wheels/*.whl 2>/dev/null) >>"$LOG" 2>&1; then
      # a wheel tagged for another Python: unpacked (its libraries and ctypes bindings do not depend on the version)
      "$PY" -m zipfile -e "$(ls "$WHEELDIR"/llama_cpp_python-*.whl | head -1)" "$SITE" >>"$LOG" 2>&1 || STATUS=failed
      for w in "$BUNDLE"/wheels/*.whl; do [ -f "$w" ] && "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$SITE" "$w" >>"$LOG" 2>&1; done
    fi
    export PYTHONPATH="$SITE:$PYTHONPATH"
  fi
  echo "{\"cmake_args\": \"$ARGS\", \"compute_cap\": \"$CC\", \"note\": \"$CUDA_NOTE\"}" > "$WORK/build.json"
  step build "$STATUS" $(( $(date +%s) - S1 )) "$WORK/build.json"
else
  # no GPU: the llama.cpp build this Python already has; the carried wheels only where a package is missing
  for w in "$BUNDLE"/wheels/*.whl; do
    [ -f "$w" ] || continue
    mod="$(basename "$w" | cut -d- -f1)"
    "$PY" -c "import $mod" >/dev/null 2>&1 || "$PY" -m pip install -q --no-index --no-deps --target "$SITE" "$w" >>"$LOG" 2>&1
  done
  [ -d "$SITE" ] && export PYTHONPATH="$PYTHONPATH:$SITE"
  step build skipped $(( $(date +%s) - S1 )) "" "no GPU (nvcc: $(command -v nvcc || echo none); nvidia-smi -L failed or missing): using $PY's llama_cpp"
fi
GPU_INFO="$("$PY" -c 'import llama_cpp as C; print(C.__file__, "gpu_offload:", bool(C.llama_supports_gpu_offload()))' 2>&1 | tail -1)"
log "llama_cpp: $GPU_INFO"

# ------------------------------------------------------------------------------------------- 2b. quantize
STATUS=ok
for pid in "${F16_PIDS[@]}"; do wait "$pid" || STATUS=failed; done
for role in target draft; do
  if [ -s "$MODELS/$role-f16.gguf" ]; then
    if timeout $(( $(left) > 60 ? $(left) - 30 : 30 )) "$PY" research/synth_model.py quantize "$MODELS/$role-f16.gguf" "$MODELS/$role.gguf" \
        --spec "$SPEC" --model "$role" --json "$WORK/synth-$role.json" >>"$WORK/synth-$role.log" 2>&1; then
      rm -f "$MODELS/$role-f16.gguf"
    else
      STATUS=failed
    fi
  fi
  [ -s "$MODELS/$role.gguf" ] || STATUS=failed
  cat "$WORK/synth-$role.log" >> "$LOG" 2>/dev/null
done
"$PY" -c "import json,sys; print(json.dumps({r: json.load(open(f'$WORK/synth-{r}.json')) for r in ('target','draft') if __import__('os').path.exists(f'$WORK/synth-{r}.json')}))" > "$WORK/synth.json" 2>/dev/null
step synth "$STATUS" $(( $(date +%s) - S2 )) "$WORK/synth.json"

# ------------------------------------------------------------------------------------------- 3. tests, full offload
S3=$(date +%s)
mkdir -p "$WORK/plugin"
cat > "$WORK/plugin/gpu_offload_plugin.py" <<'EOF'
"""pytest plugin (scripts/gpu_check.sh): every edgespec Model loads with all layers on the GPU."""
import dataclasses

import edgespec.llama.backend as B

_init = B.Model.__init__


def _offloaded(self, spec, *args, **kwargs):
    if spec.n_gpu_layers == 0:
        spec = dataclasses.replace(spec, n_gpu_layers=-1)
    _init(self, spec, *args, **kwargs)


B.Model.__init__ = _offloaded


def pytest_configure(config):
    import sys

    import llama_cpp as C

    print(f"gpu_check: n_gpu_layers forced to -1; llama_cpp from {C.__file__}; "
          f"llama_supports_gpu_offload = {bool(C.llama_supports_gpu_offload())}", file=sys.stderr, flush=True)
EOF
if [ "$QUICK" = 1 ]; then
  TESTS="${GPU_CHECK_TESTS:-tests/llama/test_backend.py}"
else
  TESTS="${GPU_CHECK_TESTS:-tests/llama/test_backend.py tests/runtime/test_speculate.py tests/runtime/test_engine.py}"
fi
EXIST=""
for t in $TESTS; do [ -e "$t" ] && EXIST+=" $t"; done
TLIMIT=$(( $(left) - 120 )); [ "$TLIMIT" -gt 240 ] && TLIMIT=240; [ "$TLIMIT" -lt 30 ] && TLIMIT=30
PYTHONPATH="$WORK/plugin:$PYTHONPATH" timeout "$TLIMIT" "$PY" -m pytest -q -p gpu_offload_plugin -m "not real and not slow" \
  -o addopts="" --junitxml="$WORK/tests.xml" $EXIST ${GPU_CHECK_PYTEST:-} > "$WORK/tests.log" 2>&1
RC=$?
tail -25 "$WORK/tests.log" >> "$LOG"
"$PY" - "$WORK/tests.xml" "$WORK/tests.log" "$RC" > "$WORK/tests.json" <<'EOF'
import json, sys, re
import xml.etree.ElementTree as ET
xml, logf, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
out = {"rc": rc, "files": None}
try:
    root = ET.parse(xml).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    out.update({k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")})
    out["failed"] = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
                     if c.find("failure") is not None or c.find("error") is not None][:40]
except Exception as e:  # no XML: timed out or crashed
    out["error"] = f"no junit xml ({e})"
log = open(logf, errors="replace").read()
out["header"] = [l for l in log.splitlines() if l.startswith("gpu_check:")][:1]
out["last_line"] = log.strip().splitlines()[-1] if log.strip() else ""
print(json.dumps(out))
EOF
case $RC in 0) STATUS=ok;; 124) STATUS=timeout;; *) STATUS=failed;; esac
step tests "$STATUS" $(( $(date +%s) - S3 )) "$WORK/tests.json" "pytest -m 'not real and not slow'$EXIST (n_gpu_layers=-1)"

# ------------------------------------------------------------------------------------------- 4. curve
S4=$(date +%s)
if [ "$HAVE_GPU" = 1 ]; then SIZES="${GPU_CHECK_SIZES:-1-64}"; NGL=-1; else SIZES="${GPU_CHECK_SIZES:-1-9,12,16,17}"; NGL=0; fi
[ "$QUICK" = 1 ] && SIZES="${GPU_CHECK_SIZES:-1-4,8}"
DEPTHS="${GPU_CHECK_DEPTHS:-256,640}"  # the curve again after that many cached tokens: how costs grow with the context
[ "$QUICK" = 1 ] && DEPTHS="${GPU_CHECK_DEPTHS:-64}"
CURVE="$OUTDIR/curve.json"
if [ -s "$MODELS/target.gguf" ] && [ -s "$MODELS/draft.gguf" ] && [ "$(left)" -gt 20 ]; then
  timeout $(( $(left) - 15 )) "$PY" research/predict_speedup.py measure "$MODELS/target.gguf" "$MODELS/draft.gguf" \
    --n-gpu-layers "$NGL" --sizes "$SIZES" --rounds 3 --depths "$DEPTHS" --out "$CURVE" >>"$LOG" 2>&1 && STATUS=ok || STATUS=failed
else
  STATUS=skipped
fi
step curve "$STATUS" $(( $(date +%s) - S4 )) "$CURVE" "sizes $SIZES, depths 16,$DEPTHS, n_gpu_layers $NGL"

# ------------------------------------------------------------------------------------------- 5. predict
S5=$(date +%s)
PRED_ARGS=(--curve "$ROOT/research/data/curve_gpu_flat.json")
[ -s "$CURVE" ] && PRED_ARGS=(--curve "$CURVE" "${PRED_ARGS[@]}")
[ "$QUICK" = 1 ] && PRED_ARGS+=(--suite code-completion)
if "$PY" research/predict_speedup.py "${PRED_ARGS[@]}" --json "$WORK/predict.json" > "$WORK/predict.txt" 2>>"$LOG"; then
  STATUS=ok
else
  STATUS=failed
fi
cat "$WORK/predict.txt" >> "$LOG"
step predict "$STATUS" $(( $(date +%s) - S5 )) "$WORK/predict.json"

# ------------------------------------------------------------------------------------------- summary
"$PY" - "$WORK" "$OUTDIR" "$(( $(date +%s) - T0 ))" "$BUDGET" <<'EOF'
import json, os, sys
work, outdir, total, budget = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
steps = {}
for name in ("build", "synth", "tests", "curve", "predict"):
    p = os.path.join(work, "steps", name + ".json")
    steps[name] = json.load(open(p)) if os.path.exists(p) else {"step": name, "status": "not run"}
machine = open(os.path.join(work, "machine.txt")).read().splitlines()
res = {"machine": machine, "seconds": total, "budget": budget, "steps": steps}
json.dump(res, open(os.path.join(outdir, "gpu_check.json"), "w"), indent=1)
lines = [f"gpu_check: {total} s (budget {budget} s)"] + ["  " + m for m in machine] + [""]
for name, s in steps.items():
    lines.append(f"{name:8} {s['status']:8} {s.get('seconds', 0):>4} s  {s.get('note', '')}")
t = steps["tests"].get("result") or {}
if isinstance(t, dict) and "tests" in t:
    lines.append(f"tests: {t['tests']} run, {t['failures']} failed, {t['errors']} errors, {t['skipped']} skipped; {t.get('last_line', '')}")
    lines += [f"  FAILED {f}" for f in t.get("failed", [])]
c = steps["curve"].get("result")
if isinstance(c, dict) and "verify" in c:
    v = {int(n): s for n, s in c["verify"].items()}
    one = v[min(v)]
    lines.append("verify curve: 1 token %.2f ms; x one token: %s" % (1000 * one, " ".join(f"{n}:{v[n] / one:.2f}" for n in sorted(v) if n in (2, 4, 8, 16, 32, 64))))
    if c.get("draft"):
        lines.append(f"draft: {1000 * c['draft']:.2f} ms/token = {c['draft'] / one:.2f} x one target token")
p = steps["predict"].get("result")
if isinstance(p, list):
    for r in p:
        o = r["overall"]
        lines.append(f"predicted ({r['curve']['name']}): model {o['model']['speedup']:.2f}, ngram {o['ngram']['speedup']:.2f}, "
                     f"model+ngram {o['model+ngram']['speedup']:.2f}; oracle {o['oracle']['model+ngram']:.2f}"
                     + ("" if r["draft_model_pays"] else " (draft model gated off)"))
open(os.path.join(outdir, "gpu_check.txt"), "w").write("\n".join(lines) + "\n")
print("\n".join(lines))
EOF
[ -f "$WORK/predict.txt" ] && cp "$WORK/predict.txt" "$OUTDIR/predict.txt"
log "done: $OUTDIR/gpu_check.json, $OUTDIR/gpu_check.txt"
