"""The infill benchmark (bench/bench_infill.py is its command line): spans blanked out of functions in a real Python
package installed in this environment, filled in by the model greedily, plain vs speculative, interleaved in one run
(a drift of the machine's speed lands on both alike; the order alternates per prompt).

Prompt groups (each function gives at most one prompt per group):
    line    one statement line in the middle of a function body
    block   three consecutive lines in the middle of a body
    tail    the body's last lines (the end of the function)

For every prompt: the code before the span (at most prefix_chars, cut at a line start) is the prefix, the code
after it (at most suffix_chars) the suffix; the model writes the middle with at most (the span's tokens + 16)
tokens. As in an editor, where each request shares its file with the previous one, both models hold the prompt in
their KV caches before the timed runs (a warm-up request prefills them). `summarize` gives per group and overall:
tokens/s plain and speculative (total tokens over total time after the prompt), the ratio, the lowest and the median
per-prompt ratio, the "cold" ratio (end-to-end time of a request whose prompt neither model holds: plain = target
prefill + plain decode, speculative = target prefill + the draft's prefill + speculative decode), and the exact-match
rate of the middle (whitespace at both ends ignored) for each mode (greedy speculative output equals plain output
token for token, so the two rates agree; "same" checks it).

build_prompts, summarize and markdown are pure (no model); run_infill loads the pair.
"""

from __future__ import annotations

import ast
import datetime as dt
import importlib
import json
import platform
import random
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from edgespec.config import SamplingParams
from edgespec.fsutil import atomic_write_text

GROUPS = ("line", "block", "tail")


@dataclass
class Prompt:
    group: str
    source: str
    prefix: str
    middle: str
    suffix: str


def _is_docstring(n: ast.stmt) -> bool:
    return isinstance(n, ast.Expr) and isinstance(getattr(n, "value", None), ast.Constant)


def _functions(path: Path) -> list[tuple[ast.FunctionDef | ast.AsyncFunctionDef, list[str]]]:
    try:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return []
    lines = text.splitlines(keepends=True)
    out = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
            body = [n for n in node.body if not _is_docstring(n)]
            if len(body) >= 4 and node.end_lineno - body[0].lineno >= 6:
                out.append((node, lines))
    return out


