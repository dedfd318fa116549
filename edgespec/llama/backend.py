"""llama.cpp's model API: the one module that calls it for models, contexts and decoding (llama.py loads the
library; rpc.py places layers on RPC servers).

`Model` owns one llama.cpp model + context + batch and the single sequence in its KV cache. Its state is the list
of token ids the cache holds, `cached` (n_past = its length). `decode(tokens, start_pos, rows)` appends tokens at
`start_pos` (which must equal `n_past`: the cache is never silently out of step) and returns logits only for the
requested rows; `truncate(n_past)` rolls the cache back; `sync(tokens)` makes the cache hold exactly `tokens`,
decoding only what it does not hold already.

Bookkeeping survives any exception (a Ctrl-C, an error raised by a test after any llama.cpp call): `cached` is
always a prefix of what llama.cpp holds, never more. Growing, llama.cpp decodes first and `cached` grows after;
shrinking, `cached` shrinks first and llama.cpp after; and every decode first drops whatever llama.cpp holds past
`cached` (an interrupted step's leftovers). Whatever lands between a llama.cpp call and the bookkeeping, the next
call starts from a consistent cache.

`PromptCache` (prompt_cache.py) keeps snapshots of a cache's contents (llama_state_seq_get_data) in host memory, so that a
conversation the engine left for another is restored instead of decoded again (`sync` swaps by content).

The file is validated with edgespec.llama.gguf_check before llama.cpp sees it, and models whose cache cannot be
truncated (recurrent / hybrid architectures) are refused up front.
"""

from __future__ import annotations

import contextlib
import copy
import ctypes
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from edgespec.config import MAX_SEQUENCES, ModelSpec, check_slots_fit, check_tree_fits
from edgespec.decoding.constraint import Vocabulary
from edgespec.errors import BackendError, ConfigError, ContextFullError, EngineClosedError, StopRequested, non_finite_logits
from .gguf_check import GGUFInfo, inspect_gguf
from edgespec.prompts.infill import FimTokens, InfillVocab
from .prompt_cache import PromptCache, common_prefix
from .threads import ThreadTuner, candidate_counts
from . import rpc
from .binding import C  # after the pure imports on purpose: loading the library can fail (one BackendError)

_LOG_CB = None
_LOCAL_CALL = contextlib.nullcontext()  # reusable: what Model._remote gives a local model's calls
RPC_SLOW_FACTOR = 4.0  # an RPC decode of n tokens may take the timeout plus this many times n x the recent median per token
RPC_RECENT = 64  # decodes that allowance looks back on
_INIT_LOCK = threading.Lock()
# tokens that text parsed with parse_special becomes (llama.cpp matches control and unknown ones only then; unused
# ones too, to be safe): what a message content must never turn into
_PARSED_SPECIAL = C.LLAMA_TOKEN_ATTR_CONTROL | C.LLAMA_TOKEN_ATTR_UNKNOWN | C.LLAMA_TOKEN_ATTR_UNUSED
# Texts longer than this many bytes are tokenized in pieces cut where llama.cpp's own special-token partition cuts
# (SpecialSplitter): its partition walks a list from its start for every special token it finds, so one call on a
# text of n special tokens costs O(n^2) (40k of them: 2.9 s, 200k: 76 s); pieces of this size cost ~1 ms each.
TOKENIZE_PIECE_BYTES = 4096
_SPACE = frozenset(b" \t\n\v\f\r")  # C isspace() in the C locale: what LSTRIP/RSTRIP tokens strip


def _init_llama() -> None:
    global _LOG_CB
    with _INIT_LOCK:
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
    """Whether this machine has a GPU to offload to (an RPC server's devices do not count)."""
    _init_llama()
    return rpc.local_gpu()


class SpecialSplitter:
    """Where a UTF-8 text may be cut so that llama.cpp tokenizes the pieces, one call each, into exactly the ids of
    the whole text (its tokenizer_st_partition cuts the text at special-token matches, then tokenizes each raw
    fragment on its own; add_special only adds tokens around the whole).

    texts: the text of every token the partition looks for (control, unknown and user-defined tokens with
    parse_special, user-defined ones only without) -> whether one of those tokens has the LSTRIP attribute.

    A cut at byte p is safe when a token text starts at p, no token text occurrence straddles p, every occurrence
    that overlaps the longest one at p starts at p, and no whitespace next to p can be stripped across it (text[p]
    is not a space; text[p-1] is not one when a token at p strips to its left). Then, whatever the order in which
    llama.cpp tries its tokens, every match and strip lies on one side of p, the token at p is matched at p in both
    the whole text and the right piece, and the right piece starts with that token (the SPM space prefix, given
    after every special token, is the same)."""

    def __init__(self, texts: dict[bytes, bool]) -> None:
        self.texts = {t: ls for t, ls in texts.items() if t}
        self.lengths = sorted({len(t) for t in self.texts}, reverse=True)
        self.longest = self.lengths[0] if self.lengths else 0
        order = sorted(self.texts, key=len, reverse=True)
        self.pattern = re.compile(b"|".join(re.escape(t) for t in order)) if order else None

    def _longest_at(self, data: bytes, s: int) -> int:
        for n in self.lengths:
            if s + n <= len(data) and data[s:s + n] in self.texts:
                return n
        return 0

    def safe(self, data: bytes, p: int) -> bool:
        """Whether a cut at byte p is safe (see the class docstring)."""
        if p <= 0 or p >= len(data) or data[p] in _SPACE:
            return False
        longest = self._longest_at(data, p)
        if longest == 0:
            return False
        if data[p - 1] in _SPACE and any(p + n <= len(data) and self.texts.get(data[p:p + n]) for n in self.lengths):
            return False
        for s in range(max(0, p - self.longest + 1), p):  # an occurrence that straddles p
            for n in self.lengths:
                if s + n > p and s + n <= len(data) and data[s:s + n] in self.texts:
                    return False
        return not any(self._longest_at(data, s) for s in range(p + 1, min(len(data), p + longest)))

    def cuts(self, data: bytes, size: int) -> list[int]:
        """Safe cuts about `size` bytes apart (none where the text has no safe place: it is then one piece)."""
        out: list[int] = []
        if self.pattern is None:
            return out
        start = 0
        while len(data) - start > size:
            q = start + size
            while True:
                m = self.pattern.search(data, q)
                if m is None:
                    return out
                if self.safe(data, m.start()):
                    break
                q = m.start() + 1
            start = m.start()
            out.append(start)
        return out


