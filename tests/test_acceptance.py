"""edgespec.acceptance: exact speculative sampling must reproduce the target distribution p whatever the draft q.

Every statistical test uses a fixed seed (deterministic), N >= 20,000 calls of accept_sampled, and Pearson
chi-square at significance ALPHA = 1e-3; acceptance rates must lie within 4 standard errors of sum min(p, q).
Drafts are drawn vectorised up front; accept_sampled itself runs once per trial (it is the code under test).
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np
import pytest
from scipy import stats

from edgespec.acceptance import Verdict, accept_greedy, accept_sampled, expected_acceptance, residual
from edgespec.config import SamplingParams
from edgespec.sampling import sample, warp

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


def draw_rows(rows: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """n independent draws from each row of `rows` (shape (k, V)) -> (n, k) token ids, by inverse CDF."""
    cdf = np.cumsum(rows, axis=1)
    u = rng.random((n, rows.shape[0])) * cdf[:, -1]
    return np.stack([np.searchsorted(cdf[i], u[:, i], side="right") for i in range(rows.shape[0])], axis=1)


def random_rows(rng: np.random.Generator, k: int, V: int, alpha: float = 1.0) -> np.ndarray:
    return rng.dirichlet(np.full(V, alpha), size=k)


def run(drafts: np.ndarray, q: Sequence[np.ndarray | None], p: np.ndarray, seed: int) -> list[Verdict]:
    rng = np.random.default_rng(seed)
    return [accept_sampled(d, q, p, rng) for d in drafts.tolist()]


def first_tokens(drafts: np.ndarray, verdicts: list[Verdict]) -> np.ndarray:
    """The first token each cycle emits: d_0 if it was accepted, else the residual sample."""
    return np.array([d[0] if v.n_accepted > 0 else v.token for d, v in zip(drafts.tolist(), verdicts, strict=True)])


def assert_acceptance_rates(verdicts: list[Verdict], p: np.ndarray, q: Sequence[np.ndarray], drafts=None) -> None:
    """Position i is reached when d_0..d_{i-1} were accepted; given that, d_i is accepted with probability
    sum min(p_i, q_i) (p rows here do not depend on the drafted prefix). Checked within 4 standard errors."""
    n_acc = np.array([v.n_accepted for v in verdicts])
    for i in range(len(q)):
        reached = int(np.sum(n_acc >= i))
        accepted = int(np.sum(n_acc >= i + 1))
        if reached == 0:
            continue
        alpha = expected_acceptance(p[i], q[i], None if drafts is None else drafts[0][i])
        se = np.sqrt(max(alpha * (1 - alpha), 1e-12) / reached)
        assert abs(accepted / reached - alpha) <= 4 * se, (i, accepted / reached, alpha)


# ---------------------------------------------------------------------------------------------------------
# Distribution identity
# ---------------------------------------------------------------------------------------------------------


def test_first_token_is_distributed_as_p0_and_acceptance_rates_match() -> None:
    rng = np.random.default_rng(10)
    k, V = 3, 8
    p = random_rows(rng, k + 1, V)
    q = random_rows(rng, k, V)
    drafts = draw_rows(q, N, rng)
    verdicts = run(drafts, list(q), p, seed=11)
    x0 = first_tokens(drafts, verdicts)
    assert chi_square_pvalue(np.bincount(x0, minlength=V), p[0]) > ALPHA
    assert_acceptance_rates(verdicts, p, list(q))
    # the token after the accepted prefix, given that all k were accepted, is a sample of p_k
    bonus = np.array([v.token for v in verdicts if v.bonus])
    assert len(bonus) > 500 and all(v.n_accepted == k for v in verdicts if v.bonus)
    assert chi_square_pvalue(np.bincount(bonus, minlength=V), p[k]) > ALPHA


def test_control_accept_always_fails_the_same_test() -> None:
    """The same setup, but a wrong rule that keeps every drafted token: its first token follows q_0, and the
    chi-square test against p_0 must reject it overwhelmingly (so the identity tests have power)."""
    rng = np.random.default_rng(10)
    k, V = 3, 8
    p = random_rows(rng, k + 1, V)
    q = random_rows(rng, k, V)
    drafts = draw_rows(q, N, rng)

    def accept_always(draft_tokens: Sequence[int], p_rows: np.ndarray, g: np.random.Generator) -> Verdict:
        return Verdict(n_accepted=len(draft_tokens), token=sample(p_rows[-1], g), bonus=True)

    g = np.random.default_rng(11)
    verdicts = [accept_always(d, p, g) for d in drafts.tolist()]
    x0 = first_tokens(drafts, verdicts)
    assert chi_square_pvalue(np.bincount(x0, minlength=V), p[0]) < 1e-30


def test_q_equal_to_p_accepts_everything() -> None:
    rng = np.random.default_rng(12)
    k, V = 4, 8
    p = random_rows(rng, k + 1, V)
    q = [p[i].copy() for i in range(k)]
    drafts = draw_rows(p[:k], N, rng)
    verdicts = run(drafts, q, p, seed=13)
    assert all(v.n_accepted == k and v.bonus for v in verdicts)  # p/q = 1: accepted in every trial
    assert chi_square_pvalue(np.bincount(drafts[:, 0], minlength=V), p[0]) > ALPHA
    assert chi_square_pvalue(np.bincount([v.token for v in verdicts], minlength=V), p[k]) > ALPHA
    assert expected_acceptance(p[0], q[0]) == pytest.approx(1.0)


def test_disjoint_support_rejects_everything_and_stays_exact() -> None:
    rng = np.random.default_rng(14)
    k, V = 2, 8
    p = np.zeros((k + 1, V))
    p[:, :4] = random_rows(rng, k + 1, 4)
    q = np.zeros((k, V))
    q[:, 4:] = random_rows(rng, k, 4)
    drafts = draw_rows(q, N, rng)
    verdicts = run(drafts, list(q), p, seed=15)
    assert all(v.n_accepted == 0 and not v.bonus for v in verdicts)
    assert expected_acceptance(p[0], q[0]) == 0.0
    assert chi_square_pvalue(np.bincount([v.token for v in verdicts], minlength=V), p[0]) > ALPHA


def test_deterministic_proposals() -> None:
    """q = None: d_i is accepted with probability p_i(d_i); the first token is still distributed as p_0."""
    rng = np.random.default_rng(16)
    k, V = 3, 8
    p = random_rows(rng, k + 1, V)
    p[1, 5] = 0.0  # the second guess is outside the target's support
    p[1] /= p[1].sum()
    guess = [2, 5, 0]
    drafts = np.tile(guess, (N, 1))
    verdicts = run(drafts, [None] * k, p, seed=17)
    x0 = first_tokens(drafts, verdicts)
    assert chi_square_pvalue(np.bincount(x0, minlength=V), p[0]) > ALPHA
    assert_acceptance_rates(verdicts, p, [None] * k, drafts)
    assert max(v.n_accepted for v in verdicts) == 1  # d_1 = 5 has p_1 = 0: never accepted
    # after accepting d_0 the rejection at position 1 samples normalize(p_1 without token 5) = p_1 itself
    second = np.array([v.token for v in verdicts if v.n_accepted == 1])
    assert chi_square_pvalue(np.bincount(second, minlength=V), p[1]) > ALPHA


def test_deterministic_proposal_with_certain_target_is_always_accepted() -> None:
    p = np.array([[0, 0, 1.0, 0], [0.25, 0.25, 0.25, 0.25]])
    rng = np.random.default_rng(0)
    for _ in range(200):
        v = accept_sampled([2], [None], p, rng)
        assert v.n_accepted == 1 and v.bonus


def test_target_truncated_by_top_k() -> None:
    """p from warp with top_k=3 (zeros elsewhere), q from an untruncated hotter draft: drafted tokens outside
    p's support are always rejected, only supported tokens are ever emitted, and x_0 ~ p_0."""
    rng = np.random.default_rng(18)
    k, V = 3, 8
    logits = (rng.standard_normal((k + 1, V)) * 1.5).astype(np.float32)
    p = np.stack([warp(row, SamplingParams(temperature=0.9, top_k=3)) for row in logits])
    q = np.stack(
        [warp(row + rng.standard_normal(V).astype(np.float32), SamplingParams(temperature=1.5)) for row in logits[:k]]
    )
    assert (p == 0).sum() == (k + 1) * (V - 3)
    drafts = draw_rows(q, N, rng)
    verdicts = run(drafts, list(q), p, seed=19)
    x0 = first_tokens(drafts, verdicts)
    assert chi_square_pvalue(np.bincount(x0, minlength=V), p[0]) > ALPHA  # also asserts no zero-p token
    for d, v in zip(drafts.tolist(), verdicts, strict=True):
        assert all(p[i][d[i]] > 0 for i in range(v.n_accepted))
        assert p[v.n_accepted][v.token] > 0
    assert_acceptance_rates(verdicts, p, list(q))


