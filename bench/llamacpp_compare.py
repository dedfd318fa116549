#!/usr/bin/env python3
"""Compare edgespec with llama.cpp's own C++ tools on the same model pair, prompts and settings.

    .venv/bin/python bench/llamacpp_compare.py               # build (once, cached) + run + print a table
    .venv/bin/python bench/llamacpp_compare.py --build-only  # just build the llama.cpp tools

What it does:

1. Builds `llama-speculative-simple`, `llama-lookup` and `llama-bench` from the llama.cpp sources vendored in the
   llama-cpp-python sdist (the same version edgespec runs on, 0.3.36 by default), with GGML_NATIVE=OFF and the
   CPU flags scripts/setup.sh would pick (EDGESPEC_CMAKE_ARGS overrides them, as for setup.sh). Sources and
   binaries live in ~/.cache/edgespec/llamacpp/ (never in the repository); a second run reuses the build.
2. Runs them greedily with the same max tokens on the first prompts of every edgespec benchmark suite (chat
   prompts rendered with the model's template and passed with special tokens parsed, so both sides see the same
   token sequence): plain llama.cpp is llama-lookup with a draft length of 0 (one token per decode, no drafting);
   llama.cpp's own speculation is llama-speculative-simple (with the draft model) and llama-lookup (prompt
   lookup). llama-bench's tg at the prompt's depth gives llama.cpp's plain decode rate once more, timed by itself.
3. Runs edgespec on the same prompts through the library, one engine: plain (speculative=False), the default
   drafter, the n-gram lookup and the suffix drafter, every method interleaved per prompt in alternating order,
   then prints tokens/s for all of them and the ratios edgespec / llama.cpp.
4. With --repeats R every prompt is run R times (the order of the methods alternating from one pass to the next).
   The ratio table is paired: each ratio is taken between two methods' runs of the same prompt in the same pass
   (seconds apart), and the table gives the median of those pairs per suite with their range, so that the
   machine's drift between passes cancels out instead of landing on one side.

Decode rates exclude prompt processing on both sides: llama.cpp's tools print "decoded N tokens in T seconds"
measured after the prompt is encoded; edgespec's stats.tokens_per_second excludes stats.timings.prefill.

The command line of edgespec/bench/llamacpp.py (building and running the tools) and edgespec/bench/llamacpp_compare.py
(the interleaved run, the paired ratios, the report).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from edgespec.bench.llamacpp import build, detect_cmake_args, log  # noqa: E402
from edgespec.bench.llamacpp_compare import METHODS, format_report, run_comparison  # noqa: E402


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-cpp-python-version", default="0.3.36", help="sdist whose vendor/llama.cpp is built (default: %(default)s)")
    ap.add_argument("--cache", type=Path, default=None, help="sources and builds go here (default: $EDGESPEC_CACHE_DIR/llamacpp)")
    ap.add_argument("--build-only", action="store_true", help="build the tools and stop")
    ap.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--target", default=None, help="target GGUF (default: the default pair's)")
    ap.add_argument("--draft", default=None, help="draft GGUF (default: the default pair's)")
    ap.add_argument("--max-tokens", "-n", type=int, default=128)
    ap.add_argument("--suites", nargs="+", default=None, help="suites to run (default: all)")
    ap.add_argument("--prompts-per-suite", type=int, default=2, help="first N prompts of each suite (default: %(default)s)")
    ap.add_argument("--repeats", type=int, default=1, help="passes over the prompts; ratios are paired per prompt and pass (default: %(default)s)")
    ap.add_argument("--methods", nargs="+", default=None, choices=METHODS, metavar="METHOD",
                    help=f"methods to run (default: all): {', '.join(repr(m) for m in METHODS)}")
    ap.add_argument("--draft-max", type=int, default=8, help="most drafted tokens per cycle, both sides (default: %(default)s)")
    ap.add_argument("--threads", "-t", type=int, default=None, help="CPU threads, both sides (default: edgespec's default)")
    ap.add_argument("--no-bench", action="store_true", help="skip llama-bench")
    ap.add_argument("--json-out", type=Path, default=None, help="also write every measurement as JSON here")
    args = ap.parse_args()
    if args.repeats < 1 or args.prompts_per_suite < 1 or args.max_tokens < 1:
        ap.error("--repeats, --prompts-per-suite and --max-tokens must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    methods = tuple(args.methods or METHODS)
    from edgespec.paths import cache_dir

    cache = args.cache or cache_dir() / "llamacpp"
    bin_dir = build(cache, args.llama_cpp_python_version, args.jobs)
    if args.build_only:
        print(bin_dir)
        return

    from edgespec.llama.backend import default_threads
    from edgespec.bench import load_suites
    from edgespec.config import ModelSpec, SpecConfig
    from edgespec.runtime.engine import Engine
    from edgespec.models import resolve_model

    import llama_cpp

    if getattr(llama_cpp, "__version__", None) != args.llama_cpp_python_version:
        log(f"note: edgespec runs on llama-cpp-python {getattr(llama_cpp, '__version__', '?')}, the tools are built from {args.llama_cpp_python_version}")
    target = Path(resolve_model(args.target, "target"))
    draft = Path(resolve_model(args.draft, "draft"))
    threads = args.threads or default_threads()
    n = args.max_tokens
    suites = load_suites()
    work = {name: entries[: args.prompts_per_suite] for name, entries in suites.items() if not args.suites or name in args.suites}
    eng = Engine.load(ModelSpec(str(target), n_threads=threads, n_ctx=4096), ModelSpec(str(draft), n_threads=threads, n_ctx=4096),
                      drafter="model+suffix", spec=SpecConfig(draft_max=args.draft_max), memory=False)
    try:
        res = run_comparison(eng, bin_dir, target, draft, work, methods=methods, n=n, threads=threads, draft_max=args.draft_max,
                             repeats=args.repeats, bench=not args.no_bench)
    finally:
        eng.close()
    header = [
        f"llama.cpp (llama-cpp-python {args.llama_cpp_python_version} sources, CPU flags: {detect_cmake_args() or 'defaults'})",
        f"target {target.name}  draft {draft.name}  greedy, {n} tokens, draft max {args.draft_max}, {threads} threads, "
        f"{args.prompts_per_suite} prompts per suite, {args.repeats} pass(es), {res['seconds']:.0f}s",
    ]
    print(format_report(res, methods, header))
    if args.json_out:
        from edgespec.fsutil import atomic_write_text

        atomic_write_text(args.json_out, json.dumps({"results": res["results"], "llama_bench": res["llama_bench"], "threads": threads,
                                                     "max_tokens": n, "repeats": args.repeats}, indent=1))


if __name__ == "__main__":
    main()
