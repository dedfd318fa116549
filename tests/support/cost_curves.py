"""Verify-cost curves for the pure policy tests, relative to one token's verify (one token = 1), and the cost models
built on them: a GPU-like flat curve, a curve with a cliff, this project's 2-core CPU, an x86 desktop
(test_policy_decision, test_rate_guard, test_draft_trees, test_engine)."""

from __future__ import annotations

from edgespec.config import SpecConfig
from edgespec.drafting.costs import CostModel, speculation_ceiling

# A GPU-like flat curve, a curve with a cliff (A100 shape: 9 tokens cost 3.9x one), and this project's 2-core CPU
# (almost linear).
FLAT = {1: 1.0, 2: 1.01, 4: 1.02, 8: 1.05, 16: 1.1, 64: 1.3}
CLIFF = {1: 1.0, 2: 1.05, 4: 1.15, 8: 1.45, 9: 3.9, 16: 4.3}
CPU = {1: 1.0, 2: 1.6, 3: 2.24, 4: 3.23, 8: 7.19, 16: 9.07}

# An x86-desktop-like curve (research/data/curves/x86_16core_cpu.json): at a draft cost near 0.6 of a target token
# the gate's ceiling sits near its threshold.
DESKTOP = {1: 1.0, 2: 1.12, 4: 1.35, 8: 1.95, 16: 3.3}


def costs(rel: dict[int, float], draft: float) -> CostModel:
    """The curve at 10 ms a token, the draft at `draft` of a target token; refined online like a live one."""
    return CostModel.from_relative(0.01, rel, c_draft=0.01 * draft)


def frozen_costs(rel: dict[int, float], draft: float = 0.3) -> CostModel:
    """The same, frozen: decisions depend on acceptance only."""
    return CostModel({n: 0.01 * r for n, r in rel.items()}, c_draft=0.01 * draft, frozen=True)


def draft_cost_at(ceiling: float, spec: SpecConfig) -> float:
    """The draft cost (relative to a target token, on DESKTOP) at which the gate's ceiling is `ceiling` (it falls as
    the draft gets dearer): bisection."""
    lo, hi = 0.0, 2.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if speculation_ceiling(costs(DESKTOP, mid), spec.draft_max, spec.draft_min) > ceiling:
            lo = mid
        else:
            hi = mid
    return lo
