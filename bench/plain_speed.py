#!/usr/bin/env python3
"""Where does plain decoding's time go? Per-token decode time of the target, measured side by side (interleaved,
alternating order) in one run, for configurations that peel edgespec's path apart down to a bare llama.cpp loop:

    bare          llama.cpp through the binding, context parameters as llama.cpp's own tools set them
    model         edgespec's backend.Model (edgespec's context parameters), a greedy loop over decode()
    model+draft   the same with the draft model loaded beside it (and used once, as calibration does)
    engine        Engine.generate(speculative=False): the whole stack (worker thread, sampling, detokenizer)
    llama-bench   llama.cpp's own llama-bench tg at the same context depth (when bench/llamacpp_compare.py built it)

    .venv/bin/python bench/plain_speed.py                       # default pair, depths 16 and 512, 64 tokens
    .venv/bin/python bench/plain_speed.py --tokens 128 --rounds 3 --json-out /tmp/plain.json

Every configuration decodes the same prompt tokens and then `--tokens` tokens one at a time; the number is the
median milliseconds per decoded token after the prompt. Ratios are against `bare` in the same round.

    .venv/bin/python bench/plain_speed.py --paired              # token by token: bare, model, model+trees

--paired is the finer comparison of the layers that can be stepped one token at a time: the bare loop, the backend
Model, and the Model loaded with tree sequences as the suffix drafters load it (n_seq_max > 1, unified KV cache).
Their contexts decode in turn, one token each (the order alternating), so a drift of the machine's speed lands on
all of them alike; the number is the median over every token of every round.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


class BareStepper:
    """The bare llama.cpp loop: a context made the way llama.cpp's tools make it (their defaults: n_batch 2048,
    n_ubatch 512), decoded through the binding with nothing of edgespec's in between. Same interface as
    backend.Model for what the loops here use: reset(), decode(tokens, pos) -> the last row's logits, n_past."""

    def __init__(self, path: str, n_ctx: int, threads: int) -> None:
        import llama_cpp as C

        from edgespec.llama.context import init_llama

        init_llama()
        self.C = C
        self.model = C.llama_model_load_from_file(path.encode(), C.llama_model_default_params())
        cp = C.llama_context_default_params()
        cp.n_ctx, cp.n_threads, cp.n_threads_batch = n_ctx, threads, threads
        self.ctx = C.llama_init_from_model(self.model, cp)
        self.mem = C.llama_get_memory(self.ctx)
        self.n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(self.model))
        self.batch = C.llama_batch_init(max(2048, n_ctx), 0, 1)
        self.n_past = 0

    def reset(self) -> None:
        self.C.llama_memory_clear(self.mem, True)
        self.n_past = 0

    def decode(self, tokens: list[int], pos: int) -> np.ndarray:
        b = self.batch
        b.n_tokens = len(tokens)
        for i, t in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i], b.seq_id[i][0] = t, pos + i, 1, 0
            b.logits[i] = i == len(tokens) - 1
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


def run_paired(target: str, n_ctx: int, threads: int, depths: list[int], rounds: int, n: int) -> dict[str, dict[str, float]]:
    """--paired: median ms per token of bare, model and model+trees at each depth (see the module docstring)."""
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
            print(f"depth {depth}: " + " | ".join(f"{name} {ms:.2f} ms ({ms / med['bare']:.3f}x bare)" for name, ms in med.items())
                  + f"  ({rounds} rounds x {n} tokens each)")
    finally:
        for m in steppers.values():
            m.close()
    return out


def model_loop(model: Any, prompt: list[int], n: int) -> float:
    model.reset()
    tok = int(np.argmax(model.decode(prompt, 0)[0]))
    t0 = time.perf_counter()
    for _ in range(n):
        tok = int(np.argmax(model.decode([tok], model.n_past)[0]))
    return (time.perf_counter() - t0) / n


def _engine_per_decode(eng: Any, prompt: list[int], n: int) -> float:
    """Seconds per decode after the prompt: n + 1 tokens take n decodes (the first comes from the prefill)."""
    from edgespec.config import SamplingParams

    st = eng.generate(tokens=prompt, sampling=SamplingParams(temperature=0), max_tokens=n + 1).stats
    return st.decode_seconds / max(st.n_generated - 1, 1)


