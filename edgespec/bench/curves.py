"""Verify-cost curves: what the speedup replay charges each model call (replay.py, speedup.py, docs/gpu.md).

Acceptance does not depend on the hardware; cost does. The replay's fake models advance a virtual clock (`Clock`) by
what a curve file says each call costs:

    target decode of n tokens   verify(n)                            (the curve)
    draft: one token            draft                                (seconds per draft token)
    draft: catching up m tokens draft_verify(m), else draft * verify(m) / verify(1)
    every cycle                 overhead                             (Python work outside both models; default 0)

Curve files: {"verify": {"1": s, "2": s, ...}, "draft": s_per_token, optional "overhead": s_per_cycle,
"draft_verify": {"1": s, ...}, "host": {"cycle": s, "row": s}, "depth_scale": {...}, "name": ...}. "host" is the
engine's own work on that machine (bench/host_bench.py --fit): charged per cycle, and per logits row on top of every
verified row and every drafted token (Curve.with_host). "depth_scale" says how a decode's cost grows with the context
it runs at (measure.py, `predict_speedup.py measure --depths`). Also accepted by `load_curve`: an `edgespec bench
--json` report (its costs.calibration) and edgespec's calibration cache (the most recently used entry).

Pure Python and numpy: no model, no llama.cpp.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np


@dataclass
class Curve:
    """Costs from a curve file: verify {n: s}, draft s/token, overhead s/cycle, draft_verify {n: s} (optional)."""

    verify: dict[int, float]
    draft: float
    overhead: float = 0.0
    draft_verify: dict[int, float] | None = None
    name: str = ""
    # how a decode's cost grows with the context it runs at: {"verify": {depth: {n: factor}}, "draft": {depth: factor}},
    # factors relative to the curve above (measured after a short context); None = the same at every depth
    depth_scale: dict[str, Any] | None = None
    # also charge the Python work the replay really does between model calls (this machine's wall clock: the loop,
    # the speculators, the acceptance math; the fakes' row building stands in for llama.cpp's logits copy)
    python_time: bool = False
    # the engine's measured host work folded in (with_host): seconds per logits row it handles (a verify row, a
    # drafted token), already added to verify and draft; the per-cycle part is in overhead
    host_row: float = 0.0
    host_cycle: float = 0.0

    def with_host(self, cycle: float, row: float) -> "Curve":
        """The curve with the engine's host work charged: `row` seconds per logits row (each target row verified and
        each token drafted: warping, sampling, the acceptance math on it) and `cycle` seconds per cycle (the loop, the
        controller, detokenization, the hand-off to the caller), as bench/host_bench.py measures them."""
        if not (cycle >= 0 and row >= 0 and math.isfinite(cycle) and math.isfinite(row)):
            raise ValueError(f"host costs must be finite and >= 0, got {cycle}, {row}")
        dv = None if self.draft_verify is None else {n: s + row for n, s in self.draft_verify.items()}
        return replace(
            self, verify={n: s + n * row for n, s in self.verify.items()}, draft=self.draft + row, draft_verify=dv,
            overhead=self.overhead + cycle, host_row=self.host_row + row, host_cycle=self.host_cycle + cycle,
            name=f"{self.name} [host {1000 * cycle:.3f} ms/cycle + {1000 * row:.3f} ms/row]",
        )

    def verify_factor(self, n: int, depth: int) -> float:
        return _depth_factor((self.depth_scale or {}).get("verify"), depth, n)

    def draft_factor(self, depth: int) -> float:
        return _depth_factor((self.depth_scale or {}).get("draft"), depth, None)

    def with_draft_relative(self, rel: float) -> "Curve":
        """The same curve with the draft at `rel` x one target token (its catch-up curve, if any, scaled alike)."""
        if not (rel >= 0 and math.isfinite(rel)):
            raise ValueError(f"a draft's relative cost must be >= 0, got {rel}")
        h = self.host_row  # the host's share of a row is not the model's: rel scales the model's time alone
        one = (self.verify.get(1) or min(self.verify.values())) - h
        new = rel * one
        dv = None
        if self.draft_verify is not None and self.draft - h > 0:
            dv = {n: (s - h) * new / (self.draft - h) + h for n, s in self.draft_verify.items()} if new > 0 else None
        return replace(self, draft=new + h, draft_verify=dv, name=f"{self.name} [draft {rel:g}x]")

    def describe(self) -> dict[str, Any]:
        one = self.verify.get(1) or min(self.verify.values())
        return {
            "name": self.name,
            "verify": {str(n): s for n, s in sorted(self.verify.items())},
            "verify_relative": {str(n): round(s / one, 4) for n, s in sorted(self.verify.items())},
            "draft": self.draft,
            "draft_relative": round(self.draft / one, 4),
            "overhead": self.overhead,
            "draft_verify": None if self.draft_verify is None else {str(n): s for n, s in sorted(self.draft_verify.items())},
            "depth_scale": self.depth_scale,
            "python_time": self.python_time,
            "host": {"cycle": self.host_cycle, "row": self.host_row},
        }


def _depth_factor(table: Mapping[str, Any] | None, depth: int, n: int | None) -> float:
    """Linear interpolation over depths (clamped at the ends) of a factor; per batch size n when the table has one
    per size (interpolated over n, clamped)."""
    if not table:
        return 1.0
    depths = sorted(int(d) for d in table)
    vals = []
    for d in depths:
        v = table[str(d)]
        if isinstance(v, Mapping):
            ns = sorted(int(k) for k in v)
            vals.append(float(np.interp(n or 1, ns, [float(v[str(k)]) for k in ns])))
        else:
            vals.append(float(v))
    return float(np.interp(depth, depths, vals))


def _points(raw: Mapping[Any, Any]) -> dict[int, float]:
    pts = {int(n): float(s) for n, s in raw.items()}
    if not pts or any(n < 1 or not (0 < s < math.inf) for n, s in pts.items()):
        raise ValueError(f"a verify curve needs {{n >= 1: seconds > 0}}, got {dict(raw)}")
    return pts


def load_curve(path: str | Path) -> Curve:
    """A curve file, a bench --json report, or edgespec's calibration cache (see the module docstring)."""
    p = Path(path).expanduser()
    data = json.loads(p.read_text(encoding="utf-8"))
    name = p.name
    if isinstance(data, dict) and isinstance(data.get("costs"), dict) and "calibration" in data["costs"]:
        data = data["costs"]["calibration"]  # an edgespec bench --json report
        name += " (bench report costs)"
    elif isinstance(data, dict) and isinstance(data.get("entries"), dict):  # the calibration cache
        entries = [e for e in data["entries"].values() if isinstance(e, dict) and "verify" in e]
        if not entries:
            raise ValueError(f"{p}: no calibration entries")
        data = max(entries, key=lambda e: float(e.get("used") or e.get("when") or 0))
        name += " (latest calibration entry)"
    if not isinstance(data, dict) or "verify" not in data:
        raise ValueError(f"{p}: expected {{\"verify\": {{n: seconds}}, \"draft\": seconds}}")
    dv = data.get("draft_verify")
    curve = Curve(
        verify=_points(data["verify"]),
        draft=float(data.get("draft", 0.0)),
        overhead=float(data.get("overhead", 0.0)),
        draft_verify=_points(dv) if dv else None,
        name=str(data.get("name") or name),
        depth_scale=data.get("depth_scale"),
    )
    host = data.get("host")  # {"cycle": s, "row": s}: the engine's host work measured on that machine
    if isinstance(host, dict):
        curve = curve.with_host(float(host.get("cycle", 0.0)), float(host.get("row", 0.0)))
    return curve


