"""Exactness of speculative decoding through the real llama.cpp on tiny generated models.

* Greedy identity: speculative output == plain target output, token for token (tiny models have large top-2
  gaps, so full identity is demanded), for every speculator, and each run must really draft.
* Seeded identity through the public API (Engine.generate with a seed): speculative output == the engine's plain
  output == the reference (the target's warped rows sampled by inverse CDF at PositionalUniforms' uniforms), token
  for token, for every seed in SEEDED_N, with the model draft, the hybrid and the n-gram lookup.
* Chi-square smoke tests (the law, sampled through llama.cpp): the speculative sampler's distribution over the first
  3 generated tokens against the target's exact distribution, enumerated from the target alone. **N = SMOKE_N =
  5,000 sequences, significance ALPHA = 1e-3**, cells with expected count < 5 merged into one; a sampled sequence
  outside the exact support fails at once. Fixed seeds. Run for the model draft (T = 1) and suffix-index trees
  (T = 1, top-k 3); the control (an accept-always rule) FAILS the same test at the same N (p < 1e-6).
  Every other setting and drafter (7 sampling settings, the adaptive controller, draft temperature, hybrid, bad
  draft, lookup, trees, draft-model trees, constraints, the acceptance rate at position 1) is an exact law of whole
  generations on numpy fakes: tests/runtime/test_loop_laws.py.
* Controls: a draft equal to the target is accepted 100% of the time (exactly).
* Rollback: after a long generation with many rejections, the target's cache gives the same next-token logits as
  a fresh prefill (tolerance 1e-2; a different recent token moves them by > 0.1).
"""

from __future__ import annotations

import numpy as np
import pytest

import edgespec.runtime.speculate as spec_mod
from edgespec.decoding.acceptance import Verdict
from edgespec.llama.backend import Model
from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.drafting.costs import CostModel
from edgespec.drafting.ngram import NgramIndex
from edgespec.drafting.estimators import MatchLengthEstimator
from edgespec.drafting.lookup_policy import NgramPolicy
from edgespec.drafting.model_policy import Controller
from edgespec.decoding.sampling import sample, warp
from edgespec.runtime.speculate import speculate
from edgespec.drafting import HybridSpeculator, LookupSpeculator, ModelSpeculator
from edgespec.stats import GenerationStats

from support.model_law import PROMPT, exact_distribution
from support.shared import SETTINGS, chi_square

SMOKE_N = 5_000
ALPHA = 1e-3
SEEDED_N = 300
SEQ_LEN = 3
ROLLBACK_TOL = 1e-2
# A verify curve on which drafting pays (GPU-like), frozen: decisions depend on acceptance only.
FLAT = {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.3}


@pytest.fixture(scope="module")
def models(tiny):
    opened = {}
    for key in ("target", "draft", "bad_draft"):
        opened[key] = Model(ModelSpec(tiny[key], n_ctx=512, n_batch=64, n_threads=1), tree_paths=8 if key == "target" else 0)
    # a second instance of the target, used as its own draft
    opened["target_as_draft"] = Model(ModelSpec(tiny["target"], n_ctx=512, n_batch=64, n_threads=1))
    yield opened
    for m in opened.values():
        m.close()


def model_speculator(model, sp, k, *, adaptive=False, draft_temperature=None, c_draft=0.02):
    spec = SpecConfig(draft_max=k, adaptive=adaptive, draft_temperature=draft_temperature)
    return ModelSpeculator(model, sp, Controller(spec, CostModel(FLAT, c_draft=c_draft, frozen=True)), draft_temperature)


def lookup_speculator(policy: NgramPolicy | None = None, n_max: int = 4, **spec) -> LookupSpeculator:
    """The n-gram lookup choosing its own lengths on a cheap-verify curve, so that it does draft."""
    cost = CostModel({1: 1.0, 2: 1.1, 4: 1.3, 8: 1.8, 16: 2.5}, frozen=True)  # units, not this run's seconds
    return LookupSpeculator(NgramIndex(n_max, 1), policy or NgramPolicy(SpecConfig(**spec), cost))


