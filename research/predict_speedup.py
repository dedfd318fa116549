#!/usr/bin/env python3
"""Predict edgespec's greedy speedup on any hardware from its measured costs, without the models.

    .venv/bin/python research/predict_speedup.py --curve research/data/curve_gpu_flat.json
    .venv/bin/python research/predict_speedup.py --curve bench.json          # the costs an `edgespec bench --json` used
    .venv/bin/python research/predict_speedup.py --curve ~/.cache/edgespec/calibration.json --json out.json
    .venv/bin/python research/predict_speedup.py --profiles [--sampled] [--streams 4]
    .venv/bin/python research/predict_speedup.py measure TARGET.gguf [DRAFT.gguf] --n-gpu-layers -1 --out curve.json

Acceptance does not depend on the hardware; cost does. research/record_traces.py recorded the real pair's traces on
the 5 bench suites and the draft model's continuations along them (research/data/traces.json.gz; a sampled recording
at T = 1.0 in research/data/traces_t1.json.gz); this script replays them through edgespec's own loop and speculators
on a verify-cost curve and prints the predicted speedup per suite for each drafter, with the oracle bound.

The command line of the replay in the package (edgespec/bench/): curves.py (curve files: what each model call costs),
recorded.py (the recorded target and draft), replay.py (the replay through the engine's loop and learning state),
oracle.py (the bounds and fitted rules), speedup.py (speedups per suite, hardware profiles and their goals) and
measure.py (`measure`: a curve file for any pair of GGUF files on this machine, CPU or GPU offload: verify sizes 1..64
by default, the draft's per-token cost and its curve up to 17 tokens for catch-ups). docs/gpu.md says what the
numbers mean.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's edgespec

from edgespec.bench.curves import load_curve, parse_sizes  # noqa: E402
from edgespec.bench.replay import KINDS, TREE_KINDS, format_streams, predict_streams  # noqa: E402
from edgespec.bench.speedup import DEFAULT_RELATIVE, format_profiles, format_table, goals_check, predict, profile_rows  # noqa: E402
from edgespec.bench.traces import load_traces  # noqa: E402
from edgespec.fsutil import atomic_write_text  # noqa: E402

DEFAULT_TRACES = HERE / "data" / "traces.json.gz"
DEFAULT_SAMPLED = HERE / "data" / "traces_t1.json.gz"  # the sampled recording (T = 1.0 with the bench's settings)
DEFAULT_PROFILES = HERE / "data" / "curves"


def measure_main(argv: list[str]) -> int:
    """predict_speedup.py measure TARGET [DRAFT] --out FILE."""
    from edgespec.bench.measure import measure

    ap = argparse.ArgumentParser(prog="predict_speedup.py measure", description="Write a curve file for a GGUF pair on this machine.")
    ap.add_argument("target")
    ap.add_argument("draft", nargs="?", default=None)
    ap.add_argument("--n-gpu-layers", "-ngl", type=int, default=0)
    ap.add_argument("--sizes", default="1-64", help="verify batch sizes, e.g. 1-64 or 1-9,12,16,17 (default 1-64)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--depths", default="", help="also measure at these context depths, e.g. 256,640 (depth_scale)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    depths = [int(x) for x in a.depths.split(",") if x.strip()]
    res = measure(a.target, a.draft, a.n_gpu_layers, parse_sizes(a.sizes), a.rounds, a.threads, depths)
    atomic_write_text(Path(a.out), json.dumps(res, indent=1) + "\n")
    one = res["verify"]["1"]
    print(f"wrote {a.out}: 1 token {1000 * one:.2f} ms, " + " ".join(
        f"{n}:{s / one:.2f}" for n, s in res["verify"].items() if int(n) in (2, 4, 8, 16, 32, 64)
    ) + (f"; draft {1000 * res['draft']:.2f} ms/token" if res["draft"] else "") + f" ({res['seconds']} s)")
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="subcommand: predict_speedup.py measure TARGET [DRAFT] --out FILE (see measure --help)")
    ap.add_argument("--curve", action="append", default=[], help="curve file(s) (or bench --json report, or calibration cache)")
    ap.add_argument("--profiles", type=Path, nargs="?", const=DEFAULT_PROFILES, default=None,
                    help="replay every curve file in this folder (default research/data/curves) at every --draft-relative "
                         "and print one table (profile x draft cost x suite) with the issue-23 goals")
    ap.add_argument("--draft-relative", default=None,
                    help="the draft's cost in target tokens, comma-separated (e.g. 0.3,0.45,0.6,0.8): replays each curve at "
                         "each (default: the curve's own; with --profiles 0.3,0.45,0.6,0.8)")
    ap.add_argument("--traces", type=Path, default=None, help=f"a recording (default {DEFAULT_TRACES.name}, greedy)")
    ap.add_argument("--sampled", action="store_true",
                    help=f"replay sampling at T = 1.0 (the bench's settings) from {DEFAULT_SAMPLED.name} (see edgespec/bench/speedup.py)")
    ap.add_argument("--replay-seed", type=int, default=0, help="--sampled: the replay's draws (prompt i draws from [seed, i])")
    ap.add_argument("--suite", action="append", default=[])
    ap.add_argument("--kinds", default=",".join(KINDS),
                    help=f"drafters to replay, comma-separated, of {', '.join(KINDS + TREE_KINDS)} (default {','.join(KINDS)})")
    ap.add_argument("--draft-max", type=int, default=8)
    ap.add_argument("--draft-siblings", type=int, default=None,
                    help="the most alternatives a draft model's chain may carry a cycle (draft-model trees; default SpecConfig's; "
                         "0 = chains; needs format-2 traces, which record the draft's alternatives)")
    ap.add_argument("--ngram-draft-max", type=int, default=None, help="most tokens an n-gram lookup drafts (default: SpecConfig's)")
    ap.add_argument("--fixed-k", action="store_true", help="always draft --draft-max (no adaptive controller, no gate)")
    ap.add_argument("--overhead", type=float, default=None, help="seconds of per-cycle overhead (overrides the curve file's)")
    ap.add_argument("--host-cost", default=None, metavar="CYCLE_MS,ROW_MS",
                    help="charge the engine's host work: milliseconds per cycle and per logits row (a verified row or a "
                         "drafted token), as bench/host_bench.py --fit measures them; added to every curve and profile")
    ap.add_argument("--python-time", action="store_true",
                    help="also charge the Python work the replay really does (this machine's wall clock) on top of the modelled "
                         "model calls: the engine's own per-cycle and per-token costs outside llama.cpp (results then vary run to run)")
    ap.add_argument("--depth-scale", default=None,
                    help="a curve file whose depth_scale (cost growth with context depth, from `measure --depths`) applies to every --curve")
    ap.add_argument("--fit-run-table", action="store_true",
                    help="also fit, per suite, the best table from an n-gram match's run to its draft length (a bound for run-based rules)")
    ap.add_argument("--fit-rules", action="store_true",
                    help="also fit, per suite, the best fixed confidence / match-run rule for model+ngram (a bound for "
                         "policies that decide from those signals; ~3x slower)")
    ap.add_argument("--streams", type=int, default=None,
                    help="N streams together against one after another (an engine's slots; predict_streams), per curve or profile")
    ap.add_argument("--json", type=Path, default=None, help="write the results (a list, one per curve) here")
    return ap


def load_inputs(a: argparse.Namespace) -> dict[str, Any]:
    """The settings, the recording and the curves the arguments name; ValueError (and the like) for a bad one."""
    from dataclasses import replace

    from edgespec.config import SpecConfig

    spec = SpecConfig(draft_max=a.draft_max, adaptive=not a.fixed_k)
    if a.ngram_draft_max is not None:
        spec = replace(spec, ngram_draft_max=a.ngram_draft_max)
    if a.draft_siblings is not None:
        spec = replace(spec, draft_siblings=a.draft_siblings)
    rels = [float(x) for x in a.draft_relative.split(",") if x.strip()] if a.draft_relative else []
    kinds = tuple(k.strip() for k in a.kinds.split(",") if k.strip())
    unknown = [k for k in kinds if k not in KINDS + TREE_KINDS]
    if unknown or not kinds:
        raise ValueError(f"--kinds: unknown drafter(s) {', '.join(unknown) or '(none given)'}; choose from {', '.join(KINDS + TREE_KINDS)}")
    if not a.curve and a.profiles is None:
        raise ValueError("give --curve FILE or --profiles [DIR]")
    data = load_traces(a.traces or (DEFAULT_SAMPLED if a.sampled else DEFAULT_TRACES))
    if a.sampled and data.get("format") != 3:
        raise ValueError(f"--sampled: {a.traces} is not a sampled recording (record_traces.py --sampled)")
    profiles = []
    if a.profiles is not None:
        files = sorted(Path(a.profiles).glob("*.json"))
        if not files:
            raise ValueError(f"{a.profiles}: no curve files (*.json)")
        profiles = [(f.stem, load_curve(f)) for f in files]
    costs = [load_curve(path) for path in a.curve]
    for c in costs + [c for _, c in profiles]:
        c.python_time = a.python_time
    scale = load_curve(a.depth_scale) if a.depth_scale else None
    if a.host_cost is not None:
        parts = [float(x) / 1000.0 for x in a.host_cost.split(",")]
        if len(parts) != 2:
            raise ValueError("--host-cost takes CYCLE_MS,ROW_MS")
        costs = [c.with_host(*parts) for c in costs]
        profiles = [(name, c.with_host(*parts)) for name, c in profiles]
    return {"spec": spec, "rels": rels, "kinds": kinds, "data": data, "profiles": profiles, "costs": costs, "scale": scale}


def write_json(path: Path | None, obj: Any) -> None:
    if path:
        atomic_write_text(Path(path), json.dumps(obj, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "measure":
        return measure_main(argv[1:])
    if argv and argv[0] == "predict":
        argv = argv[1:]
    a = parser().parse_args(argv)
    from edgespec.errors import ConfigError

    try:
        x = load_inputs(a)
    except (OSError, ValueError, KeyError, TypeError, ConfigError) as e:
        print(f"predict_speedup: error: {e}", file=sys.stderr)
        return 2
    spec, kinds, data = x["spec"], x["kinds"], x["data"]
    if a.streams is not None:
        if a.streams < 1:
            print("predict_speedup: error: --streams must be at least 1", file=sys.stderr)
            return 2
        results = []
        for cost in [c for _, c in x["profiles"]] if a.profiles is not None else x["costs"]:
            results.append(predict_streams(data, cost, spec, a.streams, a.suite, kinds=kinds))
            print(format_streams(results[-1]))
        write_json(a.json, results)
        return 0
    if a.profiles is not None:
        rows = profile_rows(data, x["profiles"], x["rels"] or DEFAULT_RELATIVE, spec, a.suite, fit_rules=a.fit_rules, seed=a.replay_seed)
        print(format_profiles(rows))
        write_json(a.json, {"rows": rows, "goals": goals_check(rows)})
        return 0
    costs = [c.with_draft_relative(r) for c in x["costs"] for r in x["rels"]] if x["rels"] else x["costs"]
    results = []
    for cost in costs:
        if a.overhead is not None:
            cost.overhead = a.overhead
        if x["scale"] is not None:
            cost.depth_scale = x["scale"].depth_scale
            cost.name += f" x depth scale of {Path(a.depth_scale).name}"
        results.append(predict(data, cost, spec, a.suite, kinds=kinds, fit=a.fit_run_table, fit_rules=a.fit_rules, seed=a.replay_seed))
        print(format_table(results[-1], kinds))
        print()
    write_json(a.json, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
