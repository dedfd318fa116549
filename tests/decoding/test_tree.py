"""edgespec.decoding.tree: exact acceptance on token trees must reproduce the target's distribution whatever the tree.

* Exact enumeration: on vocabularies of 4-5 tokens, with target and draft rows that depend on the whole path, every
  draft realisation of a tree shape (all i.i.d. / without-replacement draws, duplicates included) is enumerated
  with its probability, and every random decision of the rule on it (`outcome_distribution`). The law of the first
  depth + 1 tokens (the cycle's tokens, then the target's own samples) must equal the target's to 1e-12.
  tests/decoding/test_exact_laws.py does the same on V = 6-10, under constraints (masked rows, skipped nodes, forced
  chains), for the coupled rule, for RngDraws (the uniforms behind accept_tree), with planted bugs in the rule's own
  source.
* One statistical smoke test on the implementation with a real rng (test_chi_square_implementation_matches_the_
  enumerated_rule): fixed seed, N = 20,000 trials, Pearson chi-square at ALPHA = 1e-3 (cells expected < 5 merged).

Broken variants of the rule (no renormalisation after a rejected deterministic child; sampled siblings tried
against the unreduced p) fail the exact check, so it has power.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence

import numpy as np
import pytest
from scipy import stats

from edgespec.decoding.acceptance import residual
from edgespec.decoding.sampling import PositionalUniforms, sample_at
from edgespec.decoding.tree import (
    ROOT,
    Draws,
    TokenTree,
    TreeVerdict,
    accept_tree,
    accept_tree_coupled,
    accept_tree_greedy,
    accept_tree_with,
    outcome_distribution,
    sample_children,
)

from support.exact import sibling_draws  # every way to draw b siblings (i.i.d. or without replacement) with its probability

ALPHA = 1e-3
N = 20_000
EXACT_TOL = 1e-12

Prefix = tuple[int, ...]


# ------------------------------------------------------------------------------------------------ synthetic models
class Model:
    """Next-token rows that depend on the whole prefix, fixed by (seed, kind, prefix) (no hash()). T sharpens or
    flattens; `keep` > 0 keeps only the `keep` most likely tokens (a top-k-like filter: zeros in the row)."""

    def __init__(self, V: int, seed: int, kind: int, T: float = 1.0, keep: int = 0) -> None:
        self.V, self.seed, self.kind, self.T, self.keep = V, seed, kind, T, keep
        self._rows: dict[Prefix, np.ndarray] = {}

    def __call__(self, prefix: Sequence[int]) -> np.ndarray:
        try:
            row = self._rows.get(prefix)  # type: ignore[call-overload]
        except TypeError:  # a list
            prefix = tuple(prefix)
            row = self._rows.get(prefix)
        if row is None:
            key = tuple(int(t) for t in prefix)
            g = np.random.default_rng([self.seed, self.kind, len(key), *key])
            logits = g.standard_normal(self.V) * 1.5 / self.T
            if self.keep:
                logits[np.argsort(-logits, kind="stable")[self.keep :]] = -np.inf
            w = np.exp(logits - logits.max())
            row = self._rows[key] = self._rows[prefix] = w / w.sum()  # type: ignore[index]
        return row


def target_joint(p: Model, K: int) -> np.ndarray:
    """P(first K tokens = s) for every s in V^K, as an array indexed like np.ravel_multi_index."""
    out = np.zeros((p.V,) * K)
    for s in itertools.product(range(p.V), repeat=K):
        prob = 1.0
        for i in range(K):
            prob *= p(s[:i])[s[i]]
        out[s] = prob
    return out


def rows_for(tree: TokenTree, p: Model, context: Prefix = ()) -> list[np.ndarray]:
    """The root row, then the target's row after context + the path to each node."""
    prefixes: list[Prefix] = []
    for t, parent in zip(tree.tokens, tree.parents):
        prefixes.append((context if parent == ROOT else prefixes[parent]) + (t,))
    return [p(context)] + [p(x) for x in prefixes]


# A shape is a tuple of child shapes; () is a leaf.
DEEP3 = ((((),), ()), ((),), ())  # root: 3 children; depth 3 under the first
SAMPLED_WIDE = (((), ()), ((),))  # root: 2 sampled, then 2 and 1
SAMPLED_DEEP = ((((),),), ((),))  # root: 2 sampled, a depth-3 chain under the first