def suffix_speculator(adaptive: bool = False, memory=None):
    """Suffix-index lookups verified as trees: a fixed shape (the best 8 candidates, width 3) or chosen from a
    cheap-verify curve, so that trees are really verified."""
    from edgespec.drafting.lookup_policy import TreePolicy
    from edgespec.drafting import SuffixSpeculator
    from edgespec.drafting.suffix_index import SuffixIndex

    cost = CostModel({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.3}, frozen=True)
    spec = SpecConfig(adaptive=adaptive, draft_max=4)
    return SuffixSpeculator(memory if memory is not None else SuffixIndex(), TreePolicy(spec, cost, 8, 3, min_gain=0.0))


def generate(target, ctx, sampling, rng, max_tokens, speculator=None, stats=None):
    out = []
    for step in speculate(target, ctx, sampling, rng, max_tokens=max_tokens, speculator=speculator, stats=stats):
        out.extend(step.tokens)
    return out


# ------------------------------------------------------------------------------------------------ greedy
GREEDY_KINDS = ["draft", "bad_draft", "draft-adaptive", "ngram-fixed", "lookup", "hybrid", "suffix-tree", "suffix-adaptive"]


def _greedy_speculator(kind, models, sp):
    if kind == "draft":
        return model_speculator(models["draft"], sp, 4)
    if kind == "bad_draft":
        return model_speculator(models["bad_draft"], sp, 4)
    if kind == "draft-adaptive":
        return model_speculator(models["draft"], sp, 6, adaptive=True)
    if kind == "ngram-fixed":
        return lookup_speculator(draft_max=4, adaptive=False)
    if kind == "lookup":
        return lookup_speculator()
    if kind.startswith("suffix"):
        return suffix_speculator(adaptive=kind == "suffix-adaptive")
    return HybridSpeculator(model_speculator(models["draft"], sp, 4, adaptive=True), lookup_speculator())


@pytest.mark.parametrize("kind", GREEDY_KINDS)
def test_greedy_identity_many_prompts(models, kind):
    target = models["target"]
    greedy = SamplingParams(temperature=0)
    rng = np.random.default_rng(0)
    # random prompts, and repetitive ones where a lookup finds matches
    prompts = [list(map(int, np.random.default_rng(s).integers(0, 256, 3 + s % 13))) for s in range(25)]
    prompts += [[ord(c) for c in "abcabcabcab"], [ord(c) for c in "the the the th"], PROMPT * 4]
    drafted = 0
    for ctx in prompts:
        plain = generate(target, ctx, greedy, rng, 40)
        stats = GenerationStats()
        spec = generate(target, ctx, greedy, rng, 40, _greedy_speculator(kind, models, greedy), stats)
        assert spec == plain, f"prompt {ctx}: speculative output differs from plain greedy"
        drafted += stats.n_drafted
    assert drafted > 0, f"{kind}: nothing was drafted, so nothing was tested"


def test_greedy_identity_with_repeat_penalty(models):
    target = models["target"]
    sp = SamplingParams(temperature=0, repeat_penalty=1.3, repeat_last_n=16)
    rng = np.random.default_rng(1)
    stats = GenerationStats()
    for s in range(10):
        ctx = list(map(int, np.random.default_rng(100 + s).integers(0, 256, 6)))
        plain = generate(target, ctx, sp, rng, 40)
        spec = generate(target, ctx, sp, rng, 40, model_speculator(models["draft"], sp, 3), stats)
        assert spec == plain
    assert stats.n_drafted > 0


# ------------------------------------------------------------------------------------------------ distribution


SEEDS = {name: 1000 + i for i, name in enumerate(SETTINGS)}  # fixed: a failure replays exactly


