"""Which tree to verify: the shape that maximises expected tokens per second on this machine (Sequoia's DP).

Pure numpy; no model, no clock. Inputs:

* a `CostModel` (costs.py): T(n) = n * c_draft + c_verify(n + 1) + overhead for a tree of n nodes (the verify
  batch holds the n nodes and the root, the context's last token);
* acceptance[d - 1][r - 1] = a(d, r): the probability that the candidate of rank r at depth d is the one the
  target accepts, given that its parent was accepted (Sequoia's "positional acceptance" vector; sum_r a(d, r) <= 1
  because at most one sibling is accepted). For deterministic candidates a(d, r) estimates p(c_r); from per-rank
  rates "accepted given the earlier siblings were rejected" use `from_conditional`.

A tree's value is E = 1 + sum over nodes of P(the node's path is accepted) = 1 + sum_v prod_{u on path(v)} a(u),
and its rate E / T(n). Plain decoding (n = 0: E = 1, T = c_verify(1) + overhead) and chains (width 1) are special
cases. A node's children always use ranks 1..m (a rank-r candidate exists only with the better ones).

Sequoia (Chen et al. 2024, "Sequoia: Scalable, Robust, and Hardware-aware Speculative Decoding", section 3.1)
finds, for every node count n, the tree of n nodes with the largest E by dynamic programming; the best n is then
the argmax of E*(n) / T(n). Here, with G_d(n) the best sum below a node at depth d using exactly n nodes, and
H_d(r, n) the same using only children of rank >= r:

    G_D(0) = 0, G_D(n > 0) = -inf                                   (no children below the depth limit)
    H_d(W + 1, n) = 0 if n == 0 else -inf
    H_d(r, n) = max( [n == 0 ? 0 : -inf],                           (no child of rank r, hence none after it)
                     max_{k < n} a(d + 1, r) * (1 + G_{d+1}(k)) + H_d(r + 1, n - 1 - k) )
    G_d(n) = H_d(1, n),   E*(n) = 1 + G_0(n).

Each (d, r) step is one max-plus convolution of two vectors of length max_nodes + 1, done in numpy: D * W small
array operations in all (32 for depth 8, width 4), a few hundred microseconds at most. `best_tree` returns the
shape (parents, ranks, depths, in breadth-first order) with its E, T and rate; ties go to fewer nodes.

This module does not know tokens, drafters or the acceptance estimators: it maps numbers to a shape, and the
caller fills the shape with candidates (`TreeShape.rank_paths`: node i is the rank_paths[i][-1]-th candidate after
the candidates of rank_paths[i][:-1]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from .costs import CostModel

NEG = -np.inf
_TIE_RTOL = 1e-12  # rates within this relative distance count as a tie (fewer nodes win)


@dataclass(frozen=True)
class TreeShape:
    """A tree shape in breadth-first order: parents[i] (-1 = the root), ranks[i] (0 = best candidate), depths[i]
    (1 = a child of the root); expected_tokens E, cycle_time T (seconds) and rate E / T."""

    parents: tuple[int, ...]
    ranks: tuple[int, ...]
    depths: tuple[int, ...]
    expected_tokens: float
    cycle_time: float

    @property
    def n_nodes(self) -> int:
        return len(self.parents)

    @property
    def rate(self) -> float:
        return self.expected_tokens / self.cycle_time

    @property
    def max_depth(self) -> int:
        return max(self.depths, default=0)

    @property
    def width(self) -> int:
        """The most children any node (the root included) has."""
        counts: dict[int, int] = {}
        for p in self.parents:
            counts[p] = counts.get(p, 0) + 1
        return max(counts.values(), default=0)

    @property
    def is_chain(self) -> bool:
        return all(r == 0 for r in self.ranks)

    @property
    def rank_paths(self) -> tuple[tuple[int, ...], ...]:
        """For each node, the ranks from the root's child down to it."""
        out: list[tuple[int, ...]] = []
        for p, r in zip(self.parents, self.ranks):
            out.append((out[p] if p >= 0 else ()) + (r,))
        return tuple(out)


def from_conditional(conditional: Sequence[float]) -> np.ndarray:
    """Per-rank rates c_r = P(rank r accepted | parent accepted, ranks < r rejected) -> positional acceptance
    a_r = c_r * prod_{j < r} (1 - c_j) (a 1-D array; stack one per depth for the 2-D table)."""
    c = np.clip(np.asarray(conditional, dtype=np.float64), 0.0, 1.0)
    survive = np.concatenate([[1.0], np.cumprod(1.0 - c)[:-1]])
    return c * survive


def positional_acceptance(by_rank: Sequence[float], max_depth: int) -> np.ndarray:
    """The same per-rank acceptance at every depth: a (max_depth, width) table."""
    row = np.asarray(by_rank, dtype=np.float64)
    return np.tile(row, (max_depth, 1))


def _check_acceptance(acceptance: Sequence[Sequence[float]] | np.ndarray) -> np.ndarray:
    a = np.asarray(acceptance, dtype=np.float64)
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2 or a.shape[0] < 1 or a.shape[1] < 1:
        raise ValueError(f"acceptance must be a (max_depth, max_width) table, got shape {a.shape}")
    if not np.all((a >= 0.0) & (a <= 1.0)):
        raise ValueError("acceptance probabilities must lie in [0, 1]")
    if np.any(a.sum(axis=1) > 1.0 + 1e-9):
        raise ValueError("at most one sibling is accepted: each depth's acceptance must sum to <= 1")
    return a


