"""A GGUF file's header as gguf_check.read_header reads it and gguf_rules.check checks it: plain records with no
reading and no rules, imported by both (gguf_check imports gguf_rules, never the other way round).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class TensorInfo:
    name: str
    dims: list[int]  # ggml order: dims[0] is the row length
    ttype: int  # ggml type id
    offset: int  # from the start of the data section


@dataclass
class GGUFHeader:
    """Everything before the tensor data. Numeric arrays longer than the reader keeps (gguf_check._KEEP_NUMBERS:
    per-token scores) and the BPE merges are skipped: their value is None, their type and length are kept. Token types
    are an array.array("i"), a precompiled charsmap is bytes."""

    version: int
    kv: dict[str, Any]
    kv_types: dict[str, tuple[int, int | None]]  # key -> (value type, element type of an array)
    array_lengths: dict[str, int]
    tensors: list[TensorInfo]
    alignment: int
    data_start: int
    file_size: int
    # sha256 of the raw bytes of each tokenizer.ggml.* array (tokens, token types, merges, scores): a tokenizer's
    # identity without decoding it (the merges are not kept, their digest is)
    digests: dict[str, str] = field(default_factory=dict)


__all__ = ["GGUFHeader", "TensorInfo"]