def shape_depth(shape: tuple) -> int:
    return 1 + max((shape_depth(c) for c in shape), default=0) if shape else 0


def deterministic_tree(shape: tuple, q: Model, context: Prefix = ()) -> TokenTree:
    """Children = the draft's top-b tokens at each node (b = the shape's width there)."""
    tree = TokenTree()

    def grow(node: int, prefix: Prefix, sub: tuple) -> None:
        ranked = np.argsort(-q(prefix), kind="stable")
        for rank, child_shape in enumerate(sub):
            tok = int(ranked[rank])
            c = tree.add(node, tok)
            grow(c, prefix + (tok,), child_shape)

    grow(ROOT, context, shape)
    return tree


def enumerate_sampled_trees(shape: tuple, q: Model, replacement: bool) -> list[tuple[TokenTree, float]]:
    """Every realisation of a sampled tree of this shape with its probability."""

    def subtrees(prefix: Prefix, sub: tuple) -> list[tuple[list, float]]:
        # a realisation = nested list of (token, q row, child realisation)
        if not sub:
            return [([], 1.0)]
        out = []
        for draws, prob in sibling_draws(q(prefix), len(sub), replacement):
            options = [subtrees(prefix + (t,), child_shape) for (t, _), child_shape in zip(draws, sub)]
            for combo in itertools.product(*options):
                sub_prob = prob
                for _, sp in combo:
                    sub_prob *= sp
                out.append(([(t, row, c) for (t, row), (c, _) in zip(draws, combo)], sub_prob))
        return out

    result = []
    for realisation, prob in subtrees((), shape):
        tree = TokenTree()
        stack = [(ROOT, realisation)]
        while stack:
            node, kids = stack.pop(0)
            for t, row, sub in kids:
                stack.append((tree.add(node, t, row), sub))
        result.append((tree, prob))
    return result


def emitted_law(outcomes: dict, tree: TokenTree, p: Model, K: int, into: np.ndarray, weight: float) -> None:
    """Add weight * P(first K tokens = s) to into[s]: the cycle's tokens, then the target's own samples."""
    for (path, token), prob in outcomes.items():
        emitted = tuple(tree.token(i) for i in path) + (token,)
        base = weight * prob
        rest = K - len(emitted)
        for tail in itertools.product(range(p.V), repeat=rest):
            s = emitted + tail
            pr = base
            for i in range(len(emitted), K):
                pr *= p(s[:i])[s[i]]
            into[s] += pr


def rule_law(trees: list[tuple[TokenTree, float]], p: Model, K: int, rule=accept_tree_with) -> np.ndarray:
    law = np.zeros((p.V,) * K)
    for tree, prob in trees:
        emitted_law(outcome_distribution(tree, rows_for(tree, p), rule), tree, p, K, law, prob)
    return law


# ------------------------------------------------------------------------------------------------ broken rules
def broken_no_renormalise(tree: TokenTree, p_rows, draws: Draws) -> TreeVerdict:
    """Wrong: a later deterministic child is tried with its original p(c) instead of the renormalised p'(c)."""
    path, node = [], ROOT
    while True:
        row = np.asarray(p_rows[node + 1], dtype=np.float64)
        r, chosen = row.copy(), None
        for c in tree.children(node):
            x = tree.token(c)
            if draws.accept(row[x], 1.0):
                chosen = c
                break
            r[x] = 0.0
        if chosen is None:
            return TreeVerdict(path, [tree.token(i) for i in path], draws.choose(r if r.any() else row), not tree.children(node))
        path.append(chosen)
        node = chosen


def broken_no_residual(tree: TokenTree, p_rows, draws: Draws) -> TreeVerdict:
    """Wrong: every sampled sibling is tried with min(1, p/q) against the unreduced p."""
    path, node = [], ROOT
    while True:
        row = np.asarray(p_rows[node + 1], dtype=np.float64)
        r, chosen = row.copy(), None
        for c in tree.children(node):
            x, q = tree.token(c), tree.q(c)
            if draws.accept(row[x], q[x]):
                chosen = c
                break
            r = residual(r, q, x)
        if chosen is None:
            return TreeVerdict(path, [tree.token(i) for i in path], draws.choose(r if r.any() else row), not tree.children(node))
        path.append(chosen)
        node = chosen


