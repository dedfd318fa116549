"""What every drafter returns, and the protocol the speculation loop calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

import numpy as np

# keep_drafting(position, confidence) -> bool: asked after each drafted token (position is 1-based, confidence is
# the draft's own probability of the token it just drafted); the controller's in-cycle early stop.
KeepDrafting = Callable[[int, float], bool]


@dataclass
class Proposal:
    """Drafted tokens d1..dk and, for each, the distribution q it was drawn from.

    q[i] is a probability row (the draft sampled d_i from exactly this), or None for a deterministic proposal
    (a one-hot q at d_i: n-gram lookups, greedy drafts). The acceptance rule needs nothing else to stay exact.
    """

    tokens: list[int] = field(default_factory=list)
    q: list[np.ndarray | None] = field(default_factory=list)
    source: str = "none"
    seconds: float = 0.0

    def __len__(self) -> int:
        return len(self.tokens)


class Drafter(Protocol):
    name: str
    cost_per_token_hint: float  # 0 for model-free drafters

    def propose(
        self, tokens: Sequence[int], k: int, rng: np.random.Generator, keep_drafting: KeepDrafting
    ) -> Proposal: ...

    def close(self) -> None: ...
