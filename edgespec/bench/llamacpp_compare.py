"""edgespec against llama.cpp's own C++ tools on the same pair, prompts and settings (bench/llamacpp_compare.py is the
command line; llamacpp.py builds and runs the tools).

`run_comparison` runs llama.cpp's tools greedily with the same max tokens on the given prompts (chat prompts rendered
with the model's template and passed with special tokens parsed, so both sides see the same token sequence): plain
llama.cpp is llama-lookup with a draft length of 0 (one token per decode, no drafting); llama.cpp's own speculation
is llama-speculative-simple (with the draft model) and llama-lookup (prompt lookup). llama-bench's tg at each suite's
mean prompt depth gives llama.cpp's plain decode rate once more, timed by itself. edgespec runs on the same prompts
through the library, one engine: plain (speculative=False), the default drafter, the n-gram lookup and the suffix
drafter, every method interleaved per prompt in alternating order. With repeats R every prompt is run R times (the
order of the methods alternating from one pass to the next).

The ratios are paired (`paired_ratios`): each is taken between two methods' runs of the same prompt in the same
pass (seconds apart), and `format_report` gives the median of those pairs per suite with their range
(`summarize`), so that the machine's drift between passes cancels out instead of landing on one side.

Decode rates exclude prompt processing on both sides: llama.cpp's tools print "decoded N tokens in T seconds"
measured after the prompt is encoded; edgespec's stats.tokens_per_second excludes stats.timings.prefill.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from edgespec.config import SamplingParams

from . import run_generation
from .llamacpp import llama_bench, log, run_tool

METHODS = ("llama plain", "llama spec-simple", "llama lookup", "edgespec plain", "edgespec default", "edgespec ngram", "edgespec suffix")
# edgespec's methods: the drafter each runs (None = plain decoding); the default is "auto" with a draft model
OURS = {"edgespec plain": None, "edgespec default": "model+ngram", "edgespec ngram": "ngram", "edgespec suffix": "suffix"}
# the ratio table's columns: (numerator, denominator); "best llama spec" = llama.cpp's faster speculative tool per run
PAIRS = (("edgespec plain", "llama plain"), ("edgespec default", "llama plain"), ("edgespec suffix", "llama plain"),
         ("edgespec default", "best llama spec"), ("llama spec-simple", "llama plain"), ("llama lookup", "llama plain"))


# --------------------------------------------------------------------------------------------- ratios
def _finished(r: Mapping[str, Any]) -> bool:
    """A run that finished and was timed (a failed run carries "error")."""
    return "error" not in r and r.get("seconds", 0) > 0


def rate(runs: Sequence[Mapping[str, Any]]) -> float | None:
    """Tokens per second over the finished runs (summed tokens / summed seconds); None when none finished."""
    ok = [r for r in runs if _finished(r)]
    if not ok:
        return None
    return sum(r["tokens"] for r in ok) / sum(r["seconds"] for r in ok)


def acceptance(runs: Sequence[Mapping[str, Any]]) -> float | None:
    """Accepted / drafted tokens over the runs that drafted; None when none did."""
    ok = [r for r in runs if "error" not in r and r.get("n_drafted")]
    return sum(r["n_accept"] for r in ok) / sum(r["n_drafted"] for r in ok) if ok else None


def paired_ratios(runs_a: Sequence[Mapping[str, Any]], runs_b: Sequence[Mapping[str, Any]]) -> list[float]:
    """rate(a) / rate(b) for every (prompt, pass) both methods finished: runs carry "prompt" and "pass" keys."""
    def rates_of(runs: Sequence[Mapping[str, Any]]) -> dict[tuple[int, int], float]:
        return {(r["prompt"], r["pass"]): r["tokens"] / r["seconds"] for r in runs
                if _finished(r) and r.get("tokens", 0) > 0}

    ra, rb = rates_of(runs_a), rates_of(runs_b)
    return [ra[key] / rb[key] for key in sorted(ra.keys() & rb.keys())]


def summarize(ratios: Sequence[float]) -> str:
    """'median (min-max, n)' of paired ratios, '-' for none."""
    if not ratios:
        return "-"
    med = statistics.median(ratios)
    return f"{med:.2f} ({min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)})" if len(ratios) > 1 else f"{med:.2f}"


def best_of(runs_by_method: Mapping[str, Sequence[Mapping[str, Any]]], methods: tuple[str, ...]) -> list[Mapping[str, Any]]:
    """Per (prompt, pass), the fastest finished run among `methods` (llama.cpp's best speculative tool)."""
    best: dict[tuple[int, int], Mapping[str, Any]] = {}
    for m in methods:
        for r in runs_by_method.get(m, []):
            if not _finished(r):
                continue
            key = (r["prompt"], r["pass"])
            if key not in best or r["tokens"] / r["seconds"] > best[key]["tokens"] / best[key]["seconds"]:
                best[key] = r
    return list(best.values())


# --------------------------------------------------------------------------------------------- the run
def tool_commands(bin_dir: Path, target: Path, draft: Path, n: int, threads: int, draft_max: int) -> dict[str, Callable[[str], list[str]]]:
    """llama.cpp's methods: the command line each runs for a prompt text."""
    common = ["--no-escape", "-n", str(n), "--temp", "0", "-t", str(threads), "-c", "4096", "--spec-draft-n-max", str(draft_max)]
    return {
        "llama plain": lambda p: [str(bin_dir / "llama-lookup"), "-m", str(target), "-p", p, *common[:-1], "0"],
        "llama spec-simple": lambda p: [str(bin_dir / "llama-speculative-simple"), "-m", str(target), "-md", str(draft),
                                        "--spec-type", "draft-simple", "-p", p, *common, "-td", str(threads)],
        "llama lookup": lambda p: [str(bin_dir / "llama-lookup"), "-m", str(target), "-p", p, *common],
    }


def run_ours(eng: Any, ctx: list[int], kind: str | None, n: int) -> dict[str, Any]:
    """One edgespec run as edgespec bench runs it (empty caches, the draft's prompt processed apart where the draft
    model runs), in the tools' terms."""
    st = run_generation(eng, ctx, SamplingParams(temperature=0.0), n, kind is not None, cold_draft=False, drafter=kind)["record"]
    return {"tokens": st.n_generated, "seconds": st.decode_seconds, "prompt_tokens": st.n_prompt,
            "n_drafted": st.n_drafted, "n_accept": st.n_accepted, "sources": st.source_counts}


def _run_step(eng: Any, name: str, how: Any, ctx: list[int], text: str, n: int, tag: str) -> dict[str, Any]:
    """One method's run of one prompt, logged."""
    if not name.startswith("llama"):
        r = run_ours(eng, ctx, how, n)
        log(f"{tag}: {name} {r['tokens'] / r['seconds']:.1f} tok/s")
        return r
    r = run_tool(how(text), timeout=600)
    if "error" in r:
        log(f"{tag}: {name} failed: {r['error']}")
        return r
    log(f"{tag}: {name} {r['tokens'] / r['seconds']:.1f} tok/s" + (f", accept {r['n_accept']}/{r['n_drafted']}" if r.get("n_drafted") else ""))
    if r.get("prompt_tokens") not in (None, len(ctx)):
        log(f"  WARNING: prompt token counts differ: llama.cpp {r['prompt_tokens']} vs edgespec {len(ctx)}")
    return r


def run_comparison(
    eng: Any, bin_dir: Path, target: Path, draft: Path, work: Mapping[str, Sequence[Mapping[str, Any]]], *,
    methods: Sequence[str] = METHODS, n: int = 128, threads: int, draft_max: int = 8, repeats: int = 1, bench: bool = True,
) -> dict[str, Any]:
    """Every method on every prompt of `work` ({suite: entries}), `repeats` passes, interleaved (see the module
    docstring); `eng`: the engine loaded on the same pair (drafter model+suffix, spec.draft_max = draft_max).
    Returns {"results": {suite: {method: [runs, each with "prompt" and "pass"]}}, "llama_bench": {suite: ...},
    "seconds": the run's wall time}."""
    tools = tool_commands(bin_dir, target, draft, n, threads, draft_max)
    t_start = time.time()
    first = next(iter(work.values()))[0]
    ctx0 = eng.prompt_tokens(first.get("prompt"), messages=first.get("messages"))
    for name, kind in OURS.items():  # unrecorded warm-up of our side (first-call page faults), as edgespec bench does
        if name in methods:
            run_ours(eng, ctx0[:64], kind, n)
    prompts: list[tuple[str, int, list[int], str]] = []
    depths: dict[str, list[int]] = {}
    for suite, entries in work.items():
        for i, entry in enumerate(entries):
            ctx = eng.prompt_tokens(entry.get("prompt"), messages=entry.get("messages"))
            depths.setdefault(suite, []).append(len(ctx))
            prompts.append((suite, i, ctx, entry["prompt"] if "prompt" in entry else eng.render(entry["messages"])))
    steps: list[tuple[str, Any]] = [(nm, fn) for nm, fn in tools.items() if nm in methods]
    steps += [(nm, kind) for nm, kind in OURS.items() if nm in methods]
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    k = 0
    for rep in range(repeats):
        for suite, i, ctx, text in prompts:
            order = steps[::-1] if k % 2 else steps  # alternate the order so that slow phases hit every method
            k += 1
            tag = f"{suite} {i + 1}" + (f" (pass {rep + 1}/{repeats})" if repeats > 1 else "")
            for name, how in order:
                r = _run_step(eng, name, how, ctx, text, n, tag)
                r.update(prompt=i, **{"pass": rep})
                results.setdefault(suite, {}).setdefault(name, []).append(r)
    tg = {suite: llama_bench(bin_dir, target, n, threads, 1, depth=int(sum(ds) / len(ds))) for suite, ds in depths.items()} if bench else {}
    return {"results": results, "llama_bench": tg, "seconds": time.time() - t_start}


# --------------------------------------------------------------------------------------------- the report
def format_table(head: list[str], rows: list[list[str]]) -> list[str]:
    """Columns padded to their widest cell, the first left-aligned, a rule under the head."""
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]

    def fmt(r: list[str]) -> str:
        return "  ".join(str(c).rjust(w) if j else str(c).ljust(w) for j, (c, w) in enumerate(zip(r, widths)))

    return [fmt(head), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows]