# ------------------------------------------------------------------------------------------------ structure
def example_tree() -> TokenTree:
    #            ROOT
    #        /     |    \
    #      0:5    1:7   2:9
    #     /   \     |
    #   3:1   4:2  5:3
    #    |
    #   6:4
    t = TokenTree()
    a, b, _ = t.add(ROOT, 5), t.add(ROOT, 7), t.add(ROOT, 9)
    c, _ = t.add(a, 1), t.add(a, 2)
    t.add(b, 3)
    t.add(c, 4)
    return t


def test_structure_helpers() -> None:
    t = example_tree()
    assert len(t) == 7
    assert t.tokens == [5, 7, 9, 1, 2, 3, 4]
    assert t.parents == [ROOT, ROOT, ROOT, 0, 0, 1, 3]
    assert t.depths == [1, 1, 1, 2, 2, 2, 3] and t.max_depth == 3
    assert t.children() == [0, 1, 2] and t.children(0) == [3, 4] and t.children(6) == []
    assert t.paths() == [[0, 3, 6], [0, 4], [1, 5], [2]]
    assert t.leaves() == [6, 4, 5, 2]
    assert t.seq_ids() == [[0, 1], [2], [3], [0], [1], [2], [0]]
    assert t.parent_rows() == [0, 0, 0, 1, 1, 2, 4]
    assert t.bfs_order() == [0, 1, 2, 3, 4, 5, 6]
    assert t.path(6) == [0, 3, 6] and t.path_tokens(6) == [5, 1, 4] and t.path(ROOT) == []
    assert not t.is_sampled() and not t.is_sampled(6)


def test_bfs_order_when_built_depth_first() -> None:
    t = TokenTree.from_paths([[1, 2, 3], [1, 4], [5]])
    assert t.tokens == [1, 2, 3, 4, 5]  # insertion order is depth first
    assert [t.token(i) for i in t.bfs_order()] == [1, 5, 2, 4, 3]
    assert t.paths() == [[0, 1, 2], [0, 3], [4]]


def test_from_paths_merges_prefixes_and_keeps_rank() -> None:
    t = TokenTree.from_paths([[4, 5, 6], [4, 5, 7], [4, 8], [9], [4, 5, 6]])
    assert t.tokens == [4, 5, 6, 7, 8, 9]
    assert [t.token(c) for c in t.children()] == [4, 9]
    assert [t.token(c) for c in t.children(1)] == [6, 7]
    assert TokenTree.chain([3, 3, 3]).paths() == [[0, 1, 2]]


def test_batch_layout_matches_tree_attention() -> None:
    """llama.cpp's mask: a token sees a cell sharing one of its sequence ids at a position <= its own. With one id
    per root-to-leaf path that is exactly 'itself or an ancestor' (the tree-attention mask)."""
    t = example_tree()
    b = t.batch(last_token=42, root_pos=100)
    assert b.tokens == [42, 5, 7, 9, 1, 2, 3, 4]
    assert b.positions == [100, 101, 101, 101, 102, 102, 102, 103]
    assert b.seq_ids[0] == [0, 1, 2, 3] and b.n_seqs == 4 and b.paths == t.paths()
    assert b.node_row == [1, 2, 3, 4, 5, 6, 7] and b.parent_row == [0, 0, 0, 1, 1, 2, 4]
    n = len(b.tokens)
    seen = np.array(
        [[bool(set(b.seq_ids[i]) & set(b.seq_ids[j])) and b.positions[j] <= b.positions[i] for j in range(n)] for i in range(n)]
    )
    np.testing.assert_array_equal(seen, t.ancestor_mask())