class Clock:
    """The virtual clock the speculation loop reads instead of time.perf_counter: the modelled seconds of the model
    calls, plus (real=True) the wall-clock seconds spent since it was made (the Python work around them)."""

    def __init__(self, real: bool = False) -> None:
        import time

        self.now = 0.0
        self._wall = time.perf_counter if real else None
        self._t0 = time.perf_counter() if real else 0.0

    def perf_counter(self) -> float:
        return self.now + (self._wall() - self._t0 if self._wall is not None else 0.0)


def draft_call_seconds(cost: Curve, curve: Any, n: int, depth: int) -> float:
    """One draft decode of n tokens that ends at context depth `depth`: draft per token for one, a catch-up batch
    shaped like `curve` (the draft's own, else the target's) above, scaled with the depth."""
    base = cost.draft if n <= 1 else curve(n) * cost.draft / curve(1)
    return base * cost.draft_factor(depth)


def cycle_decode_seconds(v: Any, cost: Curve, t: int, k: int, first_from_prefill: bool, n_prompt: int) -> float:
    """The target's decode in a cycle at trace position t that drafts k tokens: k + 1 tokens at their context depth;
    on the first cycle after a prefill that computed the last prompt token's row, only the k drafts (nothing for a
    plain step)."""
    if t == 0 and first_from_prefill:
        return v(k) * cost.verify_factor(k, n_prompt + k) if k else 0.0
    return v(k + 1) * cost.verify_factor(k + 1, n_prompt + t + k)


def parse_sizes(text: str) -> list[int]:
    """"1-64" or "1,2,4,8" or "1-9,12,16"."""
    out: list[int] = []
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            out += list(range(int(a), int(b) + 1))
        elif part.strip():
            out.append(int(part))
    return sorted(set(out))