class _VocabUse:
    """Vocabulary calls (any number at once, from any thread: llama.cpp's tokenizer is read-only) against the
    model's release: `release_when_idle` frees at once when no call is in progress, else after a short wait, else
    when the last call in progress returns (the owner has marked the model closed first, so no new call starts)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._users = 0
        self._pending: Callable[[], None] | None = None

    @contextlib.contextmanager
    def use(self) -> Iterator[None]:
        with self._cond:
            self._users += 1
        try:
            yield
        finally:
            with self._cond:
                self._users -= 1
                run, self._pending = (self._pending, None) if self._users == 0 else (None, self._pending)
                self._cond.notify_all()
            if run is not None:
                run()

    def release_when_idle(self, free: Callable[[], None], wait: float) -> bool:
        """free() now if no call is in progress within `wait` seconds (True), else when the last one ends (False)."""
        deadline = time.monotonic() + wait
        with self._cond:
            while self._users and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            if self._users:
                self._pending = free
                return False
        free()
        return True


@dataclass(frozen=True)
class DecodePart:
    """One view's share of a batched decode (Model.decode_parts): a chain of `tokens` appended at the view's n_past
    (start_pos, when given, must equal it) with logits for `rows`; or, with depths and seq_ids, a token tree laid out
    as for decode_tree."""

    view: "Model"
    tokens: Sequence[int]
    rows: Sequence[int] = (-1,)
    start_pos: int | None = None
    depths: Sequence[int] | None = None
    seq_ids: Sequence[Sequence[int]] | None = None


def available_memory() -> int | None:
    """Bytes of memory this machine can still give (MemAvailable; None where the system does not say)."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def fit_parallel(spec: ModelSpec, most: int, tree_paths: int) -> int:
    """The most slots, up to `most`, whose sequences one context allows (config.check_slots_fit), at least 1."""
    per = 1 + tree_paths
    return max(1, min(most, MAX_SEQUENCES // per, min(spec.n_batch, spec.n_ctx) // per))


def check_cache_memory(need: int, parallel: int, n_ctx: int) -> None:
    """ConfigError, before llama.cpp allocates, when a cache of `need` bytes (parallel slots of n_ctx tokens) would
    take more than 90% of the memory the machine has available (llama.cpp would fail, or the system kill us later)."""
    have = available_memory()
    if have is not None and need > 0.9 * have:
        gib = 2**30
        raise ConfigError(
            f"{parallel} slot(s) of {n_ctx} tokens need a {need / gib:.1f} GiB KV cache, but this machine has "
            f"{have / gib:.1f} GiB available: lower parallel (--parallel) or the context (--ctx-size)"
        )


def _bad_row(r: int, n: int) -> int:
    raise BackendError(f"logits row {r} is outside the {n} tokens decoded")


class Model:
    """One GGUF model loaded in llama.cpp with a single-sequence KV cache (see the module docstring).

    Thread use: one thread at a time may compute (decode/truncate/sync/reset: the engine's worker); the vocabulary
    functions (tokenize, token_bytes, detokenize) may be called from any thread, at once, and `close` waits for them
    (a long text is tokenized in pieces: close waits for one piece, and the rest raises EngineClosedError).
    """

    def __init__(
        self, spec: ModelSpec, info: GGUFInfo | None = None, *, prompt_cache_bytes: int = 0, tree_paths: int = 0,
        parallel: int = 1,
    ) -> None:
        if tree_paths > 0:
            check_tree_fits(spec, int(tree_paths))  # before loading: llama.cpp aborts the process on a smaller batch
        auto = parallel < 0  # -n: as many slots as fit, up to n
        if auto:
            parallel = fit_parallel(spec, -int(parallel), int(tree_paths))
        check_slots_fit(spec, int(parallel), int(tree_paths))
        self.spec = spec
        self._primary = self  # a slot view (slot()) points at the Model that owns the context
        self._seq = 0  # this view's main llama.cpp sequence; its tree paths are _seq + 1 .. _seq + tree_paths
        self.parallel = int(parallel)
        self.info = info if info is not None else inspect_gguf(spec.path)
        _init_llama()
        self._closing = False
        self._model: Any = None
        self._ctx: Any = None
        self._batch: Any = None
        self._vocab_use = _VocabUse()  # vocabulary calls vs close
        self._splitters: dict[bool, SpecialSplitter] = {}

        mparams = C.llama_model_default_params()
        ngl = spec.n_gpu_layers
        self._rpc: tuple[str, ...] = ()
        self._rpc_timeout = 0.0  # seconds a call to the RPC servers may take (rpc.WATCHDOG), read once at load
        self._rpc_token_seconds: list[float] = []  # an RPC model's recent decodes: seconds per token (the decode's allowance)
        if spec.rpc:  # the layers go to the RPC servers' devices (then this machine's GPUs): rpc.py
            self._rpc_timeout = rpc.timeout()  # a bad EDGESPEC_RPC_TIMEOUT: one ConfigError now, before anything is held
            # probed first (llama.cpp aborts on a server it cannot reach), within the RPC timeout where it is shorter
            self._rpc_devices, _ = rpc.model_devices(spec.rpc, min(rpc.PROBE_TIMEOUT, self._rpc_timeout))
            self._rpc = spec.rpc
            mparams.devices = ctypes.cast(self._rpc_devices, ctypes.c_void_p)
            ngl = -1 if ngl == 0 else ngl
        if spec.tensor_split:
            self._split = self._tensor_split(spec)  # kept alive until the load
            mparams.tensor_split = ctypes.cast(self._split, ctypes.POINTER(ctypes.c_float))
        mparams.n_gpu_layers = ngl if ngl >= 0 else 999
        if os.environ.get("EDGESPEC_NO_REPACK", "") not in ("", "0"):
            # Workaround for CPUs that advertise AMX but fault on it with a native build (see docs/setup.md).
            mparams.use_extra_bufts = False
        with self._remote(rpc.LOADING, rpc.load_seconds(spec.path, self._rpc_timeout) if self._rpc else None):
            self._model = C.llama_model_load_from_file(os.fsencode(spec.path), mparams)
        if not self._model:
            self._free()
            if spec.rpc:
                raise BackendError(f"{spec.path}: llama.cpp could not load the model onto RPC server(s) {', '.join(spec.rpc)}: does each have "
                                   "the memory for its share of the layers? (their own logs say; `edgespec info --rpc` shows their free "
                                   "memory; --tensor-split and --n-gpu-layers N move layers; EDGESPEC_VERBOSE=1 shows llama.cpp's log)")
            raise BackendError(f"{spec.path}: llama.cpp could not load the model (run with EDGESPEC_VERBOSE=1 for its log)")
        if C.llama_model_is_recurrent(self._model) or C.llama_model_is_hybrid(self._model):
            self.close()
            raise BackendError(
                f"{spec.path}: {self.info.architecture} is a recurrent/hybrid model whose cache cannot be rolled back; "
                "speculative decoding needs a truncatable KV cache"
            )
        self.n_threads = spec.n_threads or default_threads()
        # Threads follow the machine's load (threads.py) unless the user fixed them, or the weights are all on a GPU
        # (CPU threads then hardly matter and their timings say nothing about the load).
        auto = spec.n_threads is None and not (ngl < 0 and (spec.rpc or gpu_offload_supported()))
        cands = candidate_counts(self.n_threads) if auto else (self.n_threads,)
        self.tuner: ThreadTuner | None = ThreadTuner(cands) if len(cands) > 1 else None
        self._threads_now = self.n_threads
        self._pinned = False
        n_ctx = spec.n_ctx
        n_batch = min(spec.n_batch, n_ctx)
        if not (ngl != 0 and (spec.rpc or gpu_offload_supported())):  # the cache lives in this machine's memory
            try:
                per_slot = self.kv_bytes_per_token() * n_ctx
                have = available_memory()
                if auto and have is not None:  # the default: no more slots than a quarter of the free memory holds
                    self.parallel = max(1, min(self.parallel, int(0.25 * have) // max(1, per_slot)))
                check_cache_memory(per_slot * self.parallel, self.parallel, n_ctx)
            except BaseException:
                self.close()
                raise
        cparams = C.llama_context_default_params()
        cparams.n_ctx = n_ctx * self.parallel  # every slot may hold n_ctx cells (one unified cache for all)
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        # tree_paths > 0: token trees are verified with one sequence per root-to-leaf path (1..tree_paths) beside the
        # main sequence 0, in one unified cache (the paths share the context's cells)
        self.tree_paths = max(0, int(tree_paths))
        self._tree: tuple[int, int] | None = None  # (start, paths) of the last decode_tree
        self._tree_seqs = False  # tree sequences may hold cells (from decode_tree until they are dropped)
        # each slot s holds sequences s * (1 + tree_paths) .. s * (1 + tree_paths) + tree_paths
        cparams.n_seq_max = self.parallel * (1 + self.tree_paths)
        cparams.kv_unified = cparams.n_seq_max > 1
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        cparams.no_perf = True
        cparams.swa_full = True  # sliding-window models keep the full cache so that rollback is always possible
        with self._remote("allocating the context"):
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
        # every id of the vocabulary through ctypes costs ~0.1 s on a 152k vocabulary: acceptable once per load
        self.eog_ids = frozenset(i for i in range(self.n_vocab) if C.llama_vocab_is_eog(self._vocab, i))
        self._batch = C.llama_batch_init(n_batch, 0, cparams.n_seq_max)
        # Every batch entry belongs to one sequence, 0 at first; _batch_seq mirrors the entries' sequence ids so that a
        # decode rewrites only those that differ (_use_seq). Token/pos/logits arrays are numpy views over the C batch.
        for i in range(n_batch):
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = 0
        self._batch_seq = np.zeros(n_batch, dtype=np.int32)
        self._tok = np.ctypeslib.as_array(self._batch.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(self._batch.pos, shape=(n_batch,))
        self._want = np.ctypeslib.as_array(self._batch.logits, shape=(n_batch,))
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self._constraint_vocab: Vocabulary | None = None
        self._infill_vocab: InfillVocab | None = None
        self.cached: list[int] = []  # the token ids the KV cache holds, in order (a prefix of llama.cpp's content)
        self._n_decoded = 0  # tokens pushed through llama_decode since load, all slots (n_decoded)
        self._decode_seconds = 0.0  # seconds inside llama_decode since load, all slots (decode_seconds)
        self._views: dict[tuple[int | None, int], np.ndarray] = {}  # _logits_view: arrays over llama.cpp's logits buffer
        # every decode checks that its rows are finite (one pass over each row) unless the caller checks them itself
        # while it samples them (the engine's loop: sampling.NonFiniteLogitsError, re-raised as this model's BackendError)
        self.check_logits = True
        self.prompt_cache = PromptCache(prompt_cache_bytes) if prompt_cache_bytes > 0 else None
        self._slots: list[Model] = [self]

    # ----------------------------------------------------------------- slots
    def slot(self, i: int) -> "Model":
        """Slot i's view of this context (0 <= i < parallel): the same model, vocabulary, batch and prompt cache,
        with its own sequences and its own `cached` tokens. Slot 0 is this object. Every method works on a view as
        on the model, for that slot's sequences alone; closing a view does nothing (the owner frees the context)."""
        primary = self._primary
        if not 0 <= i < primary.parallel:
            raise BackendError(f"slot {i} does not exist: the model was loaded with parallel={primary.parallel}")
        while len(primary._slots) <= i:
            view = copy.copy(primary)
            view._seq = len(primary._slots) * (1 + primary.tree_paths)
            view.cached, view._tree, view._tree_seqs = [], None, False
            primary._slots.append(view)
        return primary._slots[i]

    @property
    def n_decoded(self) -> int:
        """Tokens pushed through llama_decode since load, in every slot of the context (a work counter for tests and stats)."""
        return int(self._primary.__dict__.get("_n_decoded", 0))

    @n_decoded.setter
    def n_decoded(self, n: int) -> None:
        self._primary._n_decoded = n

    @property
    def decode_seconds(self) -> float:
        """Seconds spent inside llama_decode since load, in every slot of the context: what a generation's wall time
        less this is the engine's own (host) work."""
        return float(self._primary.__dict__.get("_decode_seconds", 0.0))

    @property
    def slot_index(self) -> int:
        return self._seq // (1 + self.tree_paths)

    def _use_seq(self, m: int) -> None:
        """The first m batch entries belong to this view's main sequence (each alone)."""
        p = self._primary
        bs = p._batch_seq
        for i in np.flatnonzero(bs[:m] != self._seq).tolist():
            self._batch.n_seq_id[i] = 1
            self._batch.seq_id[i][0] = self._seq
        bs[:m] = self._seq

    def kv_bytes_per_token(self) -> int:
        """The KV cache's bytes per token of context (f16 keys and values of every layer's KV heads)."""
        n_head = max(1, int(C.llama_model_n_head(self._model)))
        head_dim = int(C.llama_model_n_embd(self._model)) // n_head
        return 2 * 2 * int(C.llama_model_n_layer(self._model)) * int(C.llama_model_n_head_kv(self._model)) * head_dim

    # ----------------------------------------------------------------- threads
    @property
    def threads_now(self) -> int:
        """The thread count llama.cpp uses for the next small decode."""
        return self.tuner.current if self.tuner is not None else self.n_threads

    def threads_info(self) -> dict[str, Any]:
        """How threads are chosen: {"mode": "fixed", "current": n} or the tuner's description."""
        if self.tuner is None:
            return {"mode": "fixed", "current": self.n_threads}
        return self.tuner.describe()

    @contextlib.contextmanager
    def pinned_threads(self) -> Iterator[None]:
        """Within the block every decode runs with the current count and teaches the tuner nothing (cost
        measurements compare batch sizes, not thread counts)."""
        p = self._primary
        old, p._pinned = p._pinned, True
        try:
            yield
        finally:
            p._pinned = old

    def warm_threads(self) -> None:
        """Let the tuner compare its thread counts on a few single-token decodes (at load, before the costs are
        measured at the count it then prefers); the cache is left empty. Nothing to do with a fixed count."""
        if self.tuner is None:
            return
        self.reset()
        base = [self.bos if 0 <= self.bos < self.n_vocab else 0]
        self._decode(base, 0, (), None, None)
        for i in range(2 * len(self.tuner.candidates) + 2):
            if self.n_past + 1 > self.n_ctx:
                break
            self._decode([(7 * i + 11) % self.n_vocab], self.n_past, (), None, None)
        self.reset()

    def _llama_decode(self, batch: Any, n: int) -> int:
        """llama_decode with the thread count the tuner picks for a batch of n tokens, timed for it."""
        p = self._primary  # the context's thread count is the owner's (every view decodes on one context)
        tuner = None if p._pinned else self.tuner
        now = time.perf_counter()
        t = tuner.choose(n, now) if tuner is not None else self.threads_now
        if t != p._threads_now:
            C.llama_set_n_threads(self._ctx, t, t)
            p._threads_now = t
        t0 = time.perf_counter()
        with self._remote("a decode", self._rpc_decode_seconds(n)):
            started = time.perf_counter()
            rc = int(C.llama_decode(self._ctx, batch))
            # llama_decode may return before its work is done (an RPC model's is sent by ggml-rpc's own thread; a GPU's
            # runs on the device): wait for it here, where it is timed as the decode's (and, for RPC, watched), not in
            # the first llama_get_logits* call (unwatched, and counted as the engine's own host work)
            C.llama_synchronize(self._ctx)
            if self._rpc:
                recent = p._rpc_token_seconds
                recent.append((time.perf_counter() - started) / max(1, n))
                del recent[:-RPC_RECENT]
        p._decode_seconds += time.perf_counter() - t0
        if tuner is not None and rc == 0:
            tuner.observe(t, n, time.perf_counter() - now, now)
        return rc

    def _tensor_split(self, spec: ModelSpec) -> Any:
        """llama_model_params.tensor_split for spec.tensor_split: a ConfigError (before anything loads) where the
        model has fewer devices than shares."""
        devices = len(self._rpc_devices) - 1 if spec.rpc else (len(rpc.local_devices()) if rpc.available() else None)
        if devices is not None and len(spec.tensor_split) > devices:
            where = "its RPC servers' devices and this machine's GPUs" if spec.rpc else "this machine's GPUs (no --rpc)"
            self._free()
            raise ConfigError(f"tensor_split has {len(spec.tensor_split)} shares but the model has {devices} device(s) to split over: {where}")
        n = int(C.llama_max_devices())
        return (ctypes.c_float * n)(*spec.tensor_split, *([0.0] * (n - len(spec.tensor_split))))

    def _rpc_decode_seconds(self, n: int) -> float | None:
        """The watchdog's limit for an RPC model's decode of n tokens: EDGESPEC_RPC_TIMEOUT plus RPC_SLOW_FACTOR times
        n x the median seconds per token of its last RPC_RECENT decodes (a large batch, or a busy server, is given the
        time it needs; the median, not the slowest: one decode slowed by a busy moment does not delay the detection of
        a stall for the next 64); None for a local model."""
        if not self._rpc:
            return None
        recent = sorted(self._primary._rpc_token_seconds)
        return self._rpc_timeout + RPC_SLOW_FACTOR * n * (recent[len(recent) // 2] if recent else 0.0)

    def _remote(self, what: str, seconds: float | None = None) -> Any:
        """A call that talks to this model's RPC servers: under rpc.WATCHDOG for `seconds` (default: the model's
        EDGESPEC_RPC_TIMEOUT); nothing for a local model (every decode asks)."""
        if not self._rpc:
            return _LOCAL_CALL
        return rpc.WATCHDOG.watch(self._rpc, what, self._rpc_timeout if seconds is None else seconds)

    # ----------------------------------------------------------------- state
    @property
    def n_past(self) -> int:
        return len(self.cached)

    @property
    def closed(self) -> bool:
        return self._primary._ctx is None or self._primary._closing

    def _live(self) -> None:
        if self._primary._ctx is None or self._primary._closing:
            raise EngineClosedError(f"{os.path.basename(self.spec.path)}: the model was closed")

    def common_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading `tokens` the cache already holds (the reusable prefix)."""
        return common_prefix(self.cached, tokens)

    def sync(
        self,
        tokens: Sequence[int],
        rows: Sequence[int] = (-1,),
        *,
        should_stop: Callable[[], bool] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> np.ndarray:
        """Make the cache hold exactly `tokens`, decoding only what it does not hold already (common-prefix reuse,
        or a snapshot from the prompt cache when one shares more), and return logits for `rows` of the newly
        decoded part. At least the last token is always decoded when rows are wanted, so its logits are fresh.

        should_stop() is asked between chunks of n_batch tokens (StopRequested when it says yes; the cache then
        holds the chunks decoded so far); progress(done, total) is called after each chunk."""
        self._live()
        tokens = list(tokens)
        keep = self.common_prefix(tokens)
        if self.prompt_cache is not None and (keep < self.n_past or len(tokens) - keep >= PromptCache.MIN_TOKENS):
            keep = self.prompt_cache.swap(self, tokens, keep)
        if rows and keep == len(tokens):
            keep -= 1
        self.truncate(keep)
        if len(tokens) == keep:
            return np.empty((0, self.n_vocab), np.float32)
        return self._decode(tokens[keep:], keep, rows, should_stop, progress)

    # ----------------------------------------------------------------- facts
    @property
    def name(self) -> str:
        return self.info.name or os.path.basename(self.spec.path)

    @property
    def chat_template(self) -> str | None:
        with self._vocab_use.use():
            self._live()
            ptr = C.llama_model_chat_template(self._model, None)
            return ptr.decode("utf-8", "replace") if ptr else None

    def is_eog(self, token: int) -> bool:
        return token in self.eog_ids

    def control_tokens(self) -> list[int]:
        """The ids of the tokens that only text tokenized with parse_special becomes (control, unknown, unused)."""
        with self._vocab_use.use():
            self._live()
            attr = C.llama_vocab_get_attr
            return [i for i in range(self.n_vocab) if attr(self._vocab, i) & _PARSED_SPECIAL]

    def fim_tokens(self) -> FimTokens:
        """The vocabulary's fill-in-the-middle tokens, as llama.cpp found them (GGUF metadata, or their known text)."""
        with self._vocab_use.use():
            self._live()

            def tok(fn: Any) -> int | None:
                t = int(fn(self._vocab))
                return t if 0 <= t < self.n_vocab else None

            return FimTokens(
                prefix=tok(C.llama_vocab_fim_pre), suffix=tok(C.llama_vocab_fim_suf), middle=tok(C.llama_vocab_fim_mid),
                pad=tok(C.llama_vocab_fim_pad), repo=tok(C.llama_vocab_fim_rep), sep=tok(C.llama_vocab_fim_sep),
            )

    def constraint_vocab(self) -> Vocabulary:
        """The vocabulary as constraints need it (constraint.Vocabulary): every token's bytes (control tokens
        marked special), the end-of-generation ids, and this model's tokenizer. Built once per model."""
        if self._constraint_vocab is None:
            control = self.control_tokens()
            tokens = [self.token_bytes(i, special=True) for i in range(self.n_vocab)]
            self._constraint_vocab = Vocabulary(
                tokens, sorted(self.eog_ids), control, lambda text: self.tokenize(text, parse_special=False)
            )
        return self._constraint_vocab

    def infill_vocab(self) -> InfillVocab:
        """The vocabulary as llama.cpp's infill sampler needs it (infill.InfillVocab): every token's text without
        special tokens, the end-of-generation ids, and the token that ends a completion (EOT, else EOS, else the first
        EOG id; BackendError for a vocabulary without any). Built once per model."""
        if self._infill_vocab is None:
            with self._vocab_use.use():
                self._live()
                ends = [int(C.llama_vocab_eot(self._vocab)), int(C.llama_vocab_eos(self._vocab))]
            ends += sorted(self.eog_ids)
            end = next((t for t in ends if 0 <= t < self.n_vocab), None)
            if end is None:
                raise BackendError("this model's vocabulary has no end-of-text token: the infill sampler cannot end a completion")
            pieces = [self.token_bytes(i) for i in range(self.n_vocab)]
            self._infill_vocab = InfillVocab(pieces, self.eog_ids, end)
        return self._infill_vocab

    # ----------------------------------------------------------------- text
    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids for `text`. parse_special: control-token text (e.g. "<|im_end|>") becomes the control token;
        without it such text is tokenized as plain characters.

        Time is linear in the text: a long one is tokenized in pieces cut where llama.cpp cuts it anyway
        (SpecialSplitter), with the same ids as one call on the whole; close() waits for one piece at most."""
        data = text.encode("utf-8", "replace")  # a lone surrogate (undecodable input) becomes "?"
        cuts = self.special_splitter(parse_special).cuts(data, TOKENIZE_PIECE_BYTES) if len(data) > TOKENIZE_PIECE_BYTES else []
        if not cuts:
            return self._tokenize_bytes(data, add_special, parse_special)
        bounds = [0, *cuts, len(data)]
        first = data[: bounds[1]]
        out = self._tokenize_bytes(first, False, parse_special)
        head: list[int] = []
        tail: list[int] = []
        if add_special:  # what add_special adds around the whole (BOS/CLS before, EOS/SEP after), from the first piece
            full = self._tokenize_bytes(first, True, parse_special)
            extra = len(full) - len(out)
            k = next((k for k in range(extra, -1, -1) if full[k:k + len(out)] == out), 0)
            head, tail = full[:k], full[k + len(out):]
        for a, b in zip(bounds[1:], bounds[2:]):
            out += self._tokenize_bytes(data[a:b], False, parse_special)
        return head + out + tail

    def special_splitter(self, parse_special: bool) -> SpecialSplitter:
        """The texts llama.cpp partitions a text at (see SpecialSplitter), built once per model and flag."""
        hit = self._splitters.get(parse_special)
        if hit is not None:
            return hit
        skip = 0 if parse_special else (C.LLAMA_TOKEN_ATTR_CONTROL | C.LLAMA_TOKEN_ATTR_UNKNOWN)
        want = C.LLAMA_TOKEN_ATTR_CONTROL | C.LLAMA_TOKEN_ATTR_USER_DEFINED | C.LLAMA_TOKEN_ATTR_UNKNOWN
        texts: dict[bytes, bool] = {}
        with self._vocab_use.use():
            self._live()
            for i in range(self.n_vocab):
                attr = int(C.llama_vocab_get_attr(self._vocab, i))
                if attr & want and not attr & skip:
                    t = C.llama_vocab_get_text(self._vocab, i) or b""
                    texts[t] = texts.get(t, False) or bool(attr & C.LLAMA_TOKEN_ATTR_LSTRIP)
        self._splitters[parse_special] = out = SpecialSplitter(texts)
        return out

    def _tokenize_bytes(self, data: bytes, add_special: bool, parse_special: bool) -> list[int]:
        """One llama_tokenize call."""
        with self._vocab_use.use():
            self._live()
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
        with self._vocab_use.use():
            self._live()
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
    def decode(self, tokens: Sequence[int], start_pos: int, rows: Sequence[int] = (-1,), *, view: bool = False) -> np.ndarray:
        """Append `tokens` at positions start_pos.. and return float32 logits for the requested `rows` (indices into
        `tokens`, negative allowed), shape (len(rows), n_vocab). llama.cpp computes output only for those rows.
        `start_pos` must equal `n_past` (call `truncate` first to rewrite history). view=True: where the rows come out
        of one llama_decode in the order asked (ascending, within n_batch), they are a view of llama.cpp's own buffer,
        valid until this context's next decode (any slot's), instead of a copy."""
        self._live()
        if start_pos != self.n_past:
            raise BackendError(f"decode at position {start_pos} but the cache holds {self.n_past} tokens")
        return self._decode(list(tokens), start_pos, rows, None, None, view=view)

    def decode_next(self, token: int) -> np.ndarray:
        """Append one token at n_past and return the logits after it (float32, n_vocab) as a view of llama.cpp's own
        buffer, not a copy: valid until this context's next decode (any slot's). For a caller that reads the row at
        once (a draft model drafting token by token); everything else takes decode()'s copies."""
        self._live()
        return self._decode([int(token)], self.n_past, (0,), None, None, view=True)[0]

    def _decode(
        self,
        tokens: list[int],
        start_pos: int,
        rows: Sequence[int],
        should_stop: Callable[[], bool] | None,
        progress: Callable[[int, int], None] | None,
        view: bool = False,
    ) -> np.ndarray:
        n = len(tokens)
        if n == 0:
            if rows:
                raise BackendError("no tokens to decode")
            return np.empty((0, self.n_vocab), dtype=np.float32)
        if start_pos + n > self.n_ctx:
            raise ContextFullError(f"context full: {start_pos + n} tokens do not fit in n_ctx={self.n_ctx}")
        if len(rows) == 1 and -n <= rows[0] < n:  # the common case: one row (a plain step, a drafted token)
            want = [rows[0] % n]
        else:
            want = sorted({r % n if -n <= r < n else _bad_row(r, n) for r in rows})
        order = {r: i for i, r in enumerate(want)}
        view = view and n <= self.n_batch and list(rows) == want
        out = np.empty((0 if view else len(want), self.n_vocab), dtype=np.float32)
        if min(tokens) < 0 or max(tokens) >= self.n_vocab:
            raise BackendError(f"token id out of range [0, {self.n_vocab})")
        self._clean()
        for c0 in range(0, n, self.n_batch):
            if should_stop is not None and c0 > 0 and should_stop():
                raise StopRequested()
            c1 = min(n, c0 + self.n_batch)
            m = c1 - c0
            self._tok[:m] = tokens[c0:c1]
            self._pos[:m] = np.arange(start_pos + c0, start_pos + c1, dtype=np.int32) if m > 1 else start_pos + c0
            self._want[:m] = 0
            self._use_seq(m)
            chunk_rows = [r for r in want if c0 <= r < c1]
            for r in chunk_rows:
                self._want[r - c0] = 1
            self._batch.n_tokens = m
            rc = self._llama_decode(self._batch, m)
            if rc != 0:
                C.llama_memory_seq_rm(self._mem, self._seq, self.n_past, -1)  # drop whatever part of this call was stored
                raise BackendError(f"llama_decode failed with code {rc}")
            if view and want:  # the outputs in batch order: exactly the rows asked, in their order
                out = self._primary._logits_view(len(want))
            for r in [] if view else chunk_rows:
                ptr = C.llama_get_logits_ith(self._ctx, r - c0)
                out[order[r]] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
            self.cached += tokens[c0:c1]  # one list operation: the bookkeeping is never half done
            self.n_decoded += m
            if progress is not None:
                progress(c1, n)
        # NaN propagates into the max; +inf is the max; all -inf too (skipped where the caller samples every row it reads,
        # which checks the same: check_logits False)
        if self._primary.check_logits and not np.isfinite(out.max(axis=1)).all():
            raise non_finite_logits(self.name)
        if list(rows) == want:
            return out
        return out[[order[r % n] for r in rows]]

    def _logits_view(self, n_rows: int) -> np.ndarray:
        """The first n_rows rows of this context's logits buffer (llama_get_logits) as a float32 array over that
        memory: made once per (address, n_rows) and kept while llama.cpp keeps the buffer where it is (numpy's
        ctypes conversion costs 10-70 us a call on a row of 151,936 entries; a dict lookup does not)."""
        addr = ctypes.cast(C.llama_get_logits(self._ctx), ctypes.c_void_p).value
        views = self._views
        arr = views.get((addr, n_rows))
        if arr is None:
            if len(views) > 64 or any(a != addr for a, _ in views):
                views.clear()  # the buffer moved (reallocated for more outputs): the old views point at freed memory
            if not addr:
                raise BackendError(f"{self.name}: llama.cpp returned no logits buffer")
            buf = (ctypes.c_float * (n_rows * self.n_vocab)).from_address(addr)
            arr = views[(addr, n_rows)] = np.frombuffer(memoryview(buf), dtype=np.float32).reshape(n_rows, self.n_vocab)
        return arr

    def _clean(self) -> None:
        """Drop whatever llama.cpp holds past `cached` in this view's main sequence, and every tree sequence of the
        view (an interrupted step's leftovers): the next decode starts from exactly `cached`."""
        C.llama_memory_seq_rm(self._mem, self._seq, self.n_past, -1)
        self._drop_tree_seqs()

    def _drop_tree_seqs(self) -> None:
        if self._tree_seqs:
            for s in range(1, 1 + self.tree_paths):
                C.llama_memory_seq_rm(self._mem, self._seq + s, -1, -1)
            self._tree_seqs = False

    def decode_tree(self, tokens: Sequence[int], depths: Sequence[int], seq_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """Verify a token tree in one llama_decode (layout: tree.TokenTree.batch). Row 0 is the root: the context's
        last token, which the cache does not hold yet; row i sits at depth depths[i] (the root's is 0) and belongs to
        the tree paths seq_ids[i] (0-based; path s is this view's sequence + s + 1, and the context is shared with
        every path). Returns the logits of every row. The cache then holds the context and the root in the main
        sequence; `keep_tree_path` keeps the accepted path and drops the rest."""
        return self._primary.decode_parts([DecodePart(self, tokens, depths=depths, seq_ids=seq_ids)])[0]

    def decode_parts(self, parts: Sequence["DecodePart"]) -> list[np.ndarray]:
        """Several views' decodes of this context in ONE llama_decode (each part a chain appended at its view's n_past,
        like decode(), or a token tree, like decode_tree(); at most one part per view, all of them within n_batch
        tokens). Returns each part's logits (a chain's requested rows, a tree's every row). On a failure every view
        is left holding exactly its `cached` tokens and BackendError is raised."""
        self._live()
        if not parts:
            return []
        views = [pt.view for pt in parts]
        if any(v._primary is not self._primary for v in views) or len({id(v) for v in views}) != len(views):
            raise BackendError("decode_parts takes at most one part per slot of this model")
        total = sum(len(pt.tokens) for pt in parts)
        if total > self.n_batch:
            raise BackendError(f"{total} tokens do not fit one batch of {self.n_batch}")
        plans = [pt.view._prepare(pt) for pt in parts]  # checks (nothing held yet), then each view's leftovers dropped
        b = self._batch
        off = 0
        for pt, plan in zip(parts, plans):
            pt.view._fill(off, pt, plan)
            off += len(pt.tokens)
        b.n_tokens = total
        try:
            rc = self._llama_decode(b, total)
        except BaseException:
            for v in views:
                v._clean()
            raise
        if rc != 0:
            for v in views:
                v._clean()
            raise BackendError(f"llama_decode failed with code {rc}")
        out = []
        off = 0
        for pt, plan in zip(parts, plans):
            out.append(pt.view._finish(off, pt, plan))
            off += len(pt.tokens)
        for got in out:
            if len(got) and self._primary.check_logits and not np.isfinite(got.max(axis=1)).all():
                raise non_finite_logits(self.name)
        return out

    def _prepare(self, pt: "DecodePart") -> tuple[np.ndarray, list[int], int]:
        """Check one part against this view (token range, context, batch, tree paths) and drop the view's leftovers:
        (token ids, the rows whose logits are wanted, the number of tree paths; 0 for a chain)."""
        n = len(pt.tokens)
        if n == 0:
            raise BackendError("no tokens to decode")
        toks = np.asarray(pt.tokens, dtype=np.int64)
        if toks.min() < 0 or toks.max() >= self.n_vocab:
            raise BackendError(f"token id out of range [0, {self.n_vocab})")
        start = self.n_past
        if pt.depths is None:
            if pt.start_pos is not None and pt.start_pos != start:
                raise BackendError(f"decode at position {pt.start_pos} but the cache holds {start} tokens")
            if start + n > self.n_ctx:
                raise ContextFullError(f"context full: {start + n} tokens do not fit in n_ctx={self.n_ctx}")
            want = sorted({r % n if -n <= r < n else _bad_row(r, n) for r in pt.rows})
            self._clean()
            return toks, want, 0
        seq_ids = pt.seq_ids or []
        n_paths = 1 + max((s for ids in seq_ids for s in ids), default=0)
        if n_paths > self.tree_paths:
            raise BackendError(f"a tree of {n_paths} paths needs a model loaded with tree_paths >= {n_paths}")
        if n > self.n_batch:
            raise BackendError(f"a tree of {n} nodes does not fit a batch of {self.n_batch}")
        if start + n > self.n_ctx or start + max(pt.depths) >= self.n_ctx:
            raise ContextFullError(f"context full: a tree of {n} nodes after {start} tokens does not fit n_ctx={self.n_ctx}")
        self._clean()
        self._tree_seqs = True
        for s in range(n_paths):
            C.llama_memory_seq_cp(self._mem, self._seq, self._seq + s + 1, -1, -1)  # the context is visible to every path
        return toks, list(range(n)), n_paths

    def _fill(self, off: int, pt: "DecodePart", plan: tuple[np.ndarray, list[int], int]) -> None:
        """Write one part into batch entries off.. (its positions, sequences and wanted rows)."""
        toks, want, n_paths = plan
        n, start = len(toks), self.n_past
        b = self._batch
        self._tok[off:off + n] = toks
        self._want[off:off + n] = 0
        if not n_paths:
            self._pos[off:off + n] = np.arange(start, start + n, dtype=np.int32)
            self._want[[off + r for r in want]] = 1
            p = self._primary
            bs = p._batch_seq
            for i in (off + np.flatnonzero(bs[off:off + n] != self._seq)).tolist():
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = self._seq
            bs[off:off + n] = self._seq
            return
        assert pt.depths is not None and pt.seq_ids is not None
        self._primary._batch_seq[off:off + n] = -1  # these entries carry several sequences: rewritten by the next use
        for i in range(n):
            ids = ([self._seq] if i == 0 else []) + [self._seq + s + 1 for s in pt.seq_ids[i]]
            self._pos[off + i] = start + int(pt.depths[i])
            b.n_seq_id[off + i] = len(ids)
            for k, sid in enumerate(ids):
                b.seq_id[off + i][k] = sid
            self._want[off + i] = 1

    def _finish(self, off: int, pt: "DecodePart", plan: tuple[np.ndarray, list[int], int]) -> np.ndarray:
        """After the decode: this part's logits, and the view's bookkeeping (what its cache now holds)."""
        toks, want, n_paths = plan
        n = len(toks)
        out = np.empty((len(want), self.n_vocab), dtype=np.float32)
        for j, r in enumerate(want):
            out[j] = np.ctypeslib.as_array(C.llama_get_logits_ith(self._ctx, off + r), shape=(self.n_vocab,))
        start = self.n_past
        self.n_decoded += n
        if n_paths:
            self.cached += [int(toks[0])]
            self._tree = (start, n_paths)
            return out
        self.cached += [int(t) for t in toks]
        rows = list(pt.rows)
        if rows == want:
            return out
        order = {r: i for i, r in enumerate(want)}
        return out[[order[r % n] for r in rows]]

    def keep_tree_path(self, path: int, tokens: Sequence[int]) -> None:
        """After decode_tree: keep the accepted drafts `tokens`, the first nodes after the root of tree path `path`,
        in sequence 0, and drop every tree sequence."""
        self._live()
        if self._tree is None or self.n_past != self._tree[0] + 1 or not 0 <= path < self._tree[1]:
            raise BackendError("keep_tree_path does not match the last decode_tree")
        start = self._tree[0]
        if tokens:
            C.llama_memory_seq_cp(self._mem, self._seq + path + 1, self._seq, start + 1, start + 1 + len(tokens))
        self._drop_tree_seqs()
        self.cached += [int(t) for t in tokens]

    def truncate(self, n_past: int) -> None:
        """Forget every cached token at position >= n_past."""
        self._live()
        if n_past < 0 or n_past > self.n_past:
            raise BackendError(f"cannot truncate to {n_past}: the cache holds {self.n_past} tokens")
        if n_past == self.n_past:
            return
        del self.cached[n_past:]  # first: llama.cpp may hold more than `cached`, never less
        if not C.llama_memory_seq_rm(self._mem, self._seq, n_past, -1):
            raise BackendError(f"llama.cpp could not truncate the cache to {n_past} tokens")

    def reset(self) -> None:
        """Empty the cache (the prompt cache's snapshots stay)."""
        self._live()
        self.cached = []
        self._tree_seqs = False
        with self._remote("clearing the cache"):
            if self._primary.parallel == 1:
                C.llama_memory_clear(self._mem, True)
            else:  # this slot's sequences only
                for s in range(1 + self.tree_paths):
                    C.llama_memory_seq_rm(self._mem, self._seq + s, -1, -1)

    # ----------------------------------------------------------------- snapshots
    def save_state(self) -> bytes:
        """The cache's contents (this view's main sequence) as bytes (loadable into any slot); restore with load_state(self.cached copy, data)."""
        self._live()
        with self._remote("saving a cache snapshot"):
            size = int(C.llama_state_seq_get_size(self._ctx, self._seq))
        buf = (ctypes.c_uint8 * size)()
        with self._remote("saving a cache snapshot", rpc.transfer_seconds(size, self._rpc_timeout) if self._rpc else None):
            got = int(C.llama_state_seq_get_data(self._ctx, buf, size, self._seq))
        if got <= 0:
            raise BackendError("llama.cpp could not save the cache state")
        return bytes(memoryview(buf)[:got])

    def load_state(self, tokens: Sequence[int], data: bytes) -> bool:
        """Make the cache hold `tokens` from a snapshot saved by save_state (False if llama.cpp refused it; the
        cache is then empty)."""
        self._live()
        self.cached = []  # first: llama.cpp clears the sequence before it reads the snapshot
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        with self._remote("restoring a cache snapshot", rpc.transfer_seconds(len(data), self._rpc_timeout) if self._rpc else None):
            ok = int(C.llama_state_seq_set_data(self._ctx, buf, len(data), self._seq)) > 0
        if not ok:
            C.llama_memory_seq_rm(self._mem, self._seq, 0, -1)
            return False
        self.cached = list(tokens)
        return True

    # ----------------------------------------------------------------- lifetime
    CLOSE_WAIT = 2.0  # seconds close() waits for vocabulary calls in progress before leaving the release to them

    def close(self) -> None:
        """Free the model. Vocabulary calls in progress on other threads (a long tokenization is at most one piece
        of one, but a plain text is one llama.cpp call) get CLOSE_WAIT seconds; past that close() returns and the
        last of them frees the model as it ends. No call starts after close(). A slot view's close does nothing."""
        if self.__dict__.get("_primary", self) is not self:
            return
        self._closing = True
        use = self.__dict__.get("_vocab_use")
        if use is None:
            self._free()
        else:
            use.release_when_idle(self._free, self.CLOSE_WAIT)

    def _free(self) -> None:
        remote = self.__dict__.get("_rpc") or ()  # freeing an RPC model's buffers waits for its servers: watched too
        with _INIT_LOCK, (rpc.WATCHDOG.watch(remote, "freeing the model", self.__dict__.get("_rpc_timeout") or rpc.DEFAULT_TIMEOUT)
                          if remote else _LOCAL_CALL):  # close() from two threads at once frees once
            if self._batch is not None:
                C.llama_batch_free(self._batch)
                self._batch = None
            if self._ctx is not None:
                self.__dict__.get("_views", {}).clear()
                C.llama_free(self._ctx)
                self._ctx = None
            if self._model is not None:
                self._vocab = None  # the model's: freed with it
                C.llama_model_free(self._model)
                self._model = None
            cache = self.__dict__.get("prompt_cache")
            if cache is not None:
                cache.clear()
            if self.__dict__.get("_rpc"):  # the model's connections to its RPC servers are closed now
                rpc.release(self._rpc)
                self._rpc = ()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


__all__ = ["DecodePart", "Model", "PromptCache", "SpecialSplitter", "TOKENIZE_PIECE_BYTES", "default_threads", "gpu_offload_supported"]
