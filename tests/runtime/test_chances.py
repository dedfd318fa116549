"""Acceptance chances (Rao-Blackwell): a sampled verify reports, for each draft position it examined, the probability
that position had of being accepted, and the acceptance estimators learn from those expectations instead of the
accepted/rejected draws. Pure numpy fakes, no llama.cpp."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.decoding.acceptance import expected_acceptance
from edgespec.config import SamplingParams, SpecConfig
from edgespec.drafting.costs import CostModel
from edgespec.drafting.estimators import AcceptanceEstimator, MatchLengthEstimator
from edgespec.drafting.model_policy import Controller
from edgespec.decoding.sampling import PositionalUniforms, warp
from edgespec.runtime.speculate import verify
from edgespec.drafting import ModelSpeculator

from support.fake_speculators import OracleSpeculator, fake_speculator, run
from support.fakes import FakeModel, FakeTreeModel


def _row(rng: np.random.Generator, n: int, zeros: int = 0) -> np.ndarray:
    x = rng.gamma(0.5, size=n)
    x[rng.choice(n, size=zeros, replace=False)] = 0.0
    return x / x.sum()


def _logits(rng: np.random.Generator, k: int, v: int = 8) -> np.ndarray:
    return (rng.standard_normal((k + 1, v)) * 2.0).astype(np.float32)


def test_a_sampled_verify_reports_the_chance_of_each_examined_position():
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
        v = verify(draft, q, logits, history, sp, np.random.default_rng(trial), sampled_chances=True)
        assert len(v.chances) == min(v.n_accepted + 1, k)
        lengths.add(len(v.chances))
        for i, c in enumerate(v.chances):
            p_i = warp(logits[i], sp, history + draft[:i])
            assert c == pytest.approx(expected_acceptance(p_i, q[i], draft[i]), abs=1e-12)
        # not asked for: a verify that examined a sampled draft (here always d_0) reports none
        assert verify(draft, q, logits, history, sp, np.random.default_rng(trial)).chances == ()
    assert lengths == {1, 2, 3, 4}
    greedy = verify([1, 2], [None, None], _logits(rng, 2), [0], SamplingParams(temperature=0), np.random.default_rng(0))
    assert greedy.chances == ()  # the indicator is certain: nothing to add


def test_deterministic_drafts_always_have_their_chance_and_seeded_sampled_ones_never():
    """p(d) is one entry of a row the verify computes anyway, and it is the acceptance probability under the chain rule
    and under common random numbers alike; a seeded verify accepts a sampled draft with another probability than
    sum min(p, q), so it reports none even when asked."""
    sp = SamplingParams(temperature=1.0)
    rng = np.random.default_rng(8)
    for trial in range(20):
        logits = _logits(rng, 3)
        draft = [int(np.argmax(logits[i])) for i in range(3)]
        for source in (np.random.default_rng(trial), PositionalUniforms(trial)):
            v = verify(draft, [None] * 3, logits, [0], sp, source)
            assert len(v.chances) == min(v.n_accepted + 1, 3)
            for i, c in enumerate(v.chances):
                assert c == pytest.approx(float(warp(logits[i], sp, [0] + draft[:i])[draft[i]]), abs=1e-12)
        q = [_row(rng, 8), None, None]
        assert verify(draft, q, logits, [0], sp, PositionalUniforms(trial), sampled_chances=True).chances == ()


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
    ctrl = Controller(SpecConfig(draft_max=4), _costs(), chances_below=float("inf"))  # every cycle asks
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
        spec.controller.chances_below = float("inf")
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


def test_a_draft_asks_for_its_chances_while_its_evidence_is_thin():
    """Controller.wants_chances: while position 1 holds fewer than chances_below decayed observations (a fresh engine,
    a long plain stretch that aged them), not once it holds more."""
    sp = SamplingParams(temperature=1.0)
    ctrl = Controller(SpecConfig(draft_max=4), _costs(), chances_below=6.0)
    spec = _Recorder(FakeModel(64, seed=1, sharp=1.5), sp, ctrl)
    asked = []
    orig = spec._draft

    def draft(*a, **kw):
        p = orig(*a, **kw)
        asked.append((p.sampled_chances, ctrl.estimator.evidence(1)))
        return p

    spec._draft = draft  # type: ignore[method-assign]
    run(FakeModel(64, seed=1), [1, 2], sp, np.random.default_rng(5), 50, spec)
    assert asked and asked[0][0]  # fresh: asks
    assert all(want == (seen < 6.0) for want, seen in asked)
    assert not asked[-1][0]  # evidence piled up: draws from then on
    drafted = [o for o in spec.outcomes if o.n_drafted]
    assert any(o.chances for o in drafted) and any(not o.chances for o in drafted)
