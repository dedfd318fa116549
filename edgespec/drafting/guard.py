"""A speculator under the live-rate check (rate_guard.RateGuard): the inner speculator drafts as it plans, unless the
guard has found that speculation delivers fewer tokens per second than plain decoding on this machine now; then the
cycle is a plain step, which the inner speculator observes as one of its own plain cycles."""

from __future__ import annotations

from typing import Any, Sequence

from .costs import CostModel
from .rate_guard import RateGuard
from edgespec.config import DrafterKind
from .base import Outcome, Proposal, Speculator


class GuardedSpeculator:
    """`inner` under `guard` (see the module docstring). Each cycle's period (Outcome.t_cycle) teaches the guard; with
    a frozen cost model the model's time for the cycle stands in for it (seeded runs decide from the model, never the
    clock): the proposal's draft cost (`cost.c_draft` per token for a draft model's, none for a lookup's) and the
    verify of what was decoded."""

    def __init__(self, inner: Speculator, guard: RateGuard, cost: CostModel) -> None:
        self.inner, self.guard, self.cost = inner, guard, cost
        self.name = inner.name
        self._source: str | None = None  # the last proposal's source; None: the guard kept the cycle plain

    def propose(self, context: Sequence[int], budget: int, rng: Any) -> Proposal:
        if not self.guard.allow():
            self._source = None
            return Proposal()
        p = self.inner.propose(context, budget, rng)
        self._source = p.source if len(p) else "plain"
        return p

    def observe(self, outcome: Outcome) -> None:
        self.inner.observe(outcome)
        seconds = outcome.t_cycle
        if self.cost.frozen and seconds > 0:
            c = self.cost
            seconds = (outcome.n_drafted * c.c_draft if self._source == DrafterKind.MODEL else 0.0) + c.verify(outcome.n_drafted + 1) + c.overhead
        self.guard.observe(outcome.n_drafted > 0, outcome.n_emitted, seconds, 1.0 / self.cost.cycle_time(0))

    def stats(self) -> dict[str, Any]:
        return {**self.inner.stats(), "guard": self.guard.stats()}


def guarded(speculator: Speculator | None, guard: RateGuard | None, cost: CostModel) -> Speculator | None:
    """`speculator` under `guard` (None for either: as it is)."""
    if speculator is None or guard is None:
        return speculator
    return GuardedSpeculator(speculator, guard, cost)


def unguarded(speculator: Speculator | None) -> Speculator | None:
    """The speculator a GuardedSpeculator wraps (any other: itself)."""
    return speculator.inner if isinstance(speculator, GuardedSpeculator) else speculator


__all__ = ["GuardedSpeculator", "guarded", "unguarded"]