def format_report(res: Mapping[str, Any], methods: Sequence[str], header: Sequence[str]) -> str:
    """The rates table (tokens/s per suite and method, with acceptance) and the paired ratios table, after `header`
    (the lines that say what was run); failed runs listed at the end."""
    results, bench = res["results"], res["llama_bench"]
    cols = [c for c in METHODS if c in methods]
    lines = [*header, "decode tokens/s (prompt processing excluded on both sides; sum of tokens / sum of seconds over the prompts)", ""]
    rows = []
    for suite, runs in results.items():
        row = [suite]
        for c in cols:
            r = rate(runs.get(c, []))
            acc = acceptance(runs.get(c, [])) if c not in ("llama plain", "edgespec plain") else None
            row.append("-" if r is None else f"{r:.1f}" + (f" ({100 * acc:.0f}%)" if acc is not None else ""))
        b = bench.get(suite, {})
        row.append(f"{b['tokens_per_second']:.1f}" if "tokens_per_second" in b else "-")
        rows.append(row)
    lines += format_table(["suite"] + cols + ["llama-bench tg"], rows)
    lines.append("(xx%) = draft acceptance (accepted / drafted); llama-bench tg at the suite's mean prompt depth")
    lines.append("")
    ratio_rows = []
    for suite, runs in results.items():
        by = {**runs, "best llama spec": best_of(runs, ("llama spec-simple", "llama lookup"))}
        ratio_rows.append([suite] + [summarize(paired_ratios(by.get(a, []), by.get(b, []))) for a, b in PAIRS])
    lines += format_table(["suite"] + [f"{a} / {b}".replace("edgespec", "es") for a, b in PAIRS], ratio_rows)
    lines.append("ratios: median over (prompt, pass) pairs run seconds apart, (min-max, number of pairs)")
    errors = [(s, c, r["error"]) for s, runs in results.items() for c, rs in runs.items() for r in rs if "error" in r]
    lines += [f"ERROR {s} {c}: {e}" for s, c, e in errors]
    return "\n".join(lines)
