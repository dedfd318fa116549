"""Greedy identity on the real pair (docs/determinism.md): a long answer decoded plain and alone vs the same answer
decoded speculatively with short requests started beside it in other slots; then for each prompt, plain decoding vs
speculative decoding with a fixed 8-token draft (verify batches of up to 9 rows; token ids compared).
One mode per process (--mode): ggml reads GGML_CPU_TILED_MM once.

    PYTHONPATH=$PWD python bench/determinism_check.py --mode deterministic [--prompts 17] [--tokens 160]
    PYTHONPATH=$PWD python bench/determinism_check.py --mode both --cost   # generation speed, modes alternated
    PYTHONPATH=$PWD python bench/determinism_check.py --decode-cost 5       # the decode times, both in one process
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from typing import Any

MODELS = os.path.expanduser("~/.cache/edgespec/models/")
TARGET = MODELS + "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
DRAFT = MODELS + "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"

PROMPTS = [  # code, edits, prose, extraction, reasoning
    "Write a Python function that merges two sorted lists into one sorted list, with a docstring and tests.",
    "Write a C function that reverses a singly linked list in place, and explain each step.",
    "Implement an LRU cache class in Python with get and put in O(1), using OrderedDict.",
    "Write a bash script that finds the ten largest files under a directory and prints their sizes.",
    "Rewrite this function to use a list comprehension and type hints:\n\ndef evens(xs):\n    out = []\n    for x in xs:\n"
    "        if x % 2 == 0:\n            out.append(x)\n    return out",
    "Refactor this JavaScript to async/await:\n\nfunction load(url, cb) {\n  fetch(url).then(r => r.json()).then(d => cb(null, d))"
    ".catch(e => cb(e));\n}",
    "Fix the bug in this Python code and explain it:\n\ndef mean(xs):\n    return sum(xs) / len(xs) if xs else sum(xs) / 0",
    "Add error handling and logging to this function:\n\ndef read_config(path):\n    with open(path) as f:\n        return json.load(f)",
    "Explain in plain English how a hash table handles collisions, for a new programmer.",
    "Write a short essay on why code review matters in software teams.",
    "Describe the differences between TCP and UDP and when to use each.",
    "Extract every name, date and amount from this text as a JSON list: 'On March 3, 2024 Alice paid Bob $120. On April 9, "
    "2024 Carol paid Dave $75.50. Erin refunded Frank $20 on May 1, 2024.'",
    "List the HTTP status codes mentioned and what each means: 'The server returned 404 first, then 500, and after the "
    "retry 200; the proxy logged 502 and 301 redirects.'",
    "From this CSV header and row, write a SQL CREATE TABLE statement: id,name,email,signup_date,score\n1,Ann,a@x.io,2024-01-02,9.5",
    "A train leaves at 3pm at 60 km/h; another leaves the same station at 4pm at 90 km/h on the same track. When does the "
    "second catch the first? Reason step by step.",
    "Is 1001 a prime number? Reason step by step and show your work.",
    "You have 3 boxes, one with apples, one with oranges, one with both, all labeled wrong. Picking one fruit from one box, "
    "how do you relabel them all? Explain step by step.",
]
LONG = "Write a detailed tutorial on Python decorators: what they are, how to write one with arguments, functools.wraps, " \
       "class decorators, and three practical examples with code."
SHORT = ["Say hello in French.", "What is 17 * 23?", "Name three sorting algorithms.", "Give a synonym for fast."]


def _first_diff(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (a length difference counts), None where they are equal."""
    k = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), None)
    return k if k is not None or len(a) == len(b) else min(len(a), len(b))


def _sha(ids: list[int]) -> str:
    """A short hash of token ids: two runs' outputs compared from their logs."""
    return hashlib.sha256(json.dumps(ids).encode()).hexdigest()[:12]


def _fixed() -> Any:
    from edgespec.config import SpecConfig

    return SpecConfig(draft_max=8, adaptive=False)


def _greedy() -> Any:
    from edgespec.config import SamplingParams

    return SamplingParams(temperature=0.0)


def _load(deterministic: bool, parallel: int) -> Any:
    from edgespec.config import ModelSpec
    from edgespec.runtime.engine import Engine

    return Engine.load(ModelSpec(TARGET, n_ctx=2048), ModelSpec(DRAFT, n_ctx=2048), deterministic=deterministic,
                       parallel=parallel, memory=False)


