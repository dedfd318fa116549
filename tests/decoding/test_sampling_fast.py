"""The loop's fast sampling path (sampling.warp_probs, Probs, the blocked inverse CDF) against the readable
specification (sampling.warp, a full cumulative sum), on many random rows.

What is compared, and how closely:
- warp_probs(row) as a dense row equals warp(row): the same support exactly, probabilities within 1e-12 absolute
  where a filter keeps a subset (the same float64 arithmetic on the same kept set), within 1e-5 relative (each entry)
  where temperature alone applies (float32 weights exp2(l * log2(e) / T): the float32 product is the rounding);
- Probs.prob(t), minus (the residual), overlap (sum min) equal the same operations on the dense rows;
- sample_at on a Probs, and the blocked inverse CDF of a long dense row, pick the same id as the full float64
  cumulative sum for 2,000 uniforms per row, except where u * total lies within 1e-8 of a boundary (rounding: a long
  row's block sums are float32 sums).
The acceptance rules themselves are proven on Probs rows by enumeration in tests/decoding/test_exact_laws.py style
below.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.decoding.acceptance import accept_sampled, expected_acceptance, residual
from edgespec.config import SamplingParams
from edgespec.decoding.sampling import Probs, sample_at, top_k_indices, warp, warp_probs
from edgespec.decoding.warp_fast import _top_k_candidates

N_ROWS = 40  # random rows per setting
SETTINGS = [
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),  # llama.cpp's defaults
    dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0),  # OpenAI's defaults
    dict(temperature=0.7, top_k=0, top_p=0.9, min_p=0.0),
    dict(temperature=1.3, top_k=0, top_p=1.0, min_p=0.1),
    dict(temperature=0.5, top_k=5, top_p=1.0, min_p=0.0),
    dict(temperature=1.0, top_k=0, top_p=0.5, min_p=0.02),
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2),
    dict(temperature=0.0),
]


def _rows(n_vocab: int, n: int, seed: int) -> list[np.ndarray]:
    """Rows shaped like a model's (a broad background and a peaked head), with ties and -inf entries mixed in."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        x = (rng.standard_normal(n_vocab) * rng.uniform(0.5, 4.0)).astype(np.float32)
        head = rng.integers(0, n_vocab, 6)
        x[head] += rng.uniform(0.0, 12.0, 6).astype(np.float32)
        if i % 5 == 1:  # ties at the top
            x[head[:3]] = x.max()
        if i % 7 == 2:  # masked entries
            x[rng.integers(0, n_vocab, n_vocab // 3)] = -np.inf
        if i % 11 == 3:  # a flat row
            x[:] = np.float32(1.5)
        out.append(x)
    return out


@pytest.mark.parametrize("n_vocab", [50, 5000, 151_936])
@pytest.mark.parametrize("kw", SETTINGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_warp_probs_is_warp(n_vocab, kw):
    sp = SamplingParams(**kw)
    history = [3, 7, 7, 11, 3, 1] if sp.uses_history else []
    # float32 weights over the whole row: no top-k, and not min-p alone (which selects candidates first)
    f32 = sp.temperature > 0 and sp.top_k == 0 and not (sp.top_p >= 1.0 and sp.min_p > 0.0)
    for x in _rows(n_vocab, N_ROWS if n_vocab < 100_000 else 3, seed=n_vocab):
        ref = warp(x, sp, history)
        fast = warp_probs(x, sp, history)
        got = np.asarray(fast)
        assert np.array_equal(np.flatnonzero(got), np.flatnonzero(ref)), "the support differs from warp's"
        np.testing.assert_allclose(got, ref, rtol=1e-5 if f32 else 0, atol=1e-12)
        for t in list(np.flatnonzero(ref)[:5]) + [int(np.argmax(ref)), 0, n_vocab - 1]:
            assert fast.prob(t) == pytest.approx(float(ref[t]), rel=1e-5 if f32 else 0, abs=1e-12)
        assert fast.prob(n_vocab + 5) == 0.0


def test_top_k_candidates_is_top_k_indices():
    rng = np.random.default_rng(5)
    for n in (100, 4096, 151_936):
        for k in (1, 2, 40, 500):
            if k >= n:
                continue
            x = (rng.standard_normal(n) * rng.uniform(0.1, 30)).astype(np.float32)
            x[rng.integers(0, n, 10)] = x.max()  # ties at the top
            x[: n // 2 : 7] = -np.inf
            ids, m = _top_k_candidates(x, k)
            assert np.array_equal(ids, top_k_indices(x, k)) and m == float(x.max())
        ties = np.zeros(n, dtype=np.float32)  # every entry tied: the k lowest ids
        assert np.array_equal(_top_k_candidates(ties, 40)[0], np.arange(40))


def _reference_sample_at(p: np.ndarray, u: float) -> int:
    cdf = np.cumsum(np.asarray(p, dtype=np.float64))
    return min(int(cdf.searchsorted(u * cdf[-1], side="right")), int(np.flatnonzero(p > 0)[-1]))


@pytest.mark.parametrize("kw", SETTINGS[:6], ids=str)
def test_sample_at_matches_the_full_inverse_cdf(kw):
    sp = SamplingParams(**kw)
    rng = np.random.default_rng(11)
    us = rng.random(2000)
    for x in _rows(151_936, 3, seed=3):
        fast = warp_probs(x, sp)
        dense = np.asarray(fast)
        cdf = np.cumsum(dense)
        # _reference_sample_at for every u at once (its cumulative sum does not depend on u)
        ref_cdf = np.cumsum(np.asarray(dense, dtype=np.float64))
        wants = np.minimum(ref_cdf.searchsorted(us * ref_cdf[-1], side="right"), int(np.flatnonzero(dense > 0)[-1]))
        assert all(wants[i] == _reference_sample_at(dense, us[i]) for i in range(0, len(us), 250))
        for u, want in zip(us, wants):
            got = sample_at(fast, float(u))
            if got != want:  # only where u * total sits on a boundary, up to rounding
                assert np.min(np.abs(cdf - u * cdf[-1])) < 1e-8
            assert dense[got] > 0
            assert sample_at(dense, float(u)) == got or np.min(np.abs(cdf - u * cdf[-1])) < 1e-8


def test_probs_residual_and_overlap_match_dense():
    rng = np.random.default_rng(2)
    sp_p = SamplingParams(temperature=0.9, top_k=30, top_p=0.9)
    sp_q = SamplingParams(temperature=1.1, top_k=50, top_p=1.0)
    sp_dense = SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0)
    for i in range(30):
        x = _rows(3000, 1, seed=100 + i)[0]
        y = x + (rng.standard_normal(x.size) * 0.8).astype(np.float32)
        for pa, qa in ((sp_p, sp_q), (sp_q, sp_p), (sp_dense, sp_p), (sp_p, sp_dense), (sp_dense, sp_dense)):
            p, q = warp_probs(x, pa), warp_probs(y, qa)
            pd, qd = np.asarray(p), np.asarray(q)
            d = int(np.argmax(qd))
            for fast, ref in ((residual(p, q, d), residual(pd, qd, d)), (residual(p, None, d), residual(pd, None, d))):
                assert (fast.total > 0) == (ref.sum() > 0)  # unnormalised (its scale is its own): the same law
                if ref.sum() > 1e-6:
                    np.testing.assert_allclose(np.asarray(fast), ref / ref.sum(), atol=1e-6)
            assert expected_acceptance(p, q, d) == pytest.approx(expected_acceptance(pd, qd, d), abs=1e-6)
            assert expected_acceptance(p, None, d) == pytest.approx(float(pd[d]), abs=1e-7)


def test_accept_sampled_on_probs_has_the_law_of_dense_rows():
    """Exact, by enumeration over the two random decisions of a one-draft verify (the acceptance uniform, then the
    emitted token by its probability): the law of the emitted token on Probs rows equals p_0 and equals the law on the
    dense rows, for 40 pairs of sparse, dense and mixed rows over 12 ids."""
    rng = np.random.default_rng(9)
    for case in range(40):
        xp = rng.standard_normal(12).astype(np.float32) * 2
        xq = xp + rng.standard_normal(12).astype(np.float32)
        sp = SamplingParams(temperature=1.0, top_k=[0, 4, 7][case % 3], top_p=1.0, min_p=0.0)
        sq = SamplingParams(temperature=1.0, top_k=[0, 5, 3][case % 3], top_p=1.0, min_p=0.0)
        p0, p1, q0 = warp_probs(xp, sp), warp_probs(xp[::-1].copy(), sp), warp_probs(xq, sq)
        law = np.zeros(12)
        q0d = np.asarray(q0)
        for d in np.flatnonzero(q0d):
            a = min(1.0, p0.prob(d) / q0.prob(d))
            law[d] += q0d[d] * a  # accepted: d is emitted
            r = np.asarray(residual(p0, q0, int(d)))
            if r.sum() > 0:
                law += q0d[d] * (1 - a) * r / r.sum()
        np.testing.assert_allclose(law, np.asarray(p0), atol=1e-9)

        class _U:
            def __init__(self, u):
                self.u = u

            def random(self):
                return self.u

        for u in (0.01, 0.3, 0.77, 0.999):  # the same verdict on Probs and dense rows, draw for draw
            d = int(np.argmax(q0d))
            a = accept_sampled([d], [q0], [p0, p1], _U(u))
            b = accept_sampled([d], [q0d], np.stack([np.asarray(p0), np.asarray(p1)]), _U(u))
            assert (a.n_accepted, a.token) == (b.n_accepted, b.token)


def test_probs_dense_row_round_trip():
    p = np.array([0.0, 0.25, 0.0, 0.75])
    pr = Probs.dense_row(p)
    assert np.array_equal(np.asarray(pr), p)
    assert pr.prob(3) == 0.75 and pr.prob(2) == 0.0 and pr.top() == 3
    assert sample_at(pr, 0.1) == 1 and sample_at(pr, 0.5) == 3


@pytest.mark.parametrize("temperature", [1.0, 0.6, 2.0])
def test_temperature_row_edges_take_the_general_path(temperature):
    """Temperature alone on a long float32 row skips the pass for the maximum; rows whose weights exp(l / T) overflow
    (logits up to 120), are all tiny (logits near -300), hold -inf or a lone finite entry match warp all the same, and
    NaN / +inf / all -inf logits are the same ValueError as warp's. 151,936 entries, 4 shifted rows per case."""
    sp = SamplingParams(temperature=temperature)
    base = _rows(151_936, 4, seed=9)
    for shift in (120.0, -300.0, 60.0, -60.0):
        for x in base:
            y = x + np.float32(shift)
            ref = warp(y, sp)
            got = np.asarray(warp_probs(y, sp))
            assert np.array_equal(np.flatnonzero(got), np.flatnonzero(ref))
            np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-12)
    lone = np.full(151_936, -np.inf, dtype=np.float32)
    lone[77] = -500.0
    assert np.asarray(warp_probs(lone, sp))[77] == 1.0
    for bad in (np.nan, np.inf):
        y = base[0].copy()
        y[5] = bad
        with pytest.raises(ValueError):
            warp(y, sp)
        with pytest.raises(ValueError):
            warp_probs(y, sp)
    with pytest.raises(ValueError):
        warp_probs(np.full(151_936, -np.inf, dtype=np.float32), sp)
