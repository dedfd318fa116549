"""The only module that imports llama_cpp.

`Model` owns one llama.cpp model + context + batch and the single sequence in its KV cache. Its state is one number,
`n_past`: how many tokens the cache holds. `decode(tokens, start_pos, rows)` appends tokens at `start_pos`
(which must equal `n_past`: the cache is never silently out of step) and returns logits only for the requested
rows; `truncate(n_past)` rolls the cache back. Everything above this module works on token ids and numpy rows.

The file is validated with the `gguf` reader (edgespec.gguf_check) before llama.cpp sees it, and models whose
cache cannot be truncated (recurrent / hybrid architectures) are refused up front.
"""

from __future__ import annotations

import ctypes
import os
from typing import Sequence

import numpy as np

from .config import ModelSpec
from .errors import BackendError, ContextFullError
from .gguf_check import GGUFInfo, inspect_gguf

import llama_cpp as C  # noqa: E402  (after the pure imports on purpose: this is the one place)


_LOG_CB = None


def _init_llama() -> None:
    global _LOG_CB
    if _LOG_CB is not None:
        return
    verbose = os.environ.get("EDGESPEC_VERBOSE", "") not in ("", "0")

    @C.llama_log_callback
    def _log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:  # pragma: no cover - C callback
        if verbose:
            import sys

            sys.stderr.write(text.decode("utf-8", "replace"))

    _LOG_CB = _log  # keep a reference: llama.cpp holds the pointer
    C.llama_log_set(_LOG_CB, ctypes.c_void_p(0))
    C.llama_backend_init()


def default_threads() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # macOS
        return max(1, os.cpu_count() or 1)


def gpu_offload_supported() -> bool:
    _init_llama()
    return bool(C.llama_supports_gpu_offload())


