"""What a suffix-index lookup proposes: the candidates for the next tokens as a scored trie, best first
(`SuffixProposal`), and how the occurrences' continuations become one (`trie_proposal`; suffix_index.py's docstring
gives the rule).
"""

from __future__ import annotations

import heapq
import math
from collections import Counter
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from edgespec.decoding.tree import ROOT, TokenTree


@dataclass(frozen=True)
class Continuation:
    """One candidate continuation: its tokens, each token's score (its share among its siblings, an empirical
    P(token | the path before it)), and the path score (the product)."""

    tokens: tuple[int, ...]
    scores: tuple[float, ...]

    @property
    def score(self) -> float:
        return math.prod(self.scores)


@dataclass(frozen=True)
class SuffixProposal:
    """The candidates for the next tokens, as a trie in best-first order: node i has token tokens[i], parent
    parents[i] (ROOT = -1: the context's last token), score scores[i] (its share among its siblings) and path
    score path_scores[i]; siblings appear in rank order (best first). length: the matched suffix length (a LADDER
    entry, 0 = no match); run: the best occurrence's agreement with the context (>= length, capped at run_cap);
    n_occurrences: the occurrences behind the proposal."""

    tokens: tuple[int, ...] = ()
    parents: tuple[int, ...] = ()
    scores: tuple[float, ...] = ()
    path_scores: tuple[float, ...] = ()
    length: int = 0
    run: int = 0
    n_occurrences: int = 0

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def candidates(self) -> list[Continuation]:
        """Root-to-leaf continuations, best path score first."""
        has_child = set(self.parents)
        out = []
        for i in range(len(self.tokens)):
            if i in has_child:
                continue
            path = []
            node = i
            while node != ROOT:
                path.append(node)
                node = self.parents[node]
            path.reverse()
            out.append(Continuation(tuple(self.tokens[j] for j in path), tuple(self.scores[j] for j in path)))
        out.sort(key=lambda c: -c.score)
        return out

    def tree(self, max_nodes: int | None = None) -> TokenTree:
        """A deterministic TokenTree of the best max_nodes nodes (all by default)."""
        n = len(self.tokens) if max_nodes is None else min(max_nodes, len(self.tokens))
        tree = TokenTree()
        for i in range(n):  # best-first order: parents come first
            tree.add(self.parents[i], self.tokens[i])
        return tree

    def fill(self, rank_paths: Sequence[Sequence[int]]) -> TokenTree:
        """A TokenTree with the shape given by rank paths (tree_shape.TreeShape.rank_paths: node i is the
        rank_paths[i][-1]-th child of the node at rank_paths[i][:-1]); nodes the trie lacks are left out."""
        kids: dict[int, list[int]] = {}
        for i, p in enumerate(self.parents):
            kids.setdefault(p, []).append(i)
        tree = TokenTree()
        placed: dict[tuple[int, ...], tuple[int, int]] = {(): (ROOT, ROOT)}  # rank path -> (trie node, tree node)
        for ranks in sorted((tuple(r) for r in rank_paths), key=len):
            parent = placed.get(ranks[:-1])
            if parent is None or not ranks:
                continue
            siblings = kids.get(parent[0], [])
            if ranks[-1] < len(siblings):
                node = siblings[ranks[-1]]
                placed[ranks] = (node, tree.add(parent[1], self.tokens[node]))
        return tree


def trie_proposal(
    rows: np.ndarray,
    runs: np.ndarray,
    recency: np.ndarray,
    length: int,
    max_width: int,
    max_nodes: int | None,
    min_score: float,
    *,
    run_weight: float,
    run_cap: int,
    work: Counter[str],
) -> SuffixProposal:
    """The continuations' trie, scored, then selected best-first (suffix_index.py's docstring). Plain Python: the trie has
    at most max_occurrences x max_depth nodes, fewer than the numpy calls a vectorised version would make."""
    best_run = int(runs.max())
    weights = (run_weight ** (best_run - runs).astype(np.float64)).tolist()
    # trie node 0 is the root; children[i]: token -> node
    children: list[dict[int, int]] = [{}]
    token, weight, rec = [-1], [0.0], [-1]
    for row, w, r in zip(rows.tolist(), weights, recency.tolist()):
        node = 0
        for t in row:
            if t < 0:
                break
            kids = children[node]
            child = kids.get(t)
            if child is None:
                child = kids[t] = len(token)
                children.append({})
                token.append(t)
                weight.append(w)
                rec.append(r)
            else:
                weight[child] += w
                if r > rec[child]:
                    rec[child] = r
            node = child
    work["trie_nodes"] += len(token) - 1
    limit = len(token) if max_nodes is None else max_nodes
    out_tokens: list[int] = []
    out_parents: list[int] = []
    out_scores: list[float] = []
    out_paths: list[float] = []
    heap: list[tuple[float, int, int, int, float]] = []  # (-path score, -recency, trie node, out parent, score)

    def push_children(node: int, out_parent: int, path: float) -> None:
        kids = children[node]
        if not kids:
            return
        ranked = sorted(kids.values(), key=lambda k: (-weight[k], -rec[k]))[:max_width]
        total = sum(weight[k] for k in kids.values())
        for k in ranked:
            score = weight[k] / total
            if path * score >= min_score and path * score > 0.0:
                heapq.heappush(heap, (-path * score, -rec[k], k, out_parent, score))

    push_children(0, ROOT, 1.0)
    while heap and len(out_tokens) < limit:  # best first: SuffixDecoding's greedy tree
        neg, _, k, out_parent, score = heapq.heappop(heap)
        out_tokens.append(token[k])
        out_parents.append(out_parent)
        out_scores.append(score)
        out_paths.append(-neg)
        push_children(k, len(out_tokens) - 1, -neg)
    return SuffixProposal(
        tuple(out_tokens), tuple(out_parents), tuple(out_scores), tuple(out_paths), length, min(best_run, run_cap), int(rows.shape[0])
    )


__all__ = ["Continuation", "SuffixProposal", "trie_proposal"]