def sample_sequences(target, sp, make, seed, n=SMOKE_N, stats=None):
    """n sequences of SEQ_LEN tokens after PROMPT, a fresh speculator from make() for each (None = plain)."""
    rng = np.random.default_rng(seed)
    return [tuple(generate(target, PROMPT, sp, rng, SEQ_LEN, make(), stats)[:SEQ_LEN]) for _ in range(n)]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["T1.0"])
def test_distribution_identity_model_draft(models, name):
    """Chi-square smoke test (SMOKE_N, ALPHA); the other settings: test_loop_laws.test_model_draft_chains_are_exact."""
    sp = SETTINGS[name]
    exact = exact_distribution(models["target"], PROMPT, sp, SEQ_LEN)
    stats = GenerationStats()
    seqs = sample_sequences(models["target"], sp, lambda: model_speculator(models["draft"], sp, 2), SEEDS[name], stats=stats)
    assert stats.n_drafted > 0 and 0 < stats.n_accepted < stats.n_drafted  # real accepts and rejections
    p = chi_square(seqs, exact)
    assert p > ALPHA, f"{name}: chi-square p = {p:.2e} (N={SMOKE_N})"


# The adaptive controller, a draft at its own temperature, the hybrid, a bad draft and the n-gram lookup: exact laws in
# test_loop_laws.test_controller_paths_and_other_drafters_are_exact.


def reference_seeded(target: Model, prompt: list[int], sp: SamplingParams, n: int) -> list[int]:
    """Plain seeded decoding by its definition: the token at position t is sample_at(warp(row), at(t)), at(t) being
    PositionalUniforms(seed)'s uniform for t (stopping at an end token)."""
    from edgespec.decoding.sampling import PositionalUniforms, sample_at

    u = PositionalUniforms(sp.seed)
    ctx = list(prompt)
    for _ in range(n):
        x = sample_at(warp(target.sync(ctx)[0], sp, ctx), u.at(len(ctx)))
        ctx.append(x)
        if target.is_eog(x):
            break
    return ctx[len(prompt):]


@pytest.mark.slow
@pytest.mark.parametrize("drafter,settings", [
    ("model", dict(temperature=1.0)),
    ("model+ngram", dict(temperature=0.8, top_k=5, min_p=0.02)),
    ("ngram", dict(temperature=1.0, presence_penalty=0.5)),
])
def test_seeded_identity_through_the_engine(tiny, models, drafter, settings):
    """The public API end to end (Engine.generate: the worker, the speculator factory, the adaptive controller, the
    detokenizer), seeded: for seeds 0..SEEDED_N-1 the speculative output equals the engine's plain output and the
    reference (plain seeded decoding by its definition), token for token, 6 tokens each, with drafts accepted and
    rejected. (This replaces a chi-square over 20,000 seeded generations per drafter: identity per seed is stronger,
    and the law of the reference over seeds is the target's since the uniforms are i.i.d.: test_sampling.)"""
    from dataclasses import replace

    from edgespec.drafting.calibration import Calibration
    from edgespec.runtime.engine import Engine

    sp0 = SamplingParams(**settings)
    prompt = PROMPT if drafter != "ngram" else [ord(c) for c in "abc dabc"]  # a lookup needs a repeat to match
    target = Model(ModelSpec(tiny["target"], n_ctx=64, n_batch=16, n_threads=1))
    draft = Model(ModelSpec(tiny["draft"], n_ctx=64, n_batch=16, n_threads=1))
    flat = Calibration({1: 1e-3, 16: 1.05e-3}, 2e-4, "fixed")  # a GPU-like curve: the draft model pays
    eng = Engine(target, draft, drafter=drafter, spec=SpecConfig(draft_max=3), calibration=flat)
    drafted = accepted = 0
    try:
        for i in range(SEEDED_N):
            sp = replace(sp0, seed=i)
            # the lookup's acceptance estimate starts from its prior each time (learnt across many generations of a
            # random model it would stop drafting, and the accept/reject paths would go untested)
            eng.learning.run_estimator = MatchLengthEstimator()
            r = eng.generate(tokens=prompt, sampling=sp, max_tokens=6)
            plain = eng.generate(tokens=prompt, sampling=sp, max_tokens=6, speculative=False)
            assert r.token_ids == plain.token_ids == reference_seeded(models["target"], prompt, sp, 6), f"seed {i}"
            drafted += r.stats.n_drafted
            accepted += r.stats.n_accepted
    finally:
        eng.close()
    assert drafted > 0 and 0 < accepted < drafted