class Model:
    """One GGUF model loaded in llama.cpp with a single-sequence KV cache."""

    def __init__(self, spec: ModelSpec, info: GGUFInfo | None = None) -> None:
        self.spec = spec
        self.info = info if info is not None else inspect_gguf(spec.path)
        _init_llama()
        self._model = None
        self._ctx = None
        self._batch = None

        mparams = C.llama_model_default_params()
        mparams.n_gpu_layers = spec.n_gpu_layers if spec.n_gpu_layers >= 0 else 999
        if os.environ.get("EDGESPEC_NO_REPACK", "") not in ("", "0"):
            # Workaround for CPUs that advertise AMX but fault on it with a native build (see README).
            mparams.use_extra_bufts = False
        self._model = C.llama_model_load_from_file(os.fsencode(spec.path), mparams)
        if not self._model:
            raise BackendError(f"{spec.path}: llama.cpp could not load the model (run with EDGESPEC_VERBOSE=1 for its log)")
        if C.llama_model_is_recurrent(self._model) or C.llama_model_is_hybrid(self._model):
            self.close()
            raise BackendError(
                f"{spec.path}: {self.info.architecture} is a recurrent/hybrid model whose cache cannot be rolled back; "
                "speculative decoding needs a truncatable KV cache"
            )
        self.n_threads = spec.n_threads or default_threads()
        n_ctx = spec.n_ctx
        n_batch = min(spec.n_batch, n_ctx)
        cparams = C.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        cparams.no_perf = True
        cparams.swa_full = True  # sliding-window models keep the full cache so that rollback is always possible
        self._ctx = C.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            self.close()
            raise BackendError(f"{spec.path}: llama.cpp could not create a context of {n_ctx} tokens")
        self._mem = C.llama_get_memory(self._ctx)
        self.n_ctx = min(n_ctx, int(C.llama_n_ctx(self._ctx)))  # llama.cpp may round up; the request is the limit
        self.n_batch = n_batch
        self._vocab = C.llama_model_get_vocab(self._model)
        self.n_vocab = int(C.llama_vocab_n_tokens(self._vocab))
        self.bos = int(C.llama_vocab_bos(self._vocab))
        self.eos = int(C.llama_vocab_eos(self._vocab))
        self.add_bos = bool(C.llama_vocab_get_add_bos(self._vocab))
        self.eog_ids = frozenset(i for i in self._special_candidates() if C.llama_vocab_is_eog(self._vocab, i))
        self._batch = C.llama_batch_init(n_batch, 0, 1)
        # Every slot belongs to sequence 0; set once. Token/pos/logits arrays are numpy views over the C batch.
        for i in range(n_batch):
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(n_batch,))
        self._want = np.ctypeslib.as_array(self._batch.logits, shape=(n_batch,))
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self.cached: list[int] = []  # the token ids the KV cache holds, in order
        self.n_decoded = 0  # tokens pushed through llama_decode since load (a work counter for tests and stats)

    @property
    def n_past(self) -> int:
        return len(self.cached)

    def common_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading `tokens` the cache already holds (the reusable prefix)."""
        n = 0
        for a, b in zip(self.cached, tokens):
            if a != b:
                break
            n += 1
        return n

    def sync(self, tokens: Sequence[int], rows: Sequence[int] = (-1,)) -> np.ndarray:
        """Make the cache hold exactly `tokens`, decoding only what is not cached already (common-prefix reuse),
        and return logits for `rows` of the newly decoded part. At least the last token is always decoded when
        rows are wanted, so its logits are fresh."""
        keep = self.common_prefix(tokens)
        if rows and keep == len(tokens):
            keep -= 1
        self.truncate(keep)
        return self.decode(list(tokens[keep:]), keep, rows) if len(tokens) > keep else np.empty((0, self.n_vocab), np.float32)

    # ----------------------------------------------------------------- facts
    @property
    def name(self) -> str:
        return self.info.name or os.path.basename(self.spec.path)

    @property
    def chat_template(self) -> str | None:
        ptr = C.llama_model_chat_template(self._model, None)
        return ptr.decode("utf-8") if ptr else None

    def describe(self) -> str:
        buf = ctypes.create_string_buffer(256)
        C.llama_model_desc(self._model, buf, len(buf))
        return buf.value.decode("utf-8", "replace")

    def _special_candidates(self) -> Sequence[int]:
        # Specials (control/user-defined tokens) sit at the ends of real vocabularies; checking every id of a
        # 152k vocabulary through ctypes costs ~0.1 s, which is acceptable once per load.
        return range(self.n_vocab)

    def is_eog(self, token: int) -> bool:
        return token in self.eog_ids

    # ----------------------------------------------------------------- text
    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        n_max = len(data) + 16
        buf = (C.llama_token * n_max)()
        n = C.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            n_max = -n
            buf = (C.llama_token * n_max)()
            n = C.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            raise BackendError("tokenization failed")
        return list(buf[:n])

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 character). Control tokens render as b'' unless
        `special`."""
        key = (int(token), special)
        hit = self._pieces.get(key)
        if hit is not None:
            return hit
        buf = ctypes.create_string_buffer(64)
        n = C.llama_token_to_piece(self._vocab, int(token), buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self._vocab, int(token), buf, len(buf), 0, special)
        self._pieces[key] = out = buf.raw[:n]
        return out

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return b"".join(self.token_bytes(t, special=special) for t in tokens).decode("utf-8", "replace")

    # ----------------------------------------------------------------- compute
    def decode(self, tokens: Sequence[int], start_pos: int, rows: Sequence[int] = (-1,)) -> np.ndarray:
        """Append `tokens` at positions start_pos.. and return float32 logits for the requested `rows` (indices into
        `tokens`, negative allowed), shape (len(rows), n_vocab). llama.cpp computes output only for those rows.
        `start_pos` must equal `n_past` (call `truncate` first to rewrite history)."""
        n = len(tokens)
        if start_pos != self.n_past:
            raise BackendError(f"decode at position {start_pos} but the cache holds {self.n_past} tokens")
        if n == 0:
            if rows:
                raise BackendError("no tokens to decode")
            return np.empty((0, self.n_vocab), dtype=np.float32)
        if start_pos + n > self.n_ctx:
            raise ContextFullError(f"context full: {start_pos + n} tokens do not fit in n_ctx={self.n_ctx}")
        want = sorted({r % n if -n <= r < n else _bad_row(r, n) for r in rows})
        order = {r: i for i, r in enumerate(want)}
        out = np.empty((len(want), self.n_vocab), dtype=np.float32)
        toks = np.asarray(tokens, dtype=np.int32)
        if toks.min() < 0 or toks.max() >= self.n_vocab:
            raise BackendError(f"token id out of range [0, {self.n_vocab})")
        for c0 in range(0, n, self.n_batch):
            c1 = min(n, c0 + self.n_batch)
            m = c1 - c0
            self._tok[:m] = toks[c0:c1]
            self._pos[:m] = np.arange(start_pos + c0, start_pos + c1, dtype=np.int32)
            self._want[:m] = 0
            chunk_rows = [r for r in want if c0 <= r < c1]
            for r in chunk_rows:
                self._want[r - c0] = 1
            self._batch.n_tokens = m
            rc = C.llama_decode(self._ctx, self._batch)
            if rc != 0:
                # Leave the cache consistent: drop whatever part of this call may have been stored.
                C.llama_memory_seq_rm(self._mem, 0, self.n_past, -1)
                raise BackendError(f"llama_decode failed with code {rc}")
            self.cached.extend(int(t) for t in toks[c0:c1])
            self.n_decoded += m
            for r in chunk_rows:
                ptr = C.llama_get_logits_ith(self._ctx, r - c0)
                out[order[r]] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
        if list(rows) == want:
            return out
        return out[[order[r % n] for r in rows]]

    def truncate(self, n_past: int) -> None:
        """Forget every cached token at position >= n_past."""
        if n_past < 0 or n_past > self.n_past:
            raise BackendError(f"cannot truncate to {n_past}: the cache holds {self.n_past} tokens")
        if n_past == self.n_past:
            return
        if not C.llama_memory_seq_rm(self._mem, 0, n_past, -1):
            raise BackendError(f"llama.cpp could not truncate the cache to {n_past} tokens")
        del self.cached[n_past:]

    def reset(self) -> None:
        C.llama_memory_clear(self._mem, True)
        self.cached.clear()

    # ----------------------------------------------------------------- lifetime
    def close(self) -> None:
        if self._batch is not None:
            C.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            C.llama_free(self._ctx)
            self._ctx = None
        if self._model is not None:
            C.llama_model_free(self._model)
            self._model = None

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


def _bad_row(r: int, n: int) -> int:
    raise BackendError(f"logits row {r} is outside the {n} tokens decoded")
