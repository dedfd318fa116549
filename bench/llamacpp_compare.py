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
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGETS = ("llama-speculative-simple", "llama-lookup", "llama-bench")


def log(msg: str) -> None:
    print(f"[compare] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------------- build
def detect_cmake_args() -> str:
    """The flags scripts/setup.sh builds with (scripts/cmake_args.sh; EDGESPEC_CMAKE_ARGS replaces them entirely)."""
    env = os.environ.get("EDGESPEC_CMAKE_ARGS")
    if env is not None:
        return env
    out = subprocess.run(["bash", str(ROOT / "scripts" / "cmake_args.sh")], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def run_logged(cmd: list[str], **kw: Any) -> None:
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, **kw)


def fetch_sources(cache: Path, version: str) -> Path:
    """vendor/llama.cpp of the llama-cpp-python sdist, downloaded and unpacked once."""
    src = cache / "src" / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
    if (src / "CMakeLists.txt").is_file():
        return src
    sdist_dir = cache / "sdist"
    tarballs = sorted(sdist_dir.glob(f"llama_cpp_python-{version}.tar.gz"))
    if not tarballs:
        sdist_dir.mkdir(parents=True, exist_ok=True)
        run_logged([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                    f"llama-cpp-python=={version}", "-d", str(sdist_dir)])
        tarballs = sorted(sdist_dir.glob(f"llama_cpp_python-{version}.tar.gz"))
        if not tarballs:
            raise SystemExit(f"pip download left no llama_cpp_python-{version}.tar.gz in {sdist_dir}")
    log(f"unpacking {tarballs[0]}")
    (cache / "src").mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarballs[0]) as tf:
        tf.extractall(cache / "src", filter="data") if sys.version_info >= (3, 12) else tf.extractall(cache / "src")
    if not (src / "CMakeLists.txt").is_file():
        raise SystemExit(f"no vendor/llama.cpp in the sdist (looked for {src})")
    return src


def build_dir(cache: Path, version: str, flags: str) -> Path:
    """Where build() keeps the tools of this llama-cpp-python version built with these CMake flags."""
    return cache / f"build-{version}-{hashlib.sha256(f'{version}|{flags}'.encode()).hexdigest()[:12]}"


def build(cache: Path, version: str, jobs: int) -> Path:
    """Build the three tools (once per version and flag set); return the folder holding the binaries."""
    flags = detect_cmake_args()
    bdir = build_dir(cache, version, flags)
    bin_dir = bdir / "bin"
    if all((bin_dir / t).is_file() for t in TARGETS):
        log(f"reusing llama.cpp tools in {bin_dir}")
        return bin_dir
    src = fetch_sources(cache, version)
    log(f"llama.cpp {version} CMake flags: {flags or '<defaults>'}")
    configure = [
        "cmake", "-S", str(src), "-B", str(bdir), "-DCMAKE_BUILD_TYPE=Release",
        "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_BUILD_APP=OFF", "-DBUILD_SHARED_LIBS=OFF", *flags.split(),
    ]
    if shutil.which("ninja"):
        configure += ["-G", "Ninja"]
    run_logged(configure, stdout=subprocess.DEVNULL)
    t0 = time.time()
    run_logged(["cmake", "--build", str(bdir), "--config", "Release", "-j", str(jobs), "--target", *TARGETS],
               stdout=subprocess.DEVNULL)
    log(f"built in {time.time() - t0:.0f}s")
    missing = [t for t in TARGETS if not (bin_dir / t).is_file()]
    if missing:
        raise SystemExit(f"build finished but {', '.join(missing)} not in {bin_dir}")
    (bdir / "CMAKE_FLAGS").write_text(flags + "\n")
    return bin_dir


# --------------------------------------------------------------------------------------------- llama.cpp runs
_DECODED = re.compile(r"decoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds, speed:\s+([\d.]+|inf|nan)\s+t/s")
_ENCODED = re.compile(r"encoded\s+(\d+)\s+tokens in\s+([\d.]+)\s+seconds")
_FIELD = re.compile(r"^.*?\b(n_drafted|n_accept|n_predict)\s*=\s*(\d+)\s*$", re.M)


