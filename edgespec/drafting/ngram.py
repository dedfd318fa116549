"""Prompt lookup: what followed the last time the context's ending appeared before. Pure Python, no model.

For the context t_0..t_{L-1} and n from n_max down to n_min, look for an earlier occurrence of the suffix
t_{L-n}..t_{L-1}; the first n that has one wins (the longest match), and among occurrences of that n-gram the
most recent one wins. For n = n_max the match is also extended backwards: among the `candidates` most recent
occurrences, the one whose preceding tokens agree with the context's for longest wins (ties: the most recent),
and that agreement, capped at `run_cap`, is the match's `run`. A long run means the text is being copied from
its source (a rewrite, an edit, a repeated block) and the next tokens are very likely right; the n-gram policy
(lookup_policy.NgramPolicy) plans the draft length from it. The proposal is the tokens that followed it, t_s,
t_{s+1}, ... (s = the position just after the occurrence). When the continuation runs into the end of the
context it keeps copying from its own proposed tokens (period L - s), i.e. it predicts that a repeating
pattern goes on repeating.

Proposals are deterministic, so the speculator that uses this index (drafting.lookup) reports each as a
one-hot q, which keeps the acceptance rule exact. A lookup costs microseconds.

Index: one dict from n-gram (a tuple of n token ids, n_min <= n < n_max) to the position s of the token that
followed its most recent occurrence, and one from n_max-grams to the list of such positions (the latest 2 x
`candidates` at most). Appending token t_p at position p records, for each n, the n-gram t_{p-n}..t_{p-1} ->
p; so the suffix of the context itself (which nothing follows yet) is never its own match. `extend` appends,
`reset` rebuilds after a truncation, and `lookup` does either by itself (`sync`) when handed a context that is not a
continuation of the one indexed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class NgramMatch:
    """A lookup's result: the proposed tokens, the matched suffix length n (0 = no match), the position in
    the context of the first proposed token's source (-1 = no match), and the run: how many tokens before the
    proposal the source agrees with the context (>= length; capped at the index's run_cap)."""

    tokens: list[int] = field(default_factory=list)
    length: int = 0
    start: int = -1
    run: int = 0


def as_token_list(tokens: Sequence[int]) -> list[int]:
    """Token ids as a list (a list is returned as it is, without a copy)."""
    if isinstance(tokens, list):
        return tokens
    if isinstance(tokens, np.ndarray):
        return tokens.tolist()
    return [int(t) for t in tokens]


class NgramIndex:
    """Prompt-lookup index (see the module docstring).

    `last_match` holds the latest lookup's NgramMatch; its `run` (longer = more reliable) is the cheap
    confidence signal the n-gram policy plans with.
    """

    def __init__(self, n_max: int = 4, n_min: int = 1, *, run_cap: int = 64, candidates: int = 16) -> None:
        if n_min < 1 or n_max < n_min:
            raise ValueError(f"need 1 <= n_min <= n_max, got n_min={n_min}, n_max={n_max}")
        if run_cap < n_max or candidates < 1:
            raise ValueError(f"need run_cap >= n_max and candidates >= 1, got {run_cap}, {candidates}")
        self.n_max = n_max
        self.n_min = n_min
        self.run_cap = run_cap
        self.candidates = candidates
        self._tokens: list[int] = []
        self._next: dict[tuple[int, ...], int] = {}
        self._occ: dict[tuple[int, ...], list[int]] = {}  # n_max-gram -> positions after its occurrences, oldest first
        self.last_match = NgramMatch()

    @property
    def tokens(self) -> list[int]:
        """The indexed context (do not modify)."""
        return self._tokens

    def __len__(self) -> int:
        return len(self._tokens)

    def extend(self, new_tokens: Sequence[int]) -> None:
        """Append tokens to the indexed context: O(n_max) dictionary writes per token."""
        toks, index, occ, n_max = self._tokens, self._next, self._occ, self.n_max
        for t in as_token_list(new_tokens):
            p = len(toks)
            for n in range(self.n_min, min(n_max - 1, p) + 1):
                index[tuple(toks[p - n : p])] = p
            if p >= n_max:
                where = occ.setdefault(tuple(toks[p - n_max : p]), [])
                where.append(p)
                if len(where) > 2 * self.candidates:  # keep the recent ones (amortised O(1))
                    del where[: -self.candidates]
            toks.append(int(t))

    def reset(self, tokens: Sequence[int] = ()) -> None:
        """Forget everything and index `tokens` from scratch (after a truncation or a new conversation)."""
        self._tokens = []
        self._next = {}
        self._occ = {}
        self.extend(tokens)

    def sync(self, tokens: Sequence[int]) -> None:
        """Make the index describe `tokens`: extend when it continues the indexed context, else reset."""
        toks = as_token_list(tokens)
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
                if n == self.n_max:
                    s, run = self._best_occurrence(self._occ.get(tuple(toks[L - n :]), ()))
                else:
                    s, run = self._next.get(tuple(toks[L - n :])), n
                if s is not None:
                    out = toks[s : s + k]
                    while len(out) < k:  # ran into the end: the pattern repeats with period L - s
                        out.append(out[len(out) - (L - s)])
                    match = NgramMatch(out, n, s, run)
                    break
        self.last_match = match
        return match

    def _best_occurrence(self, positions: Sequence[int]) -> tuple[int | None, int]:
        """Among the `candidates` most recent positions s (each just after an occurrence of the context's last
        n_max tokens), the one whose preceding tokens agree longest with the context's, and that length."""
        toks, cap = self._tokens, self.run_cap
        L = len(toks)
        best, best_run = None, -1
        for s in reversed(positions[-self.candidates :]):
            run = self.n_max
            while run < cap and s - 1 - run >= 0 and toks[s - 1 - run] == toks[L - 1 - run]:
                run += 1
            if run > best_run:
                best, best_run = s, run
                if run >= cap:
                    break
        return best, max(best_run, 0)

__all__ = ["NgramIndex", "NgramMatch"]
