"""Prompt-lookup drafting: propose what followed the last time the context's ending appeared before.

For the context t_0..t_{L-1} and n from n_max down to n_min, look for an earlier occurrence of the suffix
t_{L-n}..t_{L-1}; the first n that has one wins (the longest match), and among occurrences of that n-gram
the most recent one wins. The proposal is the tokens that followed it, t_s, t_{s+1}, ... (s = the position
just after the occurrence). When the continuation runs into the end of the context it keeps copying from
its own proposed tokens (period L - s), i.e. it predicts that a repeating pattern goes on repeating.

Proposals are deterministic, so the engine treats each as a one-hot q (Proposal.q rows are None), which keeps
the acceptance rule exact. No model is involved: drafting costs microseconds.

Index: one dict from n-gram (a tuple of n token ids, n_min <= n <= n_max) to the position s of the token
that followed its most recent occurrence. Appending token t_p at position p records, for each n, the
n-gram t_{p-n}..t_{p-1} -> p; so the suffix of the context itself (which nothing follows yet) is never
its own match. `extend` appends, `reset` rebuilds after a truncation, and `propose` does either by itself
when handed a context that is not a continuation of the one indexed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from .base import KeepDrafting, Proposal


@dataclass(frozen=True)
class NgramMatch:
    """A lookup's result: the proposed tokens, the matched suffix length (0 = no match), and the position in
    the context of the first proposed token's source (-1 = no match)."""

    tokens: list[int] = field(default_factory=list)
    length: int = 0
    start: int = -1


def _as_list(tokens: Sequence[int]) -> list[int]:
    if isinstance(tokens, list):
        return tokens
    if isinstance(tokens, np.ndarray):
        return tokens.tolist()
    return [int(t) for t in tokens]


class NgramDrafter:
    """Prompt-lookup decoding (see the module docstring).

    `last_match` holds the latest lookup's NgramMatch; its `length` (longer = more reliable) is the cheap
    confidence signal a controller may use.
    """

    name = "ngram"
    cost_per_token_hint = 0.0

    def __init__(self, n_max: int = 4, n_min: int = 1) -> None:
        if n_min < 1 or n_max < n_min:
            raise ValueError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        self.n_max = n_max
        self.n_min = n_min
        self._tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}
        self.last_match = NgramMatch()

    @property
    def tokens(self) -> list[int]:
        """The indexed context (do not modify)."""
        return self._tokens

    def __len__(self) -> int:
        return len(self._tokens)

    def extend(self, new_tokens: Sequence[int]) -> None:
        """Append tokens to the indexed context: O(n_max) dictionary writes per token."""
        toks, index = self._tokens, self._next
        for t in _as_list(new_tokens):
            p = len(toks)
            for n in range(self.n_min, min(self.n_max, p) + 1):
                index[tuple(toks[p - n : p])] = p
            toks.append(int(t))

    def reset(self, tokens: Sequence[int] = ()) -> None:
        """Forget everything and index `tokens` from scratch (after a truncation or a new conversation)."""
        self._tokens = []
        self._next = {}
        self.extend(tokens)

    def sync(self, tokens: Sequence[int]) -> None:
        """Make the index describe `tokens`: extend when it continues the indexed context, else reset."""
        toks = _as_list(tokens)
        m = len(self._tokens)
        if len(toks) >= m and toks[:m] == self._tokens:
            if len(toks) > m:
                self.extend(toks[m:])
        else:
            self.reset(toks)

    def lookup(self, tokens: Sequence[int], k: int) -> NgramMatch:
        """Up to k tokens continuing the longest (then most recent) earlier occurrence of a suffix of
        `tokens`; syncs the index to `tokens` first."""
        self.sync(tokens)
        toks = self._tokens
        L = len(toks)
        match = NgramMatch()
        if k > 0:
            for n in range(min(self.n_max, L - 1), self.n_min - 1, -1):
                s = self._next.get(tuple(toks[L - n :]))
                if s is not None:
                    out = toks[s : s + k]
                    while len(out) < k:  # ran into the end: the pattern repeats with period L - s
                        out.append(out[len(out) - (L - s)])
                    match = NgramMatch(out, n, s)
                    break
        self.last_match = match
        return match

    def propose(
        self,
        tokens: Sequence[int],
        k: int,
        rng: np.random.Generator | None = None,
        keep_drafting: KeepDrafting | None = None,
    ) -> Proposal:
        """The Drafter protocol: up to k deterministic tokens (q rows None = one-hot), empty when nothing
        matches. rng and keep_drafting are unused (the lookup is free and has no per-token confidence)."""
        t0 = time.perf_counter()
        match = self.lookup(tokens, k)
        return Proposal(
            tokens=list(match.tokens),
            q=[None] * len(match.tokens),
            source=self.name,
            seconds=time.perf_counter() - t0,
        )

    def close(self) -> None:
        self.reset()


__all__ = ["NgramDrafter", "NgramMatch"]
