"""edgespec.drafting.tree_shape: the Sequoia DP against brute-force enumeration of every tree shape, and the shapes it picks
on this CPU's verify curve and on a flat, GPU-like one. Deterministic: fixed seeds, no clock."""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np
import pytest

from edgespec.drafting.costs import CostModel, best_k, best_rate
from edgespec.drafting.tree_shape import (
    TreeShape,
    best_expected_tokens,
    best_tree,
    from_conditional,
    positional_acceptance,
    sequoia_tables,
    tree_value,
)

# Verify of n tokens relative to one token, measured on the 2-core CPU (issue 13); one token = 80 ms.
CPU_REL = {1: 1.0, 2: 1.64, 3: 2.14, 4: 2.65, 5: 2.96, 8: 5.48, 9: 7.55, 16: 7.48}
C_TOKEN = 0.080


def cpu(c_draft: float = 0.0) -> CostModel:
    return CostModel.from_relative(C_TOKEN, CPU_REL, c_draft=c_draft)


def gpu(c_draft: float = 0.0) -> CostModel:
    return CostModel({1: 0.020, 64: 0.022}, c_draft=c_draft)  # 64 tokens = 1.1x one token


# ------------------------------------------------------------------------------------------------ brute force
@functools.lru_cache(maxsize=None)
def shapes(n: int, depth_left: int, width: int) -> tuple[tuple, ...]:
    """Every shape with exactly n nodes below a node that may have descendants depth_left levels down; a shape is
    the tuple of its children's shapes, in rank order."""
    if n == 0:
        return ((),)
    if depth_left == 0:
        return ()
    out = []
    for m in range(1, min(width, n) + 1):
        for sizes in compositions(n - m, m):
            options = [shapes(s, depth_left - 1, width) for s in sizes]
            out.extend(itertools.product(*options))
    return tuple(out)


def compositions(total: int, parts: int):
    """Ordered tuples of `parts` non-negative integers summing to total."""
    if parts == 1:
        yield (total,)
        return
    for first in range(total + 1):
        for rest in compositions(total - first, parts - 1):
            yield (first,) + rest


def shape_value(shape: tuple, a: np.ndarray, depth: int = 0) -> float:
    """Sum over the nodes below of P(path accepted)."""
    return sum(a[depth, r] * (1.0 + shape_value(child, a, depth + 1)) for r, child in enumerate(shape))


def brute_best(a: np.ndarray, cost: CostModel, max_nodes: int) -> tuple[float, int]:
    """(best rate, its node count) over every shape with <= max_nodes nodes, ties to fewer nodes."""
    D, W = a.shape
    best, best_n = 1.0 / cost.cycle_time(0), 0
    for n in range(1, max_nodes + 1):
        e = 1.0 + max(shape_value(s, a) for s in shapes(n, D, W))
        r = e / cost.cycle_time(n)
        if r > best * (1 + 1e-12):
            best, best_n = r, n
    return best, best_n


def random_acceptance(rng: np.random.Generator, D: int, W: int) -> np.ndarray:
    """Per depth a Dirichlet split of the mass among W ranks and a 'nothing accepted' outcome, ranks sorted."""
    rows = rng.dirichlet(np.ones(W + 1) * 0.8, size=D)[:, :W]
    return -np.sort(-rows, axis=1)


def check_shape(shape: TreeShape, a: np.ndarray, max_nodes: int) -> None:
    """A valid breadth-first shape within the limits, whose stated E is its value."""
    D, W = a.shape
    assert shape.n_nodes <= max_nodes and shape.max_depth <= D and shape.width <= W
    children: dict[int, list[int]] = {}
    for i, (p, r, d) in enumerate(zip(shape.parents, shape.ranks, shape.depths)):
        assert p < i and d == (1 if p < 0 else shape.depths[p] + 1)
        children.setdefault(p, []).append(r)
    assert all(ranks == list(range(len(ranks))) for ranks in children.values())  # ranks 0..m-1, in order
    assert shape.depths == tuple(sorted(shape.depths))  # breadth first
    assert shape.expected_tokens == pytest.approx(tree_value(shape.parents, shape.ranks, shape.depths, a), abs=1e-12)


# ------------------------------------------------------------------------------------------------ the DP
@pytest.mark.parametrize("D, W, max_nodes", [(1, 4, 6), (2, 2, 7), (3, 2, 7), (3, 3, 7), (4, 1, 6), (5, 3, 6)])
def test_best_expected_tokens_matches_brute_force(D: int, W: int, max_nodes: int) -> None:
    rng = np.random.default_rng(100 + 10 * D + W)
    for _ in range(5):
        a = random_acceptance(rng, D, W)
        got = best_expected_tokens(a, max_nodes)
        for n in range(max_nodes + 1):
            options = shapes(n, D, W)
            want = 1.0 + max(shape_value(s, a) for s in options) if options else -math.inf
            assert got[n] == pytest.approx(want, abs=1e-12) if options else got[n] == -math.inf, (n, got[n], want)


@pytest.mark.parametrize("seed", range(6))
def test_best_tree_matches_brute_force_on_random_costs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    D, W, max_nodes = 3, 3, 7
    a = random_acceptance(rng, D, W)
    rel = np.cumsum(np.concatenate([[1.0], rng.uniform(0.0, 0.8, size=max_nodes)]))
    cost = CostModel.from_relative(0.05, {n + 1: float(r) for n, r in enumerate(rel)}, c_draft=float(rng.uniform(0, 0.01)))
    shape = best_tree(a, cost, max_nodes)
    rate, n = brute_best(a, cost, max_nodes)
    assert shape.rate == pytest.approx(rate, rel=1e-12)
    assert shape.n_nodes == n
    check_shape(shape, a, max_nodes)


