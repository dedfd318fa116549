"""Several streams at once (issue 34): the aggregate throughput of N concurrent generations against the same N run one
after another, in one engine, on the default pair, greedy; and the cost of slots to a lone generation.

    .venv/bin/python bench/parallel_bench.py                          # 4 streams x 128 tokens, 2 repeats
    .venv/bin/python bench/parallel_bench.py --streams 4 --tokens 200 --repeats 3 --json out.json
    .venv/bin/python bench/parallel_bench.py --alone-parallel 1,4     # a lone generation, 1 vs 4 slots (subprocesses)

Throughput = all generated tokens / wall seconds from the first request to the last token (prompts included: both
ways decode the same prompts; the prompt cache is emptied before each way). Each repeat runs "one after another" and
"together" in alternating order, seconds apart, and the ratio is taken per repeat (the machine's drift cancels). Every
stream's text together is compared with its text alone (greedy: equal up to near-ties of batched kernels; where one
differs, "divergences" gives the first differing token and the gap between the target's top-2 logits there). --plain
runs the same without speculation. --alone-parallel loads one engine per slot count in a fresh process each (one
process, one OpenMP pool) and times one generation at a time: what slots cost a single user.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from edgespec import Engine, ModelSpec, SamplingParams  # noqa: E402
from edgespec.models import resolve_model  # noqa: E402

GREEDY = SamplingParams(temperature=0)
PROMPTS = [
    "Write a Python function that parses an ISO 8601 date string without using datetime, with tests.",
    "Explain how a B-tree keeps itself balanced on insert, step by step.",
    "Refactor this loop into a list comprehension and explain why it is faster:\n\nout = []\nfor x in xs:\n    if x % 2:\n        out.append(x * x)\n",
    "Write a bash script that finds the ten largest files under a folder and prints their sizes in MiB.",
    "What is the difference between a process and a thread? Give a C example of each.",
    "Write a SQL query that returns the second highest salary per department, and explain it.",
    "Implement a least-recently-used cache class in Python with O(1) get and put.",
    "Describe three ways to detect a cycle in a linked list and their costs.",
]


def load(parallel: int | None, threads: int | None) -> Engine:
    return Engine.load(ModelSpec(str(resolve_model(None, "target")), n_threads=threads),
                       ModelSpec(str(resolve_model(None, "draft")), n_threads=threads), parallel=parallel)


def one_by_one(eng: Engine, prompts: list[str], tokens: int, speculative: bool) -> tuple[float, list[list[int]], int]:
    eng.reset_caches()
    t0 = time.perf_counter()
    out = [list(eng.generate(messages=[{"role": "user", "content": p}], sampling=GREEDY, max_tokens=tokens,
                             speculative=speculative).token_ids) for p in prompts]
    return time.perf_counter() - t0, out, sum(map(len, out))


def together(eng: Engine, prompts: list[str], tokens: int, speculative: bool) -> tuple[float, list[list[int]], int]:
    eng.reset_caches()
    t0 = time.perf_counter()
    gens = [eng.stream(messages=[{"role": "user", "content": p}], sampling=GREEDY, max_tokens=tokens, speculative=speculative)
            for p in prompts]
    out = [list(g.result().token_ids) for g in gens]
    return time.perf_counter() - t0, out, sum(map(len, out))


def near_tie(eng: Engine, prompt: str, alone: list[int], other: list[int]) -> dict[str, Any]:
    """Where a stream run beside others left its text alone: the token index and the gap between the target's two
    best logits there (one decode of the prompt and the common prefix, alone in a slot): a small gap is a near-tie
    that batched and single-row kernels may break either way."""
    i = next(j for j, (x, y) in enumerate(zip(alone, other)) if x != y) if alone[:len(other)] != other[:len(alone)] else min(len(alone), len(other))
    ctx = eng.prompt_tokens(messages=[{"role": "user", "content": prompt}]) + alone[:i]

    def gap(e: Engine) -> float:
        e.target.reset()
        row = np.sort(e.target.sync(ctx)[0])
        return float(row[-1] - row[-2])

    return {"token": i, "top2_gap": round(eng.run_on_worker(gap).result(), 3)}


def aggregate(a: argparse.Namespace) -> dict[str, Any]:
    prompts = PROMPTS[: a.streams]
    res: dict[str, Any] = {"streams": a.streams, "tokens": a.tokens, "repeats": a.repeats}
    with load(a.parallel, a.threads) as eng:
        res["parallel"] = eng.parallel
        eng.generate("warm up", max_tokens=8)
        for speculative in ([False, True] if a.plain else [True]):
            name = "speculative" if speculative else "plain"
            ratios, rows, same, ties = [], [], [], []  # type: ignore[var-annotated]
            for rep in range(a.repeats):
                order = (one_by_one, together) if rep % 2 == 0 else (together, one_by_one)
                got = {fn.__name__: fn(eng, prompts, a.tokens, speculative) for fn in order}
                (s_seq, out_seq, n_seq), (s_par, out_par, n_par) = got["one_by_one"], got["together"]
                rate_seq, rate_par = n_seq / s_seq, n_par / s_par
                ratios.append(rate_par / rate_seq)
                same.append(sum(x == y for x, y in zip(out_seq, out_par)))
                ties += [near_tie(eng, p, x, y) for p, x, y in zip(prompts, out_seq, out_par) if x != y]
                rows.append({"one_by_one_tok_s": round(rate_seq, 2), "together_tok_s": round(rate_par, 2),
                             "ratio": round(rate_par / rate_seq, 3), "identical_streams": f"{same[-1]}/{len(prompts)}"})
                print(name, rep, rows[-1], file=sys.stderr)
            res[name] = {"median_ratio": round(statistics.median(ratios), 3), "runs": rows, "divergences": ties,
                         "batched_decodes": eng.slots.batched_decodes}
    return res


def alone_parallel(a: argparse.Namespace) -> dict[str, Any]:
    """A lone generation's rate with each slot count, each in its own process, alternating, `repeats` times."""
    counts = [int(x) for x in a.alone_parallel.split(",")]
    rates: dict[int, list[float]] = {c: [] for c in counts}
    for rep in range(a.repeats):
        for c in (counts if rep % 2 == 0 else counts[::-1]):
            cmd = [sys.executable, __file__, "--child-alone", str(c), "--tokens", str(a.tokens), "--streams", str(a.streams)]
            if a.threads:
                cmd += ["--threads", str(a.threads)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            rates[c].append(json.loads(out.strip().splitlines()[-1])["tok_s"])
            print(c, rates[c][-1], file=sys.stderr)
    base = counts[0]
    return {"alone_tok_s": {str(c): [round(x, 2) for x in v] for c, v in rates.items()},
            "ratio_vs_first": {str(c): round(statistics.median(x / y for x, y in zip(rates[c], rates[base])), 3) for c in counts}}


def child_alone(a: argparse.Namespace) -> None:
    with load(a.child_alone, a.threads) as eng:
        eng.generate("warm up", max_tokens=8)
        seconds, _, n = one_by_one(eng, PROMPTS[: a.streams], a.tokens, True)
    print(json.dumps({"parallel": a.child_alone, "tok_s": n / seconds}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=None, help="slots (default: the engine's)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--plain", action="store_true", help="also without speculation")
    ap.add_argument("--alone-parallel", default=None, metavar="A,B", help="a lone generation with A vs B slots")
    ap.add_argument("--child-alone", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--json", dest="json_out", default=None)
    a = ap.parse_args()
    if a.child_alone is not None:
        child_alone(a)
        return
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    out.update(alone_parallel(a) if a.alone_parallel else aggregate(a))
    print(json.dumps(out, indent=1))
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
