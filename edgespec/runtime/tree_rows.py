"""A token tree's verify rows for the speculative loop (speculate.py's tree cycle): the target's rows warped on first
use (`TreeRows`), the acceptance chances of the tree's first-child chain, and the tree pruned to what the budget and
the target's context hold. Pure: no llama.cpp."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from edgespec.config import SamplingParams
from edgespec.decoding.acceptance import expected_acceptance
from edgespec.decoding.constraint import apply_mask
from edgespec.decoding.sampling import greedy as greedy_token
from edgespec.decoding.sampling import warp
from edgespec.decoding.tree import ROOT, TokenTree
from edgespec.prompts.infill import InfillVocab


class TreeRows(Sequence[Any]):
    """The target's rows for a tree, warped on first use (accept_tree reads only the rows along its walk): index 0
    is the root row, i + 1 node i's; None for nodes that were not decoded."""

    def __init__(
        self,
        tree: TokenTree,
        logits: np.ndarray,
        node_row: list[int],
        ctx: list[int],
        sampling: SamplingParams,
        masks: dict[int, np.ndarray] | None = None,
        infill_vocab: InfillVocab | None = None,
    ) -> None:
        self.tree, self.logits, self.node_row, self.ctx, self.sampling = tree, logits, node_row, ctx, sampling
        self.infill_vocab = infill_vocab
        self.masks = masks  # row index (0 = root, i + 1 = node i) -> the constraint's mask there
        self._rows: dict[int, np.ndarray | int | None] = {}

    def __len__(self) -> int:
        return len(self.tree) + 1

    def __getitem__(self, i: Any) -> Any:
        if i not in self._rows:
            r = 0 if i == 0 else self.node_row[i - 1]
            if r < 0:
                self._rows[i] = None
            else:
                # penalties read the history; without them, no copy of the context per row
                history = self.ctx + ([] if i == 0 else self.tree.path_tokens(i - 1)) if self.sampling.uses_history else []
                row = self.logits[r]
                if self.masks is not None:
                    row = apply_mask(row, self.masks[i])
                self._rows[i] = (
                    greedy_token(row, self.sampling, history) if self.sampling.greedy
                    else warp(row, self.sampling, history, self.infill_vocab)
                )
        return self._rows[i]


def chain_chances(tree: TokenTree, rows: TreeRows, path: Sequence[int], sampled: bool) -> tuple[float, ...]:
    """Verdict.chances (see speculate.verify: `sampled` as its sampled_chances) for a tree's chain of first children (a draft
    model's own chain; its siblings are later children): the acceptance probability of each first child the rule tried,
    from the root down to the first one it did not keep. The tree rule tries a node's first child before any other,
    with min(1, p/q) (the coupled rule keeps it when it is the target's sample, p(d) for a deterministic child), so its
    chance is that of a chain."""
    out: list[float] = []
    node = ROOT
    for depth in range(tree.max_depth):
        kids = tree.children(node)
        if not kids:
            break
        first = kids[0]
        if tree.q(first) is not None and not sampled:
            return ()
        out.append(expected_acceptance(rows[node + 1], tree.q(first), tree.token(first)))
        if depth >= len(path) or path[depth] != first:
            break
        node = first
    return tuple(out)


def prune(tree: TokenTree, max_depth: int, max_nodes: int) -> TokenTree:
    """The tree without nodes deeper than max_depth, and its first max_nodes nodes at most (insertion order: parents
    first, better ranks first); kept nodes keep their order and rank."""
    out, index = TokenTree(), {ROOT: ROOT}
    for i in range(len(tree)):
        parent = tree.parents[i]
        if len(out) < max_nodes and tree.depths[i] <= max_depth and parent in index:
            index[i] = out.add(index[parent], tree.token(i), tree.q(i))
    return out


__all__ = ["TreeRows", "chain_chances", "prune"]
