"""llama.cpp's limits on a GGUF header, checked before llama.cpp sees the file.

llama.cpp refuses many bad files cleanly (llama_model_load_from_file returns NULL), but some header values reach a
GGML_ASSERT, an uncaught C++ exception or a NULL kernel pointer and kill the process with SIGABRT or SIGSEGV. Each
rule below names the llama.cpp check it stands in for (sources as vendored by llama-cpp-python 0.3.36); rules that
only mirror a clean refusal are there to give a clearer line. `check` raises `RuleError` with a one-line reason.

Scope: the generic rules (tensor types, layer/head/rotary/expert counts, vocabulary) hold for every architecture;
the tensor shapes are checked against the hyperparameters for the llama and qwen2 layouts only (other
architectures' shapes are left to llama.cpp, which refuses mismatches cleanly).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import gguf_known
from .gguf_header import GGUFHeader


class RuleError(Exception):
    """A header value llama.cpp cannot take; the message is the reason (the caller adds the path)."""


def shown(text: str, limit: int = 48) -> str:
    """A name read from a file, fit for a one-line message: quoted, control and undecodable characters escaped, cut
    at `limit` characters (a damaged header can make a "name" of garbage kilobytes long)."""
    body = text.encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace")
    body = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in body)
    return "'" + body[:limit] + ("..." if len(body) > limit else "") + "'"



@dataclass(frozen=True)
class GGMLType:
    name: str
    block: int  # elements per block
    size: int  # bytes per block
    matmul: bool  # the CPU backend has a dot product for it, so it can hold a weight matrix


# ggml/src/ggml.c type_traits and ggml-cpu.c type_traits_cpu (vec_dot). Ids 4, 5, 31-33 and 36-38 are retired.
GGML_TYPES: dict[int, GGMLType] = {
    0: GGMLType("F32", 1, 4, True), 1: GGMLType("F16", 1, 2, True), 2: GGMLType("Q4_0", 32, 18, True),
    3: GGMLType("Q4_1", 32, 20, True), 6: GGMLType("Q5_0", 32, 22, True), 7: GGMLType("Q5_1", 32, 24, True),
    8: GGMLType("Q8_0", 32, 34, True), 9: GGMLType("Q8_1", 32, 36, False), 10: GGMLType("Q2_K", 256, 84, True),
    11: GGMLType("Q3_K", 256, 110, True), 12: GGMLType("Q4_K", 256, 144, True), 13: GGMLType("Q5_K", 256, 176, True),
    14: GGMLType("Q6_K", 256, 210, True), 15: GGMLType("Q8_K", 256, 292, False),
    16: GGMLType("IQ2_XXS", 256, 66, True), 17: GGMLType("IQ2_XS", 256, 74, True),
    18: GGMLType("IQ3_XXS", 256, 98, True), 19: GGMLType("IQ1_S", 256, 50, True), 20: GGMLType("IQ4_NL", 32, 18, True),
    21: GGMLType("IQ3_S", 256, 110, True), 22: GGMLType("IQ2_S", 256, 82, True), 23: GGMLType("IQ4_XS", 256, 136, True),
    24: GGMLType("I8", 1, 1, False), 25: GGMLType("I16", 1, 2, False), 26: GGMLType("I32", 1, 4, False),
    27: GGMLType("I64", 1, 8, False), 28: GGMLType("F64", 1, 8, False), 29: GGMLType("IQ1_M", 256, 56, True),
    30: GGMLType("BF16", 1, 2, True), 34: GGMLType("TQ1_0", 256, 54, True), 35: GGMLType("TQ2_0", 256, 66, True),
    39: GGMLType("MXFP4", 32, 17, True), 40: GGMLType("NVFP4", 64, 36, True), 41: GGMLType("Q1_0", 128, 18, True),
    42: GGMLType("Q2_0", 64, 18, True),
}
F32, _NVFP4 = 0, 40
MAX_LAYERS = 512  # LLAMA_MAX_LAYERS (src/llama-hparams.h)
MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS
MAX_NAME = 64  # GGML_MAX_NAME: tensor names are at most 63 bytes
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")  # LLAMA_ROPE_SCALING_TYPES (src/llama-model.cpp)

# GGUF value types (gguf_type)
_U8, _I8, _U32, _I32, _F32, _BOOL, _STR, _ARR = 0, 1, 4, 5, 6, 7, 8, 9
_VALUE_TYPE_NAMES = ["UINT8", "INT8", "UINT16", "INT16", "UINT32", "INT32", "FLOAT32", "BOOL", "STRING", "ARRAY",
                     "UINT64", "INT64", "FLOAT64"]


def check(h: GGUFHeader) -> None:
    """Raise RuleError if llama.cpp could abort, segfault or refuse the file `h` describes."""
    _check_alignment(h)
    arch = _architecture(h)
    if not h.tensors:
        raise RuleError("GGUF file holds no tensors")
    _check_tensors(h)
    names = {t.name for t in h.tensors}
    for name in gguf_known.GRAPH_NEEDS.get(arch, ()):
        if name not in names:
            raise RuleError(f"{arch} model has no tensor '{name}' (llama.cpp would crash building its graph)")
    embd = next((t for t in h.tensors if t.name == "token_embd.weight"), None)
    scales = names & {"output.scale", "output.input_scale"}
    if embd is not None and embd.ttype == _NVFP4 and "output.weight" not in names and scales:
        # src/llama-model.cpp load_tensors: GGML_ASSERT on a tied NVFP4 output with LM-head scales
        raise RuleError(f"tensor {shown(min(scales))} scales an output layer the file does not have (the NVFP4 token "
                        "embedding is reused as output; llama.cpp would abort)")
    hp = _check_hparams(h, arch)
    n_vocab = _check_vocab(h)
    if arch in _LAYOUTS:
        _check_layout(h, arch, hp, n_vocab)


def tensor_nbytes(dims: list[int], t: GGMLType) -> int:
    return math.prod(dims) // t.block * t.size


# ---------------------------------------------------------------- metadata access
def _get(h: GGUFHeader, key: str, vtype: int, *, required: bool = False) -> Any:
    """The value of `key`, which llama.cpp reads as `vtype` (a different stored type makes it refuse the file)."""
    if key not in h.kv:
        if required:
            raise RuleError(f"missing metadata key {key}")
        return None
    have = h.kv_types[key][0]
    if have != vtype:
        raise RuleError(f"{key} is {_type_name(have)}, llama.cpp reads it as {_type_name(vtype)}")
    return h.kv[key]


def _type_name(vtype: int | None) -> str:
    return _VALUE_TYPE_NAMES[vtype] if vtype is not None else "no type"


def _per_layer(h: GGUFHeader, key: str, n: int, default: list[int]) -> list[int]:
    """A uint32 hyperparameter given once or as `n` values, one per layer (llama_model_loader::get_key_or_arr)."""
    if key not in h.kv:
        return default
    vtype, etype = h.kv_types[key]
    if vtype != _ARR:
        return [_get(h, key, _U32)] * n
    if etype not in (_U32, _I32, _BOOL):
        raise RuleError(f"{key} is an array of {_type_name(etype)}, llama.cpp reads uint32 values")
    if h.array_lengths[key] != n:
        raise RuleError(f"{key} has {h.array_lengths[key]} values, llama.cpp expects {n}")
    return [int(v) % (1 << 32) for v in h.kv[key]]


# ---------------------------------------------------------------- file structure and tensors
def _check_alignment(h: GGUFHeader) -> None:
    # ggml/src/gguf.cpp gguf_init_from_reader
    align = _get(h, "general.alignment", _U32)
    if align is not None and (align == 0 or align & (align - 1)):
        raise RuleError(f"general.alignment {align} is not a power of 2")


def _architecture(h: GGUFHeader) -> str:
    arch = h.kv.get("general.architecture")
    if not isinstance(arch, str):
        raise RuleError("GGUF has no general.architecture")
    if arch in gguf_known.REFUSED:
        raise RuleError(f"architecture {shown(arch)} {gguf_known.REFUSED[arch]}")
    if arch not in gguf_known.KNOWN:
        raise RuleError(f"architecture {shown(arch)} is not one llama.cpp knows")
    return arch


def _check_tensors(h: GGUFHeader) -> None:
    seen: set[str] = set()
    expected_offset = 0
    for t in h.tensors:
        # ggml/src/gguf.cpp: name length, duplicates, type range, block multiple, contiguous layout
        if len(t.name.encode("utf-8", "surrogateescape")) >= MAX_NAME:
            raise RuleError(f"tensor name {shown(t.name)} is longer than {MAX_NAME - 1} bytes")
        if t.name in seen:
            raise RuleError(f"tensor {shown(t.name)} appears twice")
        seen.add(t.name)
        gt = GGML_TYPES.get(t.ttype)
        if gt is None:
            raise RuleError(f"tensor {shown(t.name)} has unknown type id {t.ttype}")
        if 0 in t.dims:
            # a zero-sized weight trips ggml_mul_mat's GGML_ASSERT(!ggml_is_transposed(a)) (ggml.c)
            raise RuleError(f"tensor {shown(t.name)} has an empty dimension {t.dims}")
        if t.dims and t.dims[0] % gt.block:
            raise RuleError(f"tensor {shown(t.name)} row of {t.dims[0]} is not a multiple of the {gt.name} block ({gt.block})")
        if t.offset != expected_offset:
            raise RuleError(f"tensor {shown(t.name)} data is at offset {t.offset:,}, expected {expected_offset:,} (damaged file)")
        nbytes = tensor_nbytes(t.dims, gt)
        expected_offset += -(-nbytes // h.alignment) * h.alignment
        end = h.data_start + t.offset + nbytes
        if end > h.file_size:
            raise RuleError(f"truncated file: tensor {shown(t.name)} ends at byte {end:,} but the file has {h.file_size:,} bytes")
        # ggml-cpu: mul_mat with no vec_dot segfaults (type_traits_cpu); elementwise ops on weights (norms, biases,
        # rope factors) take F32 only (binary-ops.cpp binary_op, ops.cpp rope) and GGML_ABORT otherwise
        if _n_dims(t.dims) >= 2 and not gt.matmul:
            raise RuleError(f"tensor {shown(t.name)} has type {gt.name}, which llama.cpp cannot compute (it would crash)")
        if _n_dims(t.dims) <= 1 and t.ttype != F32:
            raise RuleError(
                f"tensor {shown(t.name)} is a vector of type {gt.name}; llama.cpp computes norm/bias vectors only in F32 "
                "(it would abort)"
            )


def _n_dims(dims: list[int]) -> int:
    """ggml_n_dims: trailing dimensions of 1 do not count."""
    n = len(dims)
    while n > 1 and dims[n - 1] == 1:
        n -= 1
    return n


# ---------------------------------------------------------------- hyperparameters
@dataclass(frozen=True)
class Hparams:
    n_layer: int  # blocks in the main stack (block_count minus MTP blocks)
    n_embd: int
    n_head: int
    n_head_kv: int
    head_k: int
    head_v: int
    n_rot: int
    n_ff: list[int]
    n_expert: int


# How load_hparams reads the architecture keys every model shares; another stored type makes it refuse the file.
_HPARAM_TYPES = {
    "context_length": _U32, "embedding_length": _U32, "embedding_length_out": _U32, "block_count": _U32,
    "nextn_predict_layers": _U32, "pooling_type": _U32, "attention.causal": _BOOL,
    "expert_count": _U32, "expert_group_count": _U32, "expert_group_used_count": _U32,
    "attention.key_length": _U32, "attention.value_length": _U32, "attention.key_length_swa": _U32,
    "attention.value_length_swa": _U32, "rope.dimension_count": _U32, "rope.dimension_count_swa": _U32,
    "rope.freq_base": _F32, "rope.scaling.type": _STR, "rope.scaling.factor": _F32, "rope.scale_linear": _F32,
    "rope.scaling.attn_factor": _F32, "rope.scaling.alpha": _F32, "rope.scaling.original_context_length": _U32,
    "rope.scaling.finetuned": _BOOL,
}


def _check_hparams(h: GGUFHeader, arch: str) -> Hparams:
    """src/llama-model.cpp llama_model_base::load_hparams, ggml rope/attention kernels and per-arch asserts."""
    p = f"{arch}."
    for name, vtype in _HPARAM_TYPES.items():
        _get(h, p + name, vtype)
    _get(h, p + "context_length", _U32, required=True)
    n_embd = _get(h, p + "embedding_length", _U32, required=True)
    n_layer = _get(h, p + "block_count", _U32, required=True)
    if not 1 <= n_layer <= MAX_LAYERS:
        raise RuleError(f"{p}block_count is {n_layer}; llama.cpp takes 1 to {MAX_LAYERS} layers (it would abort)")
    n_nextn = _get(h, p + "nextn_predict_layers", _U32) or 0
    if n_nextn > n_layer:
        raise RuleError(f"{p}nextn_predict_layers {n_nextn} exceeds block_count {n_layer} (llama.cpp would abort)")

    n_expert = _check_experts(h, p, n_layer)
    if arch in gguf_known.EXPERTS_REQUIRED and n_expert == 0:
        raise RuleError(f"{arch} is a mixture-of-experts architecture but {p}expert_count is missing or 0 (it would abort)")

    n_head = _per_layer(h, p + "attention.head_count", n_layer, [0] * n_layer)
    n_head_kv = _per_layer(h, p + "attention.head_count_kv", n_layer, n_head)
    for il, (nh, nkv) in enumerate(zip(n_head, n_head_kv)):
        # ggml_flash_attn_ext GGML_ASSERT(ggml_can_mul_mat(k, q)): query heads a multiple of key/value heads
        if nh and (nkv == 0 or nh % nkv):
            raise RuleError(f"layer {il} has {nh} attention heads and {nkv} key/value heads; llama.cpp needs the "
                            "first to be a positive multiple of the second (it would abort)")
    if len(set(n_head_kv)) > 1 and arch not in gguf_known.PER_LAYER_KV_HEADS | gguf_known.RECURRENT_OR_HYBRID:
        raise RuleError(f"{p}attention.head_count_kv varies by layer ({n_head_kv[:8]}), but {arch} sizes every layer "
                        "like layer 0 (llama.cpp would abort)")

    scaling = _get(h, p + "rope.scaling.type", _STR)
    if scaling is not None and scaling not in ROPE_SCALING_TYPES:
        raise RuleError(f"{p}rope.scaling.type {shown(scaling)} is not one of {', '.join(ROPE_SCALING_TYPES)} (llama.cpp would abort)")
    for key in ("attention.layer_norm_epsilon", "attention.layer_norm_rms_epsilon", "attention.group_norm_epsilon"):
        eps = _get(h, p + key, _F32)
        if eps is not None and not eps >= 0:  # also catches NaN; ggml_norm/rms_norm GGML_ASSERT(eps >= 0.0f)
            raise RuleError(f"{p}{key} is {eps:g}; llama.cpp needs a number >= 0 (it would abort)")

    head_k = head_v = n_rot = 0
    if n_head[0]:
        head_k = _opt(_get(h, p + "attention.key_length", _U32), n_embd // n_head[0])
        head_v = _opt(_get(h, p + "attention.value_length", _U32), n_embd // n_head[0])
        n_rot = _opt(_get(h, p + "rope.dimension_count", _U32), head_k)
        _check_rotary(p + "rope.dimension_count", n_rot, head_k)
        _check_rotary(p + "rope.dimension_count_swa", _opt(_get(h, p + "rope.dimension_count_swa", _U32), n_rot),
                      _opt(_get(h, p + "attention.key_length_swa", _U32), head_k))
        if arch in gguf_known.FULL_ROTARY and n_rot != head_k:
            raise RuleError(f"{p}rope.dimension_count is {n_rot} but {arch} rotates whole heads of {head_k} dimensions")
        if arch in gguf_known.EQUAL_HEAD_SIZES and head_v != head_k:
            raise RuleError(f"{arch} needs key and value heads of one size, the file has {head_k} and {head_v} "
                            "(llama.cpp would abort)")
    if arch in gguf_known.MROPE:
        sections = _per_layer(h, p + "rope.dimension_sections", 4, [0] * 4)
        if not any(s > 0 for s in sections[:3]):
            raise RuleError(f"{p}rope.dimension_sections {sections} has no positive section; {arch} uses M-RoPE "
                            "(llama.cpp would abort)")
    for key in ("rope.freq_base", "rope.scaling.factor"):
        value = _get(h, p + key, _F32)
        if value is not None and (math.isnan(value) or key == "rope.freq_base" and value <= 0):
            raise RuleError(f"{p}{key} is {value:g} (the model would compute NaN)")
    for t in h.tensors:
        # the loader counts every tensor it creates; one of a layer past block_count is never created
        layer = t.name.split(".")[1] if t.name.startswith("blk.") else ""
        if layer.isdigit() and int(layer) >= n_layer:
            raise RuleError(f"tensor {shown(t.name)} belongs to layer {layer} but {p}block_count is {n_layer}")
    n_ff = _per_layer(h, p + "feed_forward_length", n_layer, [0] * n_layer)
    return Hparams(n_layer - n_nextn, n_embd, n_head[0], n_head_kv[0], head_k, head_v, n_rot, n_ff, n_expert)


def _opt(value: int | None, default: int) -> int:
    return default if value is None else value


def _check_rotary(key: str, n_rot: int, head: int) -> None:
    # ggml-cpu/ops.cpp rope: GGML_ASSERT(n_dims <= ne0) and GGML_ASSERT(n_dims % 2 == 0)
    if n_rot > head or n_rot % 2:
        raise RuleError(f"{key} is {n_rot}; llama.cpp rotates an even number of dimensions, at most the head size "
                        f"{head} (it would abort)")


def _check_experts(h: GGUFHeader, p: str, n_layer: int) -> int:
    """The expert asserts at the top of load_hparams."""
    n_expert = _get(h, p + "expert_count", _U32) or 0
    used = max(_per_layer(h, p + "expert_used_count", n_layer, [0]))
    groups = _get(h, p + "expert_group_count", _U32) or 0
    group_used = _get(h, p + "expert_group_used_count", _U32) or 0
    if n_expert > MAX_EXPERTS:
        problem = f"{n_expert} experts, more than llama.cpp's {MAX_EXPERTS}"
    elif used > n_expert:
        problem = f"{used} experts used per token out of {n_expert}"
    elif n_expert and not used:
        problem = f"{n_expert} experts but none used per token"
    elif n_expert and groups >= n_expert:
        problem = f"{groups} expert groups for {n_expert} experts"
    elif groups > 1 and (n_expert % groups or not 0 < group_used < groups):
        problem = f"{n_expert} experts in {groups} groups with {group_used} groups used"
    elif not n_expert and groups:
        problem = f"{groups} expert groups but no experts"
    else:
        return n_expert
    raise RuleError(f"{p}expert_* settings are inconsistent: {problem} (llama.cpp would abort)")


# ---------------------------------------------------------------- tensor shapes (llama, qwen2)
Shapes = dict[str, tuple[int, ...]]


@dataclass(frozen=True)
class _Layout:
    q: int  # output widths of the query, key and value projections
    k: int
    v: int
    attn_output: tuple[int, int]
    optional: Shapes  # global tensors a file may have
    optional_per_layer: Shapes  # per-layer tensors a file may have (name after "blk.N.")


def _layout_llama(hp: Hparams, n_vocab: int) -> _Layout:
    """src/models/llama.cpp load_arch_tensors."""
    q = hp.head_k * hp.n_head
    half_rot = (hp.n_rot // 2,)
    return _Layout(
        q, hp.head_k * hp.n_head_kv, hp.head_v * hp.n_head_kv, (q, hp.n_embd),
        {"rope_freqs.weight": half_rot, "rope_factors_long.weight": half_rot, "rope_factors_short.weight": half_rot},
        {"attn_output.bias": (hp.n_embd,), "ffn_gate.bias": (hp.n_ff[0],), "ffn_up.bias": (hp.n_ff[0],),
         "ffn_down.bias": (hp.n_embd,)},
    )


def _layout_qwen2(hp: Hparams, n_vocab: int) -> _Layout:
    """src/models/qwen2.cpp load_arch_tensors."""
    gqa = hp.head_v * hp.n_head_kv
    return _Layout(hp.n_embd, gqa, gqa, (hp.n_embd, hp.n_embd), {"output.bias": (n_vocab,)}, {})


_LAYOUTS = {"llama": _layout_llama, "qwen2": _layout_qwen2}
_SCALED = ("attn_q", "attn_k", "attn_v", "attn_output", "attn_qkv", "ffn_gate", "ffn_down", "ffn_up")
_SCALES = ("scale", "input_scale")


def _check_layout(h: GGUFHeader, arch: str, hp: Hparams, n_vocab: int) -> None:
    """The tensors llama_model_*::load_arch_tensors creates, with their shapes. llama.cpp refuses a file with a
    missing, extra or misshapen tensor cleanly; this says which one."""
    _get(h, f"{arch}.attention.layer_norm_rms_epsilon", _F32, required=True)
    if arch == "llama":
        _get(h, "llama.vocab_size", _U32)
    if hp.n_expert and arch == "llama":  # llama's mixture-of-experts layout (Mixtral) is left to llama.cpp
        return
    lay = _LAYOUTS[arch](hp, n_vocab)
    n_embd, n_ff = hp.n_embd, hp.n_ff[0]
    names = {t.name for t in h.tensors}
    required: Shapes = {"token_embd.weight": (n_embd, n_vocab), "output_norm.weight": (n_embd,)}
    optional: Shapes = {"output.weight": (n_embd, n_vocab), **lay.optional}
    optional |= {f"output.{scale}": (1,) for scale in _SCALES}
    for il in range(hp.n_layer):
        b = f"blk.{il}."
        # the generic per-tensor scales load_tensors looks for after the architecture's own tensors
        optional |= {f"{b}{w}.{scale}": (1,) for w in _SCALED for scale in _SCALES}
        required |= {b + "attn_norm.weight": (n_embd,), b + "attn_output.weight": lay.attn_output,
                     b + "ffn_norm.weight": (n_embd,), b + "ffn_gate.weight": (n_embd, n_ff),
                     b + "ffn_up.weight": (n_embd, n_ff), b + "ffn_down.weight": (n_ff, n_embd)}
        optional |= {b + name: shape for name, shape in lay.optional_per_layer.items()}
        widths = {"attn_q": lay.q, "attn_k": lay.k, "attn_v": lay.v}
        if b + "attn_qkv.weight" in names:  # one fused projection (create_tensor_qkv)
            required[b + "attn_qkv.weight"] = (n_embd, lay.q + lay.k + lay.v)
            optional[b + "attn_qkv.bias"] = (lay.q + lay.k + lay.v,)
        else:
            required |= {f"{b}{part}.weight": (n_embd, width) for part, width in widths.items()}
        optional |= {f"{b}{part}.bias": (width,) for part, width in widths.items()}
    for name in required:
        if name not in names:
            raise RuleError(f"{arch} model has no tensor '{name}'")
    for t in h.tensors:
        shape = required.get(t.name) or optional.get(t.name)
        if shape is None:
            raise RuleError(f"tensor {shown(t.name)} is not part of a {arch} model with {hp.n_layer} layers")
        if tuple(t.dims[: len(shape)]) != shape or any(d != 1 for d in t.dims[len(shape):]):
            raise RuleError(f"tensor {shown(t.name)} has shape {t.dims}, {arch} with these hyperparameters needs {list(shape)}")


# ---------------------------------------------------------------- vocabulary
@dataclass(frozen=True)
class _Tokenizer:
    kind: str  # llama_vocab_type
    bos: int | None  # default special token ids (src/llama-vocab.cpp llama_vocab::impl::load)
    eos: int | None
    unk: int | None
    sep: int | None


_BPE = _Tokenizer("bpe", 11, 11, None, None)
TOKENIZERS = {
    "llama": _Tokenizer("spm", 1, 2, 0, None),
    "bert": _Tokenizer("wpm", 101, None, 100, 102),
    "gpt2": _BPE, "hybriddna": _BPE, "whitespace": _BPE,
    "gemma4": _Tokenizer("bpe", None, None, None, None),
    "t5": _Tokenizer("ugm", None, 1, 2, None),
    "rwkv": _Tokenizer("rwkv", None, None, None, None),
    "plamo2": _Tokenizer("plamo2", 1, 2, 0, None),
    "test": _Tokenizer("test", None, None, None, None),
}
_T = "tokenizer.ggml."
_SPECIAL_ID_KEYS = ("bos_token_id", "eos_token_id", "eot_token_id", "eom_token_id", "unknown_token_id",
                    "seperator_token_id", "padding_token_id", "mask_token_id", "fim_pre_token_id", "fim_suf_token_id",
                    "fim_mid_token_id", "fim_pad_token_id", "fim_rep_token_id", "fim_sep_token_id", "prefix_token_id",
                    "suffix_token_id", "middle_token_id")


def _check_vocab(h: GGUFHeader) -> int:
    """Rules from llama_vocab::impl::load and ::tokenize; returns the vocabulary size."""
    model = _get(h, _T + "model", _STR, required=True)
    if model in ("none", "no_vocab"):
        raise RuleError(f"the file has no tokenizer ({_T}model = {shown(model)}); llama.cpp aborts when asked to tokenize")
    tok = TOKENIZERS.get(model)
    if tok is None:
        raise RuleError(f"unknown tokenizer {shown(model)} ({_T}model)")
    tokens = _get(h, _T + "tokens", _ARR, required=True)
    if h.kv_types[_T + "tokens"][1] != _STR or not tokens:
        raise RuleError(f"{_T}tokens must be a non-empty list of strings")
    n = len(tokens)
    _check_array(h, _T + "scores", (_F32, _I32), n)
    _check_array(h, _T + "token_type", (_I32,), n)
    pre = _get(h, _T + "pre", _STR)
    if tok.kind == "bpe" and model != "gemma4" and pre and pre not in gguf_known.PRE_TOKENIZERS:
        raise RuleError(f"unknown pre-tokenizer {shown(pre)} ({_T}pre)")
    if tok.kind == "bpe" and not (model == "gpt2" and pre == "kimi-k2"):
        _get(h, _T + "merges", _ARR, required=True)
        if h.kv_types[_T + "merges"][1] != _STR:
            raise RuleError(f"{_T}merges must be a list of strings")
    _check_unique(tokens)

    def special(key: str, default: int | None) -> int | None:
        # an out-of-range default is dropped, an out-of-range value from the file falls back to the default
        default = default if default is not None and default < n else None
        value = _get(h, _T + key, _U32)
        return value if value is not None and value < n else default

    for key in _SPECIAL_ID_KEYS:
        _get(h, _T + key, _U32)
    flags = {what: _get(h, f"{_T}add_{what}_token", _BOOL) for what in ("bos", "eos")}

    def add(what: str, default: bool) -> bool:
        return default if flags[what] is None else flags[what]

    bos, eos = special("bos_token_id", tok.bos), special("eos_token_id", tok.eos)
    unk, sep = special("unknown_token_id", tok.unk), special("seperator_token_id", tok.sep)
    # tokenize(add_special=True) GGML_ASSERTs every BOS/EOS/SEP it adds. The flags default per tokenizer; a BPE
    # pre-tokenizer may switch add_bos on (and gemma4 always does), so an unset BPE flag counts as on.
    needs = {
        "spm": {"BOS": add("bos", True), "EOS": add("eos", False)},
        "bpe": {"BOS": add("bos", True) or model == "gemma4", "EOS": add("eos", False)},
        "wpm": {"BOS": True, "separator": True},
        "ugm": {"BOS": add("bos", False), "EOS": add("eos", True)},
    }.get(tok.kind, {})
    for what, tid in (("BOS", bos), ("EOS", eos), ("separator", sep)):
        if needs.get(what) and tid is None:
            article = "an" if what == "EOS" else "a"
            raise RuleError(f"the {model} tokenizer adds {article} {what} token but the file has no valid {what} token "
                            "id (llama.cpp would abort on tokenize)")
    if tok.kind in ("wpm", "ugm", "rwkv") and unk is None:
        raise RuleError(f"the {model} tokenizer needs a valid {_T}unknown_token_id (llama.cpp would crash on unknown text)")
    _check_byte_tokens(tokens, h.kv.get(_T + "token_type"), model, tok)
    if tok.kind == "ugm" and _T + "precompiled_charsmap" in h.kv:
        _check_array(h, _T + "precompiled_charsmap", (_U8, _I8), 0)
        _check_charsmap(h.kv[_T + "precompiled_charsmap"])
    if tok.kind == "spm":
        # llama_vocab::byte_to_token: an SPM vocabulary falls back to <0xXX> byte tokens; a missing one throws
        # std::out_of_range through llama_tokenize and terminates the process
        have = set(tokens)
        for b in range(256):
            if f"<0x{b:02X}>" not in have and (b == 0 or bytes([b]).decode("utf-8", "surrogateescape") not in have):
                raise RuleError(f"the SPM vocabulary has no byte token <0x{b:02X}> (llama.cpp would abort on tokenize)")
    return n


_BYTE = 6  # LLAMA_TOKEN_TYPE_BYTE


def _check_byte_tokens(tokens: list[str], token_types: Any, model: str, tok: _Tokenizer) -> None:
    """Tokens typed BYTE, as llama_vocab::impl::token_to_piece / token_to_byte and the PLaMo-2 tokenizer read them."""
    types = token_types[: len(tokens)] if token_types else ()
    byte_ids = [i for i, t in enumerate(types) if t == _BYTE] if _BYTE in types else []
    if byte_ids and tok.kind == "wpm":
        raise RuleError(f"token {byte_ids[0]} has type BYTE, which the {model} tokenizer cannot render (llama.cpp would abort)")
    if tok.kind in ("spm", "ugm", "bpe"):
        for i in byte_ids:  # text.substr(3, 2) throws on a shorter text
            if len(tokens[i].partition("\0")[0].encode("utf-8", "surrogateescape")) < 3:
                raise RuleError(f"token {i} has type BYTE but its text {tokens[i]!r} is not a <0xXX> byte")
    if tok.kind == "plamo2":
        found = {int(tokens[i][3:5], 16) for i in byte_ids if i and _is_byte_text(tokens[i])}
        missing = next((b for b in range(256) if b not in found), None)
        if missing is not None:
            raise RuleError(f"the PLaMo-2 vocabulary has no BYTE token <0x{missing:02X}>")


def _is_byte_text(text: str) -> bool:
    return len(text) == 6 and text.startswith("<0x") and text.endswith(">") and all(
        c in "0123456789abcdefABCDEF" for c in text[3:5])


def _check_charsmap(blob: bytes) -> None:
    """Walk every path of a UGM tokenizer's normalization trie (an XOR-compressed double array, XCDA) the way
    llm_tokenizer_ugm_session::normalize_prefix does for any input. An index it would find out of bounds throws
    std::runtime_error out of llama_tokenize, which terminates the process."""
    import numpy as np

    xcda_size = int.from_bytes(blob[:4], "little")
    if len(blob) < 4 or xcda_size + 4 >= len(blob):
        raise RuleError(f"{_T}precompiled_charsmap is too small for its {xcda_size}-byte table")
    nodes = np.frombuffer(blob, dtype="<u4", count=xcda_size // 4, offset=4).astype(np.int64)
    replacements = np.frombuffer(blob, dtype=np.uint8, offset=4 + xcda_size)
    nul = np.flatnonzero(replacements == 0)
    last_nul = int(nul[-1]) if nul.size else -1  # a replacement must end in a NUL inside the table
    if nodes.size == 0:
        return
    base = (nodes >> 10) << ((nodes & (1 << 9)) >> 6)
    chars = np.arange(1, 256, dtype=np.int64)
    seen: set[int] = set()
    frontier = np.array([base[0]], dtype=np.int64)
    while frontier.size:
        seen.update(frontier.tolist())
        index = frontier[:, None] ^ chars[None, :]  # the node each next input byte leads to
        if index.max() >= nodes.size:
            raise RuleError(f"{_T}precompiled_charsmap leads out of its table (llama.cpp would abort on tokenize)")
        child = (nodes[index] & 0x800000FF) == chars[None, :]
        matched = index[child]
        after = matched ^ base[matched]
        leaf = after[((nodes[matched] >> 8) & 1) == 1]
        if leaf.size and (leaf.max() >= nodes.size or (nodes[leaf] & 0x7FFFFFFF).max() > last_nul):
            raise RuleError(f"{_T}precompiled_charsmap points past its replacements (llama.cpp would abort on tokenize)")
        frontier = np.array(sorted(set(after.tolist()) - seen), dtype=np.int64)


def _check_array(h: GGUFHeader, key: str, etypes: tuple[int, ...], n: int) -> None:
    if key not in h.kv:
        return
    vtype, etype = h.kv_types[key]
    if vtype != _ARR or etype not in etypes:
        raise RuleError(f"{key} must be an array of {' or '.join(_type_name(e) for e in etypes)}")
    if h.array_lengths[key] < n:
        raise RuleError(f"{key} has {h.array_lengths[key]} entries for {n} tokens")


def _check_unique(tokens: list[str]) -> None:
    """llama.cpp keys tokens by their C string (cut at NUL, empty ones renamed [EMPTY_i]) and GGML_ASSERTs that no
    two share one (src/llama-vocab.cpp: id_to_token.size() == token_to_id.size())."""
    distinct = set(tokens)
    if len(distinct) == len(tokens) and "" not in distinct and "\0" not in "".join(tokens):
        return
    first: dict[str, int] = {}
    for i, t in enumerate(tokens):
        key = t.partition("\0")[0] or f"[EMPTY_{i}]"
        if key in first:
            raise RuleError(f"tokens {first[key]} and {i} have the same text {shown(key)} (llama.cpp would abort)")
        first[key] = i
