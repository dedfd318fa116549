"""Draft-model trees (issue 23, item 3): a draft model's chain carries the draft's next-best candidates as leaves
where it is unsure and the curve makes the extra rows pay.

* Pure: SiblingPolicy adds siblings on a flat curve and none on this project's CPU curve, none for a confident
  token, none while the controller is plain; it learns per-rank acceptance from what verification tried.
* The speculator on numpy fakes: the tree it proposes (greedy: the draft's next-best tokens; sampling: draws without
  replacement from q without the drafted token) and what it teaches the controller and the policy.
* Exactness through the loop on numpy fakes (fast): greedy identity with plain decoding over 12 seeds; the exact law
  of whole sampled generations with siblings at T = 1.0 top-p 0.9 and T = 0.7 top-k 3 is enumerated in
  test_loop_laws.test_draft_model_trees_are_exact.
* Exactness through the public API on tiny llama.cpp models (Engine.generate, slow): a chi-square smoke test at
  T = 1.0 with top-p 0.8, N = SMOKE_N = 4,000, alpha = 1e-3, the runs really verifying siblings and keeping some;
  greedy identity with plain decoding.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.drafting.model_policy import Controller, SiblingPolicy
from edgespec.drafting import ModelSpeculator, Outcome, make_speculator
from edgespec.decoding.tree import ROOT

from support.cost_curves import CPU, FLAT, frozen_costs
from support.fake_speculators import EOG, fake_speculator, run, speculating
from support.fakes import FakeModel, FakeTreeModel
from support.shared import chi_square

SMOKE_N = 4_000
ALPHA = 1e-3


# -- the policy, pure ------------------------------------------------------------------------------------------
def test_siblings_where_rows_are_cheap_and_the_draft_unsure_only():
    flat = speculating(FLAT)
    flat.next_k()
    assert flat.siblings(1, 0.3, 2, 2) == 2  # unsure, rows almost free: both allowed siblings
    assert flat.siblings(1, 0.3, 2, 1) == 1  # never more than available
    assert flat.siblings(1, 0.999, 2, 2) == 0  # confident: a sibling would almost never be tried
    cpu = speculating(CPU)
    cpu.next_k()
    assert cpu.siblings(1, 0.3, 2, 2) == 0  # a row costs about 0.6 of a token here
    plain = Controller(SpecConfig(draft_max=4), frozen_costs(FLAT), siblings=SiblingPolicy(4, 3))
    plain.next_k()
    assert plain.plain and plain.siblings(1, 0.3, 2, 2) == 0  # probes draft chains
    assert Controller(SpecConfig(draft_max=4), frozen_costs(FLAT)).siblings(1, 0.3, 2, 2) == 0  # no sibling policy


def test_sibling_gain_shrinks_with_the_chance_of_getting_there():
    ctrl = speculating(FLAT, a=0.6)
    ctrl.next_k()
    assert ctrl.siblings(1, 0.4, 2, 2) == 2
    # deep in a chain of unsure tokens the position is rarely reached: min_gain stops it
    for i in range(1, 4):
        ctrl.keep_drafting(i, 0.2)
    assert ctrl.siblings(4, 0.2, 5, 2) == 0


def test_a_chain_with_siblings_stops_before_the_cliff_they_bring_closer():
    """A100-like cliff: 9 verify rows cost 3.9x one. A confident chain drafts up to 7 tokens (8 rows); with 2
    siblings already in the batch it stops 2 tokens earlier."""
    cliff = {1: 1.0, 2: 1.05, 4: 1.15, 8: 1.45, 9: 3.9, 16: 4.3}
    ctrl = speculating(cliff, draft_max=16, a=0.999)
    ctrl.next_k()
    assert ctrl.keep_drafting(6, 0.999) and not ctrl.keep_drafting(7, 0.999)
    ctrl.next_k()
    assert ctrl.keep_drafting(4, 0.999, extra_rows=2) and not ctrl.keep_drafting(5, 0.999, extra_rows=2)


def test_the_policy_learns_per_rank_acceptance_and_counts_against_the_rate():
    pol = SiblingPolicy(4, 3, decay=1.0)
    prior = pol.rates().copy()
    for _ in range(50):
        pol.observe(1, True)  # the first sibling kept
    assert pol.rates()[0] > 0.9 and pol.rates()[1] == pytest.approx(prior[1])
    for _ in range(50):
        pol.observe(2, False)  # both tried and rejected
    assert 0.4 < pol.rates()[0] < 0.6 and pol.rates()[1] < 0.05
    assert pol.kept == 50
    # the gain must beat rho * dt for every sibling
    assert pol.count(0.5, [0.0, 0.0], 100.0) == 1  # the second sibling's gain is below min_gain
    assert pol.count(0.5, [1.0, 1.0], 100.0) == 0  # a row worth 100 tokens of time


# -- the speculator on fakes -----------------------------------------------------------------------------------
class _UnsureDraft:
    """A draft (DraftModel protocol) whose rows rank token 3 first, then 5, then 9 (the rest -inf): softmax([2, 1.5, 1])
    (unsure: 0.51 for 3), or with sure_first, softmax([9, 1.5, 1]) at the first drafted position (0.999 for 3)."""

    n_ctx = 1 << 20
    n_vocab = 16

    def __init__(self, sure_first: bool = False) -> None:
        self.cached: list[int] = []
        self.sure_first = sure_first
        self._drafted = 0

    @property
    def n_past(self) -> int:
        return len(self.cached)

    def common_prefix(self, tokens) -> int:
        n = 0
        while n < min(len(tokens), len(self.cached)) and tokens[n] == self.cached[n]:
            n += 1
        return n

    def _row(self) -> np.ndarray:
        row = np.full((1, self.n_vocab), -np.inf, dtype=np.float32)
        row[0, [3, 5, 9]] = [9.0 if self.sure_first and self._drafted == 0 else 2.0, 1.5, 1.0]
        return row

    def sync(self, tokens, rows=(-1,)):
        self.cached, self._drafted = list(tokens), 0
        return self._row()

    def decode(self, tokens, start_pos, rows=(-1,)):
        self.cached += list(tokens)
        self._drafted += 1
        return self._row()

    def is_eog(self, token: int) -> bool:
        return False


def test_a_greedy_draft_branches_on_its_next_best_tokens_where_unsure():
    ctrl = speculating(FLAT, draft_max=3, siblings=4, a=0.95)
    spec = ModelSpeculator(_UnsureDraft(), SamplingParams(temperature=0), ctrl)
    p = spec.propose(list(range(10)), 8, np.random.default_rng(0))
    tree = p.tree
    assert tree is not None and p.source == "model" and not p.tokens
    # the unsure first token 3 with the next-best tokens 5 and 9 beside it (never a -inf token), deterministic
    assert [tree.token(c) for c in tree.children(ROOT)] == [3, 5, 9]
    assert all(tree.q(i) is None for i in range(len(tree)))
    # sure of the first token: no sibling there; the second position is unsure and gets them
    ctrl = speculating(FLAT, draft_max=3, siblings=4, a=0.95)
    spec = ModelSpeculator(_UnsureDraft(sure_first=True), SamplingParams(temperature=0), ctrl)
    tree = spec.propose(list(range(10)), 8, np.random.default_rng(0)).tree
    assert tree is not None and [tree.token(c) for c in tree.children(ROOT)] == [3]
    first = tree.children(ROOT)[0]
    assert [tree.token(c) for c in tree.children(first)] == [3, 5, 9]
    assert tree.max_depth == 2 and len(tree) == 4


def test_the_walk_teaches_the_chain_the_siblings_and_the_curve_apart():
    ctrl = speculating(FLAT, draft_max=3, siblings=4, a=0.95)
    spec = ModelSpeculator(_UnsureDraft(sure_first=True), SamplingParams(temperature=0), ctrl)
    ctx = list(range(10))
    tree = spec.propose(ctx, 8, np.random.default_rng(0)).tree
    assert tree is not None and len(tree) == 4
    seen: dict = {}
    orig = ctrl.observe
    ctrl.observe = lambda *a, **kw: (seen.update(args=a, kw=kw), orig(*a, **kw))[1]  # type: ignore[method-assign]
    pol = ctrl.sibling_policy
    assert pol is not None and pol.added == 2
    # the target keeps 3, rejects the second 3, keeps the sibling 5 (a leaf), then adds its own token 7
    spec.observe(Outcome(4, 2, 3, 0.001, 0.01, (3, 5, 7)))
    assert seen["args"][:2] == (2, 1)  # the chain: 2 drafted, 1 kept (position 2 rejected)
    assert seen["kw"]["n_verified"] == 4 and seen["kw"]["bonus"] == 1
    assert pol.kept == 1 and pol.tries[0] > pol.tries[1]
    # next cycle: both siblings tried and rejected
    tries = pol.tries.copy()
    tree = spec.propose(ctx + [3, 5, 7], 8, np.random.default_rng(0)).tree
    assert tree is not None
    spec.observe(Outcome(len(tree), 1, 2, 0.001, 0.01, (3, 8)))
    assert seen["kw"]["bonus"] == 0 and pol.kept == 1
    assert np.all(pol.tries > tries * pol.decay**2)
    # a tree cut to fit a small batch (fewer nodes decoded than drafted): its siblings teach nothing
    tries = pol.tries.copy()
    tree = spec.propose(ctx + [3, 5, 7, 3, 8], 8, np.random.default_rng(0)).tree
    assert tree is not None
    spec.observe(Outcome(2, 1, 2, 0.001, 0.01, (3, 8)))
    assert np.array_equal(pol.tries, tries)


def test_a_sampling_draft_draws_its_siblings_without_replacement():
    ctrl = speculating(FLAT, draft_max=2, siblings=4)
    spec = ModelSpeculator(_UnsureDraft(), SamplingParams(temperature=1.0), ctrl)
    p = spec.propose(list(range(10)), 8, np.random.default_rng(5))
    tree = p.tree
    assert tree is not None
    kids = tree.children(ROOT)
    assert len(kids) == 3 and tree.is_sampled(ROOT)
    q = [tree.q(c) for c in kids]
    x = [tree.token(c) for c in kids]
    assert sorted(x) == [3, 5, 9]  # three draws without replacement from a 3-token row
    # sibling j's row is q without the earlier ones, renormalised
    for j in range(1, 3):
        expect = np.array(q[0], dtype=np.float64)
        expect[x[:j]] = 0.0
        assert np.allclose(q[j], expect / expect.sum())


def test_seeded_generations_and_fixed_lengths_draft_chains():
    from edgespec.decoding.sampling import PositionalUniforms

    spec = ModelSpeculator(_UnsureDraft(), SamplingParams(temperature=1.0), speculating(FLAT))
    p = spec.propose(list(range(10)), 8, PositionalUniforms(3))
    assert p.tree is None and p.tokens
    fixed = make_speculator(
        "model", SpecConfig(draft_max=3, adaptive=False), SamplingParams(), frozen_costs(FLAT), _UnsureDraft(), tree_paths=5
    )
    assert isinstance(fixed, ModelSpeculator) and fixed.controller.sibling_policy is None
    adaptive = make_speculator("model", SpecConfig(draft_max=3), SamplingParams(), frozen_costs(FLAT), _UnsureDraft(), tree_paths=3)
    assert isinstance(adaptive, ModelSpeculator)
    assert adaptive.controller.sibling_policy is not None and adaptive.controller.sibling_policy.max_siblings == 2
    chains = make_speculator("model", SpecConfig(draft_max=3), SamplingParams(), frozen_costs(FLAT), _UnsureDraft(), tree_paths=0)
    assert isinstance(chains, ModelSpeculator) and chains.controller.sibling_policy is None


# -- exactness through the loop, on numpy fakes ----------------------------------------------------------------


def test_greedy_draft_trees_equal_plain():
    sp = SamplingParams(temperature=0)
    kept = 0
    for seed in range(12):
        plain, ps = run(FakeModel(48, seed=seed, eog=EOG), [1, 2], sp, np.random.default_rng(0), 40)
        target = FakeTreeModel(48, seed=seed, eog=EOG)
        spec = fake_speculator(FakeModel(48, seed=seed + 100, sharp=1.0), sp)
        out, st = run(target, [1, 2], sp, np.random.default_rng(0), 40, spec)
        assert out == plain and st.stop_reason == ps.stop_reason
        kept += spec.controller.sibling_policy.kept  # type: ignore[union-attr]
    assert kept > 0  # siblings were verified and kept


# the exact law of sampled draft-model trees on the fakes: test_loop_laws.test_draft_model_trees_are_exact


# -- exactness through the public API, tiny llama.cpp models ---------------------------------------------------
def _engine(tiny):
    from edgespec.llama.backend import Model
    from edgespec.drafting.calibration import Calibration
    from edgespec.runtime.engine import Engine

    # the draft: the target's own file sampled at temperature 2 (q != p, an unsure draft that is often right: the
    # tiny draft model is accepted so rarely that the controller decodes plainly and never branches)
    target = Model(ModelSpec(tiny["target"], n_ctx=64, n_batch=16, n_threads=1), tree_paths=5)
    draft = Model(ModelSpec(tiny["target"], n_ctx=64, n_batch=16, n_threads=1))
    flat = Calibration({1: 1e-3, 16: 1.02e-3}, 2e-4, "fixed")  # a GPU-like curve: rows are almost free
    spec = SpecConfig(draft_max=3, draft_temperature=2.0)
    return Engine(target, draft, drafter="model", spec=spec, calibration=flat)


@pytest.mark.slow
def test_greedy_draft_trees_through_the_engine_equal_plain(tiny):
    eng = _engine(tiny)
    try:
        prompts = [[ord(c) for c in s] for s in ("abc d", "hello", "xyz xyz", "q", "the cat")]
        added = kept = 0
        for prompt in prompts:
            plain = eng.generate(tokens=prompt, sampling=SamplingParams(temperature=0), max_tokens=24, speculative=False)
            r = eng.generate(tokens=prompt, sampling=SamplingParams(temperature=0), max_tokens=24)
            assert r.token_ids == plain.token_ids
            added += r.stats.controller["siblings"]["added"]
            kept += r.stats.controller["siblings"]["kept"]
    finally:
        eng.close()
    assert added > 0 and kept > 0  # trees were verified and siblings kept


@pytest.mark.slow
@pytest.mark.parametrize("settings", [dict(temperature=1.0, top_p=0.8)], ids=["T1.0-topp0.8"])
def test_draft_trees_are_exact_through_the_engine(tiny, settings):
    """A chi-square smoke test: SMOKE_N generations through Engine.generate, alpha = ALPHA. Unseeded (a seeded
    generation drafts chains and is verified by common random numbers): the engine's entropy is fixed instead, so
    the run can be replayed. (T = 0.7 and the exact law of the same trees: test_loop_laws.)"""
    from support.model_law import PROMPT, exact_distribution as exact_llama

    from edgespec.llama.backend import Model

    sp = SamplingParams(**settings)
    t = Model(ModelSpec(tiny["target"], n_ctx=64, n_batch=16, n_threads=1))
    try:
        exact = exact_llama(t, PROMPT, sp, 3)
    finally:
        t.close()
    eng = _engine(tiny)
    eng._entropy = np.random.SeedSequence(2026)
    try:
        seqs, added, kept = [], 0, 0
        for _ in range(SMOKE_N):
            r = eng.generate(tokens=PROMPT, sampling=sp, max_tokens=3)
            seqs.append(tuple(r.token_ids[:3]))
            sib = r.stats.controller.get("siblings", {})
            added += sib.get("added", 0)
            kept += sib.get("kept", 0)
    finally:
        eng.close()
    assert added > SMOKE_N // 4 and 0 < kept < added, (added, kept)
    p = chi_square(seqs, exact)
    assert p > ALPHA, f"{settings}: chi-square p = {p:.2e} (N={SMOKE_N})"


def test_spec_config_draft_siblings_is_checked():
    from edgespec.errors import ConfigError

    with pytest.raises(ConfigError):
        SpecConfig(draft_siblings=-1)
    with pytest.raises(ConfigError):
        SpecConfig(draft_siblings=True)  # type: ignore[arg-type]
    assert replace(SpecConfig(), draft_siblings=0).draft_siblings == 0
