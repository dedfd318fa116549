#!/usr/bin/env python3
"""The loop's own work: host milliseconds per generated token, everything outside llama_decode (sampling,
acceptance, drafting bookkeeping, detokenization, scheduling), side by side with llama-cpp-python.

    .venv/bin/python bench/host_bench.py --real                 # the default pair through Engine.generate
    .venv/bin/python bench/host_bench.py --fake                 # the loop alone on instant fake models
    .venv/bin/python bench/host_bench.py --real --fake --json-out /tmp/host.json
    .venv/bin/python bench/host_bench.py --fit /tmp/host.json   # host ms per cycle and per row (predict_speedup --host-cost)
                                                                # (from --real rows; from --fake rows: the warm-cache bound)

--real: the default pair, 2 threads, `--prompts` prompts x `--tokens` tokens per row, prefill included (a fresh
prompt each time: the prompt cache is cleared). Host time = each generation's wall time less the seconds inside
llama_decode of both models (backend.Model.decode_seconds, GenerationStats.timings.host); the number is the sum over
the prompts divided by the tokens generated. llama-cpp-python's row is the same measure on its own `Llama`:
create_completion's wall time less the time inside its llama_decode calls (wrapped), sampling with its own C
sampler chain (llama.cpp's defaults, OpenAI's, greedy, with penalties).

--fake: speculate() over instant numpy models (no decode cost at all: logits rows precomputed, a view per token)
at 151,936 and 262,144 vocabulary entries: tokens per second of the loop itself, plain and with a draft of fixed
k = 8 whose q equals the target's p (every draft accepted), greedy and sampled. At 3,000 tokens/s a GPU decoding
300 tokens/s waits on Python at most 10% of the time. --evict-mb N: each fake decode first reads N MiB (as a CPU
decode streams the weights through the caches; its time is taken out), so the loop runs with the cold caches it meets
after a real decode on this CPU. Beside it, llama.cpp's own C sampler chain on the same rows (the sampling of one
token alone, its llama_token_data array filled from the row as common_sampler_sample does).
"""

from __future__ import annotations

import argparse
import json
import os
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

