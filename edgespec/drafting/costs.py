"""What a cycle costs, and which draft length pays: pure functions and small classes, no clock, no model.

One speculative cycle drafts k tokens and verifies k + 1 positions in one batched target decode. With a_j the
chance that draft position j is accepted given that positions 1..j-1 were:

    E(k) = 1 + sum_{i=1..k} prod_{j<=i} a_j            expected tokens emitted by the cycle
    T(k) = k * c_draft + c_verify(k + 1) + overhead      cycle time in seconds
    E(0) = 1,  T(0) = c_verify(1) + overhead             plain decoding

and the long-run rate of a policy that always drafts k is E(k) / T(k) tokens per second (renewal-reward
theorem). `best_k` maximises it. `VerifyCurve` holds c_verify(n), measured on this machine and refined online;
one curve is shared by everything that plans with it (it belongs to the target model). `CostModel` is a view:
the curve plus one drafter's per-token cost and the per-cycle overhead. `draft_model_pays` is the hardware gate:
can a costly drafter beat plain decoding here at all?
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import deque
from typing import Mapping, Sequence, Union

import numpy as np

# Per-position acceptance estimates a_1..a_k: a list or a numpy array.
Rates = Union[Sequence[float], np.ndarray]

# Rates within this relative distance count as a tie (broken towards the smaller k).
_TIE_RTOL = 1e-12
# Level shifts: this many consecutive observations of one batch size, all off by more than this factor from the
# curve, mean the curve no longer describes the machine (a calibration taken while it was busy, or a machine
# that got busy). One slow decode (a hiccup) is not enough.
SHIFT_FACTOR = 1.6
SHIFT_RUN = 3
# The hardware gate (draft_model_pays): a costly drafter is run only where it could beat plain decoding by
# GATE_MIN_GAIN if every position were accepted with probability GATE_OPTIMISTIC_A.
GATE_OPTIMISTIC_A = 0.9
GATE_MIN_GAIN = 0.10
# Hysteresis: a gate that is open (the draft model is running) stays open while the drafter could still gain
# GATE_HOLD x GATE_MIN_GAIN. A shut gate learns no more draft costs, so a learnt cost that drifted a little across
# the threshold would otherwise shut a paying drafter out for good.
GATE_HOLD = 0.5


def expected_tokens(a: Rates, k: int) -> float:
    """E(k) = 1 + sum_{i=1..k} prod_{j<=i} a_j: expected tokens emitted by a cycle that drafts k tokens.

    The 1 is the token the target always contributes (the correction at the first rejection, or the bonus
    token after k acceptances).
    """
    if k < 0 or k > len(a):
        raise ValueError(f"k must be in [0, {len(a)}], got {k}")
    total, run = 1.0, 1.0
    for j in range(k):
        run *= float(a[j])
        total += run
    return total


class VerifyCurve:
    """c_verify(n): seconds for one batched target decode of n tokens.

    Built from measurements {n: seconds}. Between measured sizes it interpolates linearly; above the largest it
    extrapolates along the line through the last two points; below the smallest along the line through the first
    two, but never below v(n0) * n / n0 (batching never makes a token dearer than decoding it in a smaller batch).
    Values are made monotone non-decreasing in n (a running maximum), so noise can never make a larger batch look
    cheaper. With a single measurement the curve is flat above it (GPU-like) until other sizes are observed.

    `update(n, seconds)` refines it online with an exponential moving average per size, x <- (1 - alpha) x +
    alpha * min(measured, 2x) (one stalled decode moves it little). SHIFT_RUN consecutive observations of a size
    that are all more than SHIFT_FACTOR off mean the machine changed (another process took a core, or left): the
    whole curve is scaled by the median of those ratios, so sizes not decoded lately follow too, and refined online
    from there. Nothing is ever re-measured in the middle of a request. A frozen curve ignores observations (seeded
    runs plan reproducibly).
    """

    def __init__(self, points: Mapping[int, float], *, alpha: float = 0.2, frozen: bool = False) -> None:
        if not (0.0 < alpha <= 1.0):
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.alpha = float(alpha)
        self.frozen = frozen
        self.shifts = 0  # level shifts seen so far (each one rescaled the whole curve)
        self.version = 0  # bumped whenever the curve changes (for cached decisions)
        self._points: dict[int, float] = {}
        self._recent: dict[int, deque[float]] = {}
        self.replace(points)

    def replace(self, points: Mapping[int, float]) -> None:
        """Start over from new measurements {n: seconds}."""
        if not points:
            raise ValueError("a verify curve needs at least one measurement {n: seconds}")
        clean: dict[int, float] = {}
        for n, s in points.items():
            n, s = int(n), float(s)
            if n < 1 or not (0.0 < s < math.inf):
                raise ValueError(f"verify measurements need n >= 1 and finite seconds > 0, got {n}: {s}")
            clean[n] = s
        self._points = clean
        self._recent = {}
        self._rebuild()

    def copy(self, *, frozen: bool | None = None) -> "VerifyCurve":
        return VerifyCurve(self._points, alpha=self.alpha, frozen=self.frozen if frozen is None else frozen)

    def _rebuild(self) -> None:
        # plain lists: a dozen points, rebuilt after every measured decode (numpy's per-call cost would dominate)
        self._ns = sorted(self._points)
        self._vs = list(itertools.accumulate((self._points[n] for n in self._ns), max))  # monotone
        self._memo: dict[int, float] = {}  # __call__'s values for this version (a cycle's planning asks dozens)
        self.version += 1

    @property
    def points(self) -> dict[int, float]:
        """The current (monotone) verify measurements {n: seconds}."""
        return {int(n): float(v) for n, v in zip(self._ns, self._vs)}

    def __call__(self, n: int) -> float:
        """Seconds for one target decode of a batch of n tokens."""
        v = self._memo.get(n)
        if v is None:
            v = self._memo[n] = self._value(n)
        return v

    def _value(self, n: int) -> float:
        if n < 1:
            raise ValueError(f"batch size must be >= 1, got {n}")
        ns, vs = self._ns, self._vs
        if len(ns) == 1:
            return float(vs[0] if n >= ns[0] else vs[0] * n / ns[0])
        if n <= ns[0]:
            slope = (vs[1] - vs[0]) / (ns[1] - ns[0])
            return float(max(vs[0] - (ns[0] - n) * slope, vs[0] * n / ns[0]))
        if n >= ns[-1]:
            slope = (vs[-1] - vs[-2]) / (ns[-1] - ns[-2])
            return float(vs[-1] + (n - ns[-1]) * slope)
        j = bisect.bisect_right(ns, n) - 1  # ns[j] <= n < ns[j + 1]
        if ns[j] == n:
            return float(vs[j])
        slope = (vs[j + 1] - vs[j]) / (ns[j + 1] - ns[j])  # np.interp's arithmetic
        return float(slope * (n - ns[j]) + vs[j])

    def update(self, n: int, seconds: float) -> None:
        """Fold in one measured target decode of n tokens."""
        if self.frozen or n < 1 or not (0.0 < seconds < math.inf):
            return
        old = self._points.get(n)
        if old is None:  # first sight of this size: start from the curve, not from one timing
            old = self(n)
        recent = self._recent.setdefault(n, deque(maxlen=SHIFT_RUN))
        recent.append(float(seconds) / old)
        if len(recent) == SHIFT_RUN and (
            all(r > SHIFT_FACTOR for r in recent) or all(r < 1.0 / SHIFT_FACTOR for r in recent)
        ):
            self.shifts += 1
            ratio = float(np.median(list(recent)))
            self._points = {m: v * ratio for m, v in self._points.items()}
            self._points[n] = old * ratio
            for r in self._recent.values():
                r.clear()
        else:
            self._points[n] = (1.0 - self.alpha) * old + self.alpha * min(float(seconds), 2.0 * old)
        self._rebuild()


class CostModel:
    """Seconds per cycle for one drafter: T(k) = k * c_draft + verify(k + 1) + overhead.

    `verify_seconds` is either measurements {n: seconds} (a private curve) or a shared `VerifyCurve`.
    update_draft / update_overhead refine c_draft and the overhead online with an exponential moving average;
    update_verify goes to the curve. `frozen` (implied by a frozen shared curve) ignores every online measurement:
    decisions then depend only on acceptance outcomes, so a seeded run reproduces its output.
    """

    def __init__(
        self,
        verify_seconds: Mapping[int, float] | VerifyCurve,
        c_draft: float = 0.0,
        overhead: float = 0.0,
        alpha: float = 0.2,
        frozen: bool = False,
    ) -> None:
        if not (0.0 < alpha <= 1.0):
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        if not (0.0 <= c_draft < math.inf) or not (0.0 <= overhead < math.inf):
            raise ValueError("c_draft and overhead must be finite and >= 0")
        if isinstance(verify_seconds, VerifyCurve):
            self.curve = verify_seconds.copy(frozen=True) if frozen and not verify_seconds.frozen else verify_seconds
        else:
            self.curve = VerifyCurve(verify_seconds, alpha=alpha, frozen=frozen)
        self.c_draft = float(c_draft)
        self.overhead = float(overhead)
        self.alpha = float(alpha)
        self.frozen = frozen or self.curve.frozen  # costs over a frozen curve learn nothing else from the clock either
        # rows other generations put in the same verify decode; shared with every view() (see the `others` property)
        self._others = [0]

    @classmethod
    def from_relative(
        cls, c_token: float, relative: Mapping[int, float], c_draft: float = 0.0, overhead: float = 0.0, alpha: float = 0.2
    ) -> "CostModel":
        """Build from the single-token time and batch costs relative to it, e.g. {1: 1, 4: 1.7, 8: 3.4}."""
        return cls({n: c_token * r for n, r in relative.items()}, c_draft, overhead, alpha)

    def view(self, c_draft: float) -> "CostModel":
        """Another drafter's cost model on the same curve (shared: what one learns, the other sees), and the same rows
        of other generations beside it (`others`)."""
        out = CostModel(self.curve, c_draft=c_draft, overhead=self.overhead, alpha=self.alpha, frozen=self.frozen)
        out._others = self._others
        return out

    @property
    def others(self) -> int:
        """Rows other generations put in the same verify decode (the engine's slots, batched). A decode of n rows then
        costs this generation its share of one row, verify(others + 1) / (others + 1), plus all that its n - 1
        drafted rows add, verify(others + n) - verify(others + 1): on a flat curve a draft that pushes the batch over
        a step pays the whole step; on a linear curve nothing changes."""
        return self._others[0]

    @others.setter
    def others(self, n: int) -> None:
        self._others[0] = int(n)

    @property
    def points(self) -> dict[int, float]:
        return self.curve.points

    def verify(self, n: int) -> float:
        """Seconds of a verify decode of n rows; with others' rows in the same decode (`others`), what this generation's
        rows cost the batch (see `others`)."""
        if self.others <= 0 or n <= 0:
            return self.curve(n)
        base = self.curve(self.others + 1)
        return base / (self.others + 1) + self.curve(self.others + n) - base

    def cycle_time(self, k: int, extra_rows: int = 0) -> float:
        """T(k) = k * c_draft + verify(k + 1) + overhead; T(0) is one plain decoding step. extra_rows: verify rows
        beyond the chain's (a draft-model tree's siblings, drafted for free from rows the draft computed anyway)."""
        return k * self.c_draft + self.verify(k + 1 + extra_rows) + self.overhead

    def _ema(self, old: float, new: float) -> float:
        return (1.0 - self.alpha) * old + self.alpha * new

    def update_verify(self, n: int, seconds: float) -> None:
        if not self.frozen:
            self.curve.update(n, seconds)

    def update_draft(self, seconds_per_token: float) -> None:
        """Fold in one measured draft time per drafted token (clamped at 2x the estimate, as verify)."""
        if not self.frozen and 0.0 <= seconds_per_token < math.inf:
            cap = 2.0 * self.c_draft if self.c_draft > 0 else float(seconds_per_token)
            self.c_draft = self._ema(self.c_draft, min(float(seconds_per_token), cap))

    def update_overhead(self, seconds: float) -> None:
        if not self.frozen and 0.0 <= seconds < math.inf:
            self.overhead = self._ema(self.overhead, float(seconds))

    def describe(self) -> dict[str, object]:
        """What decisions are planned with (for stats and reports)."""
        return {
            "verify": {int(n): round(s, 6) for n, s in self.curve.points.items()},
            "draft": round(self.c_draft, 6),
            "frozen": self.frozen,
        }


def rates(a: Rates, cost: CostModel, k_max: int, k_min: int = 1, extra: float = 0.0) -> dict[int, float]:
    """{k: E(k) / T(k)} for k = 0 and k_min..k_max (k_max clipped to len(a)); a drafting cycle (k >= 1) costing
    `extra` seconds more (a catch-up) when given."""
    k_max = min(k_max, len(a))
    out = {0: 1.0 / cost.cycle_time(0)}
    run, e = 1.0, 1.0
    for k in range(1, k_max + 1):
        run *= float(a[k - 1])
        e += run
        if k >= k_min:
            out[k] = e / (cost.cycle_time(k) + extra)
    return out


def argmax_rate(table: Mapping[int, float]) -> int:
    """The k of the highest rate; near-ties (relative 1e-12) go to the smaller k."""
    top = max(table.values())
    return min(k for k, r in table.items() if r >= top * (1.0 - _TIE_RTOL))


def best_k(a: Rates, cost: CostModel, k_max: int, k_min: int = 1) -> int:
    """argmax over k in {0} ∪ [k_min, k_max] of E(k) / T(k); k = 0 is plain decoding (E = 1).

    Ties (rates within a relative 1e-12) go to the smaller k. k_max is clipped to len(a).
    """
    return argmax_rate(rates(a, cost, k_max, k_min))


def best_rate(a: Rates, cost: CostModel, k_max: int, k_min: int = 1) -> float:
    """max over k in {0} ∪ [k_min, k_max] of E(k) / T(k), in tokens per second."""
    return max(rates(a, cost, k_max, k_min).values())


def speculation_ceiling(cost: CostModel, k_max: int, k_min: int = 1, optimistic_a: float = 0.9) -> float:
    """The best speedup over plain decoding a drafter with this cost could reach if every position were accepted
    with probability optimistic_a."""
    if k_max < 1:
        return 1.0
    return best_rate([optimistic_a] * k_max, cost, k_max, k_min) * cost.cycle_time(0)


def draft_model_pays(
    cost: CostModel, k_max: int, k_min: int = 1, *, optimistic_a: float = GATE_OPTIMISTIC_A, min_gain: float = GATE_MIN_GAIN,
    held: bool = False,
) -> bool:
    """The hardware gate: can a costly drafter (a draft model) beat plain decoding by min_gain here, even if every
    position were accepted with probability optimistic_a? A 0.5B draft for a 1.5B target on a 2-core CPU, where a
    4-token verify costs ~2x one token, cannot; probing it would only cost time (the draft must also catch up on
    every token it skipped), so the engine does not run it. Free drafters (lookups) are never gated.

    held: the gate is open already (the draft model has been running on these costs): it stays open down to
    GATE_HOLD x min_gain (hysteresis; see GATE_HOLD)."""
    return speculation_ceiling(cost, k_max, k_min, optimistic_a) >= 1.0 + min_gain * (GATE_HOLD if held else 1.0)


__all__ = [
    "SHIFT_FACTOR",
    "SHIFT_RUN",
    "expected_tokens",
    "VerifyCurve",
    "CostModel",
    "rates",
    "argmax_rate",
    "best_k",
    "best_rate",
    "speculation_ceiling",
    "draft_model_pays",
]
