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

The spec holds, per model, every metadata key of the real file (architecture, layers, heads, KV heads, hidden and
FFN sizes, context length, RoPE base, norm epsilon, chat template, special token ids) except the tokenizer arrays,
which both models share and the spec holds once (151,936 tokens, their types, 151,387 merges), so the synthetic
file is a valid Qwen2 model whose tokenizer is the real one. It also holds every tensor's name and shape, the
type it has in the real file, and its scale: for each weight matrix the mean and standard deviation of a sample of
its rows (dequantized with gguf-py), for each vector (norms, biases) the mean and standard deviation of the vector.

`make` writes random normal weights with those scales (matrices as F16, vectors as F32; a 16M-value normal pool is
reused at random offsets, which keeps generation fast and changes nothing that costs time), then quantizes the
F16 file with llama.cpp's own quantizer through the binding (llama_model_quantize, default parameters, ftype
Q4_K_M, no imatrix), which picks each tensor's type by the same rules that made the real file: Q4_K with Q6_K for
some attn_v/ffn_down layers and the output, and Q5_0/Q8_0 where a row length (896 in the 0.5B) is not a multiple of
256. `make` prints the resulting type counts next to the real file's.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import lzma
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

import numpy as np

HERE = Path(__file__).resolve().parent
DEFAULT_SPEC = HERE / "data" / "qwen2.5-coder-pair.spec.json.xz"
TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")
SKIP_KEYS = ("GGUF.", "general.architecture", "general.quantization_version", "general.file_type")
FORMAT = 1
POOL = 1 << 24


def _gguf() -> Any:
    """gguf-py: the installed package, or llama.cpp's own copy when one is named by GGUF_PY (the GPU bundle)."""
    extra = os.environ.get("GGUF_PY")
    if extra and extra not in sys.path:
        sys.path.insert(0, extra)
    import gguf

    return gguf


# --------------------------------------------------------------------------------------------- spec
def _field_value(field: Any) -> Any:
    v = field.contents()
    if isinstance(v, np.generic):
        v = v.item()
    return v


def _sample_scale(gguf: Any, t: Any, rows: int = 16) -> tuple[float, float]:
    """(mean, std) of a tensor: a vector whole, a matrix from `rows` rows spread over it (dequantized)."""
    data = t.data
    if data.ndim == 1:
        x = np.asarray(data, dtype=np.float64)
        return float(x.mean()), float(x.std())
    n = data.shape[0]
    idx = np.unique(np.linspace(0, n - 1, min(rows, n)).astype(int))
    sample = np.asarray(data[idx])
    if t.tensor_type not in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        sample = gguf.quants.dequantize(sample, t.tensor_type)
    x = np.asarray(sample, dtype=np.float64)
    return float(x.mean()), float(x.std())