def test_reconstructed_shapes_have_the_dp_value_for_every_size() -> None:
    rng = np.random.default_rng(7)
    a = random_acceptance(rng, 6, 4)
    E = best_expected_tokens(a, 16)
    flat = CostModel({1: 1.0})  # every size costs the same: the largest E wins
    for n in range(17):
        shape = best_tree(a, flat, n)
        assert shape.n_nodes == int(np.argmax(E[: n + 1] >= E[: n + 1].max() * (1 - 1e-12)))
        check_shape(shape, a, n)


def test_width_one_is_the_chain_of_best_k() -> None:
    rng = np.random.default_rng(8)
    for cost in (cpu(), cpu(0.037), gpu(), gpu(0.004)):
        for _ in range(5):
            rates = rng.uniform(0.3, 0.95, size=8)
            shape = best_tree(rates[:, None], cost, 8)
            assert shape.is_chain and shape.n_nodes == best_k(list(rates), cost, 8)
            assert shape.rate == pytest.approx(best_rate(list(rates), cost, 8), rel=1e-12)


def test_plain_when_nothing_is_accepted_or_nothing_pays() -> None:
    shape = best_tree(np.zeros((4, 3)), gpu(), 16)
    assert shape.n_nodes == 0 and shape.expected_tokens == 1.0 and shape.cycle_time == pytest.approx(gpu().cycle_time(0))
    assert shape.rank_paths == () and shape.width == 0
    # a costly draft model on the CPU: even 90% acceptance at rank 1 does not pay for its tokens
    assert best_tree(positional_acceptance([0.5, 0.1], 8), cpu(0.037), 16).n_nodes == 0
    # min_gain: a marginal tree is declined
    a = positional_acceptance([0.7, 0.1], 4)
    marginal = best_tree(a, cpu(), 16)
    assert marginal.n_nodes > 0 and marginal.rate < 1.05 / cpu().cycle_time(0)
    assert best_tree(a, cpu(), 16, min_gain=0.05).n_nodes == 0


def test_small_trees_on_this_cpu_wide_and_deep_ones_on_a_flat_curve() -> None:
    """Lookup-like acceptance (rank 1 often right, lower ranks rarely): the CPU's steep verify curve allows a few
    nodes at most, mostly a chain; the flat curve fills the budget with a wide and deep tree."""
    for by_rank in ([0.8, 0.08, 0.04, 0.02], [0.9, 0.05, 0.02, 0.01], [0.6, 0.2, 0.1, 0.05]):
        a = positional_acceptance(by_rank, 8)
        small = best_tree(a, cpu(), 16)
        big = best_tree(a, gpu(), 16)
        assert small.n_nodes <= 5 and small.width <= 2, small
        assert big.n_nodes == 16 and big.width >= 2 and big.max_depth >= 4, big
        assert big.rate * gpu().cycle_time(0) > 2.0
        assert small.rate >= best_rate([by_rank[0]] * 8, cpu(), 8) * (1 - 1e-12)  # never worse than the best chain
    chain = best_tree(positional_acceptance([0.9, 0.05, 0.02, 0.01], 8), cpu(), 16)
    assert chain.is_chain and chain.n_nodes >= 2


def test_rank_paths_and_helpers() -> None:
    shape = TreeShape(parents=(-1, -1, 0, 0, 2), ranks=(0, 1, 0, 1, 0), depths=(1, 1, 2, 2, 3), expected_tokens=2.0, cycle_time=1.0)
    assert shape.rank_paths == ((0,), (1,), (0, 0), (0, 1), (0, 0, 0))
    assert shape.width == 2 and shape.max_depth == 3 and not shape.is_chain and shape.rate == 2.0
    np.testing.assert_allclose(from_conditional([0.5, 0.5, 1.0]), [0.5, 0.25, 0.25])
    assert positional_acceptance([0.5, 0.2], 3).shape == (3, 2)
    a = np.array([[0.5, 0.3], [0.4, 0.4]])
    assert tree_value((-1, -1, 0), (0, 1, 0), (1, 1, 2), a) == pytest.approx(1 + 0.5 + 0.3 + 0.5 * 0.4)


def test_invalid_acceptance_is_refused() -> None:
    with pytest.raises(ValueError):
        best_tree([[0.7, 0.5]], gpu())  # siblings' acceptance sums past 1
    with pytest.raises(ValueError):
        best_tree([[1.2]], gpu())
    with pytest.raises(ValueError):
        best_tree(np.zeros((0, 2)), gpu())
    with pytest.raises(ValueError):
        best_expected_tokens([[0.5]], -1)


def test_dp_work_is_depth_times_width_vector_steps() -> None:
    """The DP does D * W steps on vectors of max_nodes + 1 entries: 32 for depth 8, width 4 (no timing here; the
    numbers in docs/trees.md come from a benchmark)."""
    G, k_best, reach = sequoia_tables(positional_acceptance([0.6, 0.2, 0.1, 0.05], 8), 16)
    assert G.shape == (9, 17) and k_best.shape == reach.shape == (8, 4, 17)
