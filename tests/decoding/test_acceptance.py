"""edgespec.decoding.acceptance: exact speculative sampling must reproduce the target distribution p whatever the draft q.

The exactness of the chain rule is proven by enumeration in tests/decoding/test_exact_laws.py (every draft, every cell
of the rule's uniforms, the law of the first k + 1 tokens to 1e-9, planted bugs). Here: corner cases, shapes,
determinism, greedy verification, expected_acceptance, and one statistical smoke test of a whole draft/verify loop on a
real rng (test_joint_distribution_markov_target: N = 20,000 sequences, Pearson chi-square at ALPHA = 1e-3, fixed seed).
"""

from __future__ import annotations

import bisect

import numpy as np
import pytest
from scipy import stats

from edgespec.decoding.acceptance import Verdict, accept_greedy, accept_sampled, expected_acceptance, residual
from edgespec.decoding.sampling import sample

from support.exact import chain_branches, chain_run, run_cell

ALPHA = 1e-3  # chi-square significance level
N = 20_000  # trials per statistical test


def chi_square_pvalue(counts: np.ndarray, probs: np.ndarray) -> float:
    """Pearson chi-square p-value of counts against probs; cells with probability 0 must be empty."""
    counts = np.asarray(counts).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    support = probs > 0
    assert counts[~support].sum() == 0, "emitted a token the target gives probability 0"
    expected = probs[support] / probs[support].sum() * counts.sum()
    return float(stats.chisquare(counts[support], expected).pvalue)


def random_rows(rng: np.random.Generator, k: int, V: int, alpha: float = 1.0) -> np.ndarray:
    return rng.dirichlet(np.full(V, alpha), size=k)


def test_deterministic_proposal_with_certain_target_is_always_accepted() -> None:
    p = np.array([[0, 0, 1.0, 0], [0.25, 0.25, 0.25, 0.25]])
    rng = np.random.default_rng(0)
    for _ in range(200):
        v = accept_sampled([2], [None], p, rng)
        assert v.n_accepted == 1 and v.bonus


def test_k_zero_samples_p0_as_a_bonus() -> None:
    p = np.array([[0.1, 0.6, 0.0, 0.3]])
    a, b = np.random.default_rng(22), np.random.default_rng(22)
    for _ in range(100):
        v = accept_sampled([], [], p, a)
        assert v == Verdict(n_accepted=0, token=sample(p[0], b), bonus=True)


# ---------------------------------------------------------------------------------------------------------
# Joint distribution of emitted sequences, through a real draft/verify loop
# ---------------------------------------------------------------------------------------------------------


def first_two_tokens(target: np.ndarray, draft: np.ndarray, k: int, n: int, seed: int) -> np.ndarray:
    """Run a speculative decoding loop for n sequences and return their first two tokens (n, 2).

    target[s] / draft[s]: the next-token distributions after token s (a first-order Markov chain, state 0 =
    start). A cycle after state s drafts d_0 ~ draft[s], d_1 ~ draft[d_0], ...; the target rows are
    target[s], target[d_0], ..., target[d_{k-1}] (each conditioned on the drafted prefix), as a real engine
    would score them. Cycles repeat until two tokens are out.
    """
    rng = np.random.default_rng(seed)
    draft_cdf = np.cumsum(draft, axis=1).tolist()
    draft_rows = list(draft)
    out = np.empty((n, 2), dtype=np.int64)
    for t in range(n):
        seq: list[int] = []
        state = 0
        while len(seq) < 2:
            d: list[int] = []
            for _ in range(k):
                cdf = draft_cdf[d[-1] if d else state]
                d.append(bisect.bisect_right(cdf, rng.random() * cdf[-1]))
            p = target[[state] + d]
            v = accept_sampled(d, [draft_rows[s] for s in [state] + d[:-1]], p, rng)
            seq += d[: v.n_accepted] + [v.token]
            state = seq[-1]
        out[t] = seq[:2]
    return out


def test_joint_distribution_markov_target() -> None:
    """p depends on the drafted prefix: P(x_0, x_1) = p(x_0 | start) p(x_1 | x_0). 36 cells."""
    rng = np.random.default_rng(32)
    V = 6
    target = rng.dirichlet(np.full(V, 1.5), size=V)
    draft = 0.5 * target + 0.5 * rng.dirichlet(np.full(V, 1.5), size=V)
    pairs = first_two_tokens(target, draft, k=2, n=N, seed=33)
    counts = np.bincount(pairs[:, 0] * V + pairs[:, 1], minlength=V * V)
    assert chi_square_pvalue(counts, target[0][:, None] * target) > ALPHA


# ---------------------------------------------------------------------------------------------------------
# Corner cases, exact
# ---------------------------------------------------------------------------------------------------------


