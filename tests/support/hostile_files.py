"""Writers of hostile GGUF files for the validation tests (tests only).

A tiny model from `tiny.write_tiny_model` (tests/support/tiny.py) is read back into a `Doc` (metadata key/values and
tensor infos, in file order), changed, and serialized again with its tensor data section rebuilt to fit the (possibly
changed) tensor types and shapes. That makes any header value writable, including ones `gguf.GGUFWriter` refuses.

`HOSTILE` holds one writer per file that crashed llama.cpp (a signal, not a clean refusal) before edgespec checked
for it; `mutate` makes the random variations of the fuzz test.
"""

from __future__ import annotations

import copy
import math
import random
import struct
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

import numpy as np

from edgespec.llama import gguf_known
from edgespec.llama import gguf_rules

# GGUF value types (gguf.GGUFValueType)
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q", I64: "<q",
        F64: "<d"}
_MAX_FILL = 4 << 20  # tensors claiming more bytes than this are written short (the file is then truncated)
T = "tokenizer.ggml."


@dataclass
class Tensor:
    name: str
    dims: list[int]  # ggml order: dims[0] is the row length
    ttype: int
    data: bytes | None = None  # None: filled to the size that dims and ttype need


@dataclass
class Doc:
    """A GGUF file as data: kv maps key -> (value type, value); an array value is (element type, list)."""

    kv: dict[str, tuple[int, Any]]
    tensors: list[Tensor]
    version: int = 3
    alignment: int = 32
    seed: int = 0  # for the bytes of re-filled tensors

    @property
    def arch(self) -> str:
        return self.kv["general.architecture"][1]

    def set(self, key: str, value: Any, vtype: int | None = None) -> Doc:
        """Set a metadata value; the type defaults to the key's current type (U32 for a new number)."""
        if vtype is None:
            vtype = self.kv[key][0] if key in self.kv else (STR if isinstance(value, str) else U32)
        self.kv[key] = (vtype, value)
        return self

    def hp(self, name: str, value: Any, vtype: int | None = None) -> Doc:
        """Set the architecture hyperparameter `{arch}.{name}`."""
        return self.set(f"{self.arch}.{name}", value, vtype)

    def arr(self, key: str) -> list[Any]:
        return self.kv[key][1][1]

    def tensor(self, name: str) -> Tensor:
        return next(t for t in self.tensors if t.name == name)

    def retype(self, name: str, ttype: int, dims: list[int] | None = None) -> Doc:
        t = self.tensor(name)
        t.ttype, t.data = ttype, None
        if dims is not None:
            t.dims = list(dims)
        return self

    def add(self, tensor: Tensor) -> Doc:
        self.tensors.append(tensor)
        return self

    def rename_arch(self, arch: str) -> Doc:
        old = self.arch
        self.kv = {(arch + k[len(old):] if k.startswith(old + ".") else k): v for k, v in self.kv.items()}
        self.kv["general.architecture"] = (STR, arch)
        return self


@lru_cache(maxsize=8)
def _tiny_doc(items: tuple[tuple[str, Any], ...]) -> Doc:
    import gguf

    from support.tiny import write_tiny_model

    with tempfile.TemporaryDirectory() as d:
        r = gguf.GGUFReader(write_tiny_model(Path(d) / "tiny.gguf", **dict(items)))
        kv: dict[str, tuple[int, Any]] = {}
        for key, f in r.fields.items():
            if key.startswith("GGUF."):
                continue
            vtype = int(f.types[0])
            kv[key] = (ARR, (int(f.types[1]), list(f.contents()))) if vtype == ARR else (vtype, f.contents())
        tensors = [Tensor(t.name, [int(x) for x in t.shape], int(t.tensor_type), bytes(np.asarray(t.data).tobytes()))
                   for t in r.tensors]
    return Doc(kv, tensors)


def tiny_doc(**kwargs: Any) -> Doc:
    """A fresh (mutable) Doc of `write_tiny_model(**kwargs)`."""
    return copy.deepcopy(_tiny_doc(tuple(sorted(kwargs.items()))))


def spm_doc() -> Doc:
    """The tiny model with an SPM ("llama") tokenizer: its 256 byte tokens become <0xXX> byte-fallback tokens."""
    d = tiny_doc()
    d.arr(T + "tokens")[:256] = [f"<0x{b:02X}>" for b in range(256)]
    d.arr(T + "token_type")[:256] = [6] * 256  # BYTE
    return d.set(T + "model", "llama")


