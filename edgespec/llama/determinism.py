"""Deterministic mode (ModelSpec.deterministic): the llama.cpp settings under which every decode of a position gives
bit-identical logits whatever else is in the batch, and the load-time check that they hold (docs/determinism.md).

What makes a position's logits depend on its batch in llama.cpp's CPU backend, and what this mode does about it:
- repacked weights (extra buffer types): their matrix products take rows in blocks of 4 (gemm) and the rest one by
  one (gemv), which round differently: off (llama_model_params.use_extra_bufts);
- the tiled K-quant matrix product, taken from 8 rows on: off (GGML_CPU_TILED_MM=0, read by ggml once per process,
  at its first K-quant product: set here before the model loads);
- attention without flash attention (the scores' product takes a batched kernel from 2 rows on): flash attention on;
- flash attention over an F16/F32 cache splits the cache in chunks per thread for a lone query from 512 cells on, and
  tiles queries from a few rows on: a q8_0 KV cache, which flash attention reads in one pass per row in every case;
- a unified cache holds several sequences' cells interleaved, and a cell freed by one sequence's rollback can take
  another's next token ahead of its earlier ones (attention sums cells in cell order): one cache stream per sequence,
  so token trees (which share cells between sequences) are off.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from edgespec.errors import BackendError, ConfigError
from .binding import C

TILED_ENV = "GGML_CPU_TILED_MM"
CHECK_PREFIX = 8  # the check's cached tokens before the position it decodes alone and in a batch
CHECK_BATCH = 9  # the batch it decodes that position in (past the tiled product's 8 rows)


def prepare_process() -> None:
    """Before the model loads: ggml's tiled K-quant product off for this process (it reads the variable once)."""
    os.environ[TILED_ENV] = "0"


def model_params(mparams: Any) -> None:
    """llama_model_params of a deterministic model: no repacked weight buffers."""
    mparams.use_extra_bufts = False


def context_params(cparams: Any, tree_paths: int, head_dim: int) -> None:
    """llama_context_params of a deterministic context: flash attention, a q8_0 KV cache, one stream per sequence.
    ConfigError for token trees, or heads whose size a q8_0 cache cannot hold (a multiple of 32 values)."""
    if head_dim % 32:
        raise ConfigError(f"deterministic mode needs attention heads of a multiple of 32 values (its q8_0 cache); "
                          f"this model's have {head_dim}")
    if tree_paths:
        raise ConfigError("deterministic mode verifies chains only: token trees share cache cells between sequences "
                          "(use a chain drafter: model, ngram, model+ngram)")
    cparams.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_ENABLED
    cparams.type_k = C.GGML_TYPE_Q8_0
    cparams.type_v = C.GGML_TYPE_Q8_0
    cparams.kv_unified = False


def kv_bytes_per_value(deterministic: bool) -> float:
    """Bytes per cached key or value element: q8_0 (34 bytes per 32) in deterministic mode, else f16."""
    return 34 / 32 if deterministic else 2.0


def _decode(ctx: Any, seq: int, start: int, tokens: list[int], want: tuple[int, ...]) -> np.ndarray | None:
    ctx.put_chain(0, seq, start, tokens, want)
    if ctx.decode_batch(len(tokens)) != 0:
        raise BackendError(f"{ctx.name}: llama.cpp could not decode the deterministic mode's check")
    return ctx.logits_row(0).copy() if want else None


def check_invariance(ctx: Any) -> None:
    """Decode one position alone and as the first row of a 9-token batch (its own continuation, and, with several
    slots, another slot's tokens) in `ctx` (a context.Context: context.py calls this once it is created):
    ConfigError unless the logits are bit-identical (a backend or build whose kernels
    depend on the batch: a GPU's, or GGML_CPU_TILED_MM read before this model loaded). The cache is left empty."""
    if ctx.n_batch < CHECK_BATCH or ctx.n_ctx < CHECK_PREFIX + CHECK_BATCH:
        return  # too small a context to check (tests' toy sizes)
    toks = [(7 * i + 11) % ctx.n_vocab for i in range(CHECK_PREFIX + CHECK_BATCH)]
    other = 1 + ctx.tree_paths if ctx.parallel > 1 else None
    worst = 0.0
    with ctx.pinned_threads():
        try:
            _decode(ctx, 0, 0, toks[:CHECK_PREFIX], ())
            alone = _decode(ctx, 0, CHECK_PREFIX, toks[CHECK_PREFIX:CHECK_PREFIX + 1], (0,))
            for with_other in (False, True) if other is not None else (False,):
                ctx.seq_rm(0, CHECK_PREFIX, -1)
                if with_other:  # row 0 here, the other slot's 8 tokens after it, in one llama_decode
                    ctx.put_chain(0, 0, CHECK_PREFIX, toks[CHECK_PREFIX:CHECK_PREFIX + 1], (0,))
                    ctx.put_chain(1, int(other or 0), 0, toks[1:CHECK_BATCH], ())
                    if ctx.decode_batch(CHECK_BATCH) != 0:
                        raise BackendError(f"{ctx.name}: llama.cpp could not decode the deterministic mode's check")
                    got = ctx.logits_row(0).copy()
                else:
                    got = _decode(ctx, 0, CHECK_PREFIX, toks[CHECK_PREFIX:], (0,))
                assert alone is not None and got is not None
                worst = max(worst, float(np.max(np.abs(alone - got))))
        finally:
            ctx.seq_rm(0, -1, -1)
            if other is not None:
                ctx.seq_rm(other, -1, -1)
    if worst != 0.0:
        raise ConfigError(
            f"deterministic mode: {ctx.name} gives different logits for one position decoded alone and in a batch "
            f"(up to {worst:.3g}): the mode holds on llama.cpp's CPU backend (no GPU layers, no RPC) for K-quant, Q4_1 "
            f"and Q5_1 weights (F32, F16, BF16, Q8_0, Q4_0, Q5_0 and IQ4_NL take llamafile's batched kernels), with "
            f"{TILED_ENV}=0 read before the process's first batched decode (docs/determinism.md)"
        )


__all__ = ["CHECK_BATCH", "TILED_ENV", "check_invariance", "context_params", "kv_bytes_per_value", "model_params", "prepare_process"]
