#!/usr/bin/env python3
"""The infill benchmark: spans blanked out of functions in a real Python package installed in this venv, filled in
by the model greedily, plain vs speculative, interleaved in one run (the CPU is shared: a drift of the machine's
speed lands on both alike; the order alternates per prompt). The command line of edgespec/bench/infill_suite.py.

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
import importlib.metadata
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgespec.bench.infill_suite import build_prompts, markdown, run_infill, summarize  # noqa: E402
from edgespec.fsutil import atomic_write_text  # noqa: E402


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
    if args.target:
        target, draft = args.target, args.draft
    else:
        from edgespec.models import resolve_model

        target, draft = str(resolve_model(None, "target")), str(resolve_model(None, "draft"))
    prompts = build_prompts(args.package, args.per_group, args.prefix_chars, args.suffix_chars, args.seed)
    res = run_infill(prompts, target, draft, drafter=args.drafter, ctx=args.ctx, threads=args.threads, reps=args.reps,
                     calibration=args.calibration, json_out=args.json_out, progress=lambda s: print(s, file=sys.stderr, flush=True))
    result = {"rows": res["rows"], "target": target, "draft": draft, "package": args.package, "costs": res["costs"],
              "version": importlib.metadata.version(args.package)}
    summary = summarize(result["rows"])
    cmd = "bench/bench_infill.py " + " ".join(sys.argv[1:])
    md = markdown(result, summary, cmd)
    print(md)
    if args.json_out:
        atomic_write_text(args.json_out, json.dumps({**result, "summary": summary}, indent=1))
    if args.md_out:
        atomic_write_text(args.md_out, md)


if __name__ == "__main__":
    main()