def llama_bench_seconds(bin_dir: Path, target: str, n: int, depth: int, threads: int) -> float | None:
    """Seconds a token by llama-bench (tg at this depth), where llamacpp_compare.py built it for this machine."""
    from llamacpp_compare import llama_bench  # next to this script

    if not (bin_dir / "llama-bench").is_file():
        return None
    r = llama_bench(bin_dir, Path(target), n, threads, 1, depth)
    return None if "error" in r else 1.0 / r["tokens_per_second"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--depths", type=int, nargs="+", default=[16, 512])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--only", nargs="+", default=None, help="configurations to run (default: all)")
    ap.add_argument("--paired", action="store_true", help="step bare, model and model+trees token by token in turn (see above)")
    ap.add_argument("--json-out", type=Path, default=None)
    args = ap.parse_args()

    from edgespec.llama.backend import Model, default_threads
    from edgespec.config import ModelSpec
    from edgespec.runtime.engine import Engine
    from edgespec.models import resolve_model
    from edgespec.paths import cache_dir

    threads = args.threads or default_threads()
    target = str(resolve_model(None, "target"))
    n_ctx = 4096
    if args.paired:
        print(f"target {os.path.basename(target)}, {threads} threads, paired token by token")
        res = run_paired(target, n_ctx, threads, args.depths, args.rounds, args.tokens)
        if args.json_out:
            args.json_out.write_text(json.dumps(res, indent=1))
        return

    draft = str(resolve_model(None, "draft"))
    bare = BareStepper(target, n_ctx, threads)
    m = Model(ModelSpec(target, n_ctx=n_ctx, n_threads=threads))
    m2 = Model(ModelSpec(target, n_ctx=n_ctx, n_threads=threads))
    d = Model(ModelSpec(draft, n_ctx=n_ctx, n_threads=threads))
    eng = Engine(Model(ModelSpec(target, n_ctx=n_ctx, n_threads=threads)), None, drafter="none")
    eng.run_on_worker(lambda _: d.decode(list(range(100, 116)), 0)).result()  # the draft has run, as after calibration
    import llama_cpp
    from llamacpp_compare import build_dir, detect_cmake_args

    bin_dir = build_dir(cache_dir() / "llamacpp", llama_cpp.__version__, detect_cmake_args()) / "bin"  # the flags setup.sh uses
    rng = np.random.default_rng(0)
    # Every in-process configuration decodes on the engine's worker thread: llama.cpp's OpenMP keeps a thread pool
    # per calling thread, and two pools on two cores slow every decode (see docs/benchmarks-history.md, 2026-11-30).
    on_worker = eng.submit
    configs: dict[str, Callable[[list[int]], float | None]] = {
        "bare": lambda p: on_worker(lambda _: model_loop(bare, p, args.tokens)).result(),
        "model": lambda p: on_worker(lambda _: model_loop(m, p, args.tokens)).result(),
        "model+draft": lambda p: on_worker(lambda _: model_loop(m2, p, args.tokens)).result(),
        "engine": lambda p: _engine_per_decode(eng, p, args.tokens),
        "llama-bench": lambda p: llama_bench_seconds(bin_dir, target, args.tokens, len(p), threads),
    }
    if args.only:
        configs = {k: v for k, v in configs.items() if k in args.only}
    results: dict[str, dict[str, list[float]]] = {}
    for r in range(args.rounds):
        for depth in args.depths:
            prompt = [int(t) for t in rng.integers(1000, 20000, depth)]
            names = list(configs) if r % 2 == 0 else list(reversed(configs))
            for name in names:
                s = configs[name](prompt)
                if s is not None:
                    results.setdefault(f"{depth}", {}).setdefault(name, []).append(1000.0 * s)
            print(f"round {r + 1}, depth {depth}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in results[f'{depth}'].items()), file=sys.stderr)
    print(f"target {os.path.basename(target)}, {threads} threads, {args.tokens} tokens, {args.rounds} rounds (median ms per token)")
    for depth, per in results.items():
        base = statistics.median(per["bare"]) if "bare" in per else None
        cells = []
        for name, v in per.items():
            med = statistics.median(v)
            cells.append(f"{name} {med:.1f} ms" + (f" ({base / med:.3f}x bare)" if base else ""))
        print(f"depth {depth}: " + " | ".join(cells))
    if args.json_out:
        args.json_out.write_text(json.dumps(results, indent=1))
    for mm in (m, m2, d, bare):
        mm.close()
    eng.close()


if __name__ == "__main__":
    main()
