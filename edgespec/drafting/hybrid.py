""""model+ngram" / "model+suffix": a lookup's proposal (a chain, or the suffix index's tree) when it finds one its
policy wants to verify and the draft model is not expected to deliver more tokens per second now, the draft model
otherwise. Each part learns only from its own cycles; plain cycles teach both."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Sequence

import numpy as np

from .base import Outcome, Proposal
from .lookup import LookupSpeculator
from .model import ModelSpeculator
from .suffix import SuffixSpeculator


class HybridSpeculator:
    name = "model+lookup"

    def __init__(self, model: ModelSpeculator, lookup: LookupSpeculator | SuffixSpeculator) -> None:
        self.model, self.lookup = model, lookup
        self._last: str | None = None

    def propose(self, context: Sequence[int], budget: int, rng: np.random.Generator) -> Proposal:
        p = self.lookup.propose(context, budget, rng)
        if len(p):
            # one decision per cycle: the lookup's proposal unless the draft model is expected to deliver more tokens
            # per second now (its estimates, the curve, its own cost and its catch-up on the tokens it has not seen);
            # a declined lookup is still scored (shadow)
            rate_of = getattr(self.model, "expected_rate", None)
            model_rate = rate_of(context) if rate_of is not None else None
            if model_rate is not None and model_rate > self.lookup.last_rate:
                self.lookup.withdraw()
                p = Proposal()
        if not len(p):
            p = self.model.propose(context, budget, rng)
        self._last = p.source if len(p) else None
        return p

    def observe(self, outcome: Outcome) -> None:
        if self._last == self.lookup.name:
            self.lookup.observe(outcome)
            self.model.observe_foreign(outcome)
        elif self._last == self.model.name:
            self.model.observe(outcome)
            self.lookup.observe_foreign(outcome)
        else:  # a plain step: both count it (its timing goes into the shared verify curve once)
            self.model.observe(outcome)
            self.lookup.observe(replace(outcome, t_verify=0.0))
        self._last = None

    def stats(self) -> dict[str, Any]:
        return {self.model.name: self.model.stats(), self.lookup.name: self.lookup.stats()}


__all__ = ["HybridSpeculator"]