@lru_cache(maxsize=32)
def _shift_index(size: int) -> np.ndarray:
    """For the max-plus convolution C(n) = max_{k < n} A(k) + H(n - 1 - k) over vectors of length `size`:
    index[k, n] = n - 1 - k where k <= n - 1, else `size` (the -inf pad of H)."""
    k = np.arange(size)[:, None]
    n = np.arange(size)[None, :]
    j = n - 1 - k
    return np.where(j >= 0, j, size)


def sequoia_tables(acceptance: np.ndarray, max_nodes: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The DP of the module docstring. Returns (G, k_best, reach): G[d, n] = G_d(n) for d = 0..D; for a parent at
    depth d and its rank-r child, k_best[d, r, n] is the number of nodes below that child in the best way to spend
    n nodes on ranks >= r, and reach[d, r, n] > -inf says that ranks >= r can use exactly n > 0 nodes at all (a
    rank-r child is present exactly when n > 0)."""
    a = _check_acceptance(acceptance)
    D, W = a.shape
    size = max_nodes + 1
    idx = _shift_index(size)
    G = np.full((D + 1, size), NEG)
    G[:, 0] = 0.0
    k_best = np.zeros((D, W, size), dtype=np.intp)
    reach = np.full((D, W, size), NEG)
    cols = np.arange(size)
    H_pad = np.empty(size + 1)
    for d in range(D - 1, -1, -1):
        value = 1.0 + G[d + 1]  # -inf where no subtree of that size fits
        H = np.full(size, NEG)  # H_d(W + 1, .) at n > 0; n = 0 is handled apart (no child)
        for r in range(W - 1, -1, -1):
            A = a[d, r] * value if a[d, r] > 0.0 else np.where(value > NEG, 0.0, NEG)
            H_pad[:size] = H
            H_pad[0] = 0.0  # ranks > r may stay empty
            H_pad[size] = NEG
            M = A[:, None] + H_pad[idx]  # M[k, n] = A(k) + H(n - 1 - k), -inf where k > n - 1
            best = M.argmax(axis=0)
            H = M[best, cols]
            k_best[d, r] = best
            reach[d, r] = H
        H[0] = 0.0
        G[d] = H
    return G, k_best, reach


def _rebuild(k_best: np.ndarray, reach: np.ndarray, n: int) -> list[tuple[int, int, int]]:
    """Nodes (parent, rank, depth) of the optimal tree with n nodes, breadth first."""
    W = k_best.shape[1]
    nodes: list[tuple[int, int, int]] = []
    queue: list[tuple[int, int, int]] = [(-1, 0, n)]  # (node index, its depth, nodes below it)
    head = 0
    while head < len(queue):
        parent, depth, budget = queue[head]
        head += 1
        r = 0
        while budget > 0:
            if r >= W or reach[depth, r, budget] == NEG:
                raise AssertionError("inconsistent DP table")  # pragma: no cover
            k = int(k_best[depth, r, budget])
            nodes.append((parent, r, depth + 1))
            queue.append((len(nodes) - 1, depth + 1, k))
            budget -= 1 + k
            r += 1
    return nodes


def tree_value(parents: Sequence[int], ranks: Sequence[int], depths: Sequence[int], acceptance: np.ndarray) -> float:
    """E = 1 + sum over nodes of the product of a(depth, rank) along the node's path (parents before children)."""
    a = _check_acceptance(acceptance)
    reach: list[float] = []
    for p, r, d in zip(parents, ranks, depths):
        if d > a.shape[0] or r >= a.shape[1]:
            reach.append(0.0)
            continue
        reach.append((reach[p] if p >= 0 else 1.0) * float(a[d - 1, r]))
    return 1.0 + float(sum(reach))


def best_expected_tokens(acceptance: Sequence[Sequence[float]] | np.ndarray, max_nodes: int) -> np.ndarray:
    """E*(n) for n = 0..max_nodes: the largest expected tokens of any tree with exactly n nodes (-inf when none
    fits the depth and width limits)."""
    if max_nodes < 0:
        raise ValueError(f"max_nodes must be >= 0, got {max_nodes}")
    G, _, _ = sequoia_tables(_check_acceptance(acceptance), max_nodes)
    return 1.0 + G[0]


def best_tree(
    acceptance: Sequence[Sequence[float]] | np.ndarray,
    cost: CostModel,
    max_nodes: int = 16,
    *,
    min_gain: float = 0.0,
) -> TreeShape:
    """The tree with at most max_nodes nodes, depth <= len(acceptance) and width <= len(acceptance[0]) that
    maximises E / T (module docstring). A tree must beat plain decoding's rate by the factor 1 + min_gain, else the
    plain step (n = 0) is returned. Ties go to fewer nodes."""
    if max_nodes < 0 or min_gain < 0:
        raise ValueError("need max_nodes >= 0 and min_gain >= 0")
    a = _check_acceptance(acceptance)
    G, k_best, reach = sequoia_tables(a, max_nodes)
    E = 1.0 + G[0]
    T = np.array([cost.cycle_time(n) for n in range(max_nodes + 1)])
    rate = np.where(E > NEG, E / T, NEG)
    top = float(rate.max())
    n = int(np.flatnonzero(rate >= top * (1.0 - _TIE_RTOL))[0])
    if n and rate[n] < (1.0 + min_gain) * rate[0]:
        n = 0
    nodes = _rebuild(k_best, reach, n)
    return TreeShape(
        parents=tuple(p for p, _, _ in nodes),
        ranks=tuple(r for _, r, _ in nodes),
        depths=tuple(d for _, _, d in nodes),
        expected_tokens=float(E[n]),
        cycle_time=float(T[n]),
    )


__all__ = ["TreeShape", "best_expected_tokens", "best_tree", "from_conditional", "positional_acceptance", "sequoia_tables", "tree_value"]
