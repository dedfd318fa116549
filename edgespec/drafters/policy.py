"""Drafters that also act as the loop's draft policy (DraftPolicy: next_k / keep_drafting / observe).

The loop asks the policy for k before it calls the drafter. For a model drafter that order is right (k bounds the
work), but an n-gram lookup is free and the best k depends on what it found: a proposal whose source agrees with
the context for 40 tokens deserves a long draft, one that agrees for 2 a short one or none. So `LookupSpeculator`
answers next_k with an upper bound, does the lookup in propose, and lets controller.NgramPolicy cut the proposal
to the k that maximises expected tokens per second. `HybridDrafter` ("model+ngram") uses the n-gram proposal when
the policy wants one and the draft model (with its own Controller) otherwise.

Neither changes what is sampled: they only decide how many deterministic tokens go into a verify batch.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from ..controller import Controller, NgramPolicy
from .base import KeepDrafting, Proposal
from .model import ModelDrafter
from .ngram import NgramDrafter


class LookupSpeculator:
    """The n-gram drafter and its policy in one object (see the module docstring).

    Shadow scoring: when the policy declines a proposal, the lookup's first token is remembered; the next call
    sees the token the target actually produced at that position and reports a hit or miss to the policy, so
    declined contexts keep being measured at no cost.
    """

    name = "ngram"
    cost_per_token_hint = 0.0

    def __init__(self, ngram: NgramDrafter, policy: NgramPolicy) -> None:
        self.ngram = ngram
        self.policy = policy
        self._run = 0  # the run of the proposal being verified (0 = none)
        self._shadow: tuple[int, int, int] | None = None  # (run, position, proposed token) of a declined proposal

    # -- policy side ---------------------------------------------------------------------------------------------
    def next_k(self) -> int:
        return self.policy.k_max

    def keep_drafting(self, position: int, confidence: float) -> bool:
        return True  # a lookup has no per-token confidence; the length is chosen in propose

    def observe(self, n_drafted: int, n_accepted: int, t_draft: float, t_verify: float) -> None:
        if n_drafted and self._run:
            self.policy.observe_cycle(self._run, n_drafted, n_accepted, t_verify)
        else:
            self.policy.observe_plain(t_verify, 1)
        self._run = 0

    def observe_foreign(self, n_tokens: int) -> None:
        """A cycle this speculator did not draft (the model drafter did) emitted n_tokens."""
        self.policy.observe_plain(0.0, n_tokens)
        self._run = 0

    # -- drafter side --------------------------------------------------------------------------------------------
    def _score_shadow(self, tokens: Sequence[int]) -> None:
        if self._shadow is not None:
            run, pos, tok = self._shadow
            self._shadow = None
            # Only a continuation of the context the lookup saw tells what the target produced at `pos`.
            if pos < len(tokens) and len(self.ngram.tokens) == pos and list(tokens[:pos]) == self.ngram.tokens:
                self.policy.observe_shadow(run, int(tokens[pos]) == tok)

    def propose(self, tokens: Sequence[int], k: int, rng: np.random.Generator | None = None,
                keep_drafting: KeepDrafting | None = None) -> Proposal:
        self._score_shadow(tokens)
        self._run = 0
        d = self.ngram.propose(tokens, min(k, self.policy.k_max))
        if not d.tokens:
            return Proposal(source="plain", seconds=d.seconds)
        run = self.ngram.last_match.run
        n = self.policy.choose(run, len(d.tokens))
        if n == 0:
            self._shadow = (run, len(self.ngram.tokens), d.tokens[0])
            return Proposal(source="plain", seconds=d.seconds)
        self._run = run
        return Proposal(tokens=d.tokens[:n], q=d.q[:n], source=d.source, seconds=d.seconds)

    def stats(self) -> dict[str, Any]:
        return self.policy.stats()

    def close(self) -> None:
        self.ngram.close()


class HybridDrafter:
    """Drafter + policy for "model+ngram": an n-gram proposal when the lookup finds one that its policy wants to
    verify (free), the draft model otherwise (its own Controller, which only sees its own cycles)."""

    name = "model+ngram"
    cost_per_token_hint = 0.0

    def __init__(self, model: ModelDrafter, lookup: LookupSpeculator, model_ctl: Controller) -> None:
        self.model, self.lookup, self.model_ctl = model, lookup, model_ctl
        self._k_model = 0
        self._last: str | None = None

    # policy side
    def next_k(self) -> int:
        self._k_model = self.model_ctl.next_k()
        return max(self._k_model, self.lookup.next_k())

    def keep_drafting(self, position: int, confidence: float) -> bool:
        return self.model_ctl.keep_drafting(position, confidence)

    def observe(self, n_drafted: int, n_accepted: int, t_draft: float, t_verify: float) -> None:
        if self._last == "ngram":
            self.lookup.observe(n_drafted, n_accepted, t_draft, t_verify)
        elif self._last == "model" and n_drafted:
            self.model_ctl.observe(n_drafted, n_accepted, t_draft, t_verify)
            self.lookup.observe_foreign(n_accepted + 1)
        else:  # a plain step: both policies count it
            self.model_ctl.observe(0, 0, 0.0, t_verify)
            self.lookup.observe(0, 0, 0.0, t_verify)
        self._last = None

    # drafter side
    def propose(self, tokens: Sequence[int], k: int, rng: np.random.Generator, keep_drafting: Any) -> Proposal:
        d = self.lookup.propose(tokens, k, rng, keep_drafting)
        if d.tokens:
            self._last = "ngram"
            return d
        if self._k_model > 0:
            self._last = "model"
            return self.model.propose(tokens, min(k, self._k_model), rng, keep_drafting)
        self._last = None
        return Proposal(source="plain")

    def stats(self) -> dict[str, Any]:
        return {"model": self.model_ctl.stats(), "ngram": self.lookup.stats()}

    def close(self) -> None:
        """Nothing to free: the Engine owns the draft model and closes it."""


__all__ = ["LookupSpeculator", "HybridDrafter"]