@pytest.mark.slow
@pytest.mark.parametrize("name", ["T1.0-topk3"])
def test_distribution_identity_token_trees(models, name):
    """Chi-square smoke test (SMOKE_N, ALPHA): suffix-index trees (width 3, up to 8 nodes) verified in one decode,
    with one memory shared by all N runs (so candidates come from earlier sequences too). Every setting as an exact
    law: test_loop_laws.test_suffix_trees_are_exact."""
    from edgespec.drafting.suffix_index import SuffixIndex

    sp = SETTINGS[name]
    exact = exact_distribution(models["target"], PROMPT, sp, SEQ_LEN)
    memory = SuffixIndex()
    stats = GenerationStats()
    seqs = sample_sequences(models["target"], sp, lambda: suffix_speculator(memory=memory), seed=SEEDS[name] + 100, stats=stats)
    assert stats.n_drafted > 1000 and 0 < stats.n_accepted < stats.n_drafted
    p = chi_square(seqs, exact)
    assert p > ALPHA, f"{name}: chi-square p = {p:.2e} (N={SMOKE_N})"


@pytest.mark.slow
def test_draft_equal_to_target_is_always_accepted(models):
    sp = SETTINGS["T1.0-topp0.8"]
    stats = GenerationStats()
    target = models["target"]
    rng = np.random.default_rng(3)
    for _ in range(150):
        generate(target, PROMPT, sp, rng, 8, model_speculator(models["target_as_draft"], sp, 3), stats)
    assert stats.n_drafted > 300
    assert stats.n_accepted == stats.n_drafted  # exactly 100%


@pytest.mark.slow
def test_control_accept_always_fails_the_test(models, monkeypatch):
    """The chi-square smoke test has power at SMOKE_N: a broken rule that keeps every draft token is caught."""

    def accept_always(draft, q, p, rng):
        return Verdict(len(draft), sample(p[len(draft)], rng), True)

    monkeypatch.setattr(spec_mod, "accept_sampled", accept_always)
    sp = SETTINGS["T1.0"]
    exact = exact_distribution(models["target"], PROMPT, sp, SEQ_LEN)
    seqs = sample_sequences(models["target"], sp, lambda: model_speculator(models["draft"], sp, 2), seed=11)
    p = chi_square(seqs, exact)
    assert p < 1e-6, f"the broken rule passed (p = {p:.2e}): the test has no power"


# the acceptance rate at draft position 1 against sum(min(p, q)), exactly: test_loop_laws


def test_rollback_leaves_cache_equal_to_fresh_prefill(models, tiny):
    sp = SamplingParams(temperature=1.0)
    target = models["target"]
    stats = GenerationStats()
    out = generate(target, PROMPT, sp, np.random.default_rng(2), 300, model_speculator(models["draft"], sp, 4), stats)
    assert stats.n_drafted - stats.n_accepted > 20  # many rejections happened
    ctx = PROMPT + out
    # the loop's invariant: the cache holds all but the last token
    assert target.cached == ctx[:-1]
    from_cache = target.decode([ctx[-1]], len(ctx) - 1, (0,))[0]
    with Model(ModelSpec(tiny["target"], n_ctx=512, n_batch=512)) as fresh:
        ref = fresh.decode(ctx, 0, (-1,))[0]
        # control: what a stale cache entry would look like (one recent token different) is far outside the
        # tolerance
        fresh.reset()
        bad = list(ctx)
        bad[-3] = (bad[-3] + 1) % 256
        other = fresh.decode(bad, 0, (-1,))[0]
    # F16 KV cache and different batch shapes: ~4e-3 seen on logits of magnitude ~10
    assert np.max(np.abs(from_cache - ref)) < ROLLBACK_TOL
    assert np.max(np.abs(other - ref)) > 10 * ROLLBACK_TOL


