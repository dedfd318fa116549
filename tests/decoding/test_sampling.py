"""edgespec.decoding.sampling against brute-force references (full sorts, Python loops), and the exact law of sample()
(every inverse-CDF cell of its uniform probed, tests/support/exact.py; more in tests/decoding/test_exact_laws.py). No
statistical tests.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Sequence

import numpy as np
import pytest

from edgespec.config import SamplingParams
from edgespec.decoding.sampling import apply_penalties, greedy, sample, top_k_indices, top_p_mask, warp

from support.exact import cdf_cells, run_cell


# ---------------------------------------------------------------------------------------------------------
# Brute-force reference: the definition in the module docstring, written the slow obvious way.
# ---------------------------------------------------------------------------------------------------------


def ref_penalties(logits: np.ndarray, params: SamplingParams, history: Sequence[int]) -> np.ndarray:
    x = logits.copy()
    n = params.repeat_last_n
    window = [int(t) for t in list(history)[-n:] if 0 <= t < len(x)] if n > 0 else []
    for t in set(window):
        v = float(x[t])
        v = v / params.repeat_penalty if v > 0 else v * params.repeat_penalty
        v = v - window.count(t) * params.frequency_penalty - params.presence_penalty
        x[t] = v
    return x


def ref_order(values: np.ndarray) -> np.ndarray:
    """All indices sorted by value descending, ties by lower index (a full sort)."""
    return np.lexsort((np.arange(len(values)), -values.astype(np.float64)))


def ref_warp(logits: np.ndarray, params: SamplingParams, history: Sequence[int] = ()) -> np.ndarray:
    x = ref_penalties(logits, params, history)
    V = len(x)
    out = np.zeros(V)
    if params.temperature == 0:
        out[int(np.argmax(x))] = 1.0
        return out
    kept = np.arange(V)
    if 0 < params.top_k < V:
        kept = np.sort(ref_order(x)[: params.top_k])
    xk = x[kept].astype(np.float64)
    w = np.exp((xk - xk.max()) / params.temperature)
    p = w / w.sum()
    keep = np.ones(len(kept), dtype=bool)
    if params.top_p < 1.0:
        order = ref_order(p)
        cum = np.cumsum(p[order])
        reached = np.flatnonzero(cum >= params.top_p)
        n = reached[0] + 1 if reached.size else len(p)
        keep[:] = False
        keep[order[:n]] = True
    if params.min_p > 0.0:
        keep &= ~(p < params.min_p * p.max())
    out[kept[keep]] = p[keep] / p[keep].sum()
    return out


def assert_same_distribution(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == np.float64 and got.shape == want.shape
    np.testing.assert_array_equal(got > 0, want > 0)  # the exact kept set
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    assert abs(got.sum() - 1.0) < 1e-12


# ---------------------------------------------------------------------------------------------------------
# Penalties and temperature 0
# ---------------------------------------------------------------------------------------------------------


def test_penalties_by_hand() -> None:
    logits = np.array([2.0, -2.0, 0.0, 1.0, 3.0], dtype=np.float32)
    params = SamplingParams(repeat_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25, repeat_last_n=4)
    history = [4, 0, 1, 1, 2]  # the window is the last 4: token 4 falls out
    got = apply_penalties(logits, params, history)
    # 0: 2/2 - 1*0.5 - 0.25;  1: -2*2 - 2*0.5 - 0.25;  2: 0*2 - 0.5 - 0.25;  3, 4: untouched
    np.testing.assert_array_equal(got, np.array([0.25, -5.25, -0.75, 1.0, 3.0], dtype=np.float32))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(logits, [2.0, -2.0, 0.0, 1.0, 3.0])  # input untouched


def test_penalties_match_reference() -> None:
    rng = np.random.default_rng(1)
    for _ in range(20):
        V = 500
        logits = (rng.standard_normal(V) * 3).astype(np.float32)
        history = list(rng.integers(-3, V + 3, size=rng.integers(0, 200)))  # includes out-of-range ids
        params = SamplingParams(
            repeat_penalty=float(rng.uniform(0.5, 2.0)),
            frequency_penalty=float(rng.uniform(-1, 1)),
            presence_penalty=float(rng.uniform(-1, 1)),
            repeat_last_n=int(rng.integers(0, 100)),
        )
        np.testing.assert_array_equal(apply_penalties(logits, params, history), ref_penalties(logits, params, history))


def test_repeat_last_n_zero_and_off_penalties_are_identity() -> None:
    logits = np.array([1.0, -1.0, 2.0], dtype=np.float32)
    assert apply_penalties(logits, SamplingParams(repeat_penalty=1.5, repeat_last_n=0), [0, 1]) is logits
    assert apply_penalties(logits, SamplingParams(), [0, 1]) is logits


def test_temperature_zero_is_one_hot_at_argmax_lowest_id_on_ties() -> None:
    logits = np.array([0.5, 3.0, -1.0, 3.0, 2.0], dtype=np.float32)
    p = warp(logits, SamplingParams(temperature=0.0, top_k=2, top_p=0.5, min_p=0.3))
    np.testing.assert_array_equal(p, [0, 1, 0, 0, 0])
    assert p.dtype == np.float64
    assert greedy(logits, SamplingParams(temperature=0.0)) == 1
    # a repeat penalty on token 1 hands the tie to token 3
    params = SamplingParams(temperature=0.0, repeat_penalty=1.1)
    assert greedy(logits, params, [1]) == 3
    np.testing.assert_array_equal(warp(logits, params, [1]), [0, 0, 0, 1, 0])


def test_tiny_temperature_concentrates_on_the_maxima() -> None:
    logits = np.array([0.5, 3.0, -1.0, 3.0, -np.inf], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(warp(logits, SamplingParams(temperature=1e-300)), [0, 0.5, 0, 0.5, 0])


def test_greedy_equals_argmax_of_warp_reference() -> None:
    rng = np.random.default_rng(2)
    for _ in range(50):
        logits = rng.integers(-3, 4, size=64).astype(np.float32)  # many ties
        history = list(rng.integers(0, 64, size=10))
        params = SamplingParams(temperature=0.0, repeat_penalty=1.3, presence_penalty=0.2)
        assert greedy(logits, params, history) == int(np.argmax(ref_penalties(logits, params, history)))


def test_bad_logits_are_refused() -> None:
    with pytest.raises(ValueError):
        warp(np.array([0.0, np.nan], dtype=np.float32), SamplingParams())
    with pytest.raises(ValueError):
        warp(np.full(4, -np.inf, dtype=np.float32), SamplingParams())
    with pytest.raises(ValueError):
        warp(np.zeros((2, 2), dtype=np.float32), SamplingParams())
    with pytest.raises(ValueError):
        warp(np.zeros(4, dtype=np.float32), SamplingParams(temperature=float("inf")))


# ---------------------------------------------------------------------------------------------------------
# Filters against the reference
# ---------------------------------------------------------------------------------------------------------

FILTERS = [
    SamplingParams(temperature=0.8),
    SamplingParams(temperature=1.3, top_k=1),
    SamplingParams(temperature=0.7, top_k=17),
    SamplingParams(temperature=1.0, top_k=400),
    SamplingParams(temperature=0.9, top_p=0.5),
    SamplingParams(temperature=0.6, top_p=0.95),
    SamplingParams(temperature=2.0, top_p=0.999),
    SamplingParams(temperature=1.0, top_p=1e-9),
    SamplingParams(temperature=0.8, min_p=0.05),
    SamplingParams(temperature=1.5, min_p=0.5),
    SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.05),
    SamplingParams(temperature=1.1, top_p=0.8, min_p=0.02),
    SamplingParams(temperature=0.8, top_k=100, min_p=0.1, repeat_penalty=1.3, frequency_penalty=0.2),
    SamplingParams(temperature=0.8, top_p=0.9, presence_penalty=0.7, repeat_last_n=8),
]


def random_logits(kind: str, V: int, rng: np.random.Generator) -> np.ndarray:
    if kind == "gaussian":
        return (rng.standard_normal(V) * 2.5).astype(np.float32)
    if kind == "ties":  # a handful of distinct values: ties everywhere, including at every filter boundary
        return rng.integers(-4, 3, size=V).astype(np.float32)
    if kind == "masked":  # grammar-style -inf entries
        x = (rng.standard_normal(V) * 2).astype(np.float32)
        x[rng.random(V) < 0.9] = -np.inf
        return x
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["gaussian", "ties", "masked"])
@pytest.mark.parametrize("params", FILTERS, ids=lambda p: f"T{p.temperature}-k{p.top_k}-p{p.top_p}-m{p.min_p}")
def test_warp_matches_reference(params: SamplingParams, kind: str) -> None:
    rng = np.random.default_rng(zlib.crc32(f"{kind} {params!r}".encode()))
    for _ in range(5):
        V = int(rng.integers(200, 3000))
        logits = random_logits(kind, V, rng)
        history = list(rng.integers(0, V, size=30))
        before = logits.copy()
        assert_same_distribution(warp(logits, params, history), ref_warp(logits, params, history))
        np.testing.assert_array_equal(logits, before)


def test_top_k_keeps_exactly_k_with_ties_to_lower_ids() -> None:
    x = np.array([1, 3, 2, 3, 3, 0, 2], dtype=np.float32)
    np.testing.assert_array_equal(top_k_indices(x, 2), [1, 3])
    np.testing.assert_array_equal(top_k_indices(x, 4), [1, 2, 3, 4])
    np.testing.assert_array_equal(top_k_indices(x, 7), np.arange(7))
    rng = np.random.default_rng(3)
    for _ in range(100):
        x = rng.integers(0, 5, size=300).astype(np.float32)
        k = int(rng.integers(1, 300))
        want = np.sort(ref_order(x)[:k])
        np.testing.assert_array_equal(top_k_indices(x, k), want)
    p = warp(np.zeros(10, dtype=np.float32), SamplingParams(temperature=1.0, top_k=3))
    np.testing.assert_allclose(p, [1 / 3] * 3 + [0] * 7, rtol=1e-15)


def test_top_p_flat_distribution_is_exact() -> None:
    """All-equal logits: the nucleus is the lowest ids, as many as the float64 cumulative sum needs."""
    V = 1000
    logits = np.zeros(V, dtype=np.float32)
    for top_p in [1e-6, 0.3, 0.5, 0.7, 0.95, 0.999, 1 - 1e-12]:
        params = SamplingParams(temperature=1.0, top_p=top_p)
        got = warp(logits, params)
        want = ref_warp(logits, params)
        assert_same_distribution(got, want)
        n = int(np.count_nonzero(got))
        np.testing.assert_array_equal(np.flatnonzero(got), np.arange(n))  # ties -> lowest ids
        assert np.cumsum(np.full(V, 1 / V))[n - 1] >= top_p
        assert n == 1 or np.cumsum(np.full(V, 1 / V))[n - 2] < top_p


@pytest.mark.parametrize(
    "scale, top_p, nucleus_range",
    [
        (0.3, 0.95, (100_000, 151_936)),  # nearly flat: the nucleus is most of the vocabulary (full sort)
        (1.5, 0.9, (20_000, 100_000)),  # a candidate cut, then the full sort
        (3.0, 0.8, (129, 20_000)),  # two candidate cuts
        (8.0, 0.95, (1, 128)),  # peaked: small candidate sets
    ],
)
def test_top_p_exact_on_full_vocabulary(scale: float, top_p: float, nucleus_range: tuple[int, int]) -> None:
    V = 151_936
    rng = np.random.default_rng(4)
    logits = (rng.standard_normal(V) * scale).astype(np.float32)
    params = SamplingParams(temperature=1.0, top_p=top_p)
    got, want = warp(logits, params), ref_warp(logits, params)
    assert_same_distribution(got, want)
    lo, hi = nucleus_range
    assert lo <= np.count_nonzero(got) <= hi  # the case exercises the intended code path


def test_top_p_sorts_only_a_candidate_set_when_the_nucleus_is_small(monkeypatch: pytest.MonkeyPatch) -> None:
    V = 151_936
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal(V) * 3.0).astype(np.float32)
    sorted_sizes: list[int] = []
    real_sort = np.sort

    def recording_sort(a: np.ndarray, *args: object, **kw: object) -> np.ndarray:
        sorted_sizes.append(np.asarray(a).size)
        return real_sort(a, *args, **kw)

    def no_argsort(*args: object, **kw: object) -> None:
        raise AssertionError("argsort called")

    monkeypatch.setattr(np, "sort", recording_sort)
    monkeypatch.setattr(np, "argsort", no_argsort)
    got = warp(logits, SamplingParams(temperature=0.8, top_p=0.9))
    monkeypatch.undo()
    assert_same_distribution(got, ref_warp(logits, SamplingParams(temperature=0.8, top_p=0.9)))
    assert sorted_sizes and max(sorted_sizes) <= V // 8


def test_top_p_mask_with_zero_mass_tail() -> None:
    p = np.array([0.5, 0.0, 0.2, 0.0, 0.3] + [0.0] * 300)
    np.testing.assert_array_equal(np.flatnonzero(top_p_mask(p, 0.75)), [0, 4])
    assert top_p_mask(p, 0.999999).sum() == 3
    # the mass never reaches top_p (rounding below 1): everything, zeros included, is kept
    q = np.full(1000, 0.1 / 1000)
    assert top_p_mask(q, 0.5).all()


def test_min_p_keeps_tokens_at_least_min_p_times_the_max() -> None:
    logits = np.log(np.array([0.5, 0.3, 0.1, 0.06, 0.04])).astype(np.float32)
    p = warp(logits, SamplingParams(temperature=1.0, min_p=0.15))  # threshold 0.075
    np.testing.assert_allclose(p, np.array([0.5, 0.3, 0.1, 0, 0]) / 0.9, rtol=1e-6)
    assert p[3] == 0 and p[4] == 0


def test_warp_output_is_a_distribution() -> None:
    rng = np.random.default_rng(5)
    logits = (rng.standard_normal(32_000) * 4).astype(np.float32)
    for params in FILTERS:
        p = warp(logits, params)
        assert p.dtype == np.float64 and p.shape == (32_000,)
        assert p.min() >= 0 and abs(p.sum() - 1) < 1e-12


def test_float64_and_integer_logits_are_accepted() -> None:
    x64 = np.array([0.0, 1.0, 2.0])
    want = np.exp(x64) / np.exp(x64).sum()
    np.testing.assert_allclose(warp(x64, SamplingParams(temperature=1.0)), want, rtol=1e-15)
    np.testing.assert_allclose(warp(np.array([0, 1, 2]), SamplingParams(temperature=1.0)), want, rtol=1e-15)


# ---------------------------------------------------------------------------------------------------------
# sample
# ---------------------------------------------------------------------------------------------------------


def test_sample_uses_exactly_one_draw() -> None:
    probs = np.array([0.2, 0.0, 0.5, 0.3])
    a, b = np.random.default_rng(7), np.random.default_rng(7)
    for _ in range(100):
        t = sample(probs, a)
        u = b.random()
        cdf = np.cumsum(probs)
        assert t == int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    assert a.random() == b.random()


class FixedDraw:
    """A stand-in generator whose random() returns a chosen value."""

    def __init__(self, u: float) -> None:
        self.u = u

    def random(self) -> float:
        return self.u


def test_sample_never_returns_a_zero_probability_token() -> None:
    probs = np.array([0.0, 0.0, 0.25, 0.0, 0.75, 0.0, 0.0])
    assert sample(probs, FixedDraw(0.0)) == 2  # u = 0 skips the leading zeros
    assert sample(probs, FixedDraw(np.nextafter(1.0, 0.0))) == 4  # u -> 1 skips the trailing zeros
    assert sample(probs, FixedDraw(0.25)) == 4  # exactly on a boundary: the next positive entry
    assert sample(probs, FixedDraw(1.0)) == 4  # not a possible draw: exercises the guard for u * total == total
    # unnormalised rows whose cumulative sum rounds: still only positive entries
    probs = np.zeros(1000)
    probs[[3, 500, 998]] = [1e-300, 1.0, 1e-17]
    for u in [0.0, 1e-310, 0.5, np.nextafter(1.0, 0.0)]:
        assert probs[sample(probs, FixedDraw(u))] > 0
    assert sample(np.array([0.0, 1.0, 0.0]), np.random.default_rng(0)) == 1


def test_sample_refuses_bad_rows() -> None:
    rng = np.random.default_rng(0)
    for bad in [np.zeros(3), np.array([0.5, -0.1, 0.6]), np.array([np.nan, 1.0]), np.array([np.inf, 1.0])]:
        with pytest.raises(ValueError):
            sample(bad, rng)


def test_warp_then_sample_matches_reference_distribution() -> None:
    """End to end, exact: warp(top_k=6, min_p) of a V=50 row equals the reference, and sample() on it emits token t on
    exactly its inverse-CDF cell of the uniform (tests/support/exact.py run_cell: the middle and both ends of every
    cell)."""
    rng = np.random.default_rng(8)
    logits = (rng.standard_normal(50) * 1.5).astype(np.float32)
    params = SamplingParams(temperature=0.9, top_k=6, min_p=0.1)
    want = ref_warp(logits, params)
    probs = warp(logits, params)
    assert_same_distribution(probs, want)
    law = np.zeros(50)
    for t, lo, hi in cdf_cells(probs):
        out, problems = run_cell(lambda g: sample(probs, g), [(lo, hi)])  # type: ignore[arg-type]
        assert not problems and out == t
        law[t] += hi - lo
    np.testing.assert_allclose(law, want, rtol=1e-12, atol=1e-15)