from edgespec.bench.traces import machine  # noqa: E402
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
    from edgespec.config import ModelSpec

    target = str(resolve_model(None, "target"))
    draft = str(resolve_model(None, "draft"))
    prompts = PROMPTS[: args.prompts]
    rows: list[dict[str, Any]] = []
    modes: list[tuple[str, str, SpecConfig | None]] = [("plain", "none", None)]
    for k in args.ks:
        modes.append((f"model k={k}", "model", SpecConfig(draft_max=k, adaptive=False, draft_siblings=0)))
    if args.tree:
        modes.append(("suffix tree (8 nodes, width 3)", "suffix", SpecConfig(adaptive=False, tree_nodes=8, tree_width=3)))
    if args.default:
        modes.append(("default drafter", "auto", None))
    for label, drafter, spec in ([] if args.only_llama_cpp_python else modes):
        eng = Engine.load(
            ModelSpec(target, n_threads=args.threads),
            ModelSpec(draft, n_threads=args.threads) if drafter in ("model", "auto") else None,
            drafter=drafter, spec=spec, calibrate_costs=drafter == "auto", memory=False, parallel=1,
        )
        try:
            eng.generate(prompts[0], max_tokens=4, sampling=SamplingParams(temperature=0.0))  # warm up
            for name, kw, _ in SETTINGS:
                if name not in args.settings:
                    continue
                host = llama = 0.0
                n = drafted = accepted = cycles = 0
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
                    cycles += s.n_cycles
                row = dict(system="edgespec", mode=label, setting=name, tokens=n, host_ms_per_token=1000 * host / max(n, 1),
                           ms_per_token=1000 * (host + llama) / max(n, 1),
                           llama_ms_per_token=1000 * llama / max(n, 1), acceptance=accepted / drafted if drafted else None,
                           cycles=cycles, drafted=drafted, host_s=host)
                rows.append(row)
                print(f"  edgespec {label:<32} {name:<20} host {row['host_ms_per_token']:.3f} ms/token "
                      f"(llama {row['llama_ms_per_token']:.1f} ms/token, {1000 / row['ms_per_token']:.2f} tokens/s, {n} tokens"
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

    def __init__(self, table: np.ndarray, n_ctx: int = 1 << 16, evict: np.ndarray | None = None) -> None:
        # evict: a buffer read through on every decode, as a CPU decode streams the weights through the caches (the
        # seconds it takes are counted in evict_seconds, for the caller to take out)
        self.evict, self.evict_seconds = evict, 0.0
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
        self._stream()
        tokens = list(tokens)
        keep = min(self.common_prefix(tokens), len(tokens) - 1)
        del self.cached[keep:]
        self.cached.extend(tokens[keep:])
        return self._row(len(self.cached), self.cached[-1])[None, :]

    def _stream(self) -> None:
        if self.evict is not None:
            t0 = time.perf_counter()
            self.evict.max()
            self.evict_seconds += time.perf_counter() - t0

    def decode(self, tokens: Any, start_pos: int, rows: Any = (-1,)) -> np.ndarray:
        self._stream()
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
    from edgespec.drafting.costs import CostModel
    from edgespec.drafting.model_policy import Controller
    from edgespec.runtime.speculate import speculate
    from edgespec.drafting import ModelSpeculator
    from edgespec.stats import GenerationStats

    rows = []
    clock = time.process_time if args.cpu_time else time.perf_counter
    flat = {1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0, 16: 1.0}
    evict = np.ones(args.evict_mb << 18, dtype=np.float32) if args.evict_mb else None
    for n_vocab in args.vocab:
        table = fake_table(n_vocab)
        for name, kw, _ in SETTINGS:
            if name not in args.settings:
                continue
            sp = SamplingParams(**kw)
            for mode in ("plain", "k=8"):
                best = None
                for rep in range(args.repeats):
                    target = InstantModel(table, evict=evict)
                    draft = InstantModel(table, evict=evict)
                    spec = None
                    if mode != "plain":
                        cfg = SpecConfig(draft_max=8, adaptive=False, draft_siblings=0)
                        spec = ModelSpeculator(draft, sp, Controller(cfg, CostModel(flat, c_draft=0.01, frozen=True)))
                    stats = GenerationStats()
                    rng = np.random.default_rng(rep)
                    t0 = clock()
                    n = 0
                    for step in speculate(target, [1, 2, 3], sp, rng, max_tokens=args.fake_tokens, speculator=spec, stats=stats):
                        n += len(step.tokens)
                    dt = clock() - t0
                    dt -= target.evict_seconds + draft.evict_seconds
                    rate = n / dt
                    best = rate if best is None else max(best, rate)
                    acc = stats.acceptance if stats.n_drafted else None
                row = dict(system="loop", vocab=n_vocab, setting=name, mode=mode, tokens_per_second=best, acceptance=acc,
                           evict_mb=args.evict_mb)
                rows.append(row)
                print(f"  fake V={n_vocab:<7} {name:<20} {mode:<6} {best:8.0f} tokens/s"
                      + (f" (caches evicted per decode: {args.evict_mb} MiB read)" if args.evict_mb else "")
                      + (f" (acceptance {acc:.2f})" if acc is not None else ""), flush=True)
    return rows


def fit_host(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The host work as research/predict_speedup.py charges it (Curve.with_host), fitted per sampling setting to the
    real pair's edgespec rows: host seconds = cycles x CYCLE + logits rows x ROW, where a plain token is one cycle and
    one row, and a draft-model cycle handles its verified rows (drafted + 1) and one row per drafted token. Least
    squares over the plain and fixed-k rows (a tree's rows are left out), each term at least 0; milliseconds."""
    out: dict[str, dict[str, float]] = {}
    for setting in dict.fromkeys(r["setting"] for r in rows):
        eqs = []
        for r in rows:
            if r.get("system") != "edgespec" or r["setting"] != setting or "cycles" not in r or "tree" in r["mode"]:
                continue
            handled = r["cycles"] + 2 * r["drafted"]
            eqs.append((r["cycles"], handled, r["host_s"]))
        if len(eqs) < 2:
            continue
        a = np.array([[c, h] for c, h, _ in eqs], dtype=float)
        y = np.array([t for _, _, t in eqs], dtype=float)
        (cycle, row), *_ = np.linalg.lstsq(a, y, rcond=None)
        if cycle < 0 or row < 0:  # one term alone explains it: fit the other at 0
            only_row = float(a[:, 1] @ y / (a[:, 1] @ a[:, 1]))
            only_cycle = float(a[:, 0] @ y / (a[:, 0] @ a[:, 0]))
            cycle, row = (0.0, only_row) if cycle < 0 else (only_cycle, 0.0)
        out[setting] = {"cycle_ms": 1000 * float(cycle), "row_ms": 1000 * float(row), "points": len(eqs)}
        print(f"  fit {setting:<20} host {1000 * cycle:.3f} ms/cycle + {1000 * row:.3f} ms/row ({len(eqs)} rows)", flush=True)
    return out


def fit_fake(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """The same two costs from the instant fake models' rates (`--fake`): plain, a token is one cycle and one row
    (1 / rate = CYCLE + ROW); at k = 8 with every draft accepted, a cycle yields 9 tokens and handles 17 rows (9
    verified, 8 drafted: 9 / rate = CYCLE + 17 ROW). With warm caches (no --evict-mb) these are what a host pays
    whose caches no CPU decode evicts (a GPU's), the optimistic bound beside --fit's; milliseconds, per vocabulary
    and setting."""
    out: dict[str, dict[str, float]] = {}
    for r0 in rows:
        if r0.get("mode") != "plain":
            continue
        r8 = next((r for r in rows if r.get("mode") == "k=8" and r["vocab"] == r0["vocab"] and r["setting"] == r0["setting"]
                   and r.get("evict_mb") == r0.get("evict_mb")), None)
        if r8 is None:
            continue
        per_token, per_cycle8 = 1.0 / r0["tokens_per_second"], 9.0 / r8["tokens_per_second"]
        row = max(0.0, (per_cycle8 - per_token) / 16.0)
        cycle = max(0.0, per_token - row)
        key = f"{r0['vocab']} {r0['setting']}" + (f" evict {r0['evict_mb']} MiB" if r0.get("evict_mb") else "")
        out[key] = {"cycle_ms": 1000 * cycle, "row_ms": 1000 * row}
        print(f"  fit fake {key:<38} host {1000 * cycle:.3f} ms/cycle + {1000 * row:.3f} ms/row", flush=True)
    return out


class CSampler:
    """llama.cpp's own C sampler chain for one setting (SETTINGS' kwargs): the chain common/sampling.cpp builds, in its
    order (penalties, top-k, top-p, min-p, temperature, dist; greedy alone for T = 0). Called with a float32 row, it
    fills its llama_token_data array from the row, as common_sampler_sample does, applies the chain and accepts the
    token it picked; close() frees the chain."""

    def __init__(self, n_vocab: int, kw: dict[str, Any]) -> None:
        import ctypes

        import llama_cpp as C

        self.C, self.ctypes, self.n_vocab = C, ctypes, n_vocab
        token_data = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])
        assert token_data.itemsize == ctypes.sizeof(C.llama_token_data)
        self.data = np.zeros(n_vocab, dtype=token_data)
        self.ids = np.arange(n_vocab, dtype=np.int32)
        self.arr = C.llama_token_data_array(self.data.ctypes.data_as(ctypes.POINTER(C.llama_token_data)), n_vocab, -1, False)
        chain = self.chain = C.llama_sampler_chain_init(C.llama_sampler_chain_default_params())
        if kw["temperature"] == 0.0:
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_greedy())
            return
        if kw.get("repeat_penalty"):
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_penalties(
                n_vocab, kw["repeat_last_n"], kw["repeat_penalty"], kw["frequency_penalty"], kw["presence_penalty"]))
        if kw.get("top_k"):
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_k(kw["top_k"]))
        if kw.get("top_p", 1.0) < 1.0:
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_top_p(kw["top_p"], 1))
        if kw.get("min_p", 0.0) > 0.0:
            C.llama_sampler_chain_add(chain, C.llama_sampler_init_min_p(kw["min_p"], 1))
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_temp(kw["temperature"]))
        C.llama_sampler_chain_add(chain, C.llama_sampler_init_dist(1234))

    def __call__(self, row: np.ndarray) -> int:
        C, data, arr = self.C, self.data, self.arr
        data["id"] = self.ids
        data["logit"] = row
        arr.data = data.ctypes.data_as(self.ctypes.POINTER(C.llama_token_data))
        arr.size, arr.selected, arr.sorted = self.n_vocab, -1, False
        C.llama_sampler_apply(self.chain, self.ctypes.byref(arr))
        token = int(data["id"][arr.selected])
        C.llama_sampler_accept(self.chain, token)
        return token

    def close(self) -> None:
        self.C.llama_sampler_free(self.chain)


