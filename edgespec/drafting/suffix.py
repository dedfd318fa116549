"""A memory of everything seen as a speculator: the suffix index (suffix_index.py) offers several candidate
continuations of the context, from the current context, earlier generations of the engine and files the user gave
it; the tree policy (lookup_policy.TreePolicy) picks the tree to verify from the measured costs (a chain, a tree, or
nothing), and the loop verifies it in one decode.

Candidates are deterministic (q = None): exactness holds at any temperature (tree.accept_tree).
"""

from __future__ import annotations

from typing import Any, Sequence

from .lookup_policy import TreePolicy
from edgespec.config import DrafterKind
from .suffix_index import SuffixIndex
from edgespec.decoding.tree import ROOT, TokenTree, walk
from .base import Outcome, Proposal


class SuffixSpeculator:
    """Suffix-index lookups verified as trees or chains (see the module docstring).

    Shadow scoring, as in LookupSpeculator: a declined proposal's best first token is compared with the token the
    target then produces, so declined contexts keep teaching the run estimates.
    """

    name: str = DrafterKind.SUFFIX

    def __init__(self, index: SuffixIndex, policy: TreePolicy) -> None:
        self.index = index
        self.policy = policy
        self._last: tuple[TokenTree, int] | None = None  # the tree being verified and its match run
        self._shadow: tuple[int, int, int] | None = None  # (run, position, best first token) of a declined proposal
        self._first: tuple[int, int, int] | None = None  # the same for the proposal being verified (see withdraw)
        self.last_rate = float("inf")  # expected tokens/s of the last proposal (the tree's; inf: a fixed shape)

    def propose(self, context: Sequence[int], budget: int, rng: Any = None) -> Proposal:
        self._score_shadow(context)
        self._last = None
        depth = min(budget, self.policy.max_depth)
        if depth < 1:
            return Proposal()
        found = self.index.propose(context, max_depth=depth, max_width=self.policy.max_width, max_nodes=4 * self.policy.max_nodes)
        if not len(found):
            return Proposal()
        first = (found.run, len(context), found.tokens[0])  # what a declined proposal is scored by
        if self.policy.spec.adaptive:
            shape = self.policy.choose(found.run, max(_depths(found.parents)), self.policy.max_nodes)
            if not shape.n_nodes:
                self._shadow = first
                return Proposal()
            tree = found.fill(shape.rank_paths)
            self.last_rate = shape.rate
        else:  # a fixed shape: the best max_nodes candidates, whatever the costs say
            tree = found.tree(self.policy.max_nodes)
            self.last_rate = float("inf")
        if not len(tree):
            return Proposal()
        self._last, self._first = (tree, found.run), first
        paths = tree.paths()
        if len(paths) == 1:  # one path: verify it as a chain (no tree sequences)
            chain = [tree.token(i) for i in paths[0]]
            return Proposal(tokens=chain, q=[None] * len(chain), source=self.name)
        return Proposal(source=self.name, tree=tree)

    def withdraw(self) -> None:
        """The proposal just made will not be verified (another drafter's will): score it as a declined one."""
        if self._last is not None:
            self._shadow = self._first
        self._last = None

    def observe(self, outcome: Outcome) -> None:
        if self._last is not None and outcome.n_drafted:
            tree, run = self._last
            self.policy.observe_walk(run, walk(tree, outcome.tokens), outcome.t_verify, outcome.n_drafted)
        else:
            self.policy.observe_plain(outcome.t_verify if not outcome.n_drafted else 0.0, max(outcome.n_emitted, 1))
        self._last = None

    def observe_foreign(self, outcome: Outcome) -> None:
        """A cycle another speculator drafted (the hybrid's model) emitted outcome.n_emitted tokens."""
        self.policy.observe_plain(0.0, max(outcome.n_emitted, 1))
        self._last = None

    def stats(self) -> dict[str, Any]:
        return {**self.policy.stats(), "memory_tokens": len(self.index), "memory_documents": self.index.n_documents}

    def _score_shadow(self, context: Sequence[int]) -> None:
        if self._shadow is not None:
            run, pos, tok = self._shadow
            self._shadow = None
            if pos < len(context):
                self.policy.observe_shadow(run, int(context[pos]) == tok)


def _depths(parents: Sequence[int]) -> list[int]:
    out: list[int] = []
    for p in parents:
        out.append(1 if p == ROOT else out[p] + 1)
    return out


__all__ = ["SuffixSpeculator"]
