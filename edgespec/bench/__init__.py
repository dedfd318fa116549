"""`edgespec bench`: plain target decoding vs speculative decoding, same engine, same prompts, same process.

    edgespec bench                                   # every built-in suite, greedy, 128 tokens
    edgespec bench --suite input-grounded --json     # one suite, machine-readable
    edgespec bench --prompts my.jsonl --plot out.png

For every prompt it runs the plain target (`speculative=False`: the same loop and sampling code with no drafting)
and the speculative engine, interleaved (plain, spec, then spec, plain for the next prompt, ...) so that machine
noise hits both sides alike. Before each run the KV caches (and the suffix drafter's memory of earlier generations)
are emptied, so both runs prefill the whole prompt on the target and nothing is remembered across runs; before a
speculative run the draft model also processes the prompt (timed apart, as llama.cpp's llama-speculative-simple does
in its prompt phase), so that decode rates compare decoding only. `--cold-draft`
leaves the draft's prompt processing inside the first speculative cycle instead (what a one-shot
`edgespec generate` pays).

The compared number is the decode rate, stats.tokens_per_second (tokens after the prompt / seconds after
prefill). At temperature > 0 the two runs generate different tokens, possibly of different lengths, so summaries
compare rates (sum of tokens / sum of decode seconds per side), never raw times.

Library use:

    from edgespec.bench import load_suites, run_bench, format_report
    report = run_bench(engine, {"mine": [{"prompt": "def f(x):"}]}, sampling, max_tokens=64)
    print(format_report(report))

The wing also holds the measurements around this benchmark, each a library whose command line is a script in the
repository's bench/ or research/ (docs/design.md's module map): the speedup replay (traces, curves, recorded, replay,
oracle, speedup; measure and synth for curves and synthetic models), llama.cpp's own tools and the comparisons with
them (llamacpp, llamacpp_compare, bare_loop), the infill suite (infill_suite) and a delaying TCP proxy (delay_proxy).
None of them is imported here, and importing one loads llama.cpp only where it needs it.

May import: every wing below it (prompts/, decoding/, llama/, drafting/, runtime/) and the base modules; never
server/, cli/ or models/ (the scripts resolve models and pass their paths in).
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from edgespec.config import SamplingParams
from edgespec.errors import EdgespecError
from edgespec.fsutil import read_regular_bytes
from edgespec.untrusted import JSONDepthError, loads as loads_json
from edgespec.stats import Totals, acceptance_by_position

SUITES_FILE = Path(__file__).with_name("suites.json")


class BenchError(EdgespecError):
    """A bad prompt file or entry: one line naming where."""


# --------------------------------------------------------------------------------------------- prompts
def check_entry(entry: Any, where: str) -> dict[str, Any]:
    """An entry is {"prompt": "raw text"} or {"messages": [{"role": ..., "content": ...}, ...]}, with an optional
    "suite" (JSONL files) and "name". Returns it; raises BenchError naming `where` otherwise."""
    if not isinstance(entry, dict):
        raise BenchError(f"{where}: expected a JSON object, got {type(entry).__name__}")
    has_p, has_m = "prompt" in entry, "messages" in entry
    if has_p == has_m:
        raise BenchError(f"{where}: give exactly one of \"prompt\" or \"messages\"")
    if has_p:
        if not isinstance(entry["prompt"], str) or not entry["prompt"].strip():
            raise BenchError(f"{where}: \"prompt\" must be a non-empty string")
    else:
        msgs = entry["messages"]
        if not isinstance(msgs, list) or not msgs:
            raise BenchError(f"{where}: \"messages\" must be a non-empty list")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise BenchError(f"{where}: messages[{i}] must be an object with string \"role\" and \"content\"")
    for key in ("suite", "name"):
        if key in entry and not isinstance(entry[key], str):
            raise BenchError(f"{where}: \"{key}\" must be a string")
    return entry


MAX_PROMPTS_FILE = 64 * 2**20  # a --prompts file


def load_suites(path: str | os.PathLike[str] | None = None) -> dict[str, list[dict[str, Any]]]:
    """The built-in suites (edgespec/bench/suites.json, next to this module): {suite name: [entries]}."""
    p = Path(path) if path is not None else SUITES_FILE
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise BenchError(f"cannot read the benchmark suites {p}: {e.strerror or e}") from None
    except ValueError as e:
        raise BenchError(f"{p}: invalid JSON ({e})") from None
    suites = data.get("suites") if isinstance(data, dict) else None
    if not isinstance(suites, dict) or not suites:
        raise BenchError(f"{p}: expected an object with a non-empty \"suites\" object")
    out: dict[str, list[dict[str, Any]]] = {}
    for name, entries in suites.items():
        if not isinstance(entries, list) or not entries:
            raise BenchError(f"{p}: suite {name!r} must be a non-empty list")
        out[name] = [check_entry(e, f"{p}: suite {name} entry {i + 1}") for i, e in enumerate(entries)]
    return out


def load_prompts_jsonl(path: str | os.PathLike[str], default_suite: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """One entry per line (blank lines and lines starting with # are skipped); grouped by their "suite" field,
    default: the file's stem. A bad line raises BenchError "FILE:LINE: why"."""
    p = Path(path)
    suite_default = default_suite or p.stem or "custom"
    try:  # a regular file only: a FIFO is refused before any read (nothing waits for a writer)
        lines = read_regular_bytes(p, MAX_PROMPTS_FILE).decode("utf-8").splitlines()
    except OSError as e:
        raise BenchError(f"cannot read {p}: {e.strerror or e}") from None
    except UnicodeDecodeError as e:
        raise BenchError(f"{p}: not UTF-8 text ({e.reason})") from None
    out: dict[str, list[dict[str, Any]]] = {}
    for no, line in enumerate(lines, 1):
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        where = f"{p}:{no}"
        try:
            entry = loads_json(s, "the line")
        except json.JSONDecodeError as e:
            raise BenchError(f"{where}: invalid JSON ({e.msg} at column {e.colno})") from None
        except JSONDepthError:
            raise BenchError(f"{where}: invalid JSON (nested too deeply)") from None
        check_entry(entry, where)
        out.setdefault(entry.get("suite") or suite_default, []).append(entry)
    if not out:
        raise BenchError(f"{p}: no prompts in the file")
    return out


# --------------------------------------------------------------------------------------------- running
def _prepare(engine: Any, ctx: list[int], warm_draft: bool) -> float:
    """(In the engine's thread.) Empty both caches and their snapshots; with warm_draft, let the draft model
    process the prompt first (timed apart). Returns those seconds."""
    for m in (engine.target, engine.draft):
        if m is not None:
            m.reset()
            if m.prompt_cache is not None:
                m.prompt_cache.clear()
    if engine.memory is not None:  # no run may find an earlier run's output in the suffix memory
        engine.memory.clear()
    if not warm_draft or engine.draft is None or len(ctx) < 2:
        return 0.0
    t0 = time.perf_counter()
    engine.draft.sync(ctx[:-1], rows=())
    return time.perf_counter() - t0


def run_generation(
    engine: Any, ctx: list[int], sampling: SamplingParams, max_tokens: int, speculative: bool, cold_draft: bool, drafter: str | None = None
) -> dict[str, Any]:
    """One generation from an empty target cache (with `drafter`, default the engine's): its stats (the draft's
    prompt processing, when it was done apart, in seconds.draft_prefill: before the generation, so in neither its
    prefill nor its decode time), token ids and text."""
    warm = speculative and not cold_draft and engine.model_draft_used(drafter)
    draft_prefill = engine.run_on_worker(lambda e: _prepare(e, ctx, warm)).result()
    r = engine.generate(tokens=ctx, sampling=sampling, max_tokens=max_tokens, speculative=speculative, drafter=drafter)
    d = r.stats.as_dict()
    d["seconds"]["draft_prefill"] = round(draft_prefill, 4)
    if not speculative:
        d.pop("controller", None)
    return {"stats": d, "record": r.stats, "token_ids": list(r.token_ids), "text": r.text}


def _side(runs: Sequence[Mapping[str, Any]]) -> Totals:
    tot = Totals()
    for r in runs:
        tot.add(r["record"])
    return tot


def _side_summary(t: Totals, spec: bool) -> dict[str, Any]:
    dec = t.decode_seconds or 1e-12
    split = {"target": round(t.timings.target / dec, 4), "overhead": round(max(0.0, dec - t.timings.target - t.timings.draft) / dec, 4)}
    if spec:
        split["draft"] = round(t.timings.draft / dec, 4)
    return {
        "tokens": t.n_generated,
        "decode_seconds": round(t.decode_seconds, 4),
        "tokens_per_second": round(t.tokens_per_second, 3),
        "prefill_seconds": round(t.timings.prefill, 4),
        "time_split": split,
        "host_ms_per_token": round(t.host_ms_per_token, 4),  # wall less the time inside llama_decode, per token
    }


def _summary(records: Sequence[Mapping[str, Any]], greedy: bool) -> dict[str, Any]:
    """Aggregate of prompt records: rates from summed tokens and decode seconds per side."""
    plain, spec = Totals(), Totals()
    for r in records:
        for run in r["_runs"]["plain"]:
            plain.add(run["record"])
        for run in r["_runs"]["spec"]:
            spec.add(run["record"])
    p_rate, s_rate = plain.tokens_per_second, spec.tokens_per_second
    speedups = [r["speedup"] for r in records if r["speedup"] > 0]
    return {
        "n_prompts": len(records),
        "plain": _side_summary(plain, False),
        "spec": _side_summary(spec, True),
        "speedup": round(s_rate / p_rate, 4) if p_rate > 0 else None,
        "speedup_geomean": round(math.exp(sum(math.log(x) for x in speedups) / len(speedups)), 4) if speedups else None,
        "speedup_min": round(min(speedups), 4) if speedups else None,
        "speedup_max": round(max(speedups), 4) if speedups else None,
        "cycles": spec.n_cycles,
        "spec_cycles": spec.n_spec_cycles,
        "drafted": spec.n_drafted,
        "accepted": spec.n_accepted,
        "mu": round(spec.mu, 4),
        "tokens_per_cycle": round(spec.tokens_per_cycle, 4),
        "acceptance": round(spec.acceptance, 4) if spec.n_drafted else None,
        "acceptance_by_pos": acceptance_by_position(spec.accepted_by_pos, spec.drafted_by_pos),
        "drafted_by_pos": list(spec.drafted_by_pos),
        "sources": dict(sorted(spec.source_counts.items())),
        "identical": sum(1 for r in records if r["identical"]) if greedy else None,
    }


def run_bench(
    engine: Any,
    suites: Mapping[str, Sequence[Mapping[str, Any]]],
    sampling: SamplingParams,
    *,
    max_tokens: int = 128,
    repeats: int = 1,
    warmup: bool = True,
    cold_draft: bool = False,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run every entry of every suite plain and speculative (interleaved, alternating which goes first) and
    return the report: {"settings", "models", "costs", "prompts": [...], "suites": {name: summary}, "overall"}."""
    if repeats < 1:
        raise BenchError(f"repeats must be at least 1, got {repeats}")
    say = progress or (lambda s: None)
    greedy = sampling.greedy
    prepared = _prepare_prompts(engine, suites, max_tokens)
    if warmup and prepared:
        # First calls pay page faults and allocations; keep them out of the measurement.
        ctx = prepared[0][3]
        for spec_side in (False, True):
            run_generation(engine, ctx, sampling, min(8, max_tokens), spec_side, cold_draft)
    costs_before = {**engine.calibration.describe(), "draft_model_used": engine.model_draft_used()}
    records: list[dict[str, Any]] = []
    for n, (suite, i, entry, ctx) in enumerate(prepared):
        runs = _interleaved_runs(engine, ctx, sampling, max_tokens, repeats, cold_draft, first_pair=n * repeats)
        rec, line = _prompt_record(suite, i, entry, ctx, runs, greedy)
        records.append(rec)
        say(f"[{n + 1}/{len(prepared)}] {line}")
    by_suite: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        by_suite.setdefault(r["suite"], []).append(r)
    return {
        "settings": {
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
            "top_p": sampling.top_p,
            "min_p": sampling.min_p,
            "seed": sampling.seed,
            "max_tokens": max_tokens,
            "repeats": repeats,
            "cold_draft": cold_draft,
            "warmup": warmup,
        },
        "models": _describe_engine(engine),
        "costs": {"calibration": costs_before, "verify_after": engine.curve.points, "draft_after": engine.draft_cost},
        "prompts": records,
        "suites": {name: _summary(rs, greedy) for name, rs in by_suite.items()},
        "overall": _summary(records, greedy) if records else None,
    }


def _prepare_prompts(
    engine: Any, suites: Mapping[str, Sequence[Mapping[str, Any]]], max_tokens: int
) -> list[tuple[str, int, Mapping[str, Any], list[int]]]:
    """(suite, index, entry, prompt token ids) for every entry, each checked to fit in the context with max_tokens."""
    prepared: list[tuple[str, int, Mapping[str, Any], list[int]]] = []
    for suite, entries in suites.items():
        for i, entry in enumerate(entries):
            ctx = engine.prompt_tokens(entry.get("prompt"), messages=entry.get("messages"))
            if len(ctx) + max_tokens > engine.target.n_ctx:
                raise BenchError(
                    f"suite {suite} prompt {i + 1}: {len(ctx)} prompt tokens + {max_tokens} new tokens do not fit in "
                    f"the context ({engine.target.n_ctx}); raise --ctx or lower --max-tokens"
                )
            prepared.append((suite, i, entry, ctx))
    return prepared


def _interleaved_runs(
    engine: Any, ctx: list[int], sampling: SamplingParams, max_tokens: int, repeats: int, cold_draft: bool, *, first_pair: int
) -> dict[str, list[dict[str, Any]]]:
    """`repeats` plain/speculative pairs of one prompt, the side that goes first alternating from pair to pair over the
    whole bench (first_pair: how many pairs ran before); a seeded run's repeats take the seeds seed, seed + 1, ..."""
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "spec": []}
    for rep in range(repeats):
        s = sampling if sampling.seed is None or rep == 0 else _with_seed(sampling, sampling.seed + rep)
        order = ("plain", "spec") if (first_pair + rep) % 2 == 0 else ("spec", "plain")
        for side in order:
            runs[side].append(run_generation(engine, ctx, s, max_tokens, side == "spec", cold_draft))
    return runs


def _prompt_record(
    suite: str, i: int, entry: Mapping[str, Any], ctx: list[int], runs: dict[str, list[dict[str, Any]]], greedy: bool
) -> tuple[dict[str, Any], str]:
    """One prompt's record in the report, and its progress line."""
    p_rate, s_rate = _side(runs["plain"]).tokens_per_second, _side(runs["spec"]).tokens_per_second
    identical = all(a["token_ids"] == b["token_ids"] for a, b in zip(runs["plain"], runs["spec"]))
    rec = {
        "suite": suite,
        "index": i,
        "name": entry.get("name") or f"{suite}-{i + 1}",
        "kind": "raw" if "prompt" in entry else "chat",
        "n_prompt": len(ctx),
        "plain_tokens_per_second": round(p_rate, 3),
        "spec_tokens_per_second": round(s_rate, 3),
        "speedup": round(s_rate / p_rate, 4) if p_rate > 0 else 0.0,
        "identical": identical if greedy else None,
        "plain": [r["stats"] for r in runs["plain"]],
        "spec": [r["stats"] for r in runs["spec"]],
        "plain_text": runs["plain"][0]["text"],
        "spec_text": runs["spec"][0]["text"],
        "_runs": runs,
    }
    line = (f"{rec['name']}: plain {p_rate:.1f} tok/s, spec {s_rate:.1f} tok/s, x{rec['speedup']:.2f}"
            + ("" if not greedy else ("  identical" if identical else "  DIFFERENT OUTPUT")))
    return rec, line


def _with_seed(s: SamplingParams, seed: int) -> SamplingParams:
    from dataclasses import replace

    return replace(s, seed=seed)


def _describe_engine(engine: Any) -> dict[str, Any]:
    spec = engine.spec
    return {
        "target": os.fspath(engine.target.spec.path),
        "draft": os.fspath(engine.draft.spec.path) if engine.draft is not None else None,
        "drafter": engine.drafter_kind,
        "draft_max": spec.draft_max,
        "adaptive": spec.adaptive,
        "threads": threads_text(engine.target.threads_info()),
        "threads_detail": {"target": engine.target.threads_info(), "draft": engine.draft.threads_info() if engine.draft is not None else None},
        "n_ctx": engine.target.n_ctx,
        "n_gpu_layers": engine.target.spec.n_gpu_layers,
    }


def threads_text(info: Mapping[str, Any]) -> str:
    """'2 (fixed)' or 'auto 2/1, now 1, decodes 2: 310, 1: 42' for a model's threads_info()."""
    if info.get("mode") != "auto":
        return f"{info['current']} (fixed)"
    used = ", ".join(f"{c}: {n}" for c, n in info["decodes"].items())
    return f"auto {'/'.join(map(str, info['candidates']))}, now {info['current']}, decodes {used}"


def public_report(report: Mapping[str, Any]) -> dict[str, Any]:
    """The report without internal raw sums (what --json prints)."""
    out = dict(report)
    out["prompts"] = [{k: v for k, v in r.items() if k != "_runs"} for r in report["prompts"]]
    return out


from .report import format_report, plot_format, plot_report, require_matplotlib  # noqa: E402  (re-exported)

__all__ = [
    "BenchError",
    "check_entry",
    "load_suites",
    "load_prompts_jsonl",
    "run_bench",
    "run_generation",
    "format_report",
    "public_report",
    "plot_format",
    "plot_report",
    "require_matplotlib",
]