def shrink_vocab(d: Doc, n: int) -> Doc:
    """Keep the first `n` tokens, with embedding and output tensors to match."""
    for key in (T + "tokens", T + "token_type"):
        d.kv[key] = (ARR, (d.kv[key][1][0], d.arr(key)[:n]))
    width = d.tensor("token_embd.weight").dims[0]
    for name in ("token_embd.weight", "output.weight"):
        d.retype(name, 0, [width, n])
    return d


def with_head_size(d: Doc, head: int, n_head: int, n_kv: int) -> Doc:
    """Attention with explicit key/value lengths and tensors shaped to match (embedding width unchanged)."""
    n_embd = d.kv[f"{d.arch}.embedding_length"][1]
    for key, value in (("attention.key_length", head), ("attention.value_length", head), ("attention.head_count", n_head),
                       ("attention.head_count_kv", n_kv), ("rope.dimension_count", head)):
        d.hp(key, value)
    for t in d.tensors:
        shapes = {"attn_q": [n_embd, head * n_head], "attn_k": [n_embd, head * n_kv], "attn_v": [n_embd, head * n_kv],
                  "attn_output": [head * n_head, n_embd]}
        part = t.name.split(".")[2] if t.name.startswith("blk.") else ""
        if part in shapes and t.name.endswith(".weight"):
            d.retype(t.name, 0, shapes[part])
    return d


def t5_doc(arch: str = "t5", relative_bias: bool = True) -> Doc:
    """A tiny T5 (encoder-decoder) or T5 encoder with the tiny vocabulary: width 32, 4 heads, 2 layers each."""
    d = tiny_doc(n_head_kv=4).rename_arch(arch).hp("attention.relative_buckets_count", 32)
    n_vocab = len(d.arr(T + "tokens"))
    d.tensors = [Tensor("token_embd.weight", [32, n_vocab], 0), Tensor("output.weight", [32, n_vocab], 0)]
    for stack in ("enc", "dec") if arch == "t5" else ("enc",):
        d.tensors.append(Tensor(f"{stack}.output_norm.weight", [32], 0))
        attention = ["attn"] + (["cross_attn"] if stack == "dec" else [])
        for il in range(2):
            b = f"{stack}.blk.{il}."
            d.tensors += [Tensor(f"{b}{a}_norm.weight", [32], 0) for a in attention + ["ffn"]]
            d.tensors += [Tensor(f"{b}{a}_{x}.weight", [32, 32], 0) for a in attention for x in "qkvo"]
            d.tensors += [Tensor(b + "ffn_gate.weight", [32, 64], 0), Tensor(b + "ffn_up.weight", [32, 64], 0),
                          Tensor(b + "ffn_down.weight", [64, 32], 0)]
            if relative_bias and il == 0:
                d.tensors.append(Tensor(b + "attn_rel_b.weight", [4, 32], 0))
    return d


def charsmap(nodes: dict[int, int], size: int, replacements: bytes) -> list[int]:
    """A UGM precompiled_charsmap: an XCDA table of `size` uint32 nodes (the ones given, others 0) and then the
    NUL-terminated replacement strings, as the byte list tokenizer.ggml.precompiled_charsmap holds."""
    table = [nodes.get(i, 0) for i in range(size)]
    return list(struct.pack(f"<I{size}I", 4 * size, *table) + replacements)


# 'a' is normalized to 'b': the root's base is 256, node 256^'a' checks 'a', is a leaf, and leads to node 300
# whose value is offset 0 of the replacements. The table is two full 256-node blocks, as sentencepiece builds.
VALID_CHARSMAP = charsmap({0: 256 << 10, 256 ^ 97: (77 << 10) | (1 << 8) | 97}, 512, b"b\0")
# An 11-node table with a root base of 0: "\n" (10, tokenized at load) stays inside it, other bytes lead out.
SHORT_CHARSMAP = charsmap({0: 0}, 11, b"\0")


