#!/usr/bin/env python3
"""The loop's own work: host milliseconds per generated token, everything outside llama_decode (sampling,
acceptance, drafting bookkeeping, detokenization, scheduling), side by side with llama-cpp-python.

    .venv/bin/python bench/host_bench.py --real                 # the default pair through Engine.generate
    .venv/bin/python bench/host_bench.py --fake                 # the loop alone on instant fake models
    .venv/bin/python bench/host_bench.py --real --fake --json-out /tmp/host.json

--real: the default pair, 2 threads, `--prompts` prompts x `--tokens` tokens per row, prefill included (a fresh
prompt each time: the prompt cache is cleared). Host time = each generation's wall time less the seconds inside
llama_decode of both models (backend.Model.decode_seconds, GenerationStats.timings.host); the number is the sum over
the prompts divided by the tokens generated. llama-cpp-python's row is the same measure on its own `Llama`:
create_completion's wall time less the time inside its llama_decode calls (wrapped), sampling with its own C
sampler chain (llama.cpp's defaults, OpenAI's, greedy, with penalties).

--fake: speculate() over instant numpy models (no decode cost at all: logits rows precomputed, a view per token)
at 151,936 and 262,144 vocabulary entries: tokens per second of the loop itself, plain and with a draft of fixed
k = 8 whose q equals the target's p (every draft accepted), greedy and sampled. At 3,000 tokens/s a GPU decoding
300 tokens/s waits on Python at most 10% of the time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
# --code DIR: import edgespec from another checkout (an older commit, for a before/after pair)
if "--code" in sys.argv:
    sys.path.insert(0, str(Path(sys.argv[sys.argv.index("--code") + 1]).resolve()))
else:
    sys.path.insert(0, str(ROOT))

from edgespec.config import SamplingParams, SpecConfig  # noqa: E402

# Sampling settings the issue measures: (name, SamplingParams kwargs, llama-cpp-python create_completion kwargs)
SETTINGS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("greedy", dict(temperature=0.0), dict(temperature=0.0)),
    ("llama.cpp defaults", dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
     dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05)),
    ("OpenAI defaults", dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),
     dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)),
    ("penalties", dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1, presence_penalty=0.5,
                       frequency_penalty=0.5, repeat_last_n=64),
     dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.1, presence_penalty=0.5,
          frequency_penalty=0.5)),
]

PROMPTS = [
    "Write a Python function that parses an ISO 8601 date string and returns a datetime, with error handling.",
    "Explain, in a short paragraph and then a bulleted list, how a hash map handles collisions.",
    "Write a bash script that finds the ten largest files under a directory and prints their sizes.",
    "Describe the difference between a process and a thread, with an example in C.",
]


def _machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, {platform.machine()}"


# ----------------------------------------------------------------------------------------------- the real pair
class DecodeClock:
    """Seconds inside llama_decode, from a wrapper around the binding's function (the one edgespec's backend and
    llama-cpp-python both call), so that any version of either is measured the same way."""

    def __init__(self) -> None:
        import llama_cpp

        self.module = llama_cpp
        self.real = llama_cpp.llama_decode
        self.spent = 0.0

        def timed(ctx: Any, batch: Any) -> int:
            t0 = time.perf_counter()
            try:
                return int(self.real(ctx, batch))
            finally:
                self.spent += time.perf_counter() - t0

        llama_cpp.llama_decode = timed
        try:
            import llama_cpp._internals as internals

            internals.llama_cpp.llama_decode = timed
        except (ImportError, AttributeError):
            pass


def run_real(args: argparse.Namespace) -> list[dict[str, Any]]:
    clock = DecodeClock()
    from edgespec import Engine
    from edgespec.models import resolve_model
    from edgespec.backend import ModelSpec

    target = str(resolve_model(None, "target"))
    draft = str(resolve_model(None, "draft"))
    prompts = PROMPTS[: args.prompts]
    rows: list[dict[str, Any]] = []
    modes: list[tuple[str, str, SpecConfig | None]] = [("plain", "none", None)]
    for k in args.ks:
        modes.append((f"model k={k}", "model", SpecConfig(draft_max=k, adaptive=False, draft_siblings=0)))
    if args.tree:
        modes.append(("suffix tree (8 nodes, width 3)", "suffix", SpecConfig(adaptive=False, tree_nodes=8, tree_width=3)))
    for label, drafter, spec in ([] if args.only_llama_cpp_python else modes):
        eng = Engine.load(
            ModelSpec(target, n_threads=args.threads),
            ModelSpec(draft, n_threads=args.threads) if drafter == "model" else None,
            drafter=drafter, spec=spec, calibrate_costs=False, memory=False, parallel=1,
        )
        try:
            eng.generate(prompts[0], max_tokens=4, sampling=SamplingParams(temperature=0.0))  # warm up
            for name, kw, _ in SETTINGS:
                if name not in args.settings:
                    continue
                host = llama = 0.0
                n = drafted = accepted = 0
                for i, prompt in enumerate(prompts):
                    eng.reset_caches()
                    sp = SamplingParams(**kw, seed=1234 + i if kw["temperature"] and args.seeded else None)
                    spent0 = clock.spent
                    t0 = time.perf_counter()
                    r = eng.generate(prompt, max_tokens=args.tokens, sampling=sp, speculative=drafter != "none")
                    wall = time.perf_counter() - t0
                    s = r.stats
                    host += wall - (clock.spent - spent0)
                    llama += clock.spent - spent0
                    n += s.n_generated
                    drafted += s.n_drafted
                    accepted += s.n_accepted
                row = dict(system="edgespec", mode=label, setting=name, tokens=n, host_ms_per_token=1000 * host / max(n, 1),
                           llama_ms_per_token=1000 * llama / max(n, 1), acceptance=accepted / drafted if drafted else None)
                rows.append(row)
                print(f"  edgespec {label:<32} {name:<20} host {row['host_ms_per_token']:.3f} ms/token "
                      f"(llama {row['llama_ms_per_token']:.1f} ms/token, {n} tokens"
                      + (f", acceptance {row['acceptance']:.2f})" if drafted else ")"), flush=True)
        finally:
            eng.close()
    if args.llama_cpp_python:
        rows += run_llama_cpp_python(target, prompts, args, clock)
    return rows


def run_llama_cpp_python(target: str, prompts: list[str], args: argparse.Namespace, clock: DecodeClock) -> list[dict[str, Any]]:
    import llama_cpp

    rows = []
    if True:
        llm = llama_cpp.Llama(target, n_ctx=2048, n_threads=args.threads, n_threads_batch=args.threads, verbose=False)
        try:
            llm.create_completion(prompts[0], max_tokens=4, temperature=0.0)
            for name, _, kw in SETTINGS:
                if name not in args.settings:
                    continue
                host = 0.0
                n = 0
                for i, prompt in enumerate(prompts):
                    llm.reset()
                    spent0 = clock.spent
                    t0 = time.perf_counter()
                    out = llm.create_completion(prompt, max_tokens=args.tokens, seed=1234 + i, **kw)
                    wall = time.perf_counter() - t0
                    host += wall - (clock.spent - spent0)
                    n += int(out["usage"]["completion_tokens"])
                row = dict(system="llama-cpp-python", mode="plain", setting=name, tokens=n, host_ms_per_token=1000 * host / max(n, 1))
                rows.append(row)
                print(f"  llama-cpp-python plain{'':<27} {name:<20} host {row['host_ms_per_token']:.3f} ms/token ({n} tokens)", flush=True)
        finally:
            llm.close()
    return rows


# ------------------------------------------------------------------------------------------- instant fake models
class InstantModel:
    """A language model with no decode cost: the logits after a context of length n are precomputed float32 row
    n mod R (the same function in every instance, so a second instance used as the draft proposes exactly the
    target's distribution). decode() returns views of those rows, consecutive rows as one slice of the table (the
    engine reads a lone verify's rows as a view of llama.cpp's logits buffer the same way, whose filling is part of
    llama_decode, not of the loop); the interface is speculate.LanguageModel's."""

    PAD = 64  # the table repeats its first rows after the last, so that up to PAD consecutive rows are one slice

    def __init__(self, table: np.ndarray, n_ctx: int = 1 << 16) -> None:
        self.n_rows = table.shape[0]
        self.table = np.concatenate([table, table[: self.PAD]])
        self.n_vocab = table.shape[1]
        self.n_ctx = n_ctx
        self.cached: list[int] = []
        self.n_decoded = 0

    @property
    def n_past(self) -> int:
        return len(self.cached)

    def _row(self, n: int, last: int) -> np.ndarray:
        return self.table[n % self.n_rows]

    def common_prefix(self, tokens: Any) -> int:
        n = 0
        for a, b in zip(self.cached, tokens):
            if a != b:
                break
            n += 1
        return n

    def sync(self, tokens: Any, rows: Any = (-1,), *, should_stop: Any = None, progress: Any = None) -> np.ndarray:
        tokens = list(tokens)
        keep = min(self.common_prefix(tokens), len(tokens) - 1)
        del self.cached[keep:]
        self.cached.extend(tokens[keep:])
        return self._row(len(self.cached), self.cached[-1])[None, :]

    def decode(self, tokens: Any, start_pos: int, rows: Any = (-1,)) -> np.ndarray:
        base = len(self.cached)
        self.cached.extend(int(t) for t in tokens)
        self.n_decoded += len(tokens)
        n = len(tokens)
        want = [r % n for r in rows]
        first = (base + want[0] + 1) % self.n_rows
        if want == list(range(want[0], want[0] + len(want))) and len(want) <= self.PAD:
            return self.table[first : first + len(want)]
        return np.stack([self._row(base + r + 1, int(tokens[r])) for r in want])

    def truncate(self, n: int) -> None:
        del self.cached[n:]

    def is_eog(self, token: int) -> bool:
        return False

    def infill_vocab(self) -> Any:  # pragma: no cover - never asked (no infill here)
        raise NotImplementedError


