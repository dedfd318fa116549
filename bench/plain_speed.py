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

The command line of edgespec/bench/bare_loop.py (the bare loop, the paired steps, the timed loops).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgespec.bench.bare_loop import BareStepper, engine_per_decode, llama_bench_seconds, model_loop, run_paired  # noqa: E402
from edgespec.bench.llamacpp import build_dir, detect_cmake_args  # noqa: E402


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
        res = run_paired(target, n_ctx, threads, args.depths, args.rounds, args.tokens, progress=print)
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

    bin_dir = build_dir(cache_dir() / "llamacpp", llama_cpp.__version__, detect_cmake_args()) / "bin"  # the flags setup.sh uses
    rng = np.random.default_rng(0)
    # Every in-process configuration decodes on the engine's worker thread: llama.cpp's OpenMP keeps a thread pool
    # per calling thread, and two pools on two cores slow every decode (see docs/benchmarks-history.md, 2026-11-30).
    on_worker = eng.submit
    configs: dict[str, Callable[[list[int]], float | None]] = {
        "bare": lambda p: on_worker(lambda _: model_loop(bare, p, args.tokens)).result(),
        "model": lambda p: on_worker(lambda _: model_loop(m, p, args.tokens)).result(),
        "model+draft": lambda p: on_worker(lambda _: model_loop(m2, p, args.tokens)).result(),
        "engine": lambda p: engine_per_decode(eng, p, args.tokens),
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
