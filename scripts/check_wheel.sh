#!/usr/bin/env bash
# Build edgespec's wheel from this checkout, install it (not editable) into a fresh virtual environment with the
# llama-cpp-python wheel setup.sh built, and check what a user of `pip install edgespec` gets: the command, the
# package data (model manifests, bench suites), `info` on a tiny model and one short generation from it.
#
#   bash scripts/check_wheel.sh          # after scripts/setup.sh
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${PYTHON:-python3}"
CACHE="${EDGESPEC_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/edgespec}"
WORK="$(mktemp -d "${TMPDIR:-/tmp}/edgespec-wheel.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT
log() { printf '[check_wheel] %s\n' "$*" >&2; }

LLAMA_WHEEL="$(ls -t "$CACHE"/wheels/llama-cpp-python-*/llama_cpp_python-*.whl 2>/dev/null | head -1 || true)"
[ -n "$LLAMA_WHEEL" ] || { log "no llama-cpp-python wheel in $CACHE/wheels: run scripts/setup.sh first"; exit 1; }

log "building the edgespec wheel"
"$ROOT/.venv/bin/python" -m pip wheel -q --no-deps --no-build-isolation -w "$WORK/dist" "$ROOT" >&2 \
  || "$ROOT/.venv/bin/python" -m pip wheel -q --no-deps -w "$WORK/dist" "$ROOT" >&2
WHEEL="$(ls "$WORK"/dist/edgespec-*.whl)"
log "installing $(basename "$WHEEL") into a fresh venv"
"$PY" -m venv "$WORK/venv"
V="$WORK/venv/bin"
"$V/python" -m pip install -q --upgrade pip >&2 || true
"$V/python" -m pip install -q --no-deps "$LLAMA_WHEEL" >&2
"$V/python" -m pip install -q "$WHEEL" >&2

cd "$WORK"  # away from the checkout: the installed package must stand on its own
"$V/edgespec" --version
"$V/edgespec" bench --help >/dev/null
"$V/python" - <<'PY'
import edgespec.bench as b, edgespec.models as m
assert m.load_manifests(), "no model manifests in the wheel"
assert len(b.load_suites()) >= 5, "no bench suites in the wheel"
from edgespec.server import page
assert {"index.html", "app.js", "app.css", "vendor/purify.min.js", "vendor/marked.umd.js"} <= set(page.files()), "the chat page's files are not in the wheel"
PY
# a tiny model to run it on, written by the tests' fixture (numpy and gguf only: edgespec still comes from the wheel)
PYTHONPATH="$ROOT/tests" "$V/python" -c 'from support.tiny import write_tiny_set; write_tiny_set("tiny")'
"$V/edgespec" info tiny/tiny-target.gguf >/dev/null
"$V/python" -c 'from edgespec.llama import rpc; assert rpc.available(), "the llama-cpp-python wheel has no libggml-rpc (GGML_RPC=ON)"'
EDGESPEC_CACHE_DIR="$WORK/cache" "$V/edgespec" generate "abc" --raw --target tiny/tiny-target.gguf --draft ngram \
  --max-tokens 8 --ctx 256 --temperature 0 >/dev/null
log "ok: the wheel installs and runs"