def _span(group: str, code_lines: list[int], end: int) -> tuple[int, int]:
    """The blanked-out lines [a, b) of a function body for `group`."""
    if group == "line":
        a = code_lines[len(code_lines) // 2]
        return a, a + 1
    if group == "block":
        a = code_lines[len(code_lines) // 3]
        return a, min(a + 3, end)
    return code_lines[-min(3, len(code_lines) - 1)], end


def _prompt(group: str, source: str, lines: list[str], a: int, b: int, prefix_chars: int, suffix_chars: int) -> Prompt | None:
    middle = "".join(lines[a:b])
    if not middle.strip():
        return None
    # the span starts after the line's indentation: the cursor sits where code begins, as in an editor
    indent = len(middle) - len(middle.lstrip(" \t"))
    before = "".join(lines[:a]) + middle[:indent]
    after = "".join(lines[b:])
    prefix = before[-prefix_chars:]
    if len(before) > prefix_chars and "\n" in prefix:
        prefix = prefix[prefix.index("\n") + 1:]
    return Prompt(group, source, prefix, middle[indent:], after[:suffix_chars])


def build_prompts(package: str, per_group: int, prefix_chars: int, suffix_chars: int, seed: int) -> list[Prompt]:
    """Prompts from the package's source files (fixed seed: the same prompts every run)."""
    mod = importlib.import_module(package)
    root = Path(mod.__file__ or "").parent
    files = sorted(p for p in root.rglob("*.py") if "test" not in p.name)
    rng = random.Random(seed)
    funcs = [f for p in files for f in ((p, fn, lines) for fn, lines in _functions(p))]
    rng.shuffle(funcs)
    prompts: list[Prompt] = []
    counts = {g: 0 for g in GROUPS}
    for i, (path, fn, lines) in enumerate(funcs):
        group = GROUPS[i % len(GROUPS)]
        if counts[group] >= per_group:
            group = next((g for g in GROUPS if counts[g] < per_group), "")
            if not group:
                break
        body_start = fn.body[0].lineno - 1  # 0-based line index of the first body statement (docstring included)
        first_code = next(n for n in fn.body if not _is_docstring(n)).lineno - 1
        end = fn.end_lineno or body_start
        code_lines = [j for j in range(max(first_code, body_start), end) if lines[j].strip() and not lines[j].strip().startswith("#")]
        if len(code_lines) < 5:
            continue
        a, b = _span(group, code_lines, end)
        p = _prompt(group, f"{path.relative_to(root.parent)}:{a + 1}", lines, a, b, prefix_chars, suffix_chars)
        if p is not None:
            prompts.append(p)
            counts[group] += 1
    return prompts


def _measure(eng: Any, p: Prompt, i: int, reps: int) -> dict[str, Any]:
    """One prompt's row: a warm-up that prefills both models (its prefill times are the cold cost), then `reps`
    timed runs per mode, the order alternating per prompt and repetition; the median decode time counts."""
    greedy = SamplingParams(temperature=0)
    n_mid = len(eng.target.tokenize(p.middle, parse_special=False))
    # As in an editor, where each request shares its file with the previous one: both models hold the prompt
    # before the timed runs (the warm-up's target prefill and the draft's, which happens inside its first
    # propose, are reported apart as the cold cost)
    warm = eng.infill(p.prefix, p.suffix, sampling=greedy, max_tokens=2, speculative=True)
    res: dict[bool, Any] = {}
    secs: dict[bool, list[float]] = {True: [], False: []}
    for rep in range(reps):
        for spec in ((True, False) if (i + rep) % 2 == 0 else (False, True)):
            res[spec] = eng.infill(p.prefix, p.suffix, sampling=greedy, max_tokens=n_mid + 16, speculative=spec)
            secs[spec].append(res[spec].stats.decode_seconds)
    plain, sp = res[False], res[True]
    med = {k: statistics.median(v) for k, v in secs.items()}  # greedy: every repetition writes the same tokens
    rate = {k: r.stats.n_generated / max(med[k], 1e-9) for k, r in res.items()}
    return {
        "group": p.group, "source": p.source, "n_prompt": plain.stats.n_prompt, "n_middle": n_mid,
        "n_generated": plain.stats.n_generated, "plain_s": med[False], "spec_s": med[True],
        "spec_n": sp.stats.n_generated, "ratio": rate[True] / rate[False] if rate[False] > 0 else 0.0,
        "prefill_s": warm.stats.timings.prefill, "draft_prefill_s": warm.stats.timings.draft,
        "same": plain.token_ids == sp.token_ids, "exact": plain.text.strip() == p.middle.strip(),
        "exact_spec": sp.text.strip() == p.middle.strip(), "acceptance": sp.stats.acceptance,
        "sources": sp.stats.as_dict().get("sources"),
    }


def run_infill(
    prompts: list[Prompt], target: str, draft: str | None, *, drafter: str = "auto", ctx: int = 4096, threads: int | None = None,
    reps: int = 1, calibration: str | None = None, json_out: str | None = None, progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Every prompt plain and speculative on the pair (see the module docstring): {"rows", "target", "draft", "costs"}.
    calibration: a JSON file of measured costs, read when it exists, else measured and written (a busy machine may
    need many minutes to measure them, and a rerun need not). json_out: the rows so far, written after every prompt
    (a run stopped early keeps what it measured). progress: one line per prompt."""
    from edgespec.drafting.calibration import Calibration
    from edgespec.config import ModelSpec
    from edgespec.runtime.engine import Engine

    say = progress or (lambda s: None)
    rows = []
    cal_path = Path(calibration) if calibration else None
    dspec = ModelSpec(draft, n_ctx=ctx, n_threads=threads) if draft else None
    with Engine.load(ModelSpec(target, n_ctx=ctx, n_threads=threads), dspec, drafter=drafter,
                     calibrate_costs=not (cal_path and cal_path.exists())) as eng:
        if cal_path is not None:
            if cal_path.exists():  # a curve measured by an earlier run
                c = json.loads(cal_path.read_text())
                eng.set_calibration(Calibration({int(k): v for k, v in c["verify"].items()}, c["draft"], "file " + str(cal_path)))
            else:
                cal = eng.calibration
                atomic_write_text(cal_path, json.dumps({"verify": cal.verify, "draft": cal.draft, "source": cal.source}))
        for i, p in enumerate(prompts):
            r = _measure(eng, p, i, reps)
            rows.append(r)
            if json_out:
                atomic_write_text(json_out, json.dumps({"rows": rows, "partial": True}, indent=1))
            say(f"[{i + 1}/{len(prompts)}] {p.group:5s} {p.source:40s} ratio {r['ratio']:.2f} exact {r['exact']} "
                f"({r['n_generated']} tok, plain {r['plain_s']:.2f}s spec {r['spec_s']:.2f}s, prefill {r['prefill_s']:.2f}s "
                f"+ draft {r['draft_prefill_s']:.2f}s)")
        costs = {"verify": eng.calibration.verify, "draft": eng.calibration.draft, "source": eng.calibration.source}
    return {"rows": rows, "target": target, "draft": draft, "costs": costs}


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for g in (*GROUPS, "all"):
        rs = [r for r in rows if g == "all" or r["group"] == g]
        if not rs:
            continue
        plain = sum(r["n_generated"] for r in rs) / max(sum(r["plain_s"] for r in rs), 1e-9)
        spec = sum(r["spec_n"] for r in rs) / max(sum(r["spec_s"] for r in rs), 1e-9)
        pre = sum(r["prefill_s"] for r in rs)
        cold = (pre + sum(r["plain_s"] for r in rs)) / max(pre + sum(r["draft_prefill_s"] + r["spec_s"] for r in rs), 1e-9)
        out.append({"group": g, "n": len(rs), "plain_tps": plain, "spec_tps": spec, "ratio": spec / plain if plain else 0.0, "cold_ratio": cold,
                    "min_ratio": min(r["ratio"] for r in rs), "median_ratio": statistics.median(r["ratio"] for r in rs),
                    "exact_plain": sum(r["exact"] for r in rs) / len(rs), "exact_spec": sum(r["exact_spec"] for r in rs) / len(rs),
                    "same": all(r["same"] for r in rs)})
    return out


def markdown(result: dict[str, Any], summary: list[dict[str, Any]], cmd: str) -> str:
    """The summary as a markdown table, with the machine, the pair, the prompts' package and the command."""
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        f"Measured {now} on {platform.machine()} {platform.processor() or ''} ({platform.system()}), "
        f"target `{Path(result['target']).name}`, draft `{Path(result['draft']).name if result['draft'] else 'none'}`, "
        f"prompts from `{result['package']}` {result['version']}; command: `{cmd}`.",
        "",
        "| group | prompts | plain tok/s | speculative tok/s | ratio | lowest prompt ratio | median prompt ratio "
        "| cold ratio | exact middle (plain / spec) | spec = plain |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for s in summary:
        lines.append(f"| {s['group']} | {s['n']} | {s['plain_tps']:.1f} | {s['spec_tps']:.1f} | {s['ratio']:.2f}x | {s['min_ratio']:.2f}x | "
                     f"{s['median_ratio']:.2f}x | {s['cold_ratio']:.2f}x | {s['exact_plain']:.0%} / {s['exact_spec']:.0%} | {'yes' if s['same'] else 'NO'} |")
    return "\n".join(lines) + "\n"