@pytest.mark.parametrize("extra", [5, -3])
def test_draft_vocabulary_of_different_size(extra: int) -> None:
    """q rows longer (ids past the target's vocabulary, p = 0 there) or shorter (q = 0 on the last ids) than
    p rows: the shorter is treated as zero-padded; x_0 ~ p_0 and the rate is sum min over the padded rows."""
    rng = np.random.default_rng(20 + extra)
    k, V = 2, 8
    p = random_rows(rng, k + 1, V)
    q = random_rows(rng, k, V + extra)
    drafts = draw_rows(q, N, rng)
    verdicts = run(drafts, list(q), p, seed=21)
    x0 = first_tokens(drafts, verdicts)
    assert chi_square_pvalue(np.bincount(x0, minlength=max(V, V + extra)), np.pad(p[0], (0, max(0, extra)))) > ALPHA
    assert all(v.token < V for v in verdicts)
    assert_acceptance_rates(verdicts, p, list(q))
    if extra > 0:
        assert any(d[0] >= V for d in drafts.tolist())  # such drafts occurred and were all rejected
        assert all(v.n_accepted == 0 for d, v in zip(drafts.tolist(), verdicts, strict=True) if d[0] >= V)


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


def test_joint_distribution_context_free_target() -> None:
    """p rows are the same distribution whatever came before: P(x_0, x_1) = p(x_0) p(x_1). 36 cells."""
    rng = np.random.default_rng(30)
    V = 6
    target = np.tile(rng.dirichlet(np.full(V, 2.0)), (V, 1))
    draft = rng.dirichlet(np.full(V, 2.0), size=V)  # a draft that (wrongly) depends on the context
    pairs = first_two_tokens(target, draft, k=2, n=N, seed=31)
    counts = np.bincount(pairs[:, 0] * V + pairs[:, 1], minlength=V * V)
    assert chi_square_pvalue(counts, np.outer(target[0], target[0])) > ALPHA


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
    p = np.array([[0.5, 0.5, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    q = [p[0].copy()]  # q == p, yet the draft reports token 2 with q(2) = 0: residual max(0, p - q) = 0
    rng = np.random.default_rng(41)
    tokens = [accept_sampled([2], q, p, rng) for _ in range(2000)]
    assert all(v.n_accepted == 0 and not v.bonus for v in tokens)
    counts = np.bincount([v.token for v in tokens], minlength=4)
    assert counts[2] == counts[3] == 0
    assert chi_square_pvalue(counts, p[0]) > ALPHA


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
