"""The constraint inside the speculative loop (speculate.py): the tokens it forces, drafted ahead of a speculator's,
and the masks of a verify's rows, for a chain and for a tree. Pure: no llama.cpp.

With a `TokenConstraint`, every row's logits are masked for that row's own prefix before `warp` (row i of a chain:
history + drafts[:i]; a tree node's row: history + its path), on the plain path and in verification alike, so the
exact rules hold on the masked distribution. A draft the constraint forbids is a certain rejection and is never
decoded (like an id past the vocabulary). The matcher is rolled back to the cycle's start after the masks are
computed and then advanced along the tokens the cycle adds. With `forced_drafts`, the tokens the grammar forces next
open every cycle's draft as deterministic drafts (q = None); where the mask allows that token alone its p is 1 and it
is accepted without fail, so forced scaffolding (braces, keys, quotes) costs one batched decode instead of one decode
per token. The speculator drafts after them (it is asked for the context + forced tokens). On every path a row whose
mask allows one token is not computed at all (known_rows): its distribution is fixed, and llama.cpp skips the output
projection for it. A constraint that dead-ends stops the generation with stop_reason "constraint".
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from edgespec.decoding.constraint import TokenConstraint
from edgespec.decoding.sampling import Probs
from edgespec.decoding.tree import ROOT, TokenTree
from edgespec.drafting.base import Proposal
from edgespec.drafting.guard import unguarded


def advance_all(constraint: TokenConstraint, tokens: Sequence[int]) -> int:
    """Advance along tokens while the constraint allows them; how many it took."""
    n = 0
    for t in tokens:
        if not constraint.advance(t):
            break
        n += 1
    return n


def follow(constraint: TokenConstraint, tokens: Sequence[int]) -> int:
    """Advance along a cycle's tokens, each from a row its mask allowed; how many it took (fewer where the matcher hit
    a limit: the constraint dead-ends there)."""
    for i, t in enumerate(tokens):
        if not constraint.advance(t):
            if not constraint.error:  # pragma: no cover - every emitted token came from a masked row
                raise RuntimeError(f"the constraint refused token {t} that its own mask allowed")
            return i
    return len(tokens)


def bind_constraint(speculator: Any, constraint: TokenConstraint | None) -> None:
    """Let the draft models inside a speculator mask their proposals with the generation's constraint."""
    speculator = unguarded(speculator)
    for part in (speculator, getattr(speculator, "model", None)):
        if part is not None and hasattr(part, "constraint"):
            part.constraint = constraint


def after_forced(forced: list[int], proposal: Proposal) -> Proposal:
    """The forced tokens as a deterministic chain, with the speculator's chain or tree (drafted after them) below."""
    if proposal.tree is not None and len(proposal.tree):
        tree = TokenTree.chain(forced)
        index = {ROOT: len(forced) - 1}
        own = proposal.tree
        for i in range(len(own)):
            index[i] = tree.add(index[own.parents[i]], own.token(i), own.q(i))
        return Proposal(source=proposal.source, tree=tree, sampled_chances=proposal.sampled_chances)
    source = proposal.source if proposal.tokens else "grammar"
    q: list[np.ndarray | Probs | None] = [None] * len(forced)
    return Proposal(forced + list(proposal.tokens), q + list(proposal.q), source, sampled_chances=proposal.sampled_chances)


def chain_masks(constraint: TokenConstraint, draft: Sequence[int]) -> tuple[list[np.ndarray], int]:
    """The constraint's masks for the rows of a chain verify (row i: after draft[:i]) up to the first drafted token it
    forbids, and how many drafts lead the chain allowed. The matcher ends where it started."""
    masks = [constraint.mask()]
    n = 0
    for d in draft:
        m = masks[-1]
        if not (d < m.size and m[d]) or not constraint.advance(d):
            break
        n += 1
        masks.append(constraint.mask())
    constraint.rollback(n)
    return masks, n


def known_rows(masks: Sequence[np.ndarray], n_decode: int, n_vocab: int) -> dict[int, int]:
    """{row: token} for the verify rows 0..n_decode whose mask allows exactly one token (below n_vocab). There the
    masked distribution is that token with probability 1 whatever the target's logits are (every other logit is -inf
    before `warp`; penalties, temperature and the filters keep a single finite logit the only one), so the row needs
    no output from the target: llama.cpp then skips the output projection over the vocabulary for it (a quarter of a
    token's cost on the default pair on a 2-core CPU). Grammar scaffolding (keys, braces, quotes) is such rows."""
    out = {}
    for i, m in enumerate(masks[: n_decode + 1]):
        if m is not None and np.count_nonzero(m) == 1:
            t = int(np.argmax(m))
            if t < n_vocab:
                out[i] = t
    return out


def tree_masks(constraint: TokenConstraint, tree: TokenTree) -> tuple[dict[int, np.ndarray], set[int]]:
    """The constraint's mask for every row of a tree (key 0 = the root, i + 1 = node i: after the path to node i), and
    the nodes it forbids (left out of the decode with their subtrees). Depth first (depth <= 64); the matcher ends
    where it started."""
    masks = {0: constraint.mask()}
    skip: set[int] = set()

    def visit(node: int) -> None:
        m = masks[node + 1]
        for child in tree.children(node):
            t = tree.token(child)
            if not (t < m.size and m[t]):
                skip.add(child)
                continue
            if not constraint.advance(t):  # the matcher hit a limit (a dead end): the node is not drafted at all
                m = masks[node + 1] = m.copy()
                m[t] = False
                skip.add(child)
                continue
            masks[child + 1] = constraint.mask()
            visit(child)
            constraint.rollback(1)

    visit(ROOT)
    return masks, skip


__all__ = ["advance_all", "after_forced", "bind_constraint", "chain_masks", "follow", "known_rows", "tree_masks"]
