#!/usr/bin/env python3
"""The infill benchmark: spans blanked out of functions in a real Python package installed in this venv, filled in
by the model greedily, plain vs speculative, interleaved in one run (the CPU is shared: a drift of the machine's
speed lands on both alike; the order alternates per prompt).

    .venv/bin/python bench/bench_infill.py                         # the default pair, 36 prompts from click
    .venv/bin/python bench/bench_infill.py --package jinja2 --per-group 8 --md-out docs/infill_bench.md

Prompt groups (each function gives at most one prompt per group):
    line    one statement line in the middle of a function body
    block   three consecutive lines in the middle of a body
    tail    the body's last lines (the end of the function)

For every prompt: the code before the span (at most --prefix-chars, cut at a line start) is the prefix, the code
after it (at most --suffix-chars) the suffix; the model writes the middle with at most (the span's tokens + 16)
tokens. As in an editor, where each request shares its file with the previous one, both models hold the prompt in
their KV caches before the timed runs (a warm-up request prefills them). Reported per group and overall: tokens/s
plain and speculative (total tokens over total time after the prompt), the ratio, the lowest and the median
per-prompt ratio, the "cold" ratio (end-to-end time of a request whose prompt neither model holds: plain = target
prefill + plain decode, speculative = target prefill + the draft's prefill + speculative decode), and the exact-match
rate of the middle (whitespace at both ends ignored) for each mode (greedy speculative output equals plain output
token for token, so the two rates agree; "spec = plain" checks it).

--reps N times each mode N times per prompt (alternating) and counts the median decode time: a middle of a few
tokens is a few cycles, and one run of it is as noisy as the machine.

--calibration FILE keeps the measured cost curve in FILE (measured and written when FILE does not exist): a busy
machine may need many minutes to measure it, and a rerun need not.
"""

from __future__ import annotations

import argparse
import ast
import datetime as dt
import importlib
import importlib.metadata
import json
import platform
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GROUPS = ("line", "block", "tail")


