"""What batching several generations' decodes into one gives, on each cost-curve profile (issue 34): a cost model, not
a trace replay.

    .venv/bin/python research/batch_gain.py                      # every profile in research/data/curves, N = 2 and 4
    .venv/bin/python research/batch_gain.py --accept 0.6 --streams 4

N streams run in lockstep: each round every stream drafts k tokens (serially: the draft model's decodes are not
batched, k * draft seconds each) and their N * (k + 1) verify rows go to the target in one decode (verify(N(k+1))).
One after another, a stream's rate is the best over k of E(k) / (k * draft + verify(k + 1)); together it is the best
over k of N * E(k) / (N * k * draft + verify(N(k + 1))), with E(k) = 1 + a + ... + a^k at a constant acceptance a per
position. Plain decoding: N * verify(1) / verify(N). The table gives the aggregate ratio together / one after another
and the best k each way (flat curves: shorter drafts beside others). Curve points past 64 rows are extrapolated
linearly from the last two.
"""

from __future__ import annotations

import argparse
import glob
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def curve_fn(points: dict[str, float]):
    pts = sorted((int(k), float(v)) for k, v in points.items())

    def c(n: int) -> float:
        for (n0, v0), (n1, v1) in zip(pts, pts[1:]):
            if n0 <= n <= n1:
                return v0 + (v1 - v0) * (n - n0) / (n1 - n0)
        (n0, v0), (n1, v1) = pts[-2], pts[-1]
        return v1 + (v1 - v0) / (n1 - n0) * (n - n1)

    return c


def expected(a: float, k: int) -> float:
    return sum(a ** i for i in range(k + 1))


def best(rate_of, k_max: int = 16) -> tuple[float, int]:
    return max((rate_of(k), k) for k in range(k_max + 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--accept", type=float, default=0.7, help="acceptance per drafted position")
    ap.add_argument("--streams", default="2,4")
    a = ap.parse_args()
    print(f"acceptance per position {a.accept}; ratio = aggregate tokens/s together / one after another")
    print(f"{'profile':24} {'N':>2} {'plain':>6} {'spec':>6} {'k alone':>7} {'k together':>10}")
    for f in sorted(glob.glob(str(ROOT / "research" / "data" / "curves" / "*.json"))):
        d = json.loads(Path(f).read_text())
        c, draft = curve_fn(d["verify"]), float(d.get("draft", 0.0))
        alone, k_alone = best(lambda k, c=c, draft=draft: expected(a.accept, k) / (k * draft + c(k + 1)))
        for n in (int(x) for x in a.streams.split(",")):
            plain = n * c(1) / c(n)
            together, k_tog = best(lambda k, n=n, c=c, draft=draft: n * expected(a.accept, k) / (n * k * draft + c(n * (k + 1))))
            print(f"{Path(f).stem:24} {n:>2} {plain:>6.2f} {together / alone:>6.2f} {k_alone:>7} {k_tog:>10}")


if __name__ == "__main__":
    main()
