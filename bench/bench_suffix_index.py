"""Speed and size of edgespec.drafting.suffix_index.SuffixIndex at a given number of indexed tokens.

    .venv/bin/python bench/bench_suffix_index.py                    # 10k and 100k tokens
    .venv/bin/python bench/bench_suffix_index.py --tokens 250000 --lookups 2000

The indexed text is synthetic but text-like: Zipf-distributed token ids (vocabulary 32k) with copied passages, so
n-grams of every length repeat. A generation is simulated: each cycle proposes (depth 8, width 4), then appends
the first proposed tokens plus one fresh token (what a verify with a few acceptances does). Reported: the time of
one propose (the lookup, and the sync that checks the context continues the indexed one), of one appended token,
of adding a 5k-token document, of save and load, the memory the index holds, and the file size. Times are CPU
seconds of this process (time.process_time), which a busy shared machine inflates less than wall time. Compare
with one target verify on the 2-core CPU (~80 ms): 1% is 0.8 ms.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from edgespec.drafting.suffix_index import SuffixIndex

clock = time.process_time


def text_like(rng: np.random.Generator, n: int) -> list[int]:
    out = np.minimum(rng.zipf(1.3, size=n), 32_000).tolist()
    for _ in range(n // 200):
        a, b = sorted(rng.integers(0, max(n - 64, 1), size=2).tolist())
        out[b : b + 48] = out[a : a + 48]
    return out[:n]


def bench(n_tokens: int, n_lookups: int, seed: int = 0) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    idx = SuffixIndex(max_tokens=max(n_tokens * 2, 1 << 18))
    add_times = []
    for start in range(0, n_tokens, 5000):
        doc = text_like(rng, min(5000, n_tokens - start))
        t0 = clock()
        idx.add_document(doc)
        add_times.append(clock() - t0)
    ctx = text_like(rng, 2000)
    t0 = clock()
    idx.sync(ctx)
    sync_ctx = clock() - t0
    propose, append, hits, nodes = [], [], 0, []
    for _ in range(n_lookups):
        t0 = clock()
        p = idx.propose(ctx, 8, 4)
        propose.append(clock() - t0)
        hits += bool(len(p))
        nodes.append(len(p))
        new = list(p.tokens[:3]) + [min(int(rng.zipf(1.3)), 32_000)]
        t0 = clock()
        idx.extend(new)
        append.append((clock() - t0) / len(new))
        ctx = ctx + new
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "bench.idx"
        t0 = clock()
        idx.save(path)
        t_save = clock() - t0
        size = path.stat().st_size
        t0 = clock()
        SuffixIndex.load(path, max_tokens=idx.max_tokens)
        t_load = clock() - t0
    q = lambda xs, f: statistics.quantiles(xs, n=100)[f - 1] * 1e6  # noqa: E731
    return {
        "tokens": len(idx),
        "propose_us_median": statistics.median(propose) * 1e6,
        "propose_us_p99": q(propose, 99),
        "append_us_per_token": statistics.median(append) * 1e6,
        "add_5k_doc_ms": statistics.median(add_times) * 1e3,
        "sync_2k_context_ms": sync_ctx * 1e3,
        "memory_mb": idx.memory_bytes() / 1e6,
        "bytes_per_token": idx.memory_bytes() / len(idx),
        "file_mb": size / 1e6,
        "save_ms": t_save * 1e3,
        "load_ms": t_load * 1e3,
        "proposals_nonempty": hits / n_lookups,
        "nodes_median": statistics.median(nodes),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="*", default=[10_000, 100_000])
    ap.add_argument("--lookups", type=int, default=1000)
    args = ap.parse_args()
    for n in args.tokens:
        r = bench(n, args.lookups)
        print(f"{n:>8} tokens: " + ", ".join(f"{k} {v:.3g}" for k, v in r.items() if k != "tokens"))


if __name__ == "__main__":
    main()
