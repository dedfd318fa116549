"""The speculator contract: the one object the speculation loop asks, once per cycle, what to verify.

A speculator is one drafting strategy. It owns both *what* to draft and *how much*:

    proposal = speculator.propose(context, budget, rng)   # up to `budget` tokens; empty = decode plainly
    ... the loop verifies proposal.tokens in one batched target decode ...
    speculator.observe(outcome)                            # what the target kept, and what it cost

Cost models and acceptance estimators (costs.py, estimators.py) are pure helpers a speculator uses; the loop never
sees them. Exactness needs only one thing from a speculator: every drafted token d_i comes with the distribution
q_i it was drawn from (a probability row), or None when it was chosen deterministically (a one-hot q at d_i:
n-gram lookups, greedy drafts). How many tokens are drafted may depend on anything the speculator knows (its own
confidence, the lookup's match run, the costs) but never on the target's verdict for this cycle. In a seeded
generation a sampling drafter draws each token with the uniform fixed for its position (common random numbers), so
the output equals plain decoding's token for token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from edgespec.decoding.sampling import Probs

from edgespec.decoding.tree import TokenTree


@dataclass
class Proposal:
    """Drafted tokens d_1..d_k and, for each, the distribution q it was drawn from (None = deterministic); or a
    token tree (`tree`: several candidate continuations, verified in one decode; tokens and q are then empty).
    `source` names the strategy that drafted them ("model", "ngram", ...); an empty proposal is a plain step."""

    tokens: list[int] = field(default_factory=list)
    q: list[np.ndarray | Probs | None] = field(default_factory=list)  # a draft model's rows are Probs (warp_probs)
    source: str = "plain"
    tree: TokenTree | None = None
    sampled_chances: bool = False  # have the verify work out sum min(p, q) for sampled drafts (speculate.verify)

    def __len__(self) -> int:
        return len(self.tree) if self.tree is not None else len(self.tokens)


@dataclass(frozen=True)
class Outcome:
    """What happened to a cycle's proposal: n_drafted tokens verified (0 = a plain step; for a tree, its nodes),
    n_accepted kept, n_emitted tokens added to the text (accepted + the target's own token, fewer when an end token cut the
    cycle short), and the seconds spent drafting and in the target's decode. `chances`: the probability each drafted
    position the rule examined had of being accepted (acceptance.Verdict.chances; a tree's first-child chain), where the
    verify gave it (speculate.verify says when), else empty: an estimator learns from these expectations where it can, and from
    the accepted/rejected draws otherwise."""

    n_drafted: int
    n_accepted: int
    n_emitted: int
    t_draft: float
    t_verify: float
    tokens: tuple[int, ...] = ()  # the tokens the cycle added after any a constraint forced: the accepted drafts, then the target's own
    chances: tuple[float, ...] = ()
    # the cycle's whole period: seconds since the previous cycle was observed (the caller's work between cycles
    # included), 0 for a generation's first cycle (its decode finishes the prefill's); what RateGuard compares
    t_cycle: float = 0.0


class Speculator(Protocol):
    """One drafting strategy (see the module docstring)."""

    name: str

    def propose(self, context: Sequence[int], budget: int, rng: Any) -> Proposal:
        """Up to `budget` (>= 1) tokens to continue `context` (every token so far, prompt included). `rng` is the
        generation's np.random.Generator, or sampling.PositionalUniforms for a seeded generation (a drafter that
        samples then uses rng.at(position) for the token at that context position)."""
        ...

    def observe(self, outcome: Outcome) -> None:
        """Called after every cycle, plain ones included."""
        ...

    def stats(self) -> dict[str, Any]:
        """Decisions and outcomes so far (for GenerationStats.controller)."""
        ...


__all__ = ["Proposal", "Outcome", "Speculator"]