def run_c_sampler(args: argparse.Namespace) -> list[dict[str, Any]]:
    """llama.cpp's own C sampler chain (CSampler) on the same fake rows: what sampling one token costs there,
    including the fill of its llama_token_data array from the row. Tokens per second of that alone (no loop around
    it); the plain rows of the fake table are the loop's comparison."""
    clock = time.process_time if args.cpu_time else time.perf_counter
    rows = []
    for n_vocab in args.vocab:
        table = fake_table(n_vocab)
        for name, kw, _ in SETTINGS:
            if name not in args.settings:
                continue
            sampler = CSampler(n_vocab, kw)
            try:
                best = None
                n = max(200, args.fake_tokens // 4)
                for _ in range(args.repeats):
                    t0 = clock()
                    for i in range(n):
                        sampler(table[i % table.shape[0]])
                    dt = clock() - t0
                    best = n / dt if best is None else max(best, n / dt)
            finally:
                sampler.close()
            rows.append(dict(system="llama.cpp C sampler", vocab=n_vocab, setting=name, tokens_per_second=best))
            print(f"  C sampler V={n_vocab:<7} {name:<20} {best:8.0f} tokens/s (sampling alone)", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--real", action="store_true", help="the default pair through Engine.generate (and llama-cpp-python)")
    ap.add_argument("--fake", action="store_true", help="the loop alone on instant fake models")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ks", type=lambda s: [int(x) for x in s.split(",") if x and x != "none"], default=[8],
                    help="fixed draft lengths (1,4,8,16; none: no fixed-k rows)")
    ap.add_argument("--default", action="store_true",
                    help="also the engine's default drafter (as `edgespec generate` runs it: the cached calibration)")
    ap.add_argument("--tree", action="store_true", help="also the suffix drafter's fixed tree")
    ap.add_argument("--no-llama-cpp-python", dest="llama_cpp_python", action="store_false")
    ap.add_argument("--settings", type=lambda s: s.split(","), default=[n for n, _, _ in SETTINGS])
    ap.add_argument("--vocab", type=lambda s: [int(x) for x in s.split(",")], default=[151_936, 262_144])
    ap.add_argument("--fake-tokens", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3, help="fake runs per cell (the best is reported)")
    ap.add_argument("--seeded", action="store_true", help="seeded sampled generations (common random numbers) instead of fresh ones")
    ap.add_argument("--only-llama-cpp-python", action="store_true")
    ap.add_argument("--code", default=None, help="import edgespec from this checkout (a before/after pair)")
    ap.add_argument("--evict-mb", type=int, default=0,
                    help="fake: every decode reads a buffer of this many MiB (as a CPU decode streams its weights through "
                         "the caches); its time is taken out: the loop's rate with cold caches")
    ap.add_argument("--no-c-sampler", dest="c_sampler", action="store_false",
                    help="fake: leave out llama.cpp's C sampler chain on the same rows")
    ap.add_argument("--cpu-time", action="store_true", help="fake: rates from this process's CPU time (a busy machine)")
    ap.add_argument("--json-out", default=None)
    ap.add_argument("--fit", nargs="+", default=None, metavar="JSON",
                    help="fit the host cost per cycle and per row (predict_speedup's --host-cost) to earlier --real "
                         "outputs of this script (their edgespec rows together) and print it")
    args = ap.parse_args()
    if args.fit:
        docs = [json.loads(Path(path).read_text()) for path in args.fit]
        fit_host([r for d in docs for r in d.get("real", [])])
        fit_fake([r for d in docs for r in d.get("fake", [])])
        return
    if not (args.real or args.fake):
        ap.error("say --real, --fake or both")
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · {machine()}")
    out: dict[str, Any] = {"date": time.strftime("%Y-%m-%d", time.gmtime()), "machine": machine(), "argv": sys.argv[1:]}
    if args.fake:
        out["fake"] = run_fake(args)
        out["fit_fake"] = fit_fake(out["fake"])
        if args.c_sampler:
            out["c_sampler"] = run_c_sampler(args)
    if args.real:
        out["real"] = run_real(args)
        out["fit"] = fit_host(out["real"])
    if args.json_out:
        tmp = args.json_out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(out, f, indent=1)
        os.replace(tmp, args.json_out)


if __name__ == "__main__":
    main()