def fake_table(n_vocab: int, n_rows: int = 64, seed: int = 0) -> np.ndarray:
    """Rows shaped like a language model's: a broad normal background (sd 2.5) and a few tokens lifted well above
    it (a peaked head), float32."""
    rng = np.random.default_rng(seed)
    t = (rng.standard_normal((n_rows, n_vocab)) * 2.5).astype(np.float32)
    for r in range(n_rows):
        head = rng.integers(0, n_vocab, 8)
        t[r, head] += rng.uniform(6.0, 14.0, 8).astype(np.float32)
    return t


def run_fake(args: argparse.Namespace) -> list[dict[str, Any]]:
    from edgespec.costs import CostModel
    from edgespec.policy import Controller
    from edgespec.speculate import speculate
    from edgespec.speculators import ModelSpeculator
    from edgespec.stats import GenerationStats

    rows = []
    flat = {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0}
    for n_vocab in args.vocab:
        table = fake_table(n_vocab)
        for name, kw, _ in SETTINGS:
            if name not in args.settings:
                continue
            sp = SamplingParams(**kw)
            for mode in ("plain", "k=8"):
                best = None
                for rep in range(args.repeats):
                    target = InstantModel(table)
                    spec = None
                    if mode != "plain":
                        cfg = SpecConfig(draft_max=8, adaptive=False, draft_siblings=0)
                        spec = ModelSpeculator(InstantModel(table), sp, Controller(cfg, CostModel(flat, c_draft=0.01, frozen=True)))
                    stats = GenerationStats()
                    rng = np.random.default_rng(rep)
                    t0 = time.perf_counter() if not args.cpu_time else time.process_time()
                    n = 0
                    for step in speculate(target, [1, 2, 3], sp, rng, max_tokens=args.fake_tokens, speculator=spec, stats=stats):
                        n += len(step.tokens)
                    dt = (time.perf_counter() if not args.cpu_time else time.process_time()) - t0
                    rate = n / dt
                    best = rate if best is None else max(best, rate)
                    acc = stats.acceptance if stats.n_drafted else None
                row = dict(system="loop", vocab=n_vocab, setting=name, mode=mode, tokens_per_second=best, acceptance=acc)
                rows.append(row)
                print(f"  fake V={n_vocab:<7} {name:<20} {mode:<6} {best:8.0f} tokens/s"
                      + (f" (acceptance {acc:.2f})" if acc is not None else ""), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real", action="store_true", help="the default pair through Engine.generate (and llama-cpp-python)")
    ap.add_argument("--fake", action="store_true", help="the loop alone on instant fake models")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",")], default=[8], help="fixed draft lengths (1,4,8,16)")
    ap.add_argument("--tree", action="store_true", help="also the suffix drafter's fixed tree")
    ap.add_argument("--no-llama-cpp-python", dest="llama_cpp_python", action="store_false")
    ap.add_argument("--settings", type=lambda s: s.split(","), default=[n for n, _, _ in SETTINGS])
    ap.add_argument("--vocab", type=lambda s: [int(x) for x in s.split(",")], default=[151_936, 262_144])
    ap.add_argument("--fake-tokens", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3, help="fake runs per cell (the best is reported)")
    ap.add_argument("--seeded", action="store_true", help="seeded sampled generations (common random numbers) instead of fresh ones")
    ap.add_argument("--only-llama-cpp-python", action="store_true")
    ap.add_argument("--code", default=None, help="import edgespec from this checkout (a before/after pair)")
    ap.add_argument("--cpu-time", action="store_true", help="fake: rates from this process's CPU time (a busy machine)")
    ap.add_argument("--json-out", default=None)
    args = ap.parse_args()
    if not (args.real or args.fake):
        ap.error("say --real, --fake or both")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · {_machine()}")
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": _machine(), "argv": sys.argv[1:]}
    if args.fake:
        out["fake"] = run_fake(args)
    if args.real:
        out["real"] = run_real(args)
    if args.json_out:
        tmp = args.json_out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=1)
        os.replace(tmp, args.json_out)


if __name__ == "__main__":
    main()