def test_draft_claiming_a_zero_q_token_is_rejected_and_resampled_from_the_residual() -> None:
    p = np.array([[0.5, 0.5, 0.0, 0.0], [0.25, 0.25, 0.25, 0.25]])
    q = [np.array([0.0, 0.5, 0.5, 0.0])]
    rng = np.random.default_rng(40)
    for _ in range(200):
        # q(0) = 0 but p(0) = 0.5: rejected; residual max(0, p - q) = [0.5, 0, 0, 0] -> token 0
        assert accept_sampled([0], q, p, rng) == Verdict(n_accepted=0, token=0, bonus=False)


def test_all_zero_residual_falls_back_to_p() -> None:
    """Exact: every cell of the rule's two uniforms (tests/support/exact.py) gives the reference outcome, and the law is
    p_0."""
    p = np.array([[0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    q = [p[0].copy()]  # q == p, yet the draft reports token 2 with q(2) = 0: residual max(0, p - q) = 0
    law = np.zeros(4)
    for br in chain_branches([2], q, p):
        out, problems = run_cell(chain_run(accept_sampled, [2], q, p), br.cells)
        assert not problems and out == br.expect and out[0] == 0 and not out[2]  # type: ignore[index]
        law[out[1]] += br.weight  # type: ignore[index]
    np.testing.assert_allclose(law, p[0], rtol=0, atol=1e-15)  # never 2 or 3


def test_residual() -> None:
    p = np.array([0.5, 0.3, 0.2, 0.0])
    np.testing.assert_allclose(residual(p, np.array([0.2, 0.5, 0.1, 0.2]), 0), [0.3, 0.0, 0.1, 0.0])
    np.testing.assert_allclose(residual(p, None, 1), [0.5, 0.0, 0.2, 0.0])
    np.testing.assert_allclose(residual(p, np.array([0.1, 0.9]), 0), [0.4, 0.0, 0.2, 0.0])  # q shorter
    np.testing.assert_allclose(residual(p, np.array([0, 0, 0, 0, 1.0]), 4), p)  # q longer
    np.testing.assert_allclose(residual(p, None, 9), p)  # a deterministic guess past the vocabulary


def test_draft_token_past_target_vocabulary_is_rejected() -> None:
    p = np.array([[0.5, 0.5], [0.5, 0.5]])
    q = [np.array([0.0, 0.0, 1.0])]
    rng = np.random.default_rng(42)
    for _ in range(100):
        v = accept_sampled([2], q, p, rng)
        assert v.n_accepted == 0 and v.token in (0, 1)
        v = accept_sampled([7], [None], p, rng)
        assert v.n_accepted == 0 and v.token in (0, 1)


def test_bad_shapes_are_refused() -> None:
    rng = np.random.default_rng(0)
    p = np.full((2, 4), 0.25)
    with pytest.raises(ValueError):
        accept_sampled([1, 2], [None, None], p, rng)  # needs 3 rows of p
    with pytest.raises(ValueError):
        accept_sampled([1], [None, None], p, rng)
    with pytest.raises(ValueError):
        accept_sampled([-1], [None], p, rng)
    with pytest.raises(ValueError):
        accept_greedy([1, 2], [1, 2])


def test_same_seed_same_verdicts() -> None:
    rng = np.random.default_rng(43)
    p = random_rows(rng, 4, 8)
    q = list(random_rows(rng, 3, 8))
    d = [1, 2, 3]
    a = [accept_sampled(d, q, p, np.random.default_rng(s)) for s in range(50)]
    b = [accept_sampled(d, q, p, np.random.default_rng(s)) for s in range(50)]
    assert a == b


# ---------------------------------------------------------------------------------------------------------
# Greedy verification and expected_acceptance
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "draft, target, want",
    [
        ([5, 6, 7], [5, 6, 7, 8], Verdict(3, 8, True)),  # all accepted, bonus = the target's next argmax
        ([5, 6, 7], [5, 9, 7, 8], Verdict(1, 9, False)),  # stop at the first mismatch, emit the target's token
        ([5, 6, 7], [4, 6, 7, 8], Verdict(0, 4, False)),  # later matches do not count
        ([], [3], Verdict(0, 3, True)),  # k = 0
    ],
)
def test_accept_greedy(draft: list[int], target: list[int], want: Verdict) -> None:
    assert accept_greedy(draft, target) == want
    assert accept_greedy(np.array(draft, dtype=np.int64), np.array(target)) == want


def test_expected_acceptance() -> None:
    p = np.array([0.5, 0.3, 0.2])
    assert expected_acceptance(p, np.array([0.2, 0.3, 0.5])) == pytest.approx(0.7)
    assert expected_acceptance(p, p) == pytest.approx(1.0)
    assert expected_acceptance(p, np.array([0.0, 0.0, 0.0, 1.0])) == 0.0  # q longer, mass past p
    assert expected_acceptance(p, np.array([0.6, 0.4])) == pytest.approx(0.8)  # q shorter
    assert expected_acceptance(p, None, 1) == pytest.approx(0.3)
    assert expected_acceptance(p, None, 5) == 0.0
    with pytest.raises(ValueError):
        expected_acceptance(p, None)