def parse_tool_output(text: str) -> dict[str, Any]:
    """The summary llama-speculative-simple and llama-lookup print at the end (this llama.cpp version):
        encoded  520 tokens in    1.234 seconds, speed:  421.4 t/s
        decoded  129 tokens in    9.876 seconds, speed:   13.1 t/s
        n_drafted = 120 / n_accept = 100 (plus other lines)"""
    m = _DECODED.search(text)
    if not m:
        raise ValueError("no 'decoded N tokens in T seconds' line in the output")
    out: dict[str, Any] = {"tokens": int(m.group(1)), "seconds": float(m.group(2))}
    e = _ENCODED.search(text)
    if e:
        out["prompt_tokens"], out["prompt_seconds"] = int(e.group(1)), float(e.group(2))
    for key, val in _FIELD.findall(text):
        out[key] = int(val)
    return out


def run_tool(cmd: list[str], timeout: float) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f}s"}
    wall = time.perf_counter() - t0
    text = p.stdout + "\n" + p.stderr
    if p.returncode != 0:
        tail = " | ".join(ln for ln in p.stderr.strip().splitlines()[-3:])
        return {"error": f"exit {p.returncode}: {tail}"}
    try:
        out = parse_tool_output(text)
    except ValueError as e:
        return {"error": str(e), "tail": p.stderr[-500:]}
    out["process_wall"] = round(wall, 3)
    return out