def test_batch_leaves_out_ids_past_the_vocabulary() -> None:
    t = TokenTree()
    a = t.add(ROOT, 3)
    bad = t.add(ROOT, 50)
    t.add(bad, 1)
    t.add(a, 2)
    b = t.batch(last_token=0, root_pos=9, n_vocab=10)
    assert b.tokens == [0, 3, 2] and b.node_row == [1, -1, -1, 2] and b.parent_row == [0, 0, -1, 1]
    # the verdict needs no row for them: p(50) = 0 at the root
    p = np.full(10, 0.1)
    rows = [p, p, None, None, p]
    for seed in range(50):
        v = accept_tree(t, rows, np.random.default_rng(seed))
        assert bad not in v.path and v.token < 10


def test_add_validates() -> None:
    t = TokenTree()
    q = np.array([0.5, 0.5])
    t.add(ROOT, 1, q)
    with pytest.raises(ValueError, match="mix"):
        t.add(ROOT, 2)  # a deterministic sibling of a sampled child
    d = t.add(0, 1)
    with pytest.raises(ValueError, match="mix"):
        t.add(0, 0, q)
    with pytest.raises(ValueError):
        t.add(7, 1)
    with pytest.raises(ValueError):
        t.add(d, -1)
    with pytest.raises(ValueError):
        t.add(d, 1, np.array([0.5, 0.6]))  # not a probability row
    with pytest.raises(ValueError):
        accept_tree(t, [q], np.random.default_rng(0))  # needs len(t) + 1 rows


def test_sample_children() -> None:
    rng = np.random.default_rng(3)
    q = np.array([0.1, 0.0, 0.6, 0.3])
    for _ in range(200):
        kids = sample_children(q, 3, rng)
        toks = [t for t, _ in kids]
        assert len(set(toks)) == 3 and 1 not in toks
        assert kids[0][1][toks[0]] > 0 and all(row[t] > 0 for t, row in kids)
        assert all(abs(row.sum() - 1) < 1e-12 for _, row in kids)
        for (t, _), (_, later) in zip(kids, kids[1:]):
            assert later[t] == 0.0  # a drawn token is gone from the next sibling's row
    assert len(sample_children(q, 5, rng)) == 3  # only 3 positive entries
    iid = sample_children(q, 4, rng, replacement=True)
    assert len(iid) == 4 and all(row is iid[0][1] for _, row in iid)


# ------------------------------------------------------------------------------------------------ exactness
@pytest.mark.parametrize("T", [0.7, 1.0, 1.5])
@pytest.mark.parametrize("keep", [0, 3])
def test_exact_deterministic_tree(T: float, keep: int) -> None:
    """Children = the draft's top-b at each node (some outside the filtered target's support when keep = 3)."""
    V = 5
    p, q = Model(V, 1, 0, T, keep), Model(V, 1, 1, 1.0)
    tree = deterministic_tree(DEEP3, q)
    K = shape_depth(DEEP3) + 1
    law = rule_law([(tree, 1.0)], p, K)
    assert np.abs(law - target_joint(p, K)).max() < EXACT_TOL
    assert law.sum() == pytest.approx(1.0, abs=1e-12)


def test_exact_deterministic_tree_with_the_target_own_top_choices() -> None:
    """The drafter is right most of the time (its top-b are the target's): deep acceptance, still exact."""
    V = 5
    p = Model(V, 2, 0, 0.7)
    tree = deterministic_tree(DEEP3, p)
    K = 4
    law = rule_law([(tree, 1.0)], p, K)
    assert np.abs(law - target_joint(p, K)).max() < EXACT_TOL


@pytest.mark.parametrize(
    "shape, replacement, T, keep_p, keep_q",
    [
        (SAMPLED_WIDE, True, 1.0, 0, 0),
        (SAMPLED_DEEP, True, 0.7, 3, 0),
        (SAMPLED_WIDE, False, 1.5, 0, 3),
        (SAMPLED_DEEP, False, 1.0, 3, 2),
    ],
)
def test_exact_sampled_tree(shape: tuple, replacement: bool, T: float, keep_p: int, keep_q: int) -> None:
    """Every draft realisation (i.i.d. draws include duplicate siblings) weighted by its probability."""
    V = 4
    p, q = Model(V, 3, 0, T, keep_p), Model(V, 3, 1, 1.0, keep_q)
    trees = enumerate_sampled_trees(shape, q, replacement)
    assert sum(w for _, w in trees) == pytest.approx(1.0, abs=1e-12)
    if replacement:
        assert any(t.token(0) == t.token(1) for t, _ in trees)  # duplicates are in the enumeration
    K = shape_depth(shape) + 1
    law = rule_law(trees, p, K)
    assert np.abs(law - target_joint(p, K)).max() < EXACT_TOL


