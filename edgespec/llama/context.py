"""One GGUF model loaded in llama.cpp with its context and batch (`Context`): loading (the weights, onto RPC
servers' devices where the spec names some; the memory the KV cache will take, checked before llama.cpp allocates
it), freeing, the thread count of each decode (threads.py), and the batch: chain and tree entries written for any
sequence, one timed llama_decode (watched for an RPC model), the logits rows it leaves. Every llama.cpp call on the
context's KV cache (its sequences, their snapshots) is made here; what each sequence holds is the slots'
bookkeeping (slot.py).

The context holds `parallel` slots of 1 + tree_paths sequences each (slot s: sequences s * (1 + tree_paths) ..
s * (1 + tree_paths) + tree_paths), in one unified cache of parallel x n_ctx cells.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from typing import Any, Iterator, Sequence

import numpy as np

from edgespec.config import MAX_SEQUENCES, ModelSpec
from edgespec.errors import BackendError, ConfigError, EngineClosedError
from .gguf_check import GGUFInfo
from .threads import ThreadTuner, candidate_counts
from . import determinism, rpc
from .binding import C, logits_address  # after the pure imports on purpose: loading the library can fail (one BackendError)

_LOG_CB = None
_LOCAL_CALL = contextlib.nullcontext()  # reusable: what Context.remote gives a local model's calls
RPC_SLOW_FACTOR = 4.0  # an RPC decode of n tokens may take the timeout plus this many times n x the recent median per token
RPC_RECENT = 64  # decodes that allowance looks back on
_INIT_LOCK = threading.Lock()


def init_llama() -> None:
    """Start llama.cpp's backend once per process, its log going to stderr only with EDGESPEC_VERBOSE."""
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
    init_llama()
    return rpc.local_gpu()


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