def read_model_spec(path: str | Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(model spec, tokenizer arrays) of a real GGUF file."""
    gguf = _gguf()
    r = gguf.GGUFReader(str(path))
    arch = _field_value(r.fields["general.architecture"])
    kv, tok = [], {}
    for key, f in r.fields.items():
        if key in TOKENIZER_ARRAYS:
            tok[key] = {"type": f.types[-1].name, "value": list(_field_value(f))}
            continue
        if key.startswith(SKIP_KEYS):
            continue
        types = [t.name for t in f.types]
        kv.append([key, types[0], types[1] if len(types) > 1 else None, _field_value(f)])
    tensors = []
    for t in r.tensors:
        shape = [int(x) for x in reversed(list(t.shape))]  # numpy order: rows first
        mean, std = _sample_scale(gguf, t)
        tensors.append({"name": t.name, "shape": shape, "type": t.tensor_type.name, "mean": round(mean, 6), "std": round(std, 6)})
    spec = {
        "source": os.path.basename(str(path)),
        "architecture": arch,
        "file_type": _field_value(r.fields["general.file_type"]) if "general.file_type" in r.fields else None,
        "kv": kv,
        "tensors": tensors,
        "types": dict(Counter(t["type"] for t in tensors)),
        "bytes": os.path.getsize(path),
    }
    return spec, tok


def write_spec(models: dict[str, str], out: Path) -> dict[str, Any]:
    """A spec file for several models that share one tokenizer (checked)."""
    spec: dict[str, Any] = {"format": FORMAT, "models": {}, "tokenizer": None}
    for role, path in models.items():
        m, tok = read_model_spec(path)
        if spec["tokenizer"] is None:
            spec["tokenizer"] = tok
        elif tok != spec["tokenizer"]:
            raise SystemExit(f"{path}: its tokenizer differs from the first model's; make one spec per model")
        spec["models"][role] = m
    out.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(out, "wt", encoding="utf-8", preset=9) as f:
        json.dump(spec, f, separators=(",", ":"))
    return spec


def load_spec(path: str | Path) -> dict[str, Any]:
    with lzma.open(path, "rt", encoding="utf-8") as f:
        spec = json.load(f)
    if spec.get("format") != FORMAT:
        raise SystemExit(f"{path}: unknown spec format {spec.get('format')}")
    return spec


# --------------------------------------------------------------------------------------------- make
def write_f16(spec: dict[str, Any], tokenizer: dict[str, Any], out: Path, seed: int = 0) -> None:
    """The F16/F32 GGUF with the spec's metadata and tensors, random weights at the recorded scales."""
    gguf = _gguf()
    VT = gguf.GGUFValueType
    rng = np.random.default_rng(seed)
    pool = rng.standard_normal(POOL, dtype=np.float32)
    w = gguf.GGUFWriter(str(out), spec["architecture"])
    for key, vtype, sub, value in spec["kv"]:
        if key == "general.name":
            value = f"synthetic {value} (random weights)"
        w.add_key_value(key, value, VT[vtype], VT[sub] if sub else None)
    for key in TOKENIZER_ARRAYS:
        t = tokenizer[key]
        w.add_key_value(key, t["value"], VT.ARRAY, VT[t["type"]])
    w.add_key_value("general.file_type", int(gguf.LlamaFileType.MOSTLY_F16), VT.UINT32)
    plan = []
    for t in spec["tensors"]:
        shape = tuple(t["shape"])
        dtype = np.float32 if len(shape) == 1 else np.float16
        n = int(np.prod(shape))
        w.add_tensor_info(t["name"], shape, np.dtype(dtype), n * np.dtype(dtype).itemsize)
        plan.append((shape, dtype, n, float(t["mean"]), float(t["std"])))
    w.write_header_to_file(path=str(out))
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for shape, dtype, n, mean, std in plan:
        arr = np.empty(n, dtype=dtype)
        off = int(rng.integers(0, POOL))
        for s in range(0, n, POOL):  # the pool, cyclically from a random offset
            m = min(POOL, n - s)
            i = (off + s) % POOL
            chunk = pool[i:i + m] if i + m <= POOL else np.concatenate((pool[i:], pool[: m - (POOL - i)]))
            arr[s:s + m] = chunk * std + mean
        w.write_tensor_data(arr.reshape(shape))
    w.close()


def quantize(src: Path, dst: Path, ftype: str = "Q4_K_M", threads: int | None = None) -> None:
    """llama.cpp's quantizer through the binding, default parameters."""
    import llama_cpp as C

    params = C.llama_model_quantize_default_params()
    params.ftype = getattr(C, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = threads or os.cpu_count() or 1
    rc = C.llama_model_quantize(os.fsencode(str(src)), os.fsencode(str(dst)), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize failed with code {rc}")


def tensor_types(path: str | Path) -> dict[str, int]:
    gguf = _gguf()
    r = gguf.GGUFReader(str(path))
    return dict(sorted(Counter(t.tensor_type.name for t in r.tensors).items()))


def make(spec: dict[str, Any], role: str, out: Path, *, ftype: str = "Q4_K_M", threads: int | None = None,
         seed: int = 0, tmpdir: str | None = None, keep_f16: bool = False) -> dict[str, Any]:
    """Write the synthetic `role` model of the spec to `out` (quantized); returns timings and type counts."""
    if role not in spec["models"]:
        raise SystemExit(f"the spec has models {list(spec['models'])}, not {role!r}")
    m = spec["models"][role]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="synth-", dir=tmpdir or str(out.parent)) as tmp:
        f16 = Path(tmp) / "model-f16.gguf"
        write_f16(m, spec["tokenizer"], f16, seed=seed)
        t1 = time.perf_counter()
        if ftype.upper() == "F16":
            os.replace(f16, out)
        else:
            quantize(f16, out, ftype.upper(), threads)
            if keep_f16:
                os.replace(f16, out.with_suffix(".f16.gguf"))
    t2 = time.perf_counter()
    res = {
        "model": role, "source": m["source"], "out": str(out), "bytes": out.stat().st_size, "real_bytes": m["bytes"],
        "write_seconds": round(t1 - t0, 1), "quantize_seconds": round(t2 - t1, 1),
        "types": tensor_types(out), "real_types": dict(sorted(m["types"].items())),
    }
    return res


# --------------------------------------------------------------------------------------------- compare
def compare(paths: Sequence[str], sizes: Sequence[int], rounds: int, threads: int | None, n_gpu_layers: int) -> dict[str, Any]:
    """Verify curves of several files measured in interleaved rounds (each round: every file, every size once), so
    that machine noise hits all alike; medians per size."""
    from edgespec.llama.backend import Model
    from edgespec.drafting.calibration import _time_sizes, _base
    from edgespec.config import ModelSpec

    models = [Model(ModelSpec(p, n_threads=threads, n_gpu_layers=n_gpu_layers, n_ctx=max(256, max(sizes) + 64))) for p in paths]
    times: list[dict[int, list[float]]] = [{n: [] for n in sizes} for _ in paths]
    try:
        starts = []
        for m in models:
            m.reset()
            base = _base(m, max(sizes))
            m.decode(base, 0, ())
            starts.append(len(base))
            _time_sizes(m, [1, 2, 4], len(base), 1)  # warm-up
        for r in range(rounds):
            order = range(len(models)) if r % 2 == 0 else reversed(range(len(models)))
            for i in order:
                t, _ = _time_sizes(models[i], sizes, starts[i], 1)
                for n in sizes:
                    times[i][n] += t[n]
    finally:
        for m in models:
            m.close()
    curves = [{n: statistics.median(v) for n, v in t.items()} for t in times]
    ref = curves[0]
    out: dict[str, Any] = {"files": [os.path.basename(p) for p in paths], "rounds": rounds, "threads": threads,
                           "n_gpu_layers": n_gpu_layers, "curves": [{str(n): s for n, s in c.items()} for c in curves]}
    out["ratio"] = [{str(n): round(c[n] / ref[n], 4) for n in sizes} for c in curves[1:]]
    out["max_deviation"] = [round(max(abs(c[n] / ref[n] - 1) for n in sizes), 4) for c in curves[1:]]
    # the fastest of the rounds: on a shared machine other work only ever adds time, so the minimum is the steadier
    # estimate of what a decode costs
    mins = [{n: min(v) for n, v in t.items()} for t in times]
    out["curves_min"] = [{str(n): s for n, s in c.items()} for c in mins]
    out["ratio_min"] = [{str(n): round(c[n] / mins[0][n], 4) for n in sizes} for c in mins[1:]]
    out["max_deviation_min"] = [round(max(abs(c[n] / mins[0][n] - 1) for n in sizes), 4) for c in mins[1:]]
    return out


def format_compare(res: dict[str, Any]) -> str:
    names = res["files"]
    sizes = list(res["curves"][0])
    head = (["n"] + [f"{n} ms (median)" for n in names] + [f"ratio {i + 2}/1" for i in range(len(names) - 1)]
            + [f"{n} ms (min)" for n in names] + [f"ratio {i + 2}/1 (min)" for i in range(len(names) - 1)])
    rows = []
    for n in sizes:
        rows.append([n] + [f"{1000 * c[n]:.2f}" for c in res["curves"]] + [f"{r[n]:.3f}" for r in res["ratio"]]
                    + [f"{1000 * c[n]:.2f}" for c in res["curves_min"]] + [f"{r[n]:.3f}" for r in res["ratio_min"]])
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]
    lines = ["  ".join(str(x).rjust(w) for x, w in zip(r, widths)) for r in [head] + rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.append(f"max |ratio - 1|: medians {', '.join(f'{d:.1%}' for d in res['max_deviation'])}, minima "
                 f"{', '.join(f'{d:.1%}' for d in res['max_deviation_min'])} ({res['rounds']} interleaved rounds)")
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
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
        from predict_speedup import parse_sizes  # next to this script

        res = compare(a.files, parse_sizes(a.sizes), a.rounds, a.threads, a.n_gpu_layers)
        print(format_compare(res))
        if a.json:
            a.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