class OneHot(Model):
    """Temperature 0: the one-hot row at the base model's argmax."""

    def __init__(self, base: Model) -> None:
        super().__init__(base.V, base.seed, base.kind)
        self.base = base

    def __call__(self, prefix: Sequence[int]) -> np.ndarray:
        row = np.zeros(self.V)
        row[int(np.argmax(self.base(prefix)))] = 1.0
        return row


def test_exact_greedy_tree_with_one_hot_rows() -> None:
    """Temperature 0: one-hot rows; the rule must keep exactly the path of argmaxes."""
    base = Model(5, 4, 0)
    p = OneHot(base)
    for tree in [deterministic_tree(DEEP3, Model(5, 4, 1)), deterministic_tree(DEEP3, base)]:
        law = rule_law([(tree, 1.0)], p, 4)
        assert np.abs(law - target_joint(p, 4)).max() < EXACT_TOL
        assert len(outcome_distribution(tree, rows_for(tree, p))) == 1  # no randomness left
    p4 = OneHot(Model(4, 4, 0))
    trees = enumerate_sampled_trees(SAMPLED_WIDE, Model(4, 4, 1), replacement=True)
    assert np.abs(rule_law(trees, p4, 3) - target_joint(p4, 3)).max() < EXACT_TOL


def test_broken_rules_fail_the_exact_check() -> None:
    V = 5
    p, q = Model(V, 1, 0, 1.0), Model(V, 1, 1, 1.0)
    tree = deterministic_tree(DEEP3, q)
    assert np.abs(rule_law([(tree, 1.0)], p, 4, broken_no_renormalise) - target_joint(p, 4)).max() > 1e-3
    p4, q4 = Model(4, 3, 0), Model(4, 3, 1)
    trees = enumerate_sampled_trees(SAMPLED_WIDE, q4, replacement=True)
    assert np.abs(rule_law(trees, p4, 3, broken_no_residual) - target_joint(p4, 3)).max() > 1e-3


def test_deterministic_acceptance_is_the_mass_of_the_candidates() -> None:
    """With deterministic children c_1..c_m the rule accepts one of them with probability sum_i p(c_i): every
    target sample among the candidates is kept (the best any rule can do)."""
    p = np.array([0.4, 0.3, 0.2, 0.1])
    t = TokenTree()
    for tok in (1, 3, 0):
        t.add(ROOT, tok)
    rows = [p] + [np.full(4, 0.25)] * 3
    dist = outcome_distribution(t, rows)
    accepted = sum(w for (path, _), w in dist.items() if path)
    assert accepted == pytest.approx(0.3 + 0.1 + 0.4, abs=1e-15)
    for child, tok in zip(t.children(), (1, 3, 0)):
        assert sum(w for (path, _), w in dist.items() if path[:1] == (child,)) == pytest.approx(p[tok], abs=1e-15)
    assert dist[((), 2)] == pytest.approx(0.2, abs=1e-15)


def test_without_replacement_accepts_more_than_iid_here() -> None:
    """Exact first-level acceptance of 3 siblings drawn from a peaked q that disagrees with p."""
    p = np.array([0.2, 0.5, 0.2, 0.1])
    q = np.array([0.7, 0.2, 0.05, 0.05])

    def accepted(replacement: bool) -> float:
        total = 0.0
        for draws, prob in sibling_draws(q, 3, replacement):
            t = TokenTree()
            for tok, row in draws:
                t.add(ROOT, tok, row)
            rows = [p] + [p] * 3
            total += prob * sum(w for (path, _), w in outcome_distribution(t, rows).items() if path)
        return total

    iid, wor = accepted(True), accepted(False)
    assert wor > iid + 0.05, (iid, wor)


