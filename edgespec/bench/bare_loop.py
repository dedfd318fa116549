"""Where plain decoding's time goes (bench/plain_speed.py is the command line): a bare llama.cpp decode loop with
nothing of edgespec's in between (`BareStepper`), stepped token by token beside edgespec's layers (`paired_steps`,
`run_paired`), and the per-token loops the benchmark times (`model_loop`, `engine_per_decode`, `llama_bench_seconds`).

Every stepper has the interface of backend.Model these loops use: reset(), decode(tokens, pos) -> the last row's
logits, n_past. Importing this module loads nothing of llama.cpp; a BareStepper loads the library when it is made.
"""

from __future__ import annotations

import ctypes
import statistics
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from .llamacpp import llama_bench


class BareStepper:
    """The bare llama.cpp loop: a context made the way llama.cpp's tools make it (their defaults: n_batch 2048,
    n_ubatch 512), decoded through the binding with nothing of edgespec's in between. Same interface as
    backend.Model for what the loops here use: reset(), decode(tokens, pos) -> the last row's logits, n_past."""

    def __init__(self, path: str, n_ctx: int, threads: int) -> None:
        from edgespec.llama.binding import C, logits_address
        from edgespec.llama.context import init_llama

        init_llama()  # as backend.Model does (backend, log callback)
        self.C = C
        self.model = C.llama_model_load_from_file(path.encode(), C.llama_model_default_params())
        cp = C.llama_context_default_params()
        cp.n_ctx, cp.n_threads, cp.n_threads_batch = n_ctx, threads, threads
        self.ctx = C.llama_init_from_model(self.model, cp)
        self.mem = C.llama_get_memory(self.ctx)
        self.n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(self.model))
        self.batch = C.llama_batch_init(max(2048, n_ctx), 0, 1)
        self.n_past = 0
        self._views: dict[tuple[int, int], np.ndarray] = {}
        self._logits_address = logits_address

    def reset(self) -> None:
        self.C.llama_memory_clear(self.mem, True)
        self.n_past = 0

    def fill(self, tokens: list[int], pos: int, all_rows: bool = False) -> None:
        """The batch holds `tokens` at positions pos.. in sequence 0, with logits for the last row (every row)."""
        b = self.batch
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = t, pos + i, 1, 0
            b.logits[i] = all_rows or i == len(tokens) - 1

    def rows(self, n: int) -> np.ndarray:
        """The last decode's first n output rows as a view of llama.cpp's logits buffer, made once per (address, n)
        as the engine's Context.logits_view is (valid until the next decode)."""
        addr = self._logits_address(self.ctx)
        view = self._views.get((addr, n))
        if view is None:
            if any(a != addr for a, _ in self._views):
                self._views.clear()
            buf = (ctypes.c_float * (n * self.n_vocab)).from_address(addr)
            view = self._views[(addr, n)] = np.frombuffer(buf, dtype=np.float32).reshape(n, self.n_vocab)
        return view

    def decode(self, tokens: list[int], pos: int) -> np.ndarray:
        b = self.batch
        self.fill(tokens, pos)
        if self.C.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")
        self.n_past += len(tokens)
        return np.ctypeslib.as_array(self.C.llama_get_logits_ith(self.ctx, len(tokens) - 1), shape=(1, self.n_vocab))

    def close(self) -> None:
        self.C.llama_batch_free(self.batch)
        self.C.llama_free(self.ctx)
        self.C.llama_model_free(self.model)


def paired_steps(steppers: dict[str, Any], prompt: list[int], n: int) -> dict[str, list[float]]:
    """Greedy decoding of n tokens after `prompt` in every stepper, one token each in turn (the order alternating);
    the seconds of every decode, per stepper."""
    last = {}
    for name, m in steppers.items():
        m.reset()
        last[name] = int(np.argmax(m.decode(prompt, 0)[-1]))
    times: dict[str, list[float]] = {name: [] for name in steppers}
    names = list(steppers)
    for i in range(n):
        for name in names if i % 2 == 0 else names[::-1]:
            m = steppers[name]
            t0 = time.perf_counter()
            last[name] = int(np.argmax(m.decode([last[name]], m.n_past)[-1]))
            times[name].append(time.perf_counter() - t0)
    return times


def run_paired(target: str, n_ctx: int, threads: int, depths: Sequence[int], rounds: int, n: int,
               progress: Callable[[str], None] | None = None) -> dict[str, dict[str, float]]:
    """Median ms per token of bare, model (backend.Model) and model+trees (a Model loaded with tree sequences as the
    suffix drafters load it) at each depth, their contexts stepped in turn (paired_steps) over `rounds` random
    prompts of that depth; progress: one line per depth."""
    from edgespec.llama.backend import Model
    from edgespec.config import ModelSpec, SpecConfig

    steppers: dict[str, Any] = {
        "bare": BareStepper(target, n_ctx, threads),
        "model": Model(ModelSpec(target, n_ctx=n_ctx, n_threads=threads)),
        "model+trees": Model(ModelSpec(target, n_ctx=n_ctx, n_threads=threads), tree_paths=SpecConfig().tree_nodes),
    }
    # Every decode of this run happens on this one thread, so llama.cpp's OpenMP keeps one thread pool (two pools on
    # two cores slow every decode, see docs/benchmarks-history.md, 2026-11-30).
    rng = np.random.default_rng(0)
    out: dict[str, dict[str, float]] = {}
    try:
        for depth in depths:
            times: dict[str, list[float]] = {name: [] for name in steppers}
            for _ in range(rounds):
                prompt = [int(t) for t in rng.integers(1000, 20000, depth)]
                for name, ts in paired_steps(steppers, prompt, n).items():
                    times[name] += ts
            med = {name: 1000.0 * statistics.median(ts) for name, ts in times.items()}
            out[str(depth)] = med
            if progress is not None:
                progress(f"depth {depth}: " + " | ".join(f"{name} {ms:.2f} ms ({ms / med['bare']:.3f}x bare)" for name, ms in med.items())
                         + f"  ({rounds} rounds x {n} tokens each)")
    finally:
        for m in steppers.values():
            m.close()
    return out


def model_loop(model: Any, prompt: list[int], n: int) -> float:
    """Seconds per token of a greedy loop of n single-token decodes after `prompt`."""
    model.reset()
    tok = int(np.argmax(model.decode(prompt, 0)[0]))
    t0 = time.perf_counter()
    for _ in range(n):
        tok = int(np.argmax(model.decode([tok], model.n_past)[0]))
    return (time.perf_counter() - t0) / n


def engine_per_decode(eng: Any, prompt: list[int], n: int) -> float:
    """Seconds per decode after the prompt of Engine.generate(speculative=False): n + 1 tokens take n decodes (the
    first comes from the prefill)."""
    from edgespec.config import SamplingParams

    st = eng.generate(tokens=prompt, sampling=SamplingParams(temperature=0), max_tokens=n + 1).stats
    return st.decode_seconds / max(st.n_generated - 1, 1)


def llama_bench_seconds(bin_dir: Path, target: str, n: int, depth: int, threads: int) -> float | None:
    """Seconds a token by llama-bench (tg at this depth), where bench/llamacpp_compare.py built it for this machine."""
    if not (bin_dir / "llama-bench").is_file():
        return None
    r = llama_bench(bin_dir, Path(target), n, threads, 1, depth)
    return None if "error" in r else 1.0 / r["tokens_per_second"]
