"""N-gram lookup as a speculator: the index (ngram.py) finds what followed the context's ending before, and the
n-gram policy (lookup_policy.NgramPolicy) chooses, *after* the lookup, how many of its tokens to verify: a proposal whose
source agrees with the context for 40 tokens deserves a long draft, one that agrees for 2 a short one or none.

Proposals are deterministic (q = None, a one-hot): exactness holds at any temperature.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from .ngram import NgramIndex
from .lookup_policy import NgramPolicy
from edgespec.config import DrafterKind
from .base import Outcome, Proposal


class LookupSpeculator:
    """The n-gram index and its length policy (see the module docstring).

    Shadow scoring: when the policy declines a proposal, the lookup's first token is remembered; the next call
    sees the token the target actually produced at that position and reports a hit or miss to the policy, so
    declined contexts keep being measured at no cost.
    """

    name: str = DrafterKind.NGRAM

    def __init__(self, index: NgramIndex, policy: NgramPolicy) -> None:
        self.index = index
        self.policy = policy
        self._run = 0  # the run of the proposal being verified (0 = none)
        self._shadow: tuple[int, int, int] | None = None  # (run, position, proposed token) of a declined proposal
        self._first: tuple[int, int, int] | None = None  # the same for the proposal being verified

    def propose(self, context: Sequence[int], budget: int, rng: np.random.Generator | None = None) -> Proposal:
        self._score_shadow(context)
        self._run = 0
        match = self.index.lookup(context, min(budget, self.policy.k_max))
        if not match.tokens:
            return Proposal()
        n = self.policy.choose(match.run, len(match.tokens))
        if n == 0:
            self._shadow = (match.run, len(self.index.tokens), match.tokens[0])
            return Proposal()
        self._run = match.run
        self._first = (match.run, len(self.index.tokens), match.tokens[0])
        return Proposal(tokens=list(match.tokens[:n]), q=[None] * n, source=self.name)

    @property
    def last_rate(self) -> float:
        """Expected tokens per second of the proposal just made (the policy's estimate)."""
        return self.policy.last_rate

    def withdraw(self) -> None:
        """The proposal just made will not be verified (another drafter's will): score it as a declined one."""
        if self._run:
            self._shadow = self._first
        self._run = 0

    def observe(self, outcome: Outcome) -> None:
        if outcome.n_drafted and self._run:
            self.policy.observe_cycle(self._run, outcome.n_drafted, outcome.n_accepted, outcome.t_verify, outcome.chances)
        else:
            self.policy.observe_plain(outcome.t_verify if not outcome.n_drafted else 0.0, max(outcome.n_emitted, 1))
        self._run = 0

    def observe_foreign(self, outcome: Outcome) -> None:
        """A cycle another speculator drafted (the hybrid's model) emitted outcome.n_emitted tokens."""
        self.policy.observe_plain(0.0, max(outcome.n_emitted, 1))
        self._run = 0

    def stats(self) -> dict[str, Any]:
        return self.policy.stats()

    def _score_shadow(self, context: Sequence[int]) -> None:
        if self._shadow is not None:
            run, pos, tok = self._shadow
            self._shadow = None
            # Only a continuation of the context the lookup saw tells what the target produced at `pos`.
            if pos < len(context) and len(self.index.tokens) == pos and list(context[:pos]) == self.index.tokens:
                self.policy.observe_shadow(run, int(context[pos]) == tok)


__all__ = ["LookupSpeculator"]