def serialize_parts(doc: Doc) -> tuple[bytes, bytes]:
    """The GGUF header (padded to the alignment) and the data section of `doc`."""
    out = [b"GGUF", struct.pack("<IQQ", doc.version, len(doc.tensors), len(doc.kv))]
    for key, (vtype, v) in doc.kv.items():
        out += [_value(STR, key), struct.pack("<I", vtype), _value(vtype, v)]
    rng = np.random.default_rng(doc.seed)
    blobs: list[bytes] = []
    offset = 0
    for t in doc.tensors:
        data = t.data if t.data is not None else _filler(rng, min(_nbytes(t), _MAX_FILL), t.ttype)
        out += [_value(STR, t.name), struct.pack("<I", len(t.dims)), b"".join(struct.pack("<Q", d) for d in t.dims)]
        out.append(struct.pack("<IQ", t.ttype, offset))
        pad = -len(data) % doc.alignment
        blobs.append(data + b"\0" * pad)
        offset += len(data) + pad
    head = b"".join(out)
    return head + b"\0" * (-len(head) % doc.alignment), b"".join(blobs)


def serialize(doc: Doc) -> bytes:
    return b"".join(serialize_parts(doc))


def write_doc(doc: Doc | bytes, path: str | Path) -> Path:
    path = Path(path)
    path.write_bytes(doc if isinstance(doc, bytes) else serialize(doc))
    return path


def _nbytes(t: Tensor) -> int:
    gt = gguf_rules.GGML_TYPES.get(t.ttype)
    return gguf_rules.tensor_nbytes(t.dims, gt) if gt else 64


def _value(vtype: int, v: Any) -> bytes:
    if vtype == STR:
        b = v.encode("utf-8", "surrogateescape") if isinstance(v, str) else bytes(v)
        return struct.pack("<Q", len(b)) + b
    if vtype == ARR:
        etype, items = v
        return struct.pack("<IQ", etype, len(items)) + b"".join(_value(etype, x) for x in items)
    return struct.pack(_FMT[vtype], v)


