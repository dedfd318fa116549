"""Exactness of every acceptance rule, proven by enumeration (pure numpy, no llama.cpp, no sampling noise).

For small vocabularies (V = 6-10), drafts of k <= 3 tokens and trees of depth <= 3, the exact law of what each rule
emits is computed (tests/support/exact.py: every draft the drafter can make with its probability, every cell of the
rule's uniforms run through the implementation itself with a scripted rng, or every decision of the tree rule via
tree.outcome_distribution) and compared with the target's law of the first K tokens (the cycle's tokens, then the
target's own samples) to TOL = 1e-9. Targets and drafts depend on the whole prefix and include exact zeros, exact
ties, near-ties (1e-13) and near-zero cells. The chain enumerations also require the implementation to give the
reference rule's outcome on every cell (not only the right law), and flag any emitted sequence of target probability
0 however small its cell; the tree enumerations hold the rule to the Draws protocol and check its bonus flag.

Families: chain rule (acceptance.accept_sampled) with sampled, deterministic and mixed drafts, vocabularies of
different sizes, filtered targets, zero-q claims; greedy (accept_greedy through speculate.verify, pathwise); seeded
/ common random numbers (accept_coupled, and speculate.verify with PositionalUniforms under a constraint: pathwise
plain seeded decoding, and in law); constraint masks and grammar-forced drafts through speculate.verify; tree rule
(tree.accept_tree_with) for deterministic, i.i.d. and without-replacement siblings, draft ids past the target's
vocabulary, forced chains with a subtree under a constraint (masked rows, forbidden nodes left out); tree greedy and
coupled rules; RngDraws (the uniforms behind accept_tree) and sample / sample_at.

Planted bugs: each family has edits of the rule's own source (exact.mutant; an edit that no longer matches fails
loudly) or hand-written wrong variants, which these checks must reject (a law off by more than BUG = 1e-3, or a
reported problem where the bug does not move the law).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from edgespec.decoding import acceptance
from edgespec.decoding.acceptance import accept_coupled, accept_greedy, accept_sampled, expected_acceptance, residual
from edgespec.config import SamplingParams
from edgespec.decoding.constraint import apply_mask
from edgespec.decoding.sampling import greedy as greedy_token
from edgespec.decoding.sampling import PositionalUniforms, Probs, sample, sample_at, warp
from edgespec.runtime.speculate import verify
from edgespec.decoding.tree import (
    ROOT,
    RngDraws,
    TokenTree,
    accept_tree_coupled,
    accept_tree_greedy,
    accept_tree_with,
    outcome_distribution,
)

from support.exact import (
    BUG,
    TOL,
    Law,
    Prefix,
    Rows,
    ScriptedRng,
    chain_branches,
    chain_law,
    chain_run,
    coupled_cells,
    cdf_cells,
    mutant,
    run_cell,
    sampled_drafts,
    sibling_draws,
)

RowFn = Callable[[Prefix], np.ndarray]


# ================================================================================================ chain rule
def assert_exact(law: Law, problems: list[str], off_theory: float = 0.0) -> None:
    assert not problems, problems[:5]
    assert off_theory == 0.0
    assert abs(law.law.sum() - 1.0) < TOL
    assert law.distance() < TOL, law.distance()


def nested_acceptance(pM: RowFn, qM: RowFn, V: int, depth: int, prefix: Prefix = ()) -> float:
    """P(the first `depth` drafts are all accepted) in closed form: sum over d_0 of min(p, q)(d_0) times the same one
    level down (expected_acceptance at every prefix)."""
    if depth == 0:
        return 1.0
    p, q = pM(prefix), qM(prefix)
    n = min(len(p), len(q))
    both = np.minimum(p[:n], q[:n])
    total = 0.0
    for t in np.flatnonzero(both > 0):
        total += both[t] * nested_acceptance(pM, qM, V, depth - 1, prefix + (int(t),))
    if depth == 1:
        assert total == pytest.approx(expected_acceptance(p, q), abs=1e-15)
    return total


CHAIN_CASES = [
    # (V, k, target kind, draft kind, mix of the target into the draft, seed)
    (6, 3, "dirichlet", "dirichlet", 0.0, 1),
    (6, 3, "sparse", "peaked", 0.0, 2),
    (6, 2, "ties", "dirichlet", 0.5, 3),
    (8, 2, "peaked", "sparse", 0.0, 4),
    (8, 2, "dirichlet", "ties", 0.7, 5),
    (10, 1, "sparse", "sparse", 0.0, 6),
    (10, 1, "ties", "peaked", 0.3, 7),
]


@pytest.mark.parametrize("V, k, pkind, qkind, mix, seed", CHAIN_CASES)
def test_chain_rule_sampled_drafts_exact(V: int, k: int, pkind: str, qkind: str, mix: float, seed: int) -> None:
    """Every draft d ~ q, every cell of the rule: the first k + 1 tokens follow the target exactly, and the rule is
    the reference rule cell by cell; the chance of keeping the first i drafts is the nested sum of min(p, q)."""
    pM = Rows(V, seed, pkind)
    qM = Rows(V, seed + 100, qkind, mix=(pM, mix) if mix else None)
    law, problems, off = chain_law(pM, V, k, qM=qM)
    assert_exact(law, problems, off)
    for i in range(1, k + 1):
        assert law.accepted[i:].sum() == pytest.approx(nested_acceptance(pM, qM, V, i), abs=1e-12)


def test_chain_rule_q_equal_to_p_accepts_everything_and_disjoint_support_nothing() -> None:
    V, k = 6, 3
    pM = Rows(V, 12, "sparse")
    law, problems, off = chain_law(pM, V, k, qM=pM)
    assert_exact(law, problems, off)
    assert law.accepted[k] == pytest.approx(1.0, abs=1e-12)  # p / q = 1 everywhere
    assert expected_acceptance(pM(()), pM(())) == pytest.approx(1.0)
    low = lambda s: np.array([0.4, 0.3, 0.2, 0.1, 0.0, 0.0]) if len(s) % 2 else np.array([0.1, 0.2, 0.3, 0.4, 0.0, 0.0])
    high = lambda s: np.array([0.0, 0.0, 0.0, 0.0, 0.5, 0.5])
    law, problems, off = chain_law(low, V, 2, qM=high)
    assert_exact(law, problems, off)
    assert law.accepted[0] == pytest.approx(1.0, abs=1e-15)
    assert expected_acceptance(low(()), high(())) == 0.0


@pytest.mark.parametrize("extra", [3, -2])
def test_chain_rule_draft_vocabulary_of_another_size_exact(extra: int) -> None:
    """q rows longer than p (ids past the target's vocabulary: certain rejections, never emitted) or shorter."""
    V = 7
    pM = Rows(V, 20 + extra, "dirichlet")
    qM = Rows(V + extra, 30 + extra, "dirichlet")
    law, problems, off = chain_law(pM, V, 2, qM=qM)
    assert_exact(law, problems, off)  # Law.add_emitted reports any id >= V as a problem
    assert nested_acceptance(pM, qM, V, 1) < 1.0
    if extra > 0:  # such drafts have positive probability, and the theory's cells (off == 0) reject them all
        assert sum(w for d, _, w in sampled_drafts(qM, 2) if d[0] >= V) > 0.05


def test_chain_rule_filtered_target_exact() -> None:
    """p from warp with top_k / top_p / min_p (zeros outside the kept set), q an unfiltered hotter draft."""
    V = 8
    base = Rows(V, 40, "dirichlet")
    params = SamplingParams(temperature=0.9, top_k=4, top_p=0.9, min_p=0.05)
    pM = lambda s: warp(np.log(base(s)).astype(np.float32), params)
    qM = lambda s: warp(np.log(base(s + (99,))).astype(np.float32), SamplingParams(temperature=1.5))
    assert (pM(()) == 0).sum() >= V - 4
    law, problems, off = chain_law(pM, V, 2, qM=qM)
    assert_exact(law, problems, off)


def all_drafts(V: int, k: int) -> list[tuple[list[int], list[np.ndarray | None], float]]:
    return [(list(d), [None] * k, 1.0) for d in itertools.product(range(V), repeat=k)]


@pytest.mark.parametrize("V, k, kind, seed", [(6, 2, "sparse", 50), (6, 3, "ties", 51), (8, 2, "dirichlet", 52)])
def test_chain_rule_deterministic_drafts_exact_for_every_draft(V: int, k: int, kind: str, seed: int) -> None:
    """q = None (n-gram, greedy draft, forced tokens): for EACH of the V^k possible drafts on its own, accepted with
    p(d) and resampled from p without d; the law is the target's whatever the guess (zero-p guesses included)."""
    pM = Rows(V, seed, kind)
    drafts = all_drafts(V, k)
    for d in drafts[:: 1 if k < 3 else 7]:  # all of them for k = 2, every 7th of the 216 for k = 3
        law, problems, off = chain_law(pM, V, k, drafts=[d])
        assert_exact(law, problems, off)


def test_chain_rule_mixed_drafts_exact() -> None:
    """Deterministic tokens first (forced scaffolding), then a draft model's samples after them: the loop's
    _after_forced chain."""
    V = 6
    pM, qM = Rows(V, 60, "sparse"), Rows(V, 61, "dirichlet")
    for lead in [(2,), (0, 4)]:
        drafts = [(list(lead) + d, [None] * len(lead) + list(rows), w) for d, rows, w in sampled_drafts(qM, 3 - len(lead), lead)]
        law, problems, off = chain_law(pM, V, 3, drafts=drafts)
        assert_exact(law, problems, off)


def test_chain_rule_k_zero_is_a_sample_of_p0() -> None:
    V = 8
    pM = Rows(V, 70, "sparse")
    law, problems, off = chain_law(pM, V, 0, drafts=[([], [], 1.0)], K=2)
    assert_exact(law, problems, off)


# ================================================================================================ greedy
def logits_model(V: int, seed: int, ties: bool = False) -> RowFn:
    """Float32 logits rows over V ids that depend on the prefix (ties: the two largest equal)."""
    cache: dict[Prefix, np.ndarray] = {}

    def f(s: Prefix) -> np.ndarray:
        s = tuple(s)
        if s not in cache:
            g = np.random.default_rng([seed, len(s), *s])
            x = (g.standard_normal(V) * 2.0).astype(np.float32)
            if ties:
                a, b = np.argsort(-x)[:2]
                x[max(a, b)] = x[min(a, b)]
            cache[s] = x
        return cache[s]

    return f


def grammar(V: int, seed: int, forced: Sequence[int] = (), allow_two: Sequence[int] = ()) -> Callable[[Prefix], np.ndarray]:
    """A toy constraint: the allowed tokens after a prefix (seeded by it), exactly one at the depths in `forced`
    (grammar-forced tokens), two at the depths in `allow_two`, else a random half or more."""

    def mask(s: Prefix) -> np.ndarray:
        g = np.random.default_rng([seed, 7, len(s), *s])
        m = np.zeros(V, dtype=bool)
        if len(s) in forced:
            m[int(g.integers(V))] = True
        elif len(s) in allow_two:
            m[g.choice(V, size=2, replace=False)] = True
        else:
            m[g.choice(V, size=int(g.integers(V // 2, V + 1)), replace=False)] = True
        return m

    return mask


def test_greedy_verify_is_plain_greedy_for_every_draft() -> None:
    """Temperature 0 through speculate.verify (penalties and masks on): for every draft in V^3 the emitted tokens
    are the plain masked greedy path, ties to the lowest id (a deterministic law: checked pathwise)."""
    V = 6
    logits, mask = logits_model(V, 80, ties=True), grammar(V, 81)
    params = SamplingParams(temperature=0.0, repeat_penalty=1.5, presence_penalty=0.2, repeat_last_n=4)
    history = [1, 1, 3]
    plain: list[int] = []
    for _ in range(4):
        s = tuple(plain)
        plain.append(greedy_token(apply_mask(logits(s), mask(s)), params, history + plain))
    assert len(set(plain)) > 1
    for d in itertools.product(range(V), repeat=3):
        n_ok = next((i for i in range(3) if not mask(tuple(d[:i]))[d[i]]), 3)
        draft = list(d[: n_ok + 1]) if n_ok < 3 else list(d)  # the loop cuts after a forbidden draft
        n_rows = len(draft) + (1 if n_ok == 3 else 0)
        rows = np.stack([logits(tuple(draft[:i])) for i in range(n_rows)])
        masks = [mask(tuple(draft[:i])) for i in range(n_rows)]
        v = verify(draft, [None] * len(draft), rows, list(history), params, np.random.default_rng(0), masks=masks)
        emitted = draft[: v.n_accepted] + [v.token]
        assert emitted == plain[: len(emitted)], (d, emitted, plain)
        assert v.n_accepted == next((i for i in range(len(draft)) if draft[i] != plain[i]), len(draft))


# ================================================================================================ coupled (seeded)
def coupled_law(
    pM: RowFn,
    qM: RowFn | None,
    V: int,
    k: int,
    rule: Callable[..., Any] = accept_coupled,
    cycle: Callable[[list[int], list[float]], list[int]] | None = None,
) -> tuple[Law, list[str]]:
    """Seeded cycles: u_i is position i's uniform, the draft samples d_i = sample_at(q_i, u_i) with it (qM None: the
    deterministic draft [0, 1, ..., k-1]), the target verifies with accept_coupled. Enumerates the common refinement
    of q_i's and p_i's inverse-CDF cells at every position up to the first mismatch (the uniforms after it are one
    cell [0, 1) each: the output must not depend on them); checks pathwise that the output is plain seeded decoding
    (x_i = sample_at(p(x_<i), u_i)) and returns the law of the first k + 1 tokens. `cycle(draft, uniforms)`: the
    emitted tokens some other way (speculate.verify with a constraint)."""
    law = Law(pM, V, k + 1)
    problems: list[str] = []

    def run(g: ScriptedRng) -> tuple[int, ...]:
        us = [g.random() for _ in range(k + 1)]
        d: list[int] = []
        for i in range(k):
            d.append(sample_at(qM(tuple(d)), us[i]) if qM is not None else i)
        if cycle is not None:
            emitted = cycle(d, us)
        else:
            v = rule(d, np.stack([pM(tuple(d[:i])) for i in range(k + 1)]), us)
            emitted = d[: v.n_accepted] + [v.token]
        plain: list[int] = []
        for i in range(len(emitted)):
            plain.append(sample_at(pM(tuple(plain)), us[i]))
        if emitted != plain:
            problems.append(f"seeded output {emitted} is not plain seeded decoding {plain}")
        return tuple(emitted)

    def grow(d: list[int], cells: list[tuple[float, float]], w: float) -> None:
        i = len(d)
        rows = [pM(tuple(d))] + ([qM(tuple(d))] if qM is not None and i < k else [])
        for lo, hi in coupled_cells(rows):
            c = cells + [(lo, hi)]
            mid = lo + 0.5 * (hi - lo)
            nxt = (sample_at(qM(tuple(d)), mid) if qM is not None else i) if i < k else -1
            if nxt != sample_at(rows[0], mid):  # the cycle ends here: later uniforms must not matter (one cell each)
                out, probs = run_cell(run, c + [(0.0, 1.0)] * (k - i))
                problems.extend(probs)
                law.add_emitted(out, w * (hi - lo))  # type: ignore[arg-type]
            else:
                grow(d + [nxt], c, w * (hi - lo))

    grow([], [], 1.0)
    return law, problems + law.problems


@pytest.mark.parametrize("V, k, pkind, qkind, seed", [(6, 2, "sparse", "dirichlet", 90), (6, 3, "ties", "peaked", 91), (8, 2, "dirichlet", "sparse", 92)])
def test_coupled_rule_is_plain_seeded_decoding_and_exact(V: int, k: int, pkind: str, qkind: str, seed: int) -> None:
    pM = Rows(V, seed, pkind)
    qM = Rows(V, seed + 1, qkind, mix=(pM, 0.5))
    law, problems = coupled_law(pM, qM, V, k)
    assert not problems, problems[:5]
    assert law.distance() < TOL
    law, problems = coupled_law(pM, None, V, k)  # a deterministic draft
    assert not problems, problems[:5]
    assert law.distance() < TOL


# ================================================================================================ constraints
def masked_target(logits: RowFn, mask: Callable[[Prefix], np.ndarray], params: SamplingParams, history: Sequence[int]) -> RowFn:
    """The plain path's distribution under a constraint: the mask for that prefix, then warp with its history."""
    cache: dict[Prefix, np.ndarray] = {}

    def f(s: Prefix) -> np.ndarray:
        s = tuple(s)
        if s not in cache:
            cache[s] = warp(apply_mask(logits(s), mask(s)), params, list(history) + list(s))
        return cache[s]

    return f


def test_masked_target_is_the_filters_on_the_allowed_set() -> None:
    """Independent of warp's code: with a mask, top-k keeps the k best ALLOWED tokens and the softmax renormalises over
    them (the mask comes before the filters, as in llama.cpp's grammar sampler)."""
    V = 9
    logits, mask = logits_model(V, 100), grammar(V, 101)
    for s in [(), (1,), (2, 3), (4, 4, 0)]:
        x, m = logits(s).astype(np.float64), mask(s)
        allowed = np.flatnonzero(m)
        kept = allowed[np.argsort(-x[allowed], kind="stable")[:3]]
        want = np.zeros(V)
        w = np.exp((x[kept] - x[kept].max()) / 0.8)
        want[kept] = w / w.sum()
        got = warp(apply_mask(logits(s), m), SamplingParams(temperature=0.8, top_k=3))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-12)
        assert set(np.flatnonzero(got)) == set(kept)


def verify_law(
    logits: RowFn,
    mask: Callable[[Prefix], np.ndarray],
    params: SamplingParams,
    history: Sequence[int],
    drafts: Sequence[tuple[list[int], list[np.ndarray | None], float]],
    V: int,
    K: int,
    verify_fn: Callable[..., Any] = verify,
) -> tuple[Law, list[str], float, np.ndarray]:
    """The exact law of speculate.verify's cycle under a constraint, with the loop's cut after a forbidden draft (it is
    a certain rejection and is never decoded); also the law of n_accepted."""
    pT = masked_target(logits, mask, params, history)
    law = Law(pT, V, K)
    problems: list[str] = []
    off = 0.0
    n_law = np.zeros(K + 1)
    for d, qrows, w in drafts:
        k = len(d)
        n_ok = next((i for i in range(k) if not mask(tuple(d[:i]))[d[i]]), k)
        draft, q = (d[: n_ok + 1], qrows[: n_ok + 1]) if n_ok < k else (d, qrows)
        n_rows = len(draft) if n_ok < k else len(draft) + 1
        rows = np.stack([logits(tuple(draft[:i])) for i in range(n_rows)])
        masks = [mask(tuple(draft[:i])) for i in range(n_rows)]
        p = [pT(tuple(draft[:i])) for i in range(n_rows)]
        if n_rows == len(draft):
            p.append(p[-1])
        for br in chain_branches(draft, q, np.stack(p)):
            if br.weight == 0.0:
                continue
            out, probs = run_cell(chain_run(verify_fn, draft, q, rows, list(history), params, masks=masks), br.cells)
            problems += probs
            if out != br.expect:
                off += w * br.weight
            if isinstance(out, tuple) and len(out) == 3:
                law.add_emitted(list(draft[: out[0]]) + [out[1]], w * br.weight)
                n_law[out[0]] += w * br.weight
    return law, problems + law.problems, off, n_law


CONSTRAINED = SamplingParams(temperature=0.9, top_k=5, min_p=0.02, repeat_penalty=1.3, repeat_last_n=6)


@pytest.mark.parametrize("masked_q", [False, True])
def test_constraint_masks_exact(masked_q: bool) -> None:
    """Sampled drafts under a constraint, through verify (mask per row for its own prefix, before warp, penalties on
    the right history): the law is the masked target's. masked_q False: the draft ignores the grammar, so forbidden
    drafts occur (cut and certainly rejected); True: a draft model that masks its q."""
    V = 7
    logits, mask = logits_model(V, 110), grammar(V, 111)
    history = [2, 5, 2]
    draft_logits = logits_model(V, 112)

    def qM(s: Prefix) -> np.ndarray:
        x = draft_logits(s)
        return warp(apply_mask(x, mask(s)) if masked_q else x, SamplingParams(temperature=1.2))

    drafts = [(d, list(r), w) for d, r, w in sampled_drafts(qM, 2)]
    law, problems, off, _ = verify_law(logits, mask, CONSTRAINED, history, drafts, V, 3)
    assert_exact(law, problems, off)
    forbidden = sum(w for d, _, w in drafts if not mask(())[d[0]] or not mask((d[0],))[d[1]])
    assert (forbidden > 0.05) != masked_q


@pytest.mark.parametrize("allow_two", [False, True])
def test_grammar_forced_drafts_exact_and_accepted_without_fail(allow_two: bool) -> None:
    """The loop's forced drafts: the tokens the grammar forces open the draft as deterministic drafts (q = None), then
    a masked draft model's samples. Where the mask allows the forced token alone (p = 1) it is accepted with
    probability exactly 1; where it allows two (allow_two) it is an ordinary deterministic draft. Exact either way."""
    V = 7
    forced_depths = (0, 1)
    mask = grammar(V, 121, forced=() if allow_two else forced_depths, allow_two=forced_depths if allow_two else ())
    logits = logits_model(V, 120)
    lead: list[int] = []
    for _ in forced_depths:
        lead.append(int(np.flatnonzero(mask(tuple(lead)))[0]))
    draft_logits = logits_model(V, 122)
    qM = lambda s: warp(apply_mask(draft_logits(s), mask(s)), SamplingParams(temperature=1.0))
    drafts = [(lead + d, [None] * len(lead) + list(r), w) for d, r, w in sampled_drafts(qM, 1, tuple(lead))]
    law, problems, off, n_law = verify_law(logits, mask, CONSTRAINED, [3], drafts, V, 4)
    assert_exact(law, problems, off)
    if allow_two:
        assert n_law[: len(lead)].sum() > 0.01
    else:
        assert n_law[: len(lead)].sum() == 0.0  # the forced tokens are never rejected


class CellUniforms(PositionalUniforms):
    """PositionalUniforms whose uniform at position L + i is us[i] (a cell's probe point)."""

    def __init__(self, L: int, us: Sequence[float]) -> None:
        super().__init__(0)
        self.L, self.us = L, list(us)

    def at(self, position: int) -> float:
        return float(self.us[position - self.L])


@pytest.mark.parametrize("masked_q", [False, True])
def test_seeded_verify_under_a_constraint_is_plain_seeded_decoding(masked_q: bool) -> None:
    """speculate.verify with PositionalUniforms (common random numbers) under a constraint, with the loop's cut after
    a forbidden draft: on every cell of the uniforms the output is plain seeded masked decoding; the law is the
    masked target's."""
    V, k = 7, 2
    logits, mask = logits_model(V, 190), grammar(V, 191)
    history = [1, 4]
    pT = masked_target(logits, mask, CONSTRAINED, history)
    draft_logits = logits_model(V, 192)
    qM = lambda s: warp(apply_mask(draft_logits(s), mask(s)) if masked_q else draft_logits(s), SamplingParams(temperature=1.1))

    def cycle(d: list[int], us: list[float]) -> list[int]:
        n_ok = next((i for i in range(k) if not mask(tuple(d[:i]))[d[i]]), k)
        draft = d[: n_ok + 1] if n_ok < k else d
        n_rows = len(draft) + (1 if n_ok == k else 0)
        rows = np.stack([logits(tuple(draft[:i])) for i in range(n_rows)])
        masks = [mask(tuple(draft[:i])) for i in range(n_rows)]
        v = verify(draft, [qM(tuple(draft[:i])) for i in range(len(draft))], rows, list(history), CONSTRAINED, CellUniforms(len(history), us), masks=masks)
        return draft[: v.n_accepted] + [v.token]

    law, problems = coupled_law(pT, qM, V, k, cycle=cycle)
    assert not problems, problems[:5]
    assert law.distance() < TOL


# ================================================================================================ tree rules
def rows_for(tree: TokenTree, pM: RowFn, skip: set[int] | None = None) -> list[np.ndarray | None]:
    """The root row, then the target's row after the path to each node (None for nodes left out and their subtrees,
    as tree.batch leaves them out)."""
    skipped: set[int] = set()
    out: list[np.ndarray | None] = [pM(())]
    for i in range(len(tree)):
        parent = tree.parents[i]
        if (skip and i in skip) or (parent != ROOT and parent in skipped):
            skipped.add(i)
            out.append(None)
        else:
            out.append(pM(tuple(tree.path_tokens(i))))
    return out


class _CheckedDraws:
    """Draws that hold the rule to the protocol: accept(num, den) only with den > 0 (RngDraws and the enumeration's
    draws read den <= 0 differently, so a rule that passes it would be exact under one and not the other)."""

    def __init__(self, draws: Any, problems: list[str]) -> None:
        self.draws, self.problems = draws, problems

    def accept(self, num: float, den: float) -> bool:
        if not den > 0:
            self.problems.append(f"accept({num}, {den}): den must be > 0")
        return bool(self.draws.accept(num, den))

    def choose(self, weights: np.ndarray) -> int:
        return int(self.draws.choose(weights))


def guarded(rule: Callable[..., Any], problems: list[str]) -> Callable[..., Any]:
    """The tree rule with its draws checked (_CheckedDraws) and its bonus flag checked ("the last accepted node is a
    leaf"); violations go to `problems`."""

    def checked(tree: TokenTree, rows: Any, draws: Any) -> Any:
        v = rule(tree, rows, _CheckedDraws(draws, problems))
        if v.bonus != (not tree.children(v.path[-1] if v.path else ROOT)):
            problems.append(f"bonus {v.bonus} after the path {v.path}")
        return v

    return checked


def tree_law(
    trees: Sequence[tuple[TokenTree, float]],
    pM: RowFn,
    V: int,
    K: int,
    rule: Callable[..., Any] = accept_tree_with,
    skip: Callable[[TokenTree], set[int]] | None = None,
) -> Law:
    """The exact law of the first K tokens after one tree cycle (the tree rule's decisions enumerated by
    tree.outcome_distribution), over trees drawn with the given probabilities; `skip`: the nodes left out of a tree.
    A verdict whose bonus flag is not "the last accepted node is a leaf" is a problem."""
    law = Law(pM, V, K)
    checked = guarded(rule, law.problems)
    for tree, w in trees:
        rows = rows_for(tree, pM, skip(tree) if skip else None)
        for (path, token), pr in outcome_distribution(tree, rows, checked).items():
            law.add_emitted([tree.token(i) for i in path] + [token], w * pr)
    return law


def top_tree(shape: tuple, qM: RowFn, prefix: Prefix = (), tree: TokenTree | None = None, node: int = ROOT) -> TokenTree:
    """A deterministic tree: at each node the draft's top-b tokens (b = the shape's width there; a shape is a tuple of
    child shapes, () a leaf)."""
    tree = tree if tree is not None else TokenTree()
    ranked = np.argsort(-qM(prefix), kind="stable")
    for rank, sub in enumerate(shape):
        t = int(ranked[rank])
        top_tree(sub, qM, prefix + (t,), tree, tree.add(node, t))
    return tree


def sampled_trees(shape: tuple, qM: RowFn, replacement: bool, lead: Sequence[int] = ()) -> list[tuple[TokenTree, float]]:
    """Every realisation of a sampled tree of this shape (siblings i.i.d. or without replacement from qM at their
    parent's path), with its probability; `lead`: a deterministic chain above it (forced tokens)."""

    def realise(prefix: Prefix, sub: tuple) -> list[tuple[list, float]]:
        if not sub:
            return [([], 1.0)]
        out = []
        for draws, pr in sibling_draws(qM(prefix), len(sub), replacement):
            options = [realise(prefix + (t,), s) for (t, _), s in zip(draws, sub)]
            for combo in itertools.product(*options):
                w = pr * float(np.prod([c[1] for c in combo]))
                out.append(([(t, row, c[0]) for (t, row), c in zip(draws, combo)], w))
        return out

    result = []
    for realisation, w in realise(tuple(lead), shape):
        tree = TokenTree()
        node = ROOT
        for t in lead:
            node = tree.add(node, t)
        todo = [(node, realisation)]
        while todo:
            parent, kids = todo.pop(0)
            for t, row, sub in kids:
                todo.append((tree.add(parent, t, row), sub))
        result.append((tree, w))
    return result


DEEP3 = ((((),), ()), ((),), ())  # 3 children at the root, depth 3 under the first
WIDE = (((),), ())  # 2 sampled children, a grandchild under the first


@pytest.mark.parametrize("V, kind, qkind, seed", [(6, "sparse", "dirichlet", 130), (8, "ties", "peaked", 131), (10, "dirichlet", "sparse", 132)])
def test_tree_rule_deterministic_siblings_exact(V: int, kind: str, qkind: str, seed: int) -> None:
    pM, qM = Rows(V, seed, kind), Rows(V, seed + 1, qkind)
    for q in (qM, pM):  # a draft that disagrees, and the target's own top choices (deep acceptance)
        law = tree_law([(top_tree(DEEP3, q), 1.0)], pM, V, 4)
        assert law.distance() < TOL and not law.problems


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("V, kind, qkind, seed", [(6, "dirichlet", "dirichlet", 140), (6, "sparse", "ties", 141), (6, "ties", "peaked", 142)])
def test_tree_rule_sampled_siblings_exact(V: int, kind: str, qkind: str, seed: int, replacement: bool) -> None:
    """i.i.d. siblings (duplicates included) and siblings without replacement, every realisation enumerated."""
    pM = Rows(V, seed, kind)
    qM = Rows(V, seed + 1, qkind, mix=(pM, 0.3))
    trees = sampled_trees(WIDE, qM, replacement)
    assert sum(w for _, w in trees) == pytest.approx(1.0, abs=1e-12)
    assert any(t.token(0) == t.token(1) for t, _ in trees) == replacement
    law = tree_law(trees, pM, V, 3)
    assert law.distance() < TOL and not law.problems


@pytest.mark.parametrize("replacement", [True, False])
def test_tree_rule_draft_vocabulary_larger_than_the_target(replacement: bool) -> None:
    """Siblings drawn from a draft row 2 ids longer than the target's: those ids (and their subtrees) are not decoded
    (rows None, as tree.batch with n_vocab leaves them out), never accepted, never emitted; the law stays exact."""
    V = 6
    pM, qM = Rows(V, 145, "dirichlet"), Rows(V + 2, 146, "dirichlet")
    trees = sampled_trees(WIDE, qM, replacement)
    past = lambda t: {i for i in range(len(t)) if t.token(i) >= V}
    law = tree_law(trees, pM, V, 3, skip=past)
    assert law.distance() < TOL and not law.problems
    assert sum(w for t, w in trees if past(t)) > 0.1


@pytest.mark.parametrize("subtree", ["sampled", "deterministic"])
def test_tree_rule_forced_chain_with_a_subtree_under_a_constraint(subtree: str) -> None:
    """The loop's tree under forced drafts: a deterministic forced chain, then siblings drawn without replacement (or
    a draft's top choices) below it; masked rows (the mask of each node's own path before warp) and nodes the
    constraint forbids left out (rows None)."""
    V = 6
    logits = logits_model(V, 150)
    mask = grammar(V, 151, forced=(0,))
    pT = masked_target(logits, mask, CONSTRAINED, [4])
    lead = [int(np.flatnonzero(mask(()))[0])]
    qM = Rows(V, 152, "dirichlet")  # an unmasked draft: some siblings are forbidden

    def skip(tree: TokenTree) -> set[int]:
        return {i for i in range(len(tree)) if not mask(tuple(tree.path_tokens(i)[:-1]))[tree.token(i)]}

    if subtree == "sampled":
        trees = sampled_trees(WIDE, qM, False, lead)
    else:
        t = TokenTree.chain(lead)  # an n-gram-like drafter that ranks what the grammar forbids first
        trees = [(top_tree(DEEP3, lambda s: qM(s) + 2.0 * ~mask(s), tuple(lead), t, 0), 1.0)]
    law = tree_law(trees, pT, V, 4, skip=skip)
    assert law.distance() < TOL and not law.problems
    assert sum(w for t, w in trees if skip(t)) > 0.05


def test_tree_greedy_rule_is_plain_greedy_on_every_tree() -> None:
    """accept_tree_greedy = accept_tree_with on one-hot rows = the target's argmax path, for deterministic trees of
    every draft's top choices and for sampled trees."""
    V = 6
    base = Rows(V, 160, "ties")
    argmax = lambda s: int(np.argmax(base(s)))  # ties to the lowest id
    onehot = lambda s: np.eye(V)[argmax(s)]
    trees = [top_tree(DEEP3, Rows(V, 161 + i, "dirichlet")) for i in range(6)] + [top_tree(DEEP3, base)]
    trees += [t for t, _ in sampled_trees(WIDE, Rows(V, 170, "sparse"), True)]
    for tree in trees:
        tokens = [argmax(tuple(tree.path_tokens(i))) if i != ROOT else argmax(()) for i in [ROOT, *range(len(tree))]]
        v = accept_tree_greedy(tree, tokens)
        dist = outcome_distribution(tree, rows_for(tree, onehot))
        assert dist == {(tuple(v.path), v.token): pytest.approx(1.0, abs=1e-15)}
        plain: list[int] = []
        for _ in v.emitted:
            plain.append(argmax(tuple(plain)))
        assert v.emitted == plain


def test_tree_coupled_rule_is_plain_seeded_decoding_and_exact() -> None:
    """Seeded trees: the root's first child drawn from q with the position's uniform, the draft's next two top choices
    as siblings, a grandchild drawn with the next uniform; enumerated over the refinement of the cells of p and q at
    each depth: the output is plain seeded decoding on every cell, hence the target's law."""
    V = 6
    pM, qM = Rows(V, 180, "sparse"), Rows(V, 181, "dirichlet")
    law = Law(pM, V, 3)
    problems: list[str] = []

    def run(g: ScriptedRng) -> tuple[int, ...]:
        us = [g.random() for _ in range(3)]
        tree = TokenTree()
        first = sample_at(qM(()), us[0])
        a = tree.add(ROOT, first)
        for tok in np.argsort(-qM(()), kind="stable")[:2]:
            if int(tok) != first:
                tree.add(ROOT, int(tok))
        tree.add(a, sample_at(qM((first,)), us[1]))
        v = accept_tree_coupled(tree, rows_for(tree, pM), us)
        plain: list[int] = []
        for i in range(len(v.emitted)):
            plain.append(sample_at(pM(tuple(plain)), us[i]))
        if v.emitted != plain:
            problems.append(f"{v.emitted} != {plain}")
        return tuple(v.emitted)

    for c0 in coupled_cells([pM(()), qM(())]):
        first = sample_at(qM(()), 0.5 * (c0[0] + c0[1]))
        x0 = sample_at(pM(()), 0.5 * (c0[0] + c0[1]))
        for c1 in coupled_cells([pM((x0,)), qM((first,))]):
            x1 = sample_at(pM((x0,)), 0.5 * (c1[0] + c1[1]))
            for c2 in coupled_cells([pM((x0, x1))]):
                out, probs = run_cell(run, [c0, c1, c2])
                problems += probs
                law.add_emitted(out, (c0[1] - c0[0]) * (c1[1] - c1[0]) * (c2[1] - c2[0]))  # type: ignore[arg-type]
    assert not problems, problems[:5]
    assert law.distance() < TOL


def test_zero_q_claims_are_rejected_exactly() -> None:
    """A draft that reports a token its own q gives probability 0 (no evidence; such a draft is not a sample of q, so
    the output need not be the target's): rejected with probability exactly 1 in the chain rule (every cell; the next
    token from the residual max(0, p - q), cell by cell) and in the tree rule (every decision)."""
    V = 6
    pM = Rows(V, 250, "dirichlet")
    q = np.array([0.0, 0.5, 0.0, 0.5, 0.0, 0.0])  # q(0) = q(2) = 0
    law, problems, off = chain_law(pM, V, 1, drafts=[([0], [q], 1.0)])
    assert not problems and off == 0.0 and law.accepted[0] == 1.0
    for kids in ([0], [2, 0]):
        tree = TokenTree()
        for t in kids:
            tree.add(ROOT, t, q)
        problems: list[str] = []
        dist = outcome_distribution(tree, rows_for(tree, pM), guarded(accept_tree_with, problems))
        assert not problems and all(not path for path, _ in dist), dist
        r = np.maximum(pM(()) - q, 0.0)
        assert {t: pytest.approx(w, abs=1e-15) for (_, t), w in dist.items()} == {int(t): r[t] / r.sum() for t in np.flatnonzero(r)}


# ================================================================================================ randomness
def test_rng_draws_turn_decisions_into_uniforms_exactly() -> None:
    """accept_tree = accept_tree_with(RngDraws): accept(num, den) is True exactly for u < num / den, choose(w) is
    sample_at(w, u). Together with the enumerations above, accept_tree's law is exact."""
    for num, den in [(0.3, 0.9), (0.0, 1.0), (2.0, 1.0), (1e-12, 3.0), (0.25, 0.25)]:
        a = min(1.0, num / den)
        for lo, hi, want in [(0.0, a, True), (a, 1.0, False)]:
            if hi > lo:
                out, problems = run_cell(lambda g, num=num, den=den: RngDraws(g).accept(num, den), [(lo, hi)])  # type: ignore[misc]
                assert not problems and out is want
    w = np.array([0.0, 0.3, 0.0, 1.2, 0.5])
    for t, lo, hi in cdf_cells(w):
        out, problems = run_cell(lambda g: RngDraws(g).choose(w), [(lo, hi)])  # type: ignore[arg-type]
        assert not problems and out == t


@pytest.mark.parametrize("V, sparse", [(9, False), (9, True), (6000, True)])
def test_sample_law_is_exact(V: int, sparse: bool) -> None:
    """sample(probs, rng) with one uniform: token t exactly on [C_{t-1}/C, C_t/C) (unnormalised rows, zeros inside,
    and a sparse row past 4096 ids, which takes sample_at's support path); never a zero-probability id."""
    g = np.random.default_rng(V + sparse)
    probs = np.zeros(V)
    support = g.choice(V, size=min(V, 9), replace=False)
    probs[support] = g.dirichlet(np.ones(len(support))) * 3.7
    if sparse:
        probs[support[:3]] = 0.0
    law = np.zeros(V)
    for t, lo, hi in cdf_cells(probs):
        out, problems = run_cell(lambda rng: sample(probs, rng), [(lo, hi)])  # type: ignore[arg-type]
        assert not problems and out == t
        law[t] += hi - lo
    np.testing.assert_allclose(law, probs / probs.sum(), rtol=0, atol=1e-15)


# ================================================================================================ planted bugs
def bug_mask_after_warp(draft, q, logits, history, sampling, rng, masks=None, **_: Any):  # type: ignore[no-untyped-def]
    """Wrong: the constraint applied after warp (filters on the unmasked row, then forbidden tokens zeroed)."""
    rows = []
    ctx = list(history)
    for i in range(logits.shape[0]):
        p = warp(logits[i], sampling, ctx)
        p = np.where(masks[i], p, 0.0) if masks is not None else p
        rows.append(p / p.sum() if p.sum() > 0 else np.where(masks[i], 1.0, 0.0) / masks[i].sum())
        if i < len(draft):
            ctx.append(draft[i])
    if len(rows) == len(draft):
        rows.append(rows[-1])
    return accept_sampled(draft, q, np.stack(rows), rng)


def bug_mask_after_ratio(draft, q, logits, history, sampling, rng, masks=None, **_: Any):  # type: ignore[no-untyped-def]
    """Wrong: acceptance decided on the unmasked target (the mask applied only to the token emitted after a rejection)."""
    ctx, raw, masked = list(history), [], []
    for i in range(logits.shape[0]):
        raw.append(warp(logits[i], sampling, ctx))
        masked.append(warp(apply_mask(logits[i], masks[i]), sampling, ctx))
        if i < len(draft):
            ctx.append(draft[i])
    if len(raw) == len(draft):
        raw.append(raw[-1])
        masked.append(masked[-1])
    for i in range(len(draft)):
        if rng.random() * (1.0 if q[i] is None else float(q[i][draft[i]])) < float(raw[i][draft[i]]):
            continue
        r = residual(masked[i], q[i], draft[i])
        return acceptance.Verdict(i, sample(r if r.any() else masked[i], rng), False)
    return acceptance.Verdict(len(draft), sample(masked[-1], rng), True)


def forced_accepted_unverified(draft, q, logits, history, sampling, rng, masks=None, **_: Any):  # type: ignore[no-untyped-def]
    """Wrong: deterministic (forced) drafts kept without verification, the rest verified after them."""
    n = 0
    while n < len(draft) and q[n] is None:
        n += 1
    rest = verify(draft[n:], q[n:], logits[n:], list(history) + list(draft[:n]), sampling, rng, masks=masks[n:] if masks else None)
    return acceptance.Verdict(n + rest.n_accepted, rest.token, rest.bonus)


def chain_distance(rule: Callable[..., Any], deterministic: bool = False) -> float:
    V = 6
    pM = Rows(V, 200, "dirichlet")
    if deterministic:
        law, _, _ = chain_law(pM, V, 2, drafts=[([1, 3], [None, None], 1.0)], rule=rule)
    else:
        law, _, _ = chain_law(pM, V, 2, qM=Rows(V, 201, "dirichlet"), rule=rule)
    return law.distance()


CHAIN_MUTANTS = {
    "every draft accepted": (mutant(accept_sampled, ("if q_d > 0.0 and u * q_d < p_d:", "if True:")), False),
    "accept u < p(d), q ignored": (mutant(accept_sampled, ("u * q_d < p_d", "u < p_d")), False),
    "ratio inverted (q/p)": (mutant(accept_sampled, ("u * q_d < p_d", "u * p_d < q_d")), False),
    "residual = p, not max(0, p - q)": (mutant(accept_sampled, ("r = residual(p_i, q_i, d_i)", "r = p_i")), False),
    "residual q not subtracted": (mutant(accept_sampled, helpers=[(residual, [("r[:n] -= q[:n]", "pass")])]), False),
    "bonus from the last drafted row": (mutant(accept_sampled, ("sample(_row(p[k]), rng)", "sample(_row(p[k - 1]), rng)")), False),
    "deterministic residual keeps d": (
        mutant(accept_sampled, helpers=[(residual, [("r[draft_token] = 0.0  # max(0, p(d) - 1) = 0", "pass")])]),
        True,
    ),
    "deterministic accept with p(d)^2": (mutant(accept_sampled, ("u * q_d < p_d", "u * q_d < p_d * p_d")), True),
}


@pytest.mark.parametrize("name", list(CHAIN_MUTANTS))
def test_planted_bug_in_the_chain_rule_fails(name: str) -> None:
    rule, deterministic = CHAIN_MUTANTS[name]
    assert chain_distance(accept_sampled, deterministic) < TOL
    assert chain_distance(rule, deterministic) > BUG


def on_probs(rule: Callable[..., Any], dense: bool = False, cls: type = Probs) -> Callable[..., Any]:
    """`rule` given its p and q rows as sampling.Probs, what the loop passes (warp_probs): the support's ids and
    weights (dense=False), or a whole row of weights (dense=True)."""

    def conv(r: np.ndarray) -> Probs:
        r = np.asarray(r, dtype=np.float64)
        if dense:
            return cls(r.size, None, r.copy())
        ids = np.flatnonzero(r > 0)
        return cls(r.size, ids, r[ids])

    def run(draft: Any, q: Any, p: Any, rng: Any) -> Any:
        return rule(draft, [None if r is None else conv(r) for r in q], [conv(r) for r in p], rng)

    return run


@pytest.mark.parametrize("dense", [False, True], ids=["support", "whole-row"])
@pytest.mark.parametrize("V, k, pkind, qkind, mix, seed", CHAIN_CASES)
def test_chain_rule_on_probs_rows_exact(V: int, k: int, pkind: str, qkind: str, mix: float, seed: int, dense: bool) -> None:
    """The chain rule on the loop's row type (sampling.Probs, its residual and overlap): every draft d ~ q, every
    cell, exact as on dense rows; deterministic drafts too."""
    pM = Rows(V, seed, pkind)
    qM = Rows(V, seed + 100, qkind, mix=(pM, mix) if mix else None)
    law, problems, off = chain_law(pM, V, k, qM=qM, rule=on_probs(accept_sampled, dense))
    assert_exact(law, problems, off)
    law, problems, off = chain_law(pM, V, 2, drafts=[([1, 3], [None, None], 1.0)], rule=on_probs(accept_sampled, dense))
    assert_exact(law, problems, off)


def _probs_mutant(*edits: tuple[str, str]) -> type:
    """A Probs whose residual (`minus`) carries a planted bug."""
    bad = mutant(Probs.minus, *edits)
    return type("BadProbs", (Probs,), {"minus": bad})


PROBS_MUTANTS = {
    "support residual: q not subtracted": (
        ("r = self.w / self.total - q.probs_of(np.minimum(self.ids, q.n - 1)) * (self.ids < q.n)", "r = self.w / self.total"),
        False, False,
    ),
    "whole-row residual: q not subtracted": (("r -= q.w * (1.0 / q.total)", "pass"), False, True),
    "support residual keeps a deterministic d": (("w[j] = 0.0", "w[j] = w[j]"), True, False),
    "whole-row residual keeps a deterministic d": (("w[d] = 0.0", "w[d] = w[d]"), True, True),
}


@pytest.mark.parametrize("name", list(PROBS_MUTANTS))
def test_planted_bug_in_the_probs_residual_fails(name: str) -> None:
    edit, deterministic, dense = PROBS_MUTANTS[name]
    assert chain_distance(on_probs(accept_sampled, dense), deterministic) < TOL
    assert chain_distance(on_probs(accept_sampled, dense, _probs_mutant(edit)), deterministic) > BUG


@pytest.mark.parametrize(
    "name, edit",
    [
        ("one uniform for every position", ("float(uniforms[i])", "float(uniforms[0])")),
        ("target sampled at 1 - u", ("sample_at(_row(p[i]), float(uniforms[i]))", "sample_at(_row(p[i]), 1.0 - float(uniforms[i]))")),
        ("kept on a mismatch", ("int(draft_tokens[i]) != x", "int(draft_tokens[i]) == x")),
    ],
)
def test_planted_bug_in_the_coupled_rule_fails(name: str, edit: tuple[str, str]) -> None:
    V = 6
    pM, qM = Rows(V, 210, "dirichlet"), Rows(V, 211, "dirichlet")
    law, _ = coupled_law(pM, qM, V, 2, rule=mutant(accept_coupled, edit))
    assert law.distance() > BUG


@pytest.mark.parametrize(
    "name, edit",
    [
        ("next token one row late", ("token=int(target_tokens[n])", "token=int(target_tokens[min(n + 1, k)])")),
        ("a mismatch kept", ("int(draft_tokens[n]) == int(target_tokens[n])", "int(draft_tokens[n]) >= int(target_tokens[n])")),
    ],
)
def test_planted_bug_in_the_greedy_rule_fails(name: str, edit: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    import edgespec.runtime.speculate as speculate

    monkeypatch.setattr(speculate, "accept_greedy", mutant(accept_greedy, edit))
    with pytest.raises(AssertionError):
        test_greedy_verify_is_plain_greedy_for_every_draft()


@pytest.mark.parametrize(
    "name, bug",
    [
        ("mask ignored", mutant(verify, ("logits = np.stack([apply_mask(logits[i], masks[i]) for i in range(n_rows)])", "pass"))),
        ("mask applied after warp", bug_mask_after_warp),
        ("mask applied after the ratio", bug_mask_after_ratio),
    ],
)
def test_planted_bug_in_the_constraint_path_fails(name: str, bug: Callable[..., Any]) -> None:
    V = 7
    logits, mask = logits_model(V, 110), grammar(V, 111)
    qM = lambda s: warp(logits_model(V, 112)(s), SamplingParams(temperature=1.2))
    drafts = [(d, list(r), w) for d, r, w in sampled_drafts(qM, 2)]
    law, problems, _, _ = verify_law(logits, mask, CONSTRAINED, [2, 5, 2], drafts, V, 3, verify_fn=bug)
    assert law.distance() > BUG or problems


def test_planted_bug_forced_drafts_kept_unverified_fails() -> None:
    """Keeping forced drafts without verification is right only where the mask allows them alone."""
    V = 7
    mask = grammar(V, 121, allow_two=(0, 1))
    logits = logits_model(V, 120)
    lead: list[int] = []
    for _ in range(2):
        lead.append(int(np.flatnonzero(mask(tuple(lead)))[0]))
    drafts: list[tuple[list[int], list[np.ndarray | None], float]] = [(lead, [None, None], 1.0)]
    law, _, _, _ = verify_law(logits, mask, CONSTRAINED, [3], drafts, V, 3, verify_fn=forced_accepted_unverified)
    assert law.distance() > BUG


TREE_MUTANTS = [
    ("sibling residual not updated", ("r = np.asarray(residual(r, None if q is None", "_ = np.asarray(residual(r, None if q is None"), "det"),
    ("sibling residual q not scaled by the normaliser", ("z * np.asarray(q, dtype=np.float64)", "np.asarray(q, dtype=np.float64)"), "iid"),
    ("ratio against the unnormalised residual", ("draws.accept(_prob(r, x), q_x * z)", "draws.accept(_prob(r, x), q_x)"), "det"),
    ("ratio against the unreduced row", ("draws.accept(_prob(r, x), q_x * z)", "draws.accept(_prob(row, x), q_x)"), "wor"),
    ("final sample from the row, not the residual", ("draws.choose(r), not kids)", "draws.choose(row), not kids)"), "det"),
]


@pytest.mark.parametrize("name, edit, kind", TREE_MUTANTS, ids=[m[0] for m in TREE_MUTANTS])
def test_planted_bug_in_the_tree_rule_fails(name: str, edit: tuple[str, str], kind: str) -> None:
    V = 6
    pM, qM = Rows(V, 220, "dirichlet"), Rows(V, 221, "dirichlet", mix=(Rows(V, 220, "dirichlet"), 0.4))
    trees = [(top_tree(DEEP3, pM), 1.0)] if kind == "det" else sampled_trees(WIDE, qM, kind == "iid")
    assert tree_law(trees, pM, V, 3).distance() < TOL
    assert tree_law(trees, pM, V, 3, rule=mutant(accept_tree_with, edit)).distance() > BUG


def test_planted_bugs_in_the_tree_rule_corners_fail() -> None:
    """A zero-q claim accepted now and then, or passed to accept() with den 0, and a wrong bonus flag: none moves the
    target's law on honest trees, all fail the exact checks (the zero-q enumeration, guarded()'s checks)."""
    V = 6
    pM = Rows(V, 250, "dirichlet")
    q = np.array([0.0, 0.5, 0.0, 0.5, 0.0, 0.0])
    tree = TokenTree()
    tree.add(ROOT, 0, q)
    claim = mutant(accept_tree_with, ("accepted = draws.accept(0.0, 1.0)", "accepted = draws.accept(1e-3, 1.0)"))
    assert any(path for path, _ in outcome_distribution(tree, rows_for(tree, pM), claim))
    problems: list[str] = []
    unguarded = mutant(accept_tree_with, ("if q_x > 0.0 and z > 0.0:", "if q_x > 0.0 or z > 0.0:"))
    outcome_distribution(tree, rows_for(tree, pM), guarded(unguarded, problems))
    assert problems  # accept(p(x), 0): RngDraws would accept it
    flag = mutant(accept_tree_with, ("draws.choose(r), not kids)", "draws.choose(r), bool(kids))"))
    law = tree_law([(top_tree(DEEP3, pM), 1.0)], pM, V, 3, rule=flag)
    assert law.distance() < TOL and law.problems


@pytest.mark.parametrize(
    "name, edit",
    [
        ("one uniform for every depth", ("float(uniforms[len(path)])", "float(uniforms[0])")),
        ("kept on a mismatch", ("tree.token(c) == x", "tree.token(c) != x")),
    ],
)
def test_planted_bug_in_the_tree_coupled_and_greedy_rules_fails(name: str, edit: tuple[str, str]) -> None:
    V = 6
    pM, qM = Rows(V, 230, "dirichlet"), Rows(V, 231, "dirichlet")
    tree = top_tree(DEEP3, qM)
    rule = mutant(accept_tree_coupled, edit)
    law = Law(pM, V, 3)
    for c0 in coupled_cells([pM(())]):
        x0 = sample_at(pM(()), 0.5 * sum(c0))
        for c1 in coupled_cells([pM((x0,))]):
            x1 = sample_at(pM((x0,)), 0.5 * sum(c1))
            for c2 in coupled_cells([pM((x0, x1))]):
                us = [0.5 * sum(c) for c in (c0, c1, c2)] + [0.5]
                v = rule(tree, rows_for(tree, pM), us)
                law.add_emitted(v.emitted, (c0[1] - c0[0]) * (c1[1] - c1[0]) * (c2[1] - c2[0]))
    assert law.distance() > BUG
    greedy_bug = mutant(accept_tree_greedy, ("tree.token(c) == int(x)", "tree.token(c) != int(x)"))
    argmax = [int(np.argmax(pM(tuple(tree.path_tokens(i)) if i != ROOT else ()))) for i in [ROOT, *range(len(tree))]]
    assert greedy_bug(tree, argmax) != accept_tree_greedy(tree, argmax)


@pytest.mark.parametrize(
    "edit",
    [("self.rng.random() * den < num", "self.rng.random() < num"), ("self.rng.random() * den < num", "self.rng.random() * num < den")],
)
def test_planted_bug_in_rng_draws_fails(edit: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """accept_tree's uniforms: a wrong threshold in RngDraws.accept fails its exact check."""
    monkeypatch.setattr(RngDraws, "accept", mutant(RngDraws.accept, edit))
    with pytest.raises(AssertionError):
        test_rng_draws_turn_decisions_into_uniforms_exactly()


def test_planted_bug_in_sample_fails() -> None:
    """sample_at's inverse CDF not scaled by the row's total (residual rows are unnormalised)."""
    from edgespec.decoding import sampling

    bad = mutant(sampling._inverse_cdf, ("cdf.searchsorted(u * total", "cdf.searchsorted(u"))
    probs = np.array([0.6, 0.0, 0.9, 1.5])
    outs = [bad(probs, 0.5 * (lo + hi)) == t for t, lo, hi in cdf_cells(probs)]
    assert not all(outs)


def test_the_mutants_are_real_edits() -> None:
    """mutant() refuses an edit that does not match the rule's source exactly once (a refactor must update the test,
    not silently plant nothing)."""
    with pytest.raises(AssertionError, match="occurs 0 times"):
        mutant(accept_sampled, ("this text is not in the rule", "x"))
    assert mutant(accept_sampled)([1], [None], np.array([[0, 1.0], [1.0, 0]]), ScriptedRng([0.5, 0.5])) == accept_sampled(
        [1], [None], np.array([[0, 1.0], [1.0, 0]]), ScriptedRng([0.5, 0.5])
    )
