#!/usr/bin/env python3
"""Synthetic GGUF models with the real pair's shapes and quantization, random weights: forward-pass costs measured
anywhere, without the real weights (they cannot travel to an offline GPU machine; the spec below is ~1 MB).

    # a spec (hyperparameters, tensor list, weight scales, tokenizer) from real files; the pair's is committed
    .venv/bin/python research/synth_model.py spec TARGET.gguf DRAFT.gguf --out research/data/qwen2.5-coder-pair.spec.json.xz
    # a synthetic model from the spec (F16 in a temp dir, then llama.cpp's quantizer to Q4_K_M; the F16 is deleted)
    .venv/bin/python research/synth_model.py make --model target --out /tmp/synth-1.5b.gguf
    .venv/bin/python research/synth_model.py make --model draft --out /tmp/synth-0.5b.gguf
    # the check: verify curves of a real and a synthetic file on this machine, measured interleaved
    .venv/bin/python research/synth_model.py compare REAL.gguf SYNTH.gguf --sizes 1-9,12,16,17

What the spec holds and how `make` writes and quantizes the weights: edgespec/bench/synth.py's docstring.

The command line of edgespec/bench/synth.py (spec, make, quantize) and edgespec/bench/measure.py (compare). GGUF_PY
names a copy of gguf-py to use when none is installed (llama.cpp's own, in the GPU bundle).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's edgespec
if os.environ.get("GGUF_PY") and os.environ["GGUF_PY"] not in sys.path:
    sys.path.insert(0, os.environ["GGUF_PY"])  # gguf-py: llama.cpp's own copy (the GPU bundle) where none is installed

from edgespec.bench.curves import parse_sizes  # noqa: E402
from edgespec.bench.measure import compare, format_compare  # noqa: E402
from edgespec.bench.synth import SynthError, load_spec, make, quantize, tensor_types, write_spec  # noqa: E402

DEFAULT_SPEC = HERE / "data" / "qwen2.5-coder-pair.spec.json.xz"


# --------------------------------------------------------------------------------------------- CLI
def run(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("spec", help="write a spec from real GGUF files (target first)")
    s.add_argument("target")
    s.add_argument("draft", nargs="?")
    s.add_argument("--out", type=Path, default=DEFAULT_SPEC)
    mk = sub.add_parser("make", help="write a synthetic model from a spec")
    mk.add_argument("--spec", type=Path, default=DEFAULT_SPEC)
    mk.add_argument("--model", default="target", help="which model of the spec (target, draft)")
    mk.add_argument("--out", type=Path, required=True)
    mk.add_argument("--ftype", default="Q4_K_M", help="llama.cpp file type for the quantizer (F16 = none)")
    mk.add_argument("--threads", type=int, default=None)
    mk.add_argument("--seed", type=int, default=0)
    mk.add_argument("--tmpdir", default=None, help="where the F16 intermediate goes (default: next to --out)")
    mk.add_argument("--keep-f16", action="store_true")
    mk.add_argument("--json", type=Path, default=None)
    q = sub.add_parser("quantize", help="quantize an F16 file made by make --ftype F16 (llama.cpp's quantizer)")
    q.add_argument("src", type=Path)
    q.add_argument("dst", type=Path)
    q.add_argument("--ftype", default="Q4_K_M")
    q.add_argument("--threads", type=int, default=None)
    q.add_argument("--spec", type=Path, default=DEFAULT_SPEC, help="for the report: the real file's types")
    q.add_argument("--model", default="target")
    q.add_argument("--json", type=Path, default=None)
    c = sub.add_parser("compare", help="verify curves of GGUF files, interleaved (the first is the reference)")
    c.add_argument("files", nargs="+")
    c.add_argument("--sizes", default="1-9,12,16,17")
    c.add_argument("--rounds", type=int, default=5)
    c.add_argument("--threads", type=int, default=None)
    c.add_argument("--n-gpu-layers", "-ngl", type=int, default=0)
    c.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)

    if a.cmd == "spec":
        models = {"target": a.target}
        if a.draft:
            models["draft"] = a.draft
        spec = write_spec(models, a.out)
        for role, m in spec["models"].items():
            print(f"{role}: {m['source']}, {len(m['tensors'])} tensors, types {m['types']}")
        print(f"wrote {a.out} ({a.out.stat().st_size / 1024:.0f} KiB)")
    elif a.cmd == "make":
        res = make(load_spec(a.spec), a.model, a.out, ftype=a.ftype, threads=a.threads, seed=a.seed, tmpdir=a.tmpdir, keep_f16=a.keep_f16)
        print(f"wrote {res['out']}: {res['bytes'] / 2**20:.0f} MiB (real {res['real_bytes'] / 2**20:.0f} MiB), "
              f"F16 {res['write_seconds']} s + quantize {res['quantize_seconds']} s")
        print(f"  types:      {res['types']}\n  real types: {res['real_types']}")
        if a.json:
            a.json.write_text(json.dumps(res, indent=1) + "\n")
    elif a.cmd == "quantize":
        t0 = time.perf_counter()
        quantize(a.src, a.dst, a.ftype.upper(), a.threads)
        m = load_spec(a.spec)["models"].get(a.model, {}) if a.spec.exists() else {}
        res = {"model": a.model, "out": str(a.dst), "bytes": a.dst.stat().st_size, "real_bytes": m.get("bytes"),
               "quantize_seconds": round(time.perf_counter() - t0, 1), "types": tensor_types(a.dst),
               "real_types": dict(sorted(m.get("types", {}).items()))}
        print(f"wrote {a.dst}: {res['bytes'] / 2**20:.0f} MiB in {res['quantize_seconds']} s; types {res['types']} (real {res['real_types']})")
        if a.json:
            a.json.write_text(json.dumps(res, indent=1) + "\n")
    else:
        res = compare(a.files, parse_sizes(a.sizes), a.rounds, a.threads, a.n_gpu_layers)
        print(format_compare(res))
        if a.json:
            a.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        return run(argv)
    except SynthError as e:
        raise SystemExit(str(e)) from None


if __name__ == "__main__":
    sys.exit(main())