def test_seed_reproduces_output_with_the_adaptive_controller(models):
    sp = SamplingParams(temperature=1.0, seed=1234)
    runs, stats = [], []
    for _ in range(2):
        rng = np.random.default_rng(sp.seed)
        st = GenerationStats()
        runs.append(generate(models["target"], PROMPT, sp, rng, 50, model_speculator(models["draft"], sp, 6, adaptive=True), st))
        stats.append(st)
    assert runs[0] == runs[1]
    assert stats[0].n_drafted > 0 and stats[0].drafted_by_pos == stats[1].drafted_by_pos


def test_max_tokens_and_eos(models, tmp_path):
    sp = SamplingParams(temperature=0)
    out = generate(models["target"], PROMPT, sp, np.random.default_rng(0), 7, model_speculator(models["draft"], sp, 5))
    assert len(out) == 7
    # a target whose hot set holds its end token: generation stops right after it, speculative as plain
    from support.tiny import token_id, write_tiny_model

    im_end = 262
    hot = tuple(token_id(c) for c in "ab") + (im_end,)
    t = Model(ModelSpec(write_tiny_model(tmp_path / "eos.gguf", seed=1, hot_tokens=hot), n_ctx=256, n_threads=1))
    d = Model(ModelSpec(write_tiny_model(tmp_path / "eos-d.gguf", seed=2, hot_tokens=hot, layer_scale=0.4), n_ctx=256, n_threads=1))
    try:
        ended = 0
        for s in range(20):
            ctx = list(map(int, np.random.default_rng(500 + s).integers(97, 99, 4)))
            st = GenerationStats()
            plain = generate(t, ctx, sp, np.random.default_rng(0), 60)
            spec = generate(t, ctx, sp, np.random.default_rng(0), 60, model_speculator(d, sp, 4), st)
            assert spec == plain
            if plain and plain[-1] == im_end:
                ended += 1
                assert st.stop_reason == "eos" and im_end not in plain[:-1]
        assert ended > 0
    finally:
        t.close()
        d.close()


def test_a_greedy_verify_takes_every_rows_argmax_in_one_pass_with_greedy_tokens_rule():
    """finite_argmax_rows (a greedy verify without penalties or masks) = greedy_token row by row on 200 random
    rows, and on rows with tied maxima (the lowest index, numpy's rule), -inf entries; a row whose largest value is NaN
    or +inf, or that has no finite value, raises NonFiniteLogitsError as greedy_token does."""
    from edgespec.decoding.sampling import NonFiniteLogitsError, greedy
    from edgespec.decoding.warp_spec import finite_argmax_rows

    rng = np.random.default_rng(0)
    sp = SamplingParams(temperature=0.0)
    rows = rng.standard_normal((200, 50)).astype(np.float32)
    rows[::7, 3] = rows[::7, 30] = rows[::7].max(axis=1) + 1.0  # ties: 3 and 30
    rows[::5, 40:] = -np.inf
    assert finite_argmax_rows(rows) == [greedy(r, sp) for r in rows]
    assert all(finite_argmax_rows(rows)[i] == 3 for i in range(0, 200, 7))
    for bad in (np.nan, np.inf):
        x = rows[:3].copy()
        x[1, 5] = bad
        with pytest.raises(NonFiniteLogitsError):
            finite_argmax_rows(x)
        with pytest.raises(NonFiniteLogitsError):
            greedy(x[1], sp)
    x = rows[:2].copy()
    x[0] = -np.inf
    with pytest.raises(NonFiniteLogitsError):
        finite_argmax_rows(x)
