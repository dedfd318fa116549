"""Acceptance chances (Rao-Blackwell): a sampled verify reports, for each draft position it examined, the probability
that position had of being accepted, and the acceptance estimators learn from those expectations instead of the
accepted/rejected draws. Pure numpy fakes, no llama.cpp."""

from __future__ import annotations

import numpy as np
import pytest
from test_draft_trees import fake_speculator
from test_loop import FakeModel, FakeTreeModel, OracleSpeculator, run

from edgespec.acceptance import coupled_acceptance, expected_acceptance
from edgespec.config import SamplingParams, SpecConfig
from edgespec.costs import CostModel
from edgespec.estimators import AcceptanceEstimator, MatchLengthEstimator
from edgespec.policy import Controller
from edgespec.sampling import PositionalUniforms, sample_at, warp
from edgespec.speculate import verify
from edgespec.speculators import ModelSpeculator


def _row(rng: np.random.Generator, n: int, zeros: int = 0) -> np.ndarray:
    x = rng.gamma(0.5, size=n)
    x[rng.choice(n, size=zeros, replace=False)] = 0.0
    return x / x.sum()


def test_coupled_acceptance_is_the_measure_of_the_uniforms_where_the_two_samples_agree():
    """On a grid of N = 20,000 uniforms the inverse-CDF samples of p and q agree on a fraction within 2V/N of the
    computed measure (every cell boundary can misplace at most one grid point); rows of different lengths (a padded
    vocabulary) and rows with zeros included."""
    rng = np.random.default_rng(11)
    n = 20_000
    grid = (np.arange(n) + 0.5) / n
    for trial in range(6):
        p = _row(rng, 8, zeros=trial % 3)
        q = _row(rng, 10 if trial % 2 else 8, zeros=(trial + 1) % 3)
        agree = np.mean([sample_at(p, u) == sample_at(q, u) for u in grid])
        got = coupled_acceptance(p, q)
        assert abs(got - agree) <= 2 * 10 / n
        assert got <= expected_acceptance(p, q) + 1e-12  # the common-u overlap never beats sum min(p, q)
    p = _row(rng, 8)
    assert coupled_acceptance(p, p) == pytest.approx(1.0)
    assert coupled_acceptance(p, None, 3) == expected_acceptance(p, None, 3) == p[3]


def _logits(rng: np.random.Generator, k: int, v: int = 8) -> np.ndarray:
    return (rng.standard_normal((k + 1, v)) * 2.0).astype(np.float32)


@pytest.mark.parametrize("seeded", [False, True], ids=["generator", "seeded"])
def test_a_sampled_verify_reports_the_chance_of_each_examined_position(seeded):
    sp = SamplingParams(temperature=0.8, top_p=0.95)
    rng = np.random.default_rng(3)
    lengths = set()
    for trial in range(40):
        k = 1 + trial % 4
        logits = _logits(rng, k)
        history = [1, 2, 3]
        # likely drafts (each row's argmax; a sampled one's q puts half its mass there), so that long prefixes are kept
        draft = [int(np.argmax(logits[i])) for i in range(k)]
        q = [0.5 * _row(rng, 8) + 0.5 * np.eye(8)[draft[i]] if i % 2 == 0 else None for i in range(k)]
        source = PositionalUniforms(trial) if seeded else np.random.default_rng(trial)
        v = verify(draft, q, logits, history, sp, source)
        assert len(v.chances) == min(v.n_accepted + 1, k)
        lengths.add(len(v.chances))
        chance = coupled_acceptance if seeded else expected_acceptance
        for i, c in enumerate(v.chances):
            p_i = warp(logits[i], sp, history + draft[:i])
            assert c == pytest.approx(chance(p_i, q[i], draft[i]), abs=1e-12)
    assert lengths == {1, 2, 3, 4}
    greedy = verify([1, 2], [None, None], _logits(rng, 2), [0], SamplingParams(temperature=0), np.random.default_rng(0))
    assert greedy.chances == ()  # the indicator is certain: nothing to add