def llama_bench(bin_dir: Path, target: Path, n: int, threads: int, reps: int, depth: int = 0) -> dict[str, Any]:
    cmd = [str(bin_dir / "llama-bench"), "-m", str(target), "-p", "0", "-n", str(n), "-t", str(threads),
           "-r", str(reps), "-d", str(depth), "-o", "json"]
    log("$ " + " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=600)
    if p.returncode != 0:
        return {"error": f"exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}"}
    try:
        rows = json.loads(p.stdout)
        row = next(r for r in rows if int(r.get("n_gen", 0)) == n)
        return {"tokens_per_second": float(row["avg_ts"]), "stddev": float(row["stddev_ts"]), "reps": reps}
    except (ValueError, StopIteration, KeyError) as e:
        return {"error": f"cannot parse llama-bench json: {e}"}


# --------------------------------------------------------------------------------------------- comparison
def _finished(r: dict[str, Any]) -> bool:
    """A run that finished and was timed (a failed run carries "error")."""
    return "error" not in r and r.get("seconds", 0) > 0


def _rate(runs: list[dict[str, Any]]) -> float | None:
    ok = [r for r in runs if _finished(r)]
    if not ok:
        return None
    return sum(r["tokens"] for r in ok) / sum(r["seconds"] for r in ok)


def _acc(runs: list[dict[str, Any]]) -> float | None:
    ok = [r for r in runs if "error" not in r and r.get("n_drafted")]
    return sum(r["n_accept"] for r in ok) / sum(r["n_drafted"] for r in ok) if ok else None


def paired_ratios(runs_a: list[dict[str, Any]], runs_b: list[dict[str, Any]]) -> list[float]:
    """rate(a) / rate(b) for every (prompt, pass) both methods finished: runs carry "prompt" and "pass" keys."""
    def rates_of(runs: list[dict[str, Any]]) -> dict[tuple[int, int], float]:
        return {(r["prompt"], r["pass"]): r["tokens"] / r["seconds"] for r in runs
                if _finished(r) and r.get("tokens", 0) > 0}

    ra, rb = rates_of(runs_a), rates_of(runs_b)
    return [ra[key] / rb[key] for key in sorted(ra.keys() & rb.keys())]


def summarize(ratios: list[float]) -> str:
    """'median (min-max, n)' of paired ratios, '-' for none."""
    if not ratios:
        return "-"
    med = statistics.median(ratios)
    return f"{med:.2f} ({min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)})" if len(ratios) > 1 else f"{med:.2f}"


def best_of(runs_by_method: dict[str, list[dict[str, Any]]], methods: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per (prompt, pass), the fastest finished run among `methods` (llama.cpp's best speculative tool)."""
    best: dict[tuple[int, int], dict[str, Any]] = {}
    for m in methods:
        for r in runs_by_method.get(m, []):
            if not _finished(r):
                continue
            key = (r["prompt"], r["pass"])
            if key not in best or r["tokens"] / r["seconds"] > best[key]["tokens"] / best[key]["seconds"]:
                best[key] = r
    return list(best.values())


METHODS = ("llama plain", "llama spec-simple", "llama lookup", "edgespec plain", "edgespec default", "edgespec ngram", "edgespec suffix")


def main() -> None:
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
    methods = tuple(args.methods or METHODS)

    sys.path.insert(0, str(ROOT))
    from edgespec.paths import cache_dir

    cache = args.cache or cache_dir() / "llamacpp"
    bin_dir = build(cache, args.llama_cpp_python_version, args.jobs)
    if args.build_only:
        print(bin_dir)
        return

    from edgespec.llama.backend import default_threads
    from edgespec.bench import _run_one, load_suites
    from edgespec.config import ModelSpec, SamplingParams, SpecConfig
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
    spec = SpecConfig(draft_max=args.draft_max)
    eng = Engine.load(ModelSpec(str(target), n_threads=threads, n_ctx=4096), ModelSpec(str(draft), n_threads=threads, n_ctx=4096),
                      drafter="model+suffix", spec=spec, memory=False)
    default_kind = "model+ngram"
    greedy = SamplingParams(temperature=0.0)
    common = ["--no-escape", "-n", str(n), "--temp", "0", "-t", str(threads), "-c", "4096", "--spec-draft-n-max", str(args.draft_max)]
    tools = {
        "llama plain": lambda p: [str(bin_dir / "llama-lookup"), "-m", str(target), "-p", p, *common[:-1], "0"],
        "llama spec-simple": lambda p: [str(bin_dir / "llama-speculative-simple"), "-m", str(target), "-md", str(draft),
                                        "--spec-type", "draft-simple", "-p", p, *common, "-td", str(threads)],
        "llama lookup": lambda p: [str(bin_dir / "llama-lookup"), "-m", str(target), "-p", p, *common],
    }
    ours = {"edgespec plain": None, "edgespec default": default_kind, "edgespec ngram": "ngram", "edgespec suffix": "suffix"}

    def run_ours(ctx: list[int], kind: str | None) -> dict[str, Any]:
        # as edgespec bench runs it: empty caches, the draft's prompt processed apart where the draft model runs
        st = _run_one(eng, ctx, greedy, n, kind is not None, cold_draft=False, drafter=kind)["record"]
        return {"tokens": st.n_generated, "seconds": st.decode_seconds, "prompt_tokens": st.n_prompt,
                "n_drafted": st.n_drafted, "n_accept": st.n_accepted, "sources": st.source_counts}

    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    depths: dict[str, list[int]] = {}
    t_start = time.time()
    first = next(iter(work.values()))[0]
    ctx0 = eng.prompt_tokens(first.get("prompt"), messages=first.get("messages"))
    for name, kind in ours.items():  # unrecorded warm-up of our side (first-call page faults), as edgespec bench does
        if name in methods:
            run_ours(ctx0[:64], kind)
    prompts = []
    for suite, entries in work.items():
        for i, entry in enumerate(entries):
            ctx = eng.prompt_tokens(entry.get("prompt"), messages=entry.get("messages"))
            depths.setdefault(suite, []).append(len(ctx))
            prompts.append((suite, i, ctx, entry["prompt"] if "prompt" in entry else eng.render(entry["messages"])))
    steps: list[tuple[str, Any]] = [(nm, fn) for nm, fn in tools.items() if nm in methods]
    steps += [(nm, kind) for nm, kind in ours.items() if nm in methods]
    k = 0
    for rep in range(args.repeats):
        for suite, i, ctx, text in prompts:
            res = results.setdefault(suite, {})
            order = steps[::-1] if k % 2 else steps  # alternate the order so that slow phases hit every method
            k += 1
            tag = f"{suite} {i + 1}" + (f" (pass {rep + 1}/{args.repeats})" if args.repeats > 1 else "")
            for name, how in order:
                if name.startswith("llama"):
                    r = run_tool(how(text), timeout=600)
                    if "error" in r:
                        log(f"{tag}: {name} failed: {r['error']}")
                    else:
                        log(f"{tag}: {name} {r['tokens'] / r['seconds']:.1f} tok/s"
                            + (f", accept {r['n_accept']}/{r['n_drafted']}" if r.get("n_drafted") else ""))
                        if r.get("prompt_tokens") not in (None, len(ctx)):
                            log(f"  WARNING: prompt token counts differ: llama.cpp {r['prompt_tokens']} vs edgespec {len(ctx)}")
                else:
                    r = run_ours(ctx, how)
                    log(f"{tag}: {name} {r['tokens'] / r['seconds']:.1f} tok/s")
                r.update(prompt=i, **{"pass": rep})
                res.setdefault(name, []).append(r)
    bench = {}
    if not args.no_bench:
        for suite, ds in depths.items():
            bench[suite] = llama_bench(bin_dir, target, n, threads, 1, depth=int(sum(ds) / len(ds)))
    elapsed = time.time() - t_start
    eng.close()

    # ------------------------------------------------------------------ report
    cols = [c for c in METHODS if c in methods]
    lines = [
        f"llama.cpp (llama-cpp-python {args.llama_cpp_python_version} sources, CPU flags: {detect_cmake_args() or 'defaults'})",
        f"target {target.name}  draft {draft.name}  greedy, {n} tokens, draft max {args.draft_max}, {threads} threads, "
        f"{args.prompts_per_suite} prompts per suite, {args.repeats} pass(es), {elapsed:.0f}s",
        "decode tokens/s (prompt processing excluded on both sides; sum of tokens / sum of seconds over the prompts)",
        "",
    ]
    head = ["suite"] + cols + ["llama-bench tg"]
    rows = []
    for suite, res in results.items():
        row = [suite]
        for c in cols:
            rate = _rate(res.get(c, []))
            acc = _acc(res.get(c, [])) if c not in ("llama plain", "edgespec plain") else None
            row.append("-" if rate is None else f"{rate:.1f}" + (f" ({100 * acc:.0f}%)" if acc is not None else ""))
        b = bench.get(suite, {})
        row.append(f"{b['tokens_per_second']:.1f}" if "tokens_per_second" in b else "-")
        rows.append(row)
    lines += _fmt_table(head, rows)
    lines.append("(xx%) = draft acceptance (accepted / drafted); llama-bench tg at the suite's mean prompt depth")
    lines.append("")
    pairs = [("edgespec plain", "llama plain"), ("edgespec default", "llama plain"), ("edgespec suffix", "llama plain"),
             ("edgespec default", "best llama spec"), ("llama spec-simple", "llama plain"), ("llama lookup", "llama plain")]
    ratio_rows = []
    for suite, res in results.items():
        runs = dict(res)
        runs["best llama spec"] = best_of(res, ("llama spec-simple", "llama lookup"))
        ratio_rows.append([suite] + [summarize(paired_ratios(runs.get(a, []), runs.get(b, []))) for a, b in pairs])
    lines += _fmt_table(["suite"] + [f"{a} / {b}".replace("edgespec", "es") for a, b in pairs], ratio_rows)
    lines.append("ratios: median over (prompt, pass) pairs run seconds apart, (min-max, number of pairs)")
    errors = [(s, c, r["error"]) for s, res in results.items() for c, rs in res.items() for r in rs if "error" in r]
    for s, c, e in errors:
        lines.append(f"ERROR {s} {c}: {e}")
    print("\n".join(lines))
    if args.json_out:
        from edgespec.fsutil import atomic_write_text

        atomic_write_text(args.json_out, json.dumps({"results": results, "llama_bench": bench, "threads": threads, "max_tokens": n,
                                                     "repeats": args.repeats}, indent=1))


def _fmt_table(head: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [head] + rows) for i in range(len(head))]

    def fmt(r: list[str]) -> str:
        return "  ".join(str(c).rjust(w) if j else str(c).ljust(w) for j, (c, w) in enumerate(zip(r, widths)))

    return [fmt(head), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows]


if __name__ == "__main__":
    main()