def _filler(rng: np.random.Generator, n: int, ttype: int) -> bytes:
    """Plausible tensor bytes: small floats for F32/F16, small random bytes (finite fp16 scales) otherwise."""
    if ttype == 0:
        return (rng.standard_normal(n // 4) * 0.1).astype(np.float32).tobytes()
    if ttype == 1:
        return (rng.standard_normal(n // 2) * 0.1).astype(np.float16).tobytes()
    return rng.integers(0, 64, n, dtype=np.uint8).tobytes()


# ---------------------------------------------------------------- files that crashed llama.cpp
# name -> writer. Each one killed llama.cpp with a signal (load, one-token decode, or tokenize with special tokens)
# before edgespec refused it; the comment names the llama.cpp check that fired.
HOSTILE: dict[str, Callable[[], Doc]] = {
    # ggml-cpu.c type_traits_cpu: no vec_dot for Q8_K/Q8_1/integers/F64 -> NULL call in mul_mat (SIGSEGV)
    "q8_k_weights": lambda: tiny_doc(d_model=256, d_ff=256).retype("blk.0.attn_q.weight", 15),
    "q8_1_weights": lambda: tiny_doc().retype("blk.0.ffn_up.weight", 9),
    "i32_weights": lambda: tiny_doc().retype("output.weight", 26),
    # ggml-cpu/ops.cpp get_rows: "fatal error" for Q8_K/I16 embeddings (SIGABRT)
    "q8_k_embedding": lambda: tiny_doc(d_model=256, d_ff=256).retype("token_embd.weight", 15),
    "i16_embedding": lambda: tiny_doc().retype("token_embd.weight", 25),
    # ggml-cpu/binary-ops.cpp binary_op: "unsupported types" for a non-F32 norm weight (SIGABRT)
    "f16_norm": lambda: tiny_doc().retype("blk.0.attn_norm.weight", 1),
    "q4_0_norm": lambda: tiny_doc().retype("output_norm.weight", 2),
    # src/llama-model.cpp load_hparams GGML_ASSERTs
    "block_count_0": lambda: tiny_doc().hp("block_count", 0),
    "block_count_513": lambda: tiny_doc().hp("block_count", 513),
    "nextn_over_block_count": lambda: tiny_doc().hp("nextn_predict_layers", 3),
    "experts_none_used": lambda: tiny_doc().hp("expert_count", 4),
    "experts_used_without_experts": lambda: tiny_doc().hp("expert_used_count", 2),
    "expert_groups_uneven": lambda: tiny_doc().hp("expert_count", 4).hp("expert_used_count", 2)
    .hp("expert_group_count", 3),
    "rope_scaling_unknown": lambda: tiny_doc().hp("rope.scaling.type", "bogus"),
    # ggml-cpu/ops.cpp rms_norm GGML_ASSERT(eps >= 0.0f)
    "rms_eps_nan": lambda: tiny_doc().hp("attention.layer_norm_rms_epsilon", math.nan),
    "rms_eps_negative": lambda: tiny_doc().hp("attention.layer_norm_rms_epsilon", -1e-5),
    # ggml.c ggml_flash_attn_ext GGML_ASSERT(ggml_can_mul_mat(k, q)): heads not a multiple of key/value heads
    "gqa_uneven": lambda: tiny_doc(n_head=4, n_head_kv=3),
    "gqa_more_kv_heads": lambda: tiny_doc(n_head=2, n_head_kv=4),
    "gqa_uneven_explicit_heads": lambda: with_head_size(tiny_doc(), 8, 6, 4),
    # ggml.c ggml_set_rows: zero key/value heads in one layer (per-layer array)
    "kv_heads_zero_in_layer": lambda: tiny_doc().hp("attention.head_count_kv", (U32, [2, 0]), ARR),
    # ggml.c ggml_set_rows GGML_ASSERT(a->ne[0] == b->ne[0]): the KV cache follows per-layer key/value heads, the
    # key/value projections are sized from layer 0
    "kv_heads_vary_by_layer": lambda: tiny_doc().hp("attention.head_count_kv", (U32, [2, 4]), ARR),
    "qwen2_kv_heads_vary_by_layer": lambda: tiny_doc().rename_arch("qwen2").hp("attention.head_count_kv", (U32, [2, 1]), ARR),
    # ggml-cpu/ops.cpp rope GGML_ASSERT(n_dims % 2 == 0): odd head size rotated whole
    "odd_head_size": lambda: tiny_doc(d_model=36),
    "odd_key_length": lambda: with_head_size(tiny_doc(), 7, 4, 2),
    # src/models/qwen2.cpp GGML_ASSERT(n_embd_head == n_rot)
    "qwen2_partial_rotary": lambda: tiny_doc().rename_arch("qwen2").hp("rope.dimension_count", 4),
    # ggml.c ggml_mul_mat GGML_ASSERT(!ggml_is_transposed(a)): a feed-forward of width 0 (empty tensors)
    "empty_ffn": lambda: _empty_ffn(tiny_doc()),
    # src/models/smallthinker.cpp, llada-moe.cpp: GGML_ASSERT(n_expert > 0)
    "moe_arch_without_experts": lambda: tiny_doc().rename_arch("smallthinker"),
    # ggml-cpu/ops.cpp rope: M-RoPE without sections
    "mrope_without_sections": lambda: tiny_doc().rename_arch("paddleocr"),
    # src/llama-graph.cpp GGML_ASSERT("llama_encode must be called first"): T5 decodes only after an encode
    "t5_encoder_decoder": lambda: t5_doc(),
    # src/llama-graph.cpp build_pos_bias: ggml_get_rows on layer 0's relative position bias, which
    # src/models/t5encoder.cpp loads as optional (NULL -> SIGSEGV)
    "t5encoder_without_relative_bias": lambda: t5_doc("t5encoder", relative_bias=False),
    # src/llama-model.cpp load_tensors: GGML_ASSERT, a tied NVFP4 output must not come with output scales
    "nvfp4_tied_output_with_scale": lambda: _tied_nvfp4_output_with_scale(tiny_doc(d_model=256, d_ff=256)),
    # llm_tokenizer_ugm_session::normalize_prefix: an XCDA index past the table throws std::runtime_error out of
    # llama_tokenize (std::terminate) for text other than the "\n" tokenized at load
    "ugm_charsmap_out_of_bounds": lambda: tiny_doc().set(T + "model", "t5")
    .set(T + "precompiled_charsmap", (U8, SHORT_CHARSMAP), ARR),
    # src/llama-vocab.cpp load: GGML_ASSERT(id_to_token.size() == token_to_id.size())
    "duplicate_token": lambda: _tokens(tiny_doc(), {5: "a"}),
    "token_with_nul": lambda: _tokens(tiny_doc(), {5: "a\0b"}),
    "empty_token_collides": lambda: _tokens(tiny_doc(), {5: "", 6: "[EMPTY_5]"}),
    # llama_vocab::byte_to_token: std::out_of_range through llama_tokenize -> std::terminate
    "spm_without_byte_tokens": lambda: tiny_doc().set(T + "model", "llama"),
    # llama_vocab::impl::tokenize GGML_ASSERT(tokenizer): no tokenizer at all
    "no_tokenizer": lambda: tiny_doc().set(T + "model", "none"),
    # unknown text becomes token -1 (no unknown token); token_to_piece(-1) throws -> std::terminate
    "rwkv_without_unknown_token": lambda: tiny_doc().set(T + "model", "rwkv"),
    # tokenize(add_special) GGML_ASSERTs the BOS/EOS/SEP it adds
    "bpe_adds_missing_bos": lambda: _no_key(shrink_vocab(tiny_doc(), 10), T + "bos_token_id").set(T + "add_bos_token", True),
    "bpe_adds_missing_eos": lambda: _no_key(shrink_vocab(tiny_doc(), 10), T + "eos_token_id").set(T + "add_eos_token", True, BOOL),
    # llama_vocab token_to_piece -> token_to_byte: GGML_ABORT for a BYTE token in a WPM (bert) vocabulary
    "bert_byte_token": lambda: _token_type(tiny_doc().set(T + "model", "bert"), 97, 6),
    "wpm_without_separator": lambda: shrink_vocab(tiny_doc(), 50).set(T + "model", "bert").set(T + "bos_token_id", 0),
    "gemma4_without_bos": lambda: _no_key(tiny_doc(), T + "bos_token_id").set(T + "model", "gemma4"),
}


def _empty_ffn(d: Doc) -> Doc:
    d.hp("feed_forward_length", 0)
    for t in d.tensors:
        if ".ffn_" in t.name and not t.name.endswith("norm.weight"):
            d.retype(t.name, 0, [0, t.dims[1]] if "ffn_down" in t.name else [t.dims[0], 0])
    return d


def _tied_nvfp4_output_with_scale(d: Doc) -> Doc:
    d.tensors.remove(d.tensor("output.weight"))
    d.retype("token_embd.weight", 40)  # NVFP4
    return d.add(Tensor("output.scale", [1], 0))


def _tokens(d: Doc, texts: dict[int, str]) -> Doc:
    for i, text in texts.items():
        d.arr(T + "tokens")[i] = text
    return d


def _token_type(d: Doc, i: int, ttype: int) -> Doc:
    d.arr(T + "token_type")[i] = ttype
    return d


def _no_key(d: Doc, key: str) -> Doc:
    del d.kv[key]
    return d


# ---------------------------------------------------------------- fuzzing
def base_docs() -> list[Doc]:
    """Starting points: llama (byte-level BPE), the same as qwen2, an SPM vocabulary, and a 256-wide llama whose
    rows fit the 256-element blocks of the K-quants."""
    return [tiny_doc(), tiny_doc().rename_arch("qwen2"), spm_doc(), tiny_doc(d_model=256, d_ff=256)]


def mutate(doc: Doc, rng: random.Random) -> Doc | bytes:
    """Apply one to three random mutations to `doc`; sometimes flip bytes of the serialized header as well."""
    for _ in range(rng.choice((1, 1, 2, 3))):
        try:
            rng.choice(_MUTATIONS)(doc, rng)
        except (KeyError, StopIteration, IndexError):
            pass  # an earlier mutation removed what this one changes
    if rng.random() < 0.15:
        head, data = serialize_parts(doc)
        raw = bytearray(head)
        for _ in range(rng.randint(1, 4)):
            raw[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        return bytes(raw) + data
    return doc


def _interesting(value: int, rng: random.Random) -> int:
    choice = rng.choice([0, 1, 2, 3, 7, 9, 255, 256, 512, 513, 2**31, 2**32 - 1, value + 1, value - 1, value * 2,
                         value // 2])
    return min(max(choice, 0), 2**32 - 1)


def _m_hparam(doc: Doc, rng: random.Random) -> None:
    keys = [k for k, (vt, _) in doc.kv.items() if k.startswith(doc.arch + ".") and vt in (U32, F32)]
    key = rng.choice(keys)
    vtype, value = doc.kv[key]
    if vtype == F32:
        doc.set(key, rng.choice([math.nan, -1.0, 0.0, math.inf, 1e-30, 1e30, value * 2]))
    else:
        doc.set(key, _interesting(value, rng))


def _m_hparam_type(doc: Doc, rng: random.Random) -> None:
    key = rng.choice([k for k in doc.kv if k.startswith(doc.arch + ".")])
    vtype, value = doc.kv[key]
    if vtype == U32:
        new_type = rng.choice([I32, U64, U16, F32, STR])
        doc.set(key, str(value) if new_type == STR else float(value) if new_type == F32 else value % 65536, new_type)
    else:
        doc.set(key, 8, U32)


_EXTRA_HPARAMS: list[tuple[str, Callable[[random.Random], tuple[Any, int]]]] = [
    ("expert_count", lambda r: (r.choice([0, 1, 4, 8, 2000]), U32)),
    ("expert_used_count", lambda r: (r.choice([0, 1, 2, 9]), U32)),
    ("expert_group_count", lambda r: (r.choice([0, 1, 2, 3]), U32)),
    ("expert_group_used_count", lambda r: (r.choice([0, 1, 2]), U32)),
    ("nextn_predict_layers", lambda r: (r.choice([0, 1, 2, 3]), U32)),
    ("attention.key_length", lambda r: (r.choice([0, 2, 7, 8, 16]), U32)),
    ("attention.value_length", lambda r: (r.choice([0, 4, 8, 16]), U32)),
    ("attention.key_length_swa", lambda r: (r.choice([0, 7, 8]), U32)),
    ("rope.dimension_count_swa", lambda r: (r.choice([0, 3, 8, 64]), U32)),
    ("attention.sliding_window", lambda r: (r.choice([0, 1, 4, 4096]), U32)),
    ("rope.scaling.type", lambda r: (r.choice(["none", "linear", "yarn", "longrope", "bogus", ""]), STR)),
    ("rope.scaling.factor", lambda r: (r.choice([0.0, 4.0, -1.0, math.nan]), F32)),
    ("rope.dimension_sections", lambda r: ((I32, r.choice([[0, 0, 0, 0], [2, 1, 1, 0], [1, 1]])), ARR)),
    ("attention.head_count", lambda r: ((U32, r.choice([[4, 4], [4, 0], [4, 3], [4, 4, 4]])), ARR)),
    ("attention.head_count_kv", lambda r: ((U32, r.choice([[2, 2], [2, 0], [2, 4], [1, 2]])), ARR)),
    ("feed_forward_length", lambda r: ((U32, r.choice([[64, 64], [64, 0], [64]])), ARR)),
    ("attention.layer_norm_epsilon", lambda r: (r.choice([1e-5, -1.0, math.nan]), F32)),
    ("attention.causal", lambda r: (r.choice([True, False]), BOOL)),
    ("pooling_type", lambda r: (r.choice([0, 1, 99]), U32)),
    ("vocab_size", lambda r: (r.choice([0, 10, 10**6]), U32)),
]


def _m_add_hparam(doc: Doc, rng: random.Random) -> None:
    name, make = rng.choice(_EXTRA_HPARAMS)
    value, vtype = make(rng)
    doc.hp(name, value, vtype)


def _m_drop(doc: Doc, rng: random.Random) -> None:
    keys = [k for k in doc.kv if k not in ("general.architecture", T + "tokens")]  # other mutations need these
    if rng.random() < 0.5:
        del doc.kv[rng.choice(keys)]
    elif len(doc.tensors) > 1:
        doc.tensors.pop(rng.randrange(len(doc.tensors)))


def _m_tensor_type(doc: Doc, rng: random.Random) -> None:
    t = rng.choice(doc.tensors)
    t.ttype = rng.choice([rng.randrange(46), *gguf_rules.GGML_TYPES])
    block = gguf_rules.GGML_TYPES.get(t.ttype, gguf_rules.GGML_TYPES[0]).block
    if rng.random() < 0.5 and t.dims and t.dims[0] % block:
        t.dims[0] = block * max(1, t.dims[0] // block)
    t.data = None


def _m_tensor_dims(doc: Doc, rng: random.Random) -> None:
    t = rng.choice(doc.tensors)
    dims = list(t.dims)
    op = rng.randrange(5)
    if op == 0:
        i = rng.randrange(len(dims))
        dims[i] = _interesting(dims[i], rng)
    elif op == 1:
        dims.reverse()
    elif op == 2:
        dims.append(rng.choice([1, 2]))
    elif op == 3 and len(dims) > 1:
        dims.pop()
    else:
        dims += [1] * (5 - len(dims))  # more dimensions than ggml has
    t.dims, t.data = dims, None


def _m_special_ids(doc: Doc, rng: random.Random) -> None:
    n = len(doc.arr(T + "tokens"))
    key = T + rng.choice(["bos_token_id", "eos_token_id", "unknown_token_id", "seperator_token_id",
                          "padding_token_id", "eot_token_id", "add_bos_token", "add_eos_token"])
    if key.endswith("_token"):
        doc.set(key, rng.random() < 0.5, BOOL)
    elif rng.random() < 0.2:
        doc.set(key, *rng.choice([(-1, I32), (5, U64)]))
    else:
        doc.set(key, rng.choice([0, 5, n - 1, n, n + 5, 2**32 - 1]), U32)


def _m_vocab(doc: Doc, rng: random.Random) -> None:
    tokens = doc.arr(T + "tokens")
    op = rng.randrange(6)
    i = rng.randrange(len(tokens))
    if op == 0:
        tokens[i] = tokens[rng.randrange(len(tokens))]
    elif op == 1:
        tokens[i] = rng.choice(["", "\0", "x\0y", "\udcff", "<0x41>", "[EMPTY_3]", "a" * 300])
    elif op == 2:
        shrink_vocab(doc, rng.choice([1, 10, 12, 100, 256]))
    elif op == 3:
        doc.kv[T + "tokens"] = (ARR, (STR, tokens[: rng.randrange(len(tokens))]))
    elif op == 4:
        key = rng.choice([T + "token_type", T + "merges", T + "scores", T + "precompiled_charsmap"])
        doc.set(key, (rng.choice([I32, U32, F32, STR]), [] if rng.random() < 0.5 else [1] * 10), ARR)
    elif doc.kv[T + "token_type"][1][0] == I32:
        types = doc.arr(T + "token_type")
        types[i % len(types)] = rng.choice([-1, 0, 2, 3, 5, 6, 99])


def _m_tokenizer(doc: Doc, rng: random.Random) -> None:
    if rng.random() < 0.7:
        doc.set(T + "model", rng.choice([*gguf_rules.TOKENIZERS, "none", "no_vocab", "sentencepiece"]))
    else:
        doc.set(T + "pre", rng.choice(["default", "llama3", "qwen2", "gpt-2", "kimi-k2", "bogus"]))


def _m_charsmap(doc: Doc, rng: random.Random) -> None:
    """A UGM tokenizer whose normalization table has a few bytes changed (or is cut short)."""
    table = list(VALID_CHARSMAP)
    for _ in range(rng.randint(1, 3)):
        i = rng.choice([rng.randrange(4), rng.randrange(len(table)), 4 + 4 * (256 ^ 97) + rng.randrange(4)])
        table[i] = rng.randrange(256)
    if rng.random() < 0.2:
        table = table[: rng.randrange(len(table))]
    doc.set(T + "model", "t5").set(T + "precompiled_charsmap", (U8, table), ARR)


def _m_arch(doc: Doc, rng: random.Random) -> None:
    """Half the time one of the two layouts edgespec runs, else any name (most other architectures want tensors
    or keys a llama file lacks, which llama.cpp refuses cleanly)."""
    names = ["llama", "qwen2"] if rng.random() < 0.5 else [*sorted(gguf_known.KNOWN), "gptj", "clip", "notanarch"]
    doc.rename_arch(rng.choice(names))


_MUTATIONS = [_m_hparam, _m_hparam, _m_hparam_type, _m_add_hparam, _m_add_hparam, _m_drop, _m_tensor_type,
              _m_tensor_type, _m_tensor_dims, _m_special_ids, _m_vocab, _m_tokenizer, _m_charsmap, _m_arch]
