#!/usr/bin/env python3
"""Tokens/s of one model's forward passes on this machine: single-token decode and batched decodes.

    .venv/bin/python bench/measure_decode.py [MODEL] [--sizes 1 4 8] [--repeats 5] [--threads N]

MODEL defaults to the default pair's target. Each size is timed `repeats` times after a 16-token context
(median reported); a batch of n tokens counts n tokens, so batched tokens/s shows what a verify costs per token.
"""

from __future__ import annotations

import argparse
import statistics
import time

from edgespec.llama.backend import Model
from edgespec.config import ModelSpec
from edgespec.models import resolve_model


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", default=None)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--n-gpu-layers", type=int, default=0)
    a = ap.parse_args()
    path = resolve_model(a.model, "target")
    with Model(ModelSpec(path, n_threads=a.threads, n_gpu_layers=a.n_gpu_layers, n_ctx=512)) as m:
        base = list(range(1000, 1016))
        m.decode(base, 0, ())
        m.decode([42], 16, (0,))  # warm-up
        m.truncate(16)
        print(f"{path.name}: {m.n_threads} threads")
        print(f"{'batch':>5} {'median ms':>10} {'x one token':>12} {'tokens/s':>9}")
        one = None
        for n in a.sizes:
            times = []
            for _ in range(a.repeats):
                toks = [(2000 + 7 * j) for j in range(n)]
                t0 = time.perf_counter()
                m.decode(toks, 16, range(n))
                times.append(time.perf_counter() - t0)
                m.truncate(16)
            med = statistics.median(times)
            one = one or med
            print(f"{n:>5} {1000 * med:>10.1f} {med / one:>12.2f} {n / med:>9.1f}")


if __name__ == "__main__":
    main()