def identity(deterministic: bool, n_prompts: int, tokens: int, long_tokens: int) -> dict[str, Any]:
    """The long answer alone vs beside short requests; plain vs speculative per prompt."""
    out: dict[str, Any] = {"mode": "deterministic" if deterministic else "default", "prompts": []}
    with _load(deterministic, 3) as eng:
        g = _greedy()
        FIXED = _fixed()
        msgs = [{"role": "user", "content": LONG}]
        alone = eng.generate(messages=msgs, sampling=g, max_tokens=long_tokens, speculative=False)
        long_gen = eng.stream(messages=msgs, sampling=g, max_tokens=long_tokens, spec=FIXED)
        shorts: list[Any] = []

        def feed() -> None:  # short requests in the other slots while the long one runs
            for s in SHORT * 2:
                time.sleep(1.0)
                shorts.append(eng.stream(messages=[{"role": "user", "content": s}], sampling=g, max_tokens=24))
                shorts[-1].result()

        th = threading.Thread(target=feed)
        th.start()
        beside = long_gen.result()
        th.join()
        out["long"] = {"n": len(alone.token_ids), "same_beside": beside.token_ids == alone.token_ids, "shorts": len(shorts),
                       "drafted_beside": beside.stats.n_drafted, "accepted_beside": beside.stats.n_accepted,
                       "first_diff": _first_diff(alone.token_ids, beside.token_ids), "alone_sha": _sha(alone.token_ids)}
        print(json.dumps(out["long"]), flush=True)
        for i, p in enumerate(PROMPTS[:n_prompts]):
            msgs = [{"role": "user", "content": p}]
            plain = eng.generate(messages=msgs, sampling=g, max_tokens=tokens, speculative=False)
            fixed = eng.generate(messages=msgs, sampling=g, max_tokens=tokens, spec=FIXED)  # up to 9-row verify batches
            row = {"i": i, "n_plain": len(plain.token_ids), "same_fixed_k8": fixed.token_ids == plain.token_ids,
                   "drafted_k8": fixed.stats.n_drafted, "accepted_k8": fixed.stats.n_accepted,
                   "first_diff_k8": _first_diff(plain.token_ids, fixed.token_ids), "plain_sha": _sha(plain.token_ids)}
            out["prompts"].append(row)
            print(json.dumps(row), flush=True)
    rows = out["prompts"]
    out["summary"] = {"prompts": len(rows), "fixed_k8_equals_plain": sum(r["same_fixed_k8"] for r in rows),
                      "min_tokens": min((r["n_plain"] for r in rows), default=0)}
    return out


def cost(deterministic: bool, tokens: int) -> dict[str, Any]:
    """Plain and speculative decode rates and the prefill rate of one mode, over the first three prompts."""
    with _load(deterministic, 1) as eng:
        g = _greedy()
        rates: dict[str, list[float]] = {"plain": [], "spec": [], "prefill": []}
        for p in PROMPTS[:3]:
            msgs = [{"role": "user", "content": p}]
            eng.reset_caches()
            r = eng.generate(messages=msgs, sampling=g, max_tokens=tokens, speculative=False)
            rates["plain"].append(r.stats.tokens_per_second)
            rates["prefill"].append(r.stats.n_prefill / max(1e-9, r.stats.timings.prefill))
            eng.reset_caches()
            rates["spec"].append(eng.generate(messages=msgs, sampling=g, max_tokens=tokens).stats.tokens_per_second)
    return {k: sum(v) / len(v) for k, v in rates.items()}


def decode_cost(rounds: int, context: int) -> dict[str, Any]:
    """The target's decode times in both modes in this one process, alternated round by round (deterministic mode's
    model loads first: ggml reads GGML_CPU_TILED_MM at the process's first K-quant product, so the default model
    here runs without the tiled product too; its repacked weights never take it): one token, a 9-token verify,
    and a 256-token prefill, after `context` tokens, 2 threads; medians in ms."""
    import statistics

    from edgespec.config import ModelSpec
    from edgespec.llama.backend import Model

    models = {"deterministic": Model(ModelSpec(TARGET, n_ctx=2048, n_threads=2, deterministic=True)),
              "default": Model(ModelSpec(TARGET, n_ctx=2048, n_threads=2))}
    ctx = [(17 * i + 100) % 150000 for i in range(context)]
    times: dict[str, dict[str, list[float]]] = {m: {"1": [], "9": [], "prefill256": []} for m in models}

    def timed(fn: Any, *args: Any, **kw: Any) -> float:
        t0 = time.perf_counter()
        fn(*args, **kw)
        return 1000 * (time.perf_counter() - t0)

    for _ in range(rounds):
        for name, m in models.items():
            m.reset()
            times[name]["prefill256"].append(timed(m.sync, ctx[:256], rows=(-1,)))
            m.sync(ctx, rows=())
            for n in (1, 9):
                for _ in range(4):
                    times[name][str(n)].append(timed(m.decode, ctx[:n], context, rows=tuple(range(n))))
                    m.truncate(context)
    for m in models.values():
        m.close()
    med = {name: {k: statistics.median(v) for k, v in t.items()} for name, t in times.items()}
    return {"ms": med, "ratio_deterministic_over_default": {k: med["deterministic"][k] / med["default"][k] for k in med["default"]}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["deterministic", "default", "both"], default="deterministic")
    ap.add_argument("--prompts", type=int, default=17)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--long-tokens", type=int, default=400)
    ap.add_argument("--cost", action="store_true", help="measure the speed of each mode instead (alternated, 2 rounds)")
    ap.add_argument("--decode-cost", type=int, default=0, metavar="ROUNDS",
                    help="the target's decode times of both modes in one process, alternated for ROUNDS rounds")
    a = ap.parse_args()
    if a.decode_cost:
        print(json.dumps(decode_cost(a.decode_cost, 300)))
        return
    if a.cost:
        if a.mode == "both":
            res: dict[str, list[dict[str, float]]] = {"default": [], "deterministic": []}
            for _ in range(2):
                for mode in ("default", "deterministic"):
                    r = subprocess.run([sys.executable, __file__, "--cost", "--mode", mode, "--tokens", str(a.tokens)],
                                       capture_output=True, text=True, check=True)
                    res[mode].append(json.loads(r.stdout.strip().splitlines()[-1]))
                    print(mode, res[mode][-1], flush=True)
            avg = {m: {k: sum(x[k] for x in v) / len(v) for k in v[0]} for m, v in res.items()}
            print(json.dumps({"avg": avg, "ratio_deterministic_over_default": {k: avg["deterministic"][k] / avg["default"][k] for k in avg["default"]}}))
        else:
            print(json.dumps(cost(a.mode == "deterministic", a.tokens)))
        return
    res2 = identity(a.mode != "default", a.prompts, a.tokens, a.long_tokens)
    print(json.dumps(res2["summary"]))


if __name__ == "__main__":
    main()
