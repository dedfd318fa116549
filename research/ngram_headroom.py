#!/usr/bin/env python3
"""How much can n-gram (prompt-lookup) drafting gain on a machine, and how close does the policy come?

    .venv/bin/python research/ngram_headroom.py                                   # this machine's calibrated curve
    .venv/bin/python research/ngram_headroom.py --curve research/data/curve_gpu_flat.json --suite input-grounded

A thin front end to the speedup replay (edgespec/bench/speedup.py; research/predict_speedup.py is its full command
line), which replaced the replay this script used to do: the greedy traces of the bench prompts are recorded once
(research/data/traces.json.gz, research/record_traces.py), and the n-gram drafter is replayed through edgespec's own
loop, LookupSpeculator and NgramPolicy on a verify-cost curve. Printed per suite: the policy's modelled speedup over
plain decoding, and the oracle's (the best any policy drafting from the same lookups can do, by dynamic programming
over the trace). Without --curve, the curve is the most recently used entry of edgespec's calibration cache (written
by any `edgespec` run that loads the pair on this machine).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # this checkout's edgespec

from edgespec.bench.curves import load_curve  # noqa: E402
from edgespec.bench.speedup import predict  # noqa: E402
from edgespec.bench.traces import load_traces  # noqa: E402

DEFAULT_TRACES = HERE / "data" / "traces.json.gz"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--curve", default=None, help="curve file (default: edgespec's calibration cache)")
    ap.add_argument("--traces", type=Path, default=DEFAULT_TRACES)
    ap.add_argument("--suite", action="append", default=[])
    a = ap.parse_args(argv)

    from edgespec.drafting.calibration import cache_path
    from edgespec.config import SpecConfig

    curve = a.curve or str(cache_path())
    if not Path(curve).expanduser().exists():
        ap.error(f"no curve: {curve} does not exist (run edgespec once on this machine, or pass --curve FILE)")
    cost = load_curve(curve)
    res = predict(load_traces(a.traces), cost, SpecConfig(), a.suite, kinds=("ngram",))
    rel = res["curve"]["verify_relative"]
    print(f"curve {res['curve']['name']}: verify x one token " + "  ".join(f"{n}: {r:.2f}" for n, r in rel.items()))
    print(f"{'suite':18} {'prompts':>7} {'policy':>7} {'oracle':>7}")
    for name, s in list(res["suites"].items()) + [("overall", res["overall"])]:
        print(f"{name:18} {s['prompts']:>7} {s['ngram']['speedup']:>6.2f}x {s['oracle']['ngram']:>6.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
