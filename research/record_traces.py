#!/usr/bin/env python3
"""Record what the speedup predictor replays: greedy traces of the real pair on the bench suites, and the draft
model's greedy continuation (with its confidences) at every position of each trace.

    nice .venv/bin/python research/record_traces.py                       # all 5 suites, 128 tokens, 16 draft tokens
    .venv/bin/python research/record_traces.py --suite code-completion --max-tokens 32 --out /tmp/t.json.gz
    nice .venv/bin/python research/record_traces.py --sampled --out research/data/traces_t1.json.gz

The command line of edgespec/bench/traces.py, whose docstring says why this is enough and describes the file
formats: greedy traces as shifted segments of the draft's continuations (format 2; format 1 files, without the
draft's alternatives, are still read and --add-alternatives upgrades them), and --sampled recordings for replaying
temperature > 0 (format 3: a sampled trajectory per prompt and both models' top distributions along it).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's edgespec

from edgespec.bench.traces import record, record_order, upgradable, upgrade  # noqa: E402

DEFAULT_OUT = HERE / "data" / "traces.json.gz"


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def parse_args(argv: list[str] | None) -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", action="append", default=[], help="bench suite(s) to record (default: all)")
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--draft-len", type=int, default=16, help="draft tokens recorded per position")
    ap.add_argument("--target", default=None, help="target GGUF (default: the default pair's)")
    ap.add_argument("--draft", default=None, help="draft GGUF (default: the default pair's)")
    ap.add_argument("--prompts-per-suite", type=int, default=0, help="only the first N prompts of each suite (0 = all)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--resume", action="store_true", help="keep the prompts already in --out (same settings), record the rest")
    ap.add_argument("--add-alternatives", type=Path, default=None, metavar="IN",
                    help="read a format-1 recording, add the draft's alternatives at every drafted position (the draft "
                         "model only; traces and continuations kept), write format 2 to --out")
    ap.add_argument("--sampled", action="store_true",
                    help="record sampled trajectories and both models' top distributions along them (format 3, for "
                         "replaying temperature > 0); with --temperature/--top-k/--top-p/--min-p/--seed")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--top-k", type=int, default=40)
    ap.add_argument("--top-p", type=float, default=0.95)
    ap.add_argument("--min-p", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--top", type=int, default=40, help="--sampled: most likely tokens recorded per position and model")
    return ap, ap.parse_args(argv)


def add_alternatives(src: Path, out: Path, draft_path: str | None, threads: int | None) -> int:
    """--add-alternatives: src (format 1) -> out (format 2), the draft model only."""
    from edgespec.llama.backend import Model
    from edgespec.config import ModelSpec
    from edgespec.models import resolve_model

    dpath = resolve_model(draft_path, "draft")
    try:
        data = upgradable(src, os.path.basename(str(dpath)))
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    draft = Model(ModelSpec(str(dpath), n_ctx=8192, n_threads=threads))
    try:
        upgrade(data, draft, out, progress=say)
    finally:
        draft.close()
    print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB)", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap, a = parse_args(argv)
    if a.add_alternatives is not None:
        return add_alternatives(a.add_alternatives, a.out, a.draft, a.threads)

    from edgespec.bench import load_suites
    from edgespec.config import ModelSpec, SamplingParams
    from edgespec.runtime.engine import Engine
    from edgespec.models import resolve_model

    tpath, dpath = resolve_model(a.target, "target"), resolve_model(a.draft, "draft")
    suites = load_suites()
    chosen = [s for s in suites if not a.suite or s in a.suite]
    unknown = [s for s in a.suite if s not in suites]
    if unknown:
        ap.error(f"unknown suite(s) {unknown}; known: {list(suites)}")
    sampling = SamplingParams(temperature=0)
    if a.sampled:
        sampling = SamplingParams(temperature=a.temperature, top_k=a.top_k, top_p=a.top_p, min_p=a.min_p, seed=a.seed)
        if sampling.greedy:
            ap.error("--sampled needs --temperature > 0")
    eng = Engine.load(
        ModelSpec(str(tpath), n_threads=a.threads), ModelSpec(str(dpath), n_threads=a.threads),
        drafter="model", calibrate_costs=False, prompt_cache_mb=0,
    )
    try:
        data = record(eng, suites, record_order(suites, chosen, a.prompts_per_suite), a.out,
                      {"target": os.path.basename(str(tpath)), "draft": os.path.basename(str(dpath))},
                      sampling=sampling, max_tokens=a.max_tokens, draft_len=a.draft_len, top=a.top, resume=a.resume, progress=say)
    finally:
        eng.close()
    print(f"wrote {a.out} ({a.out.stat().st_size / 1024:.0f} KiB, {len(data['prompts'])} prompts, {data['seconds']:.0f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