# ------------------------------------------------------------------------------------------------ statistics
def merged_chisquare(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson chi-square p-value; cells of probability 0 must be empty; cells expected < 5 are merged."""
    counts, probs = counts.ravel().astype(float), probs.ravel()
    assert counts[probs <= 0].sum() == 0, "an outcome of probability 0 occurred"
    keep = probs > 0
    counts, probs = counts[keep], probs[keep] / probs[keep].sum()
    expected = probs * counts.sum()
    small = expected < 5
    if small.any():
        counts = np.append(counts[~small], counts[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    return float(stats.chisquare(counts, expected).pvalue)


def sampled_tree_maker(shape: tuple, q: Model, replacement: bool) -> Callable[[np.random.Generator], TokenTree]:
    """Draft trees of this shape with siblings drawn from q like `sample_children` (checked against it in
    test_sample_children), with the rows and CDFs cached per (prefix, tokens drawn so far) to keep N trials fast."""
    cache: dict[tuple[Prefix, tuple[int, ...]], tuple[np.ndarray, list[float]]] = {}

    def row(prefix: Prefix, drawn: tuple[int, ...]) -> tuple[np.ndarray, list[float]]:
        key = (prefix, drawn if not replacement else ())
        hit = cache.get(key)
        if hit is None:
            r = q(prefix).copy()
            r[list(key[1])] = 0.0
            r = r / r.sum()
            hit = cache[key] = (r, np.cumsum(r).tolist())
        return hit

    def make(rng: np.random.Generator) -> TokenTree:
        tree = TokenTree()

        def grow(node: int, prefix: Prefix, sub: tuple) -> None:
            drawn: tuple[int, ...] = ()
            for child_shape in sub:
                r, cdf = row(prefix, drawn)
                tok = min(bisect.bisect_right(cdf, rng.random() * cdf[-1]), len(cdf) - 1)
                drawn += (tok,)
                grow(tree.add(node, tok, r), prefix + (tok,), child_shape)

        grow(ROOT, (), shape)
        return tree

    return make


def test_chi_square_implementation_matches_the_enumerated_rule() -> None:
    """For one fixed sampled tree, the outcomes (accepted path, next token) of accept_tree follow
    outcome_distribution: the rng plumbing takes the decisions the enumeration assumes."""
    V = 5
    p, q = Model(V, 31, 0, 1.0), Model(V, 31, 1, 1.0)
    rng = np.random.default_rng(31)
    tree = sampled_tree_maker(SAMPLED_DEEP, q, replacement=True)(rng)
    rows = rows_for(tree, p)
    dist = outcome_distribution(tree, rows)
    keys = sorted(dist)
    index = {k: i for i, k in enumerate(keys)}
    counts = np.zeros(len(keys))
    for _ in range(N):
        v = accept_tree(tree, rows, rng)
        counts[index[(tuple(v.path), v.token)]] += 1
    assert merged_chisquare(counts, np.array([dist[k] for k in keys])) > ALPHA


# ------------------------------------------------------------------------------------------------ greedy, coupled
def test_greedy_equals_one_hot_rows_and_plain_greedy() -> None:
    V = 6
    base = Model(V, 41, 0)
    q = Model(V, 41, 1)
    rng = np.random.default_rng(41)
    for trial in range(200):
        ctx = tuple(int(t) for t in rng.integers(0, V, size=trial % 3))
        tree = deterministic_tree(DEEP3, q, ctx) if trial % 2 else sampled_tree_maker(SAMPLED_WIDE, q, True)(rng)
        argmax = [int(np.argmax(base(ctx + tuple(tree.path_tokens(i))))) for i in [ROOT] + list(range(len(tree)))]
        one_hot = [np.eye(V)[a] for a in argmax]
        v = accept_tree_greedy(tree, argmax)
        assert v == accept_tree(tree, one_hot, rng)
        plain, seq = list(ctx), []
        for _ in range(len(v.emitted)):
            seq.append(int(np.argmax(base(tuple(plain + seq)))))
        assert v.emitted == seq


@pytest.mark.parametrize("keep", [0, 3])
def test_coupled_output_equals_plain_seeded_decoding(keep: int) -> None:
    """A seeded generation: the target's token at position t is sample_at(p, U.at(t)). Cycles verifying trees
    (deterministic top-b, or sampled with the first child drawn with the same uniform) must reproduce it."""
    V, length = 6, 14
    p, q = Model(V, 51, 0, 1.0, keep), Model(V, 51, 1, 1.3)
    accepted = 0
    for seed in range(60):
        U = PositionalUniforms(seed)
        start = (1, 2)
        plain = list(start)
        while len(plain) < len(start) + length:
            plain.append(sample_at(p(tuple(plain)), U.at(len(plain))))
        ctx = list(start)
        while len(ctx) < len(start) + length:
            L = len(ctx)
            if seed % 2:
                tree = deterministic_tree(DEEP3, q, tuple(ctx))
            else:
                tree = TokenTree()
                first = sample_at(q(tuple(ctx)), U.at(L))  # common random numbers for the first child
                a = tree.add(ROOT, first)
                for tok in np.argsort(-q(tuple(ctx)))[:2]:
                    if tok != first:
                        tree.add(ROOT, int(tok))
                tree.add(a, sample_at(q(tuple(ctx) + (first,)), U.at(L + 1)))
            rows = rows_for(tree, p, tuple(ctx))
            v = accept_tree_coupled(tree, rows, [U.at(L + d) for d in range(tree.max_depth + 1)])
            accepted += v.n_accepted
            ctx.extend(v.emitted)
        assert ctx[: len(plain)] == plain
    assert accepted > 100  # the trees were really used


# ------------------------------------------------------------------------------------------------ corner cases
def test_empty_tree_is_a_bonus_sample_of_the_root_row() -> None:
    p = np.array([0.1, 0.6, 0.0, 0.3])
    a, b = np.random.default_rng(5), np.random.default_rng(5)
    for _ in range(100):
        v = accept_tree(TokenTree(), [p], a)
        assert v == TreeVerdict([], [], sample_at(p, b.random()), True)


def test_zero_q_claim_is_rejected_and_all_zero_residual_falls_back() -> None:
    p = np.array([0.5, 0.5, 0.0, 0.0])
    q = np.array([0.0, 0.5, 0.5, 0.0])
    t = TokenTree()
    t.add(ROOT, 0, q)  # the draft claims a token it gave q = 0: no evidence, rejected
    rows = [p, p]
    for seed in range(100):
        v = accept_tree(t, rows, np.random.default_rng(seed))
        assert v.n_accepted == 0 and v.token == 0  # residual max(0, p - q) = [0.5, 0, 0, 0]
    t2 = TokenTree()
    t2.add(ROOT, 0)
    t2.add(ROOT, 1)
    one = np.array([1.0, 0.0])
    # p concentrated on the candidates: in exact arithmetic one is always accepted
    assert all(accept_tree(t2, [np.array([0.5, 0.5]), one, one], np.random.default_rng(s)).n_accepted == 1 for s in range(100))


def test_candidate_past_the_row_is_rejected() -> None:
    p = np.array([0.5, 0.5])
    t = TokenTree()
    t.add(ROOT, 7)
    t.add(ROOT, 1)
    for seed in range(100):
        v = accept_tree(t, [p, None, p], np.random.default_rng(seed))
        assert v.path in ([], [1]) and v.token in (0, 1)
        if not v.path:
            assert v.token == 0  # 1 was rejected too: only 0 is left


def test_same_seed_same_verdicts_and_one_draw_per_tried_child() -> None:
    V = 5
    p, q = Model(V, 61, 0), Model(V, 61, 1)
    tree = deterministic_tree(DEEP3, q)
    rows = rows_for(tree, p)
    a = [accept_tree(tree, rows, np.random.default_rng(s)) for s in range(100)]
    assert a == [accept_tree(tree, rows, np.random.default_rng(s)) for s in range(100)]

    class Counting:
        def __init__(self) -> None:
            self.n = 0
            self.rng = np.random.default_rng(0)

        def random(self) -> float:
            self.n += 1
            return float(self.rng.random())

    for s in range(50):
        g = Counting()
        g.rng = np.random.default_rng(s)
        v = accept_tree(tree, rows, g)  # type: ignore[arg-type]
        tried, node = 0, ROOT
        for nxt in v.path + [None]:
            kids = tree.children(node)
            tried += kids.index(nxt) + 1 if nxt is not None else len(kids)
            node = nxt if nxt is not None else node
        assert g.n == tried + 1