def test_the_estimators_learn_from_chances_where_given_and_from_draws_otherwise():
    est = AcceptanceEstimator(4, decay=1.0)
    est.update(3, 1, (0.6, 0.3))
    assert np.allclose(est.accepted, [0.6, 0.3, 0, 0]) and np.allclose(est.rejected, [0.4, 0.7, 0, 0])
    est.update(2, 2, (0.9, 0.8))  # all kept: both examined
    assert np.allclose(est.accepted, [1.5, 1.1, 0, 0]) and np.allclose(est.rejected, [0.5, 0.9, 0, 0])
    drawn = AcceptanceEstimator(4, decay=1.0)
    drawn.update(3, 1, (0.6,))  # not one chance per examined position: the draws count
    assert np.array_equal(drawn.accepted, [1, 0, 0, 0]) and np.array_equal(drawn.rejected, [0, 1, 0, 0])

    m = MatchLengthEstimator(decay=1.0)
    m.observe_cycle(1, 3, 1, (0.25, 0.5))
    b1, b2 = m.bucket(1), m.bucket(2)
    assert m.accepted[b1] == 0.25 and m.rejected[b1] == 0.75 and m.accepted[b2] == 0.5 and m.rejected[b2] == 0.5
    m.observe(1, True)
    assert m.accepted[b1] == 1.25 and m.rejected[b1] == 0.75


def _costs() -> CostModel:
    return CostModel({1: 0.01, 2: 0.0101, 4: 0.0102, 8: 0.0105}, c_draft=0.002, frozen=True)


class _Recorder(ModelSpeculator):
    """A ModelSpeculator that keeps every outcome it is given."""

    def __init__(self, *a, **kw) -> None:
        super().__init__(*a, **kw)
        self.outcomes: list = []

    def observe(self, outcome) -> None:
        self.outcomes.append(outcome)
        super().observe(outcome)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_the_loop_hands_the_chances_of_a_chain_to_its_speculator(temperature):
    sp = SamplingParams(temperature=temperature)
    target = FakeModel(64, seed=1)
    ctrl = Controller(SpecConfig(draft_max=4), _costs())
    spec = _Recorder(FakeModel(64, seed=1, sharp=1.5), sp, ctrl)
    run(target, [1, 2], sp, np.random.default_rng(5), 40, spec)
    drafted = [o for o in spec.outcomes if o.n_drafted]
    assert drafted
    for o in drafted:
        assert len(o.chances) == (0 if sp.greedy else min(o.n_accepted + 1, o.n_drafted))
        assert all(0.0 <= c <= 1.0 for c in o.chances)


def test_the_loop_hands_the_chances_of_a_draft_trees_chain_to_its_speculator():
    """A draft-model tree at T = 1: the chances are its chain's (first children), as many as the chain positions the
    rule tried, whether a sibling was then kept or not."""
    sp = SamplingParams(temperature=1.0)
    target = FakeTreeModel(64, seed=2)
    seen: list = []
    trees = 0
    for seed in range(20):
        spec = fake_speculator(FakeModel(64, seed=7, sharp=1.0), sp)
        orig = spec.controller.observe

        def record(*a, _orig=orig, **kw):
            seen.append((a[0], a[1], kw.get("chances", ()), kw.get("n_verified")))
            return _orig(*a, **kw)

        spec.controller.observe = record  # type: ignore[method-assign]
        run(target, [1, 2], sp, np.random.default_rng(seed), 12, spec)
    for k, m, chances, n_verified in seen:
        if k:
            assert len(chances) == min(m + 1, k)
            trees += n_verified is not None and n_verified > k
    assert trees > 0


def test_a_deterministic_drafts_chance_is_the_targets_p_of_it():
    """Deterministic drafts (a lookup's, a greedy draft's): the chance of each examined position is the target's p(d).
    The oracle drafts the target's argmax chain, so the chance at position i is the largest p there."""
    sp = SamplingParams(temperature=1.0)
    target = FakeModel(64, seed=4)
    spec = OracleSpeculator(target, 3, sp)
    ctx = [1, 2]
    run(target, list(ctx), sp, np.random.default_rng(1), 30, spec)
    checked = 0
    for o in spec.outcomes:
        if o.n_drafted:
            assert len(o.chances) == min(o.n_accepted + 1, o.n_drafted)
            for i, c in enumerate(o.chances):
                here = ctx + list(o.tokens[:i])
                assert c == pytest.approx(float(warp(target.logits(here), sp, here).max()), abs=1e-12)
                checked += 1
        ctx += list(o.tokens)
    assert checked > 10
