"""Synthetic GGUF models with a real pair's shapes and quantization, random weights: forward-pass costs measured
anywhere, without the real weights (they cannot travel to an offline GPU machine; the pair's spec is ~1 MB).
research/synth_model.py is the command line (spec, make, quantize, compare: measure.compare); scripts/gpu_check.sh
makes the synthetic pair with it.

A spec holds, per model, every metadata key of the real file (architecture, layers, heads, KV heads, hidden and
FFN sizes, context length, RoPE base, norm epsilon, chat template, special token ids) except the tokenizer arrays,
which both models share and the spec holds once (151,936 tokens, their types, 151,387 merges for the Qwen2.5-Coder
pair), so the synthetic file is a valid model whose tokenizer is the real one. It also holds every tensor's name and
shape, the type it has in the real file, and its scale: for each weight matrix the mean and standard deviation of a
sample of its rows (dequantized with gguf-py), for each vector (norms, biases) the mean and standard deviation of the
vector.

`make` writes random normal weights with those scales (matrices as F16, vectors as F32; a 16M-value normal pool is
reused at random offsets, which keeps generation fast and changes nothing that costs time), then quantizes the
F16 file with llama.cpp's own quantizer through the binding (llama_model_quantize, default parameters, ftype
Q4_K_M, no imatrix), which picks each tensor's type by the same rules that made the real file: Q4_K with Q6_K for
some attn_v/ffn_down layers and the output, and Q5_0/Q8_0 where a row length (896 in the 0.5B) is not a multiple of
256. `make` returns the resulting type counts next to the real file's.

gguf-py (the `gguf` package, or llama.cpp's own copy on the path) is imported when a file is read or written;
llama.cpp's library only when quantizing. SynthError: a spec or a request this module cannot serve.
"""

from __future__ import annotations

import ctypes
import json
import lzma
import os
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

TOKENIZER_ARRAYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")
SKIP_KEYS = ("GGUF.", "general.architecture", "general.quantization_version", "general.file_type")
FORMAT = 1
POOL = 1 << 24


class SynthError(Exception):
    """A spec that cannot be read or made (one line)."""


def _gguf() -> Any:
    """gguf-py: the installed package, or llama.cpp's own copy where it is on the path (the GPU bundle's)."""
    import gguf

    return gguf


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
            raise SynthError(f"{path}: its tokenizer differs from the first model's; make one spec per model")
        spec["models"][role] = m
    out.parent.mkdir(parents=True, exist_ok=True)
    with lzma.open(out, "wt", encoding="utf-8", preset=9) as f:
        json.dump(spec, f, separators=(",", ":"))
    return spec


def load_spec(path: str | Path) -> dict[str, Any]:
    with lzma.open(path, "rt", encoding="utf-8") as f:
        spec = json.load(f)
    if spec.get("format") != FORMAT:
        raise SynthError(f"{path}: unknown spec format {spec.get('format')}")
    return spec


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
    from edgespec.llama.binding import C

    params = C.llama_model_quantize_default_params()
    params.ftype = getattr(C, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.nthread = threads or os.cpu_count() or 1
    rc = C.llama_model_quantize(os.fsencode(str(src)), os.fsencode(str(dst)), ctypes.byref(params))
    if rc != 0:
        raise SynthError(f"llama_model_quantize failed with code {rc}")


def tensor_types(path: str | Path) -> dict[str, int]:
    gguf = _gguf()
    r = gguf.GGUFReader(str(path))
    return dict(sorted(Counter(t.tensor_type.name for t in r.tensors).items()))


def make(spec: dict[str, Any], role: str, out: Path, *, ftype: str = "Q4_K_M", threads: int | None = None,
         seed: int = 0, tmpdir: str | None = None, keep_f16: bool = False) -> dict[str, Any]:
    """Write the synthetic `role` model of the spec to `out` (quantized); returns timings and type counts."""
    if role not in spec["models"]:
        raise SynthError(f"the spec has models {list(spec['models'])}, not {role!r}")
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