@dataclass
class Prompt:
    group: str
    source: str
    prefix: str
    middle: str
    suffix: str


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
            body = [n for n in node.body if not (isinstance(n, ast.Expr) and isinstance(getattr(n, "value", None), ast.Constant))]
            if len(body) >= 4 and node.end_lineno - body[0].lineno >= 6:
                out.append((node, lines))
    return out


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
        first_code = next(n for n in fn.body if not (isinstance(n, ast.Expr) and isinstance(getattr(n, "value", None), ast.Constant))).lineno - 1
        end = fn.end_lineno or body_start
        code_lines = [j for j in range(max(first_code, body_start), end) if lines[j].strip() and not lines[j].strip().startswith("#")]
        if len(code_lines) < 5:
            continue
        if group == "line":
            a = code_lines[len(code_lines) // 2]
            b = a + 1
        elif group == "block":
            a = code_lines[len(code_lines) // 3]
            b = min(a + 3, end)
        else:
            a = code_lines[-min(3, len(code_lines) - 1)]
            b = end
        middle = "".join(lines[a:b])
        if not middle.strip():
            continue
        # the span starts after the line's indentation: the cursor sits where code begins, as in an editor
        indent = len(middle) - len(middle.lstrip(" \t"))
        before = "".join(lines[:a]) + middle[:indent]
        after = "".join(lines[b:])
        prefix = before[-prefix_chars:]
        if len(before) > prefix_chars and "\n" in prefix:
            prefix = prefix[prefix.index("\n") + 1:]
        suffix = after[:suffix_chars]
        prompts.append(Prompt(group, f"{path.relative_to(root.parent)}:{a + 1}", prefix, middle[indent:], suffix))
        counts[group] += 1
    return prompts


def run(args: argparse.Namespace) -> dict[str, Any]:
    from edgespec.drafting.calibration import Calibration
    from edgespec.config import ModelSpec, SamplingParams
    from edgespec.runtime.engine import Engine
    from edgespec.fsutil import atomic_write_text

    if args.target:
        target, draft = args.target, args.draft
    else:
        from edgespec.models import resolve_model

        target, draft = str(resolve_model(None, "target")), str(resolve_model(None, "draft"))
    prompts = build_prompts(args.package, args.per_group, args.prefix_chars, args.suffix_chars, args.seed)
    greedy = SamplingParams(temperature=0)
    rows = []
    cal_path = Path(args.calibration) if args.calibration else None
    dspec = ModelSpec(draft, n_ctx=args.ctx, n_threads=args.threads) if draft else None
    with Engine.load(ModelSpec(target, n_ctx=args.ctx, n_threads=args.threads), dspec, drafter=args.drafter,
                     calibrate_costs=not (cal_path and cal_path.exists())) as eng:
        if cal_path is not None:
            if cal_path.exists():  # a curve measured by an earlier run (a busy machine may take many minutes to measure)
                c = json.loads(cal_path.read_text())
                eng.set_calibration(Calibration({int(k): v for k, v in c["verify"].items()}, c["draft"], "file " + str(cal_path)))
            else:
                c = eng.calibration
                atomic_write_text(cal_path, json.dumps({"verify": c.verify, "draft": c.draft, "source": c.source}))
        for i, p in enumerate(prompts):
            n_mid = len(eng.target.tokenize(p.middle, parse_special=False))
            # As in an editor, where each request shares its file with the previous one: both models hold the prompt
            # before the timed runs (the warm-up's target prefill and the draft's, which happens inside its first
            # propose, are reported apart as the cold cost)
            warm = eng.infill(p.prefix, p.suffix, sampling=greedy, max_tokens=2, speculative=True)
            res: dict[bool, Any] = {}
            secs: dict[bool, list[float]] = {True: [], False: []}
            for rep in range(args.reps):  # the order alternates per prompt and per repetition
                for spec in ((True, False) if (i + rep) % 2 == 0 else (False, True)):
                    res[spec] = eng.infill(p.prefix, p.suffix, sampling=greedy, max_tokens=n_mid + 16, speculative=spec)
                    secs[spec].append(res[spec].stats.decode_seconds)
            plain, sp = res[False], res[True]
            med = {k: statistics.median(v) for k, v in secs.items()}  # greedy: every repetition writes the same tokens
            rate = {k: r.stats.n_generated / max(med[k], 1e-9) for k, r in res.items()}
            rows.append({
                "group": p.group, "source": p.source, "n_prompt": plain.stats.n_prompt, "n_middle": n_mid,
                "n_generated": plain.stats.n_generated, "plain_s": med[False], "spec_s": med[True],
                "spec_n": sp.stats.n_generated, "ratio": rate[True] / rate[False] if rate[False] > 0 else 0.0,
                "prefill_s": warm.stats.timings.prefill, "draft_prefill_s": warm.stats.timings.draft,
                "same": plain.token_ids == sp.token_ids, "exact": plain.text.strip() == p.middle.strip(),
                "exact_spec": sp.text.strip() == p.middle.strip(), "acceptance": sp.stats.acceptance,
                "sources": sp.stats.as_dict().get("sources"),
            })
            r = rows[-1]
            if args.json_out:  # after every prompt: a run stopped early keeps what it measured
                atomic_write_text(args.json_out, json.dumps({"rows": rows, "partial": True}, indent=1))
            print(f"[{i + 1}/{len(prompts)}] {p.group:5s} {p.source:40s} ratio {r['ratio']:.2f} exact {r['exact']} "
                  f"({r['n_generated']} tok, plain {r['plain_s']:.2f}s spec {r['spec_s']:.2f}s, prefill {r['prefill_s']:.2f}s "
                  f"+ draft {r['draft_prefill_s']:.2f}s)", file=sys.stderr, flush=True)
        costs = {"verify": eng.calibration.verify, "draft": eng.calibration.draft, "source": eng.calibration.source}
    return {"rows": rows, "target": target, "draft": draft, "package": args.package, "costs": costs,
            "version": importlib.metadata.version(args.package)}


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="target GGUF (default: the default pair's)")
    ap.add_argument("--draft", help="draft GGUF (with --target)")
    ap.add_argument("--drafter", default="auto")
    ap.add_argument("--package", default="click", help="the installed package whose functions are blanked out")
    ap.add_argument("--per-group", type=int, default=12)
    ap.add_argument("--prefix-chars", type=int, default=3000)
    ap.add_argument("--suffix-chars", type=int, default=1500)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=1,
                    help="timed runs per mode and prompt; the median decode time counts (short middles are a few cycles: one run is noisy)")
    ap.add_argument("--calibration", help="a JSON file of measured costs: read when it exists, else measured and written")
    ap.add_argument("--json-out")
    ap.add_argument("--md-out", help="write the markdown table here (atomically)")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be at least 1")
    result = run(args)
    summary = summarize(result["rows"])
    cmd = "bench/bench_infill.py " + " ".join(sys.argv[1:])
    md = markdown(result, summary, cmd)
    print(md)
    from edgespec.fsutil import atomic_write_text

    if args.json_out:
        atomic_write_text(args.json_out, json.dumps({**result, "summary": summary}, indent=1))
    if args.md_out:
        atomic_write_text(args.md_out, md)


if __name__ == "__main__":
    main()