def rpc_decode_allowance(timeout: float, recent: Sequence[float], n: int) -> float:
    """The watchdog's limit for an RPC model's decode of n tokens: the RPC timeout plus RPC_SLOW_FACTOR times n x the
    median of `recent` (seconds per token of the last RPC_RECENT decodes): a large batch, or a busy server, is given
    the time it needs; the median, not the slowest: one decode slowed by a busy moment does not delay the detection
    of a stall for the next 64."""
    ordered = sorted(recent)
    return timeout + RPC_SLOW_FACTOR * n * (ordered[len(ordered) // 2] if ordered else 0.0)


class Context:
    """One GGUF model loaded in llama.cpp, its context and its batch (see the module docstring); `info` is the
    file's checked header. Loading fails as one error with nothing left held. One thread at a time may decode (the
    engine's worker); the owner sets `closing` before it frees, and live() then refuses every new call."""

    def __init__(self, spec: ModelSpec, info: GGUFInfo, *, parallel: int, tree_paths: int, fit: bool = False) -> None:
        init_llama()
        self.spec = spec
        self.info = info
        self.parallel = parallel
        self.tree_paths = tree_paths
        self.closing = False
        self.model: Any = None
        self.ctx: Any = None
        self.batch: Any = None
        self.rpc: tuple[str, ...] = ()
        self.rpc_timeout = 0.0  # seconds a call to the RPC servers may take (rpc.WATCHDOG), read once at load
        self.rpc_token_seconds: list[float] = []  # an RPC model's recent decodes: seconds per token (the decode's allowance)
        self.n_decoded = 0  # tokens pushed through llama_decode since load, all slots
        self.decode_seconds = 0.0  # seconds inside llama_decode since load, all slots
        # every decode checks that its rows are finite (one pass over each row) unless the caller checks them itself
        # while it samples them (the engine's loop: sampling.NonFiniteLogitsError, re-raised as this model's BackendError)
        self.check_logits = True
        self._views: dict[tuple[int | None, int], np.ndarray] = {}  # logits_view: arrays over llama.cpp's logits buffer
        self.asynchronous = True  # decodes may run on after llama_decode returns (set at load)
        try:
            if spec.deterministic:
                determinism.prepare_process()
            ngl = self._load()
            # llama_decode may return before its work is done where RPC servers or a GPU run part of it (with no layers
            # offloaded, llama.cpp may still send a large batch's products to the GPU); on a CPU-only build it returns
            # with the logits in place
            self.asynchronous = bool(self.rpc) or gpu_offload_supported()
            self._choose_threads(ngl)
            self._fit_memory(ngl, fit)
            self._create()
            if spec.deterministic:
                determinism.check_invariance(self)
        except BaseException:
            self.free()
            raise

    # ----------------------------------------------------------------- loading
    def _load(self) -> int:
        """Load the weights (onto the RPC servers' devices, then this machine's GPUs, where spec.rpc names servers:
        rpc.py); the n_gpu_layers in effect. Refuses models whose cache cannot be truncated."""
        spec = self.spec
        mparams = C.llama_model_default_params()
        ngl = spec.n_gpu_layers
        if spec.rpc:
            self.rpc_timeout = rpc.timeout()  # a bad EDGESPEC_RPC_TIMEOUT: one ConfigError now, before anything is held
            # probed first (llama.cpp aborts on a server it cannot reach), within the RPC timeout where it is shorter
            self._rpc_devices, _ = rpc.model_devices(spec.rpc, min(rpc.PROBE_TIMEOUT, self.rpc_timeout))
            self.rpc = spec.rpc
            mparams.devices = ctypes.cast(self._rpc_devices, ctypes.c_void_p)
            ngl = -1 if ngl == 0 else ngl
        if spec.tensor_split:
            self._split = self._tensor_split()  # kept alive until the load
            mparams.tensor_split = ctypes.cast(self._split, ctypes.POINTER(ctypes.c_float))
        mparams.n_gpu_layers = ngl if ngl >= 0 else 999
        if os.environ.get("EDGESPEC_NO_REPACK", "") not in ("", "0"):
            # Workaround for CPUs that advertise AMX but fault on it with a native build (see docs/setup.md).
            mparams.use_extra_bufts = False
        if spec.deterministic:
            determinism.model_params(mparams)
        with self.remote(rpc.LOADING, rpc.load_seconds(spec.path, self.rpc_timeout) if self.rpc else None):
            self.model = C.llama_model_load_from_file(os.fsencode(spec.path), mparams)
        if not self.model:
            if spec.rpc:
                raise BackendError(f"{spec.path}: llama.cpp could not load the model onto RPC server(s) {', '.join(spec.rpc)}: does each have "
                                   "the memory for its share of the layers? (their own logs say; `edgespec info --rpc` shows their free "
                                   "memory; --tensor-split and --n-gpu-layers N move layers; EDGESPEC_VERBOSE=1 shows llama.cpp's log)")
            raise BackendError(f"{spec.path}: llama.cpp could not load the model (run with EDGESPEC_VERBOSE=1 for its log)")
        if C.llama_model_is_recurrent(self.model) or C.llama_model_is_hybrid(self.model):
            raise BackendError(
                f"{spec.path}: {self.info.architecture} is a recurrent/hybrid model whose cache cannot be rolled back; "
                "speculative decoding needs a truncatable KV cache"
            )
        return ngl

    def _tensor_split(self) -> Any:
        """llama_model_params.tensor_split for spec.tensor_split: a ConfigError (before anything loads) where the
        model has fewer devices than shares."""
        spec = self.spec
        devices = len(self._rpc_devices) - 1 if spec.rpc else (len(rpc.local_devices()) if rpc.available() else None)
        if devices is not None and len(spec.tensor_split) > devices:
            where = "its RPC servers' devices and this machine's GPUs" if spec.rpc else "this machine's GPUs (no --rpc)"
            raise ConfigError(f"tensor_split has {len(spec.tensor_split)} shares but the model has {devices} device(s) to split over: {where}")
        n = int(C.llama_max_devices())
        return (ctypes.c_float * n)(*spec.tensor_split, *([0.0] * (n - len(spec.tensor_split))))

    def _choose_threads(self, ngl: int) -> None:
        """The thread count, and the tuner where it is chosen while running."""
        spec = self.spec
        self.n_threads = spec.n_threads or default_threads()
        # Threads follow the machine's load (threads.py) unless the user fixed them, or the weights are all on a GPU
        # (CPU threads then hardly matter and their timings say nothing about the load).
        auto = spec.n_threads is None and not (ngl < 0 and (spec.rpc or gpu_offload_supported()))
        cands = candidate_counts(self.n_threads) if auto else (self.n_threads,)
        self.tuner: ThreadTuner | None = ThreadTuner(cands) if len(cands) > 1 else None
        self.threads_applied = self.n_threads  # the count llama.cpp's context uses now
        self.pinned = False  # pinned_threads(): decodes keep the count and teach the tuner nothing

    def _fit_memory(self, ngl: int, cap: bool) -> None:
        """Where the cache lives in this machine's memory: ConfigError if it would not fit (check_cache_memory); with
        `cap` (the slot count was left to the engine), first no more slots than a quarter of the free memory holds."""
        spec = self.spec
        if ngl != 0 and (spec.rpc or gpu_offload_supported()):
            return
        per_slot = self.kv_bytes_per_token() * spec.n_ctx
        have = available_memory()
        if cap and have is not None:
            self.parallel = max(1, min(self.parallel, int(0.25 * have) // max(1, per_slot)))
        check_cache_memory(per_slot * self.parallel, self.parallel, spec.n_ctx)

    def _create(self) -> None:
        """The context (every slot may hold n_ctx cells, in one unified cache for all sequences) and its batch."""
        spec = self.spec
        n_ctx = spec.n_ctx
        n_batch = min(spec.n_batch, n_ctx)
        cparams = C.llama_context_default_params()
        cparams.n_ctx = n_ctx * self.parallel
        cparams.n_batch = n_batch
        cparams.n_ubatch = n_batch
        # tree_paths > 0: token trees are verified with one sequence per root-to-leaf path beside each slot's main
        # sequence (the paths share the context's cells)
        cparams.n_seq_max = self.parallel * (1 + self.tree_paths)
        cparams.kv_unified = cparams.n_seq_max > 1
        cparams.n_threads = self.n_threads
        cparams.n_threads_batch = self.n_threads
        cparams.no_perf = True
        cparams.swa_full = True  # sliding-window models keep the full cache so that rollback is always possible
        if spec.deterministic:  # batch-invariant settings (determinism.py): no unified cache, no trees
            determinism.context_params(cparams, self.tree_paths, self.head_dim())
        with self.remote("allocating the context"):
            self.ctx = C.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            raise BackendError(f"{spec.path}: llama.cpp could not create a context of {n_ctx} tokens")
        self.mem = C.llama_get_memory(self.ctx)
        self.n_ctx = min(n_ctx, int(C.llama_n_ctx(self.ctx)))  # llama.cpp may round up; the request is the limit
        self.n_batch = n_batch
        self.n_vocab = int(C.llama_vocab_n_tokens(C.llama_model_get_vocab(self.model)))  # the width of a logits row
        self.batch = C.llama_batch_init(n_batch, 0, cparams.n_seq_max)
        # Every batch entry belongs to one sequence, 0 at first; _batch_seq mirrors the entries' sequence ids so that a
        # decode rewrites only those that differ (put_chain). Token/pos/logits arrays are numpy views over the C batch.
        for i in range(n_batch):
            self.batch.n_seq_id[i] = 1
            self.batch.seq_id[i][0] = 0
        self._batch_seq = np.zeros(n_batch, dtype=np.int32)
        self._tok = np.ctypeslib.as_array(self.batch.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(self.batch.pos, shape=(n_batch,))
        self._want = np.ctypeslib.as_array(self.batch.logits, shape=(n_batch,))
        self._steps = np.arange(n_batch, dtype=np.int32)  # 0, 1, ...: a chain's positions are start + these

    def head_dim(self) -> int:
        """Values per attention head."""
        return int(C.llama_model_n_embd(self.model)) // max(1, int(C.llama_model_n_head(self.model)))

    def kv_bytes_per_token(self) -> int:
        """The KV cache's bytes per token of context (f16 keys and values of every layer's KV heads; q8_0 in
        deterministic mode)."""
        head_dim = self.head_dim()
        per = determinism.kv_bytes_per_value(self.spec.deterministic)
        return int(2 * per * int(C.llama_model_n_layer(self.model)) * int(C.llama_model_n_head_kv(self.model)) * head_dim)

    # ----------------------------------------------------------------- state
    @property
    def name(self) -> str:
        return self.info.name or os.path.basename(self.spec.path)

    @property
    def closed(self) -> bool:
        return self.ctx is None or self.closing

    def live(self) -> None:
        """EngineClosedError once the model is closed (or closing)."""
        if self.ctx is None or self.closing:
            raise EngineClosedError(f"{os.path.basename(self.spec.path)}: the model was closed")

    def remote(self, what: str, seconds: float | None = None) -> Any:
        """A call that talks to this model's RPC servers: under rpc.WATCHDOG for `seconds` (default: the model's
        EDGESPEC_RPC_TIMEOUT); nothing for a local model (every decode asks)."""
        if not self.rpc:
            return _LOCAL_CALL
        return rpc.WATCHDOG.watch(self.rpc, what, self.rpc_timeout if seconds is None else seconds)

    def rpc_decode_seconds(self, n: int) -> float | None:
        """The watchdog's limit for this model's decode of n tokens (rpc_decode_allowance); None for a local model."""
        if not self.rpc:
            return None
        return rpc_decode_allowance(self.rpc_timeout, self.rpc_token_seconds, n)

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
        old, self.pinned = self.pinned, True
        try:
            yield
        finally:
            self.pinned = old

    # ----------------------------------------------------------------- the batch
    def put_chain(self, off: int, seq: int, start: int, tokens: Sequence[int] | np.ndarray, want: Sequence[int]) -> None:
        """Batch entries off.. hold `tokens` at positions start.., each in sequence `seq` alone; logits for the
        chain's rows `want` (indices into tokens)."""
        n = len(tokens)
        b = self.batch
        bs = self._batch_seq
        if n == 1:  # a plain step or a drafted token: element writes, no array temporaries
            self._tok[off], self._pos[off], self._want[off] = tokens[0], start, 1 if want else 0
            if bs[off] != seq:
                b.n_seq_id[off] = 1
                b.seq_id[off][0] = seq
                bs[off] = seq
            return
        part = slice(off, off + n)
        self._tok[part] = tokens
        np.add(self._steps[:n], start, out=self._pos[part])
        w = self._want[part]
        if len(want) == n:  # every row (a verify)
            w.fill(1)
        else:
            w.fill(0)
            w[list(want)] = 1
        other = bs[part] != seq
        if other.any():
            for i in (off + np.flatnonzero(other)).tolist():
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq
            bs[part] = seq

    def put_tree(
        self, off: int, seq: int, start: int, tokens: np.ndarray, depths: Sequence[int], seq_ids: Sequence[Sequence[int]]
    ) -> None:
        """Batch entries off.. hold a token tree (tree.TokenTree.batch's layout): node i at position start +
        depths[i], in the tree paths seq_ids[i] (path s is sequence seq + s + 1; node 0, the root, also in `seq`);
        logits for every node."""
        n = len(tokens)
        b = self.batch
        self._tok[off:off + n] = tokens
        self._want[off:off + n] = 1
        self._batch_seq[off:off + n] = -1  # these entries carry several sequences: rewritten by the next use
        for i in range(n):
            ids = ([seq] if i == 0 else []) + [seq + s + 1 for s in seq_ids[i]]
            self._pos[off + i] = start + int(depths[i])
            b.n_seq_id[off + i] = len(ids)
            for k, sid in enumerate(ids):
                b.seq_id[off + i][k] = sid

    def decode_batch(self, n: int) -> int:
        """llama_decode of the batch's first n entries, with the thread count the tuner picks for n tokens, timed for
        it (and, for an RPC model, watched); llama.cpp's return code."""
        self.batch.n_tokens = n
        tuner = None if self.pinned else self.tuner
        now = time.perf_counter()
        t = tuner.choose(n, now) if tuner is not None else self.threads_now
        if t != self.threads_applied:
            C.llama_set_n_threads(self.ctx, t, t)
            self.threads_applied = t
        t0 = time.perf_counter()
        with self.remote("a decode", self.rpc_decode_seconds(n)):
            started = time.perf_counter()
            rc = int(C.llama_decode(self.ctx, self.batch))
            # llama_decode may return before its work is done (an RPC model's is sent by ggml-rpc's own thread; a GPU's
            # runs on the device): wait for it here, where it is timed as the decode's (and, for RPC, watched), not in
            # the first llama_get_logits* call (unwatched, and counted as the engine's own host work). On the CPU alone
            # it has finished: no call.
            if self.asynchronous:
                C.llama_synchronize(self.ctx)
            if self.rpc:
                recent = self.rpc_token_seconds
                recent.append((time.perf_counter() - started) / max(1, n))
                del recent[:-RPC_RECENT]
        self.decode_seconds += time.perf_counter() - t0
        if tuner is not None and rc == 0:
            tuner.observe(t, n, time.perf_counter() - now, now)
        return rc

    def logits_row(self, i: int) -> np.ndarray:
        """The logits of batch entry i after the last decode (an array over llama.cpp's buffer: copy it)."""
        return np.ctypeslib.as_array(C.llama_get_logits_ith(self.ctx, i), shape=(self.n_vocab,))

    def logits_view(self, n_rows: int) -> np.ndarray:
        """The first n_rows rows of this context's logits buffer (llama_get_logits) as a float32 array over that
        memory: made once per (address, n_rows) and kept while llama.cpp keeps the buffer where it is (numpy's
        ctypes conversion costs 10-70 us a call on a row of 151,936 entries; a dict lookup does not)."""
        addr = logits_address(self.ctx)
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

    # ----------------------------------------------------------------- the KV cache's sequences
    def seq_rm(self, seq: int, p0: int, p1: int) -> bool:
        """Drop sequence seq's cells at positions [p0, p1) (-1: open end); False if llama.cpp could not."""
        return bool(C.llama_memory_seq_rm(self.mem, seq, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        """Add sequence dst to the cells of sequence src at positions [p0, p1) (-1: open end)."""
        C.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def clear(self, seq: int, n: int) -> None:
        """Empty sequences seq .. seq + n - 1 (with one slot, the whole cache: they are all of its sequences)."""
        with self.remote("clearing the cache"):
            if self.parallel == 1:
                C.llama_memory_clear(self.mem, True)
            else:
                for s in range(seq, seq + n):
                    C.llama_memory_seq_rm(self.mem, s, -1, -1)

    def save_seq(self, seq: int) -> bytes:
        """Sequence seq's cache contents as bytes (llama_state_seq_get_data; loadable into any sequence)."""
        with self.remote("saving a cache snapshot"):
            size = int(C.llama_state_seq_get_size(self.ctx, seq))
        buf = (ctypes.c_uint8 * size)()
        with self.remote("saving a cache snapshot", rpc.transfer_seconds(size, self.rpc_timeout) if self.rpc else None):
            got = int(C.llama_state_seq_get_data(self.ctx, buf, size, seq))
        if got <= 0:
            raise BackendError("llama.cpp could not save the cache state")
        return bytes(memoryview(buf)[:got])

    def load_seq(self, seq: int, data: bytes) -> bool:
        """Make sequence seq hold a snapshot from save_seq; False, with the sequence left empty, if llama.cpp
        refused it."""
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        with self.remote("restoring a cache snapshot", rpc.transfer_seconds(len(data), self.rpc_timeout) if self.rpc else None):
            ok = int(C.llama_state_seq_set_data(self.ctx, buf, len(data), seq)) > 0
        if not ok:
            C.llama_memory_seq_rm(self.mem, seq, 0, -1)
        return ok

    # ----------------------------------------------------------------- lifetime
    def free(self) -> None:
        """Free the batch, the context and the model, and release the RPC servers: once, whoever calls and however
        often (an RPC model's release waits for its servers: watched too)."""
        remote = self.rpc
        with _INIT_LOCK, (rpc.WATCHDOG.watch(remote, "freeing the model", self.rpc_timeout or rpc.DEFAULT_TIMEOUT)
                          if remote else _LOCAL_CALL):
            if self.batch is not None:
                C.llama_batch_free(self.batch)
                self.batch = None
            if self.ctx is not None:
                self._views.clear()
                C.llama_free(self.ctx)
                self.ctx = None
            if self.model is not None:
                C.llama_model_free(self.model)
                self.model = None
            if self.rpc:  # the model's connections to its RPC servers are closed now
                rpc.release(self.rpc)
                self.rpc = ()


__all__ = [
    "Context", "RPC_RECENT", "RPC_SLOW_FACTOR", "available_memory", "check_cache_memory", "default_threads", "fit_parallel",
    "gpu_offload_supported", "init_llama", "rpc_decode_allowance",
]
