"""Exactness of speculative decoding through the real llama.cpp on tiny generated models.

* Greedy identity: speculative output == plain target output, token for token (tiny models have large top-2
  gaps, so full identity is demanded), for every speculator, and each run must really draft.
* Distribution identity: the speculative sampler's distribution over the first 3 generated tokens equals the
  target's exact distribution, enumerated from the target alone. Chi-square, **N = 20,000 sequences per setting,
  significance level 1e-3**, cells with expected count < 5 merged into one; a sampled sequence outside the exact
  support fails at once. Seeds are fixed per setting (listed in SEEDS), so any failure can be replayed.
  Covered: the model speculator with a fixed k, with the adaptive controller (probes, early stops, plain
  fallback), with its own draft temperature; the n-gram lookup; the hybrid; and the Engine's own wiring through
  the public API (Engine.generate).
* Controls: a draft equal to the target is accepted 100% of the time (exactly); a deliberately bad draft is still
  exact; an accept-always rule FAILS the same test (p < 1e-6).
* Acceptance rate at draft position 1 matches the analytic sum(min(p, q)) within 4 standard errors.
* Rollback: after a long generation with many rejections, the target's cache gives the same next-token logits as
  a fresh prefill (tolerance 1e-2; a different recent token moves them by > 0.1).
"""

from __future__ import annotations

import numpy as np
import pytest
from shared import chi_square

import edgespec.speculate as spec_mod
from edgespec.acceptance import Verdict
from edgespec.backend import Model
from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.costs import CostModel
from edgespec.ngram import NgramIndex
from edgespec.policy import Controller, MatchLengthEstimator, NgramPolicy
from edgespec.sampling import sample, warp
from edgespec.speculate import speculate
from edgespec.speculators import HybridSpeculator, LookupSpeculator, ModelSpeculator
from edgespec.stats import GenerationStats

N_SEQ = 20_000
ALPHA = 1e-3
SEQ_LEN = 3
ROLLBACK_TOL = 1e-2
PROMPT = [ord(c) for c in "abc d"]
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
    from edgespec.policy import TreePolicy
    from edgespec.speculators import SuffixSpeculator
    from edgespec.suffix_index import SuffixIndex

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
def exact_distribution(target: Model, ctx: list[int], sp: SamplingParams, n: int) -> dict[tuple[int, ...], float]:
    """P(x1..xn | ctx) enumerated from the target alone (plain path's warp), pruning branches below 1e-12."""
    out: dict[tuple[int, ...], float] = {}

    def rec(prefix: list[int], mass: float) -> None:
        full = ctx + prefix
        p = warp(target.sync(full)[0], sp, full)
        for x in np.flatnonzero(p > 0):
            m = mass * float(p[x])
            if m < 1e-12:
                continue
            if len(prefix) + 1 == n or target.is_eog(int(x)):
                out[tuple(prefix + [int(x)])] = out.get(tuple(prefix + [int(x)]), 0.0) + m
            else:
                rec(prefix + [int(x)], m)

    rec([], 1.0)
    return out


SETTINGS = {
    "T0.7": SamplingParams(temperature=0.7),
    "T1.0": SamplingParams(temperature=1.0),
    "T1.5": SamplingParams(temperature=1.5),
    "T1.0-topk3": SamplingParams(temperature=1.0, top_k=3),
    "T1.0-topp0.8": SamplingParams(temperature=1.0, top_p=0.8),
    "T1.5-minp0.1": SamplingParams(temperature=1.5, min_p=0.1),
    "T1.0-repeat1.5": SamplingParams(temperature=1.0, repeat_penalty=1.5, repeat_last_n=8),
}
SEEDS = {name: 1000 + i for i, name in enumerate(SETTINGS)}  # fixed: a failure replays exactly


def sample_sequences(target, sp, make, seed, n=N_SEQ, stats=None):
    """n sequences of SEQ_LEN tokens after PROMPT, a fresh speculator from make() for each (None = plain)."""
    rng = np.random.default_rng(seed)
    return [tuple(generate(target, PROMPT, sp, rng, SEQ_LEN, make(), stats)[:SEQ_LEN]) for _ in range(n)]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SETTINGS))
def test_distribution_identity_model_draft(models, name):
    sp = SETTINGS[name]
    exact = exact_distribution(models["target"], PROMPT, sp, SEQ_LEN)
    stats = GenerationStats()
    seqs = sample_sequences(models["target"], sp, lambda: model_speculator(models["draft"], sp, 2), SEEDS[name], stats=stats)
    assert stats.n_drafted > 0 and 0 < stats.n_accepted < stats.n_drafted  # real accepts and rejections
    p = chi_square(seqs, exact)
    assert p > ALPHA, f"{name}: chi-square p = {p:.2e} (N={N_SEQ})"


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["adaptive", "draft-temperature", "hybrid"])
def test_distribution_identity_adaptive_paths(models, variant):
    """The adaptive controller (a probe first, early stops from the draft's confidence, plain steps), a draft
    sampling at its own temperature, and the hybrid: each is still exact."""
    sp = SamplingParams(temperature=1.0, top_p=0.9)
    exact = exact_distribution(models["target"], PROMPT, sp, SEQ_LEN)
    draft = models["draft"]
    if variant == "adaptive":
        make = lambda: model_speculator(draft, sp, 4, adaptive=True, c_draft=0.3)  # noqa: E731
    elif variant == "draft-temperature":
        make = lambda: model_speculator(draft, sp, 3, draft_temperature=0.6)  # noqa: E731
    else:
        make = lambda: HybridSpeculator(model_speculator(draft, sp, 3, adaptive=True), lookup_speculator(n_max=2))  # noqa: E731
    stats = GenerationStats()
    seqs = sample_sequences(models["target"], sp, make, seed=2024 + len(variant), stats=stats)
    assert stats.n_drafted > 0 and 0 < stats.n_accepted < stats.n_drafted
    if variant == "adaptive":  # the controller really varied its decisions
        assert stats.source_counts.get("plain", 0) > 0 and len([n for n in stats.drafted_by_pos if n]) >= 2
    p = chi_square(seqs, exact)
    assert p > ALPHA, f"{variant}: chi-square p = {p:.2e} (N={N_SEQ})"


@pytest.mark.slow
def test_distribution_identity_bad_draft_and_lookup(models):
    sp = SETTINGS["T1.0"]
    exact = exact_distribution(models["target"], PROMPT, sp, SEQ_LEN)

    # The tiny model's text rarely repeats, so a learning policy soon declines every lookup (correctly). To put many
    # cycles through the speculator's plumbing (proposals cut to the chosen k, shadow scoring), its estimates are
    # frozen at 0.9 here; the choice of k still varies with what each lookup offers.
    class Frozen(MatchLengthEstimator):
        def observe(self, run: int, accepted: bool) -> None:
            pass

    policy = NgramPolicy(SpecConfig(), CostModel({1: 1.0, 2: 1.3, 3: 1.6}, frozen=True), Frozen(prior_mean=0.9))
    makers = {
        "bad_draft": lambda: model_speculator(models["bad_draft"], sp, 2),
        "lookup": lambda: lookup_speculator(policy, 2),
    }
    for key, make in makers.items():
        stats = GenerationStats()
        seqs = sample_sequences(models["target"], sp, make, seed=7, stats=stats)
        p = chi_square(seqs, exact)
        assert p > ALPHA, f"{key}: chi-square p = {p:.2e} (N={N_SEQ})"
        if key == "bad_draft":
            assert stats.acceptance < 0.05  # disjoint hot sets: almost nothing accepted, still exact
    # the lookup's own policy really drafted (lookups match only where the 3 sampled tokens repeat one)
    assert stats.n_drafted > 100 and 0 < stats.n_accepted < stats.n_drafted, policy.stats()


@pytest.mark.slow
@pytest.mark.parametrize("drafter,settings", [
    ("model", dict(temperature=1.0)),
    ("model+ngram", dict(temperature=0.8, top_k=5, min_p=0.02)),
    ("ngram", dict(temperature=1.0, presence_penalty=0.5)),
])
def test_distribution_identity_through_the_engine(tiny, models, drafter, settings):
    """The public API end to end (Engine.generate: the worker, the speculator factory, the adaptive controller, the
    detokenizer): N generations with fixed seeds 0..N-1 against the exact distribution."""
    from edgespec.calibration import Calibration
    from edgespec.engine import Engine

    sp0 = SamplingParams(**settings)
    prompt = PROMPT if drafter != "ngram" else [ord(c) for c in "abc dabc"]  # a lookup needs a repeat to match
    exact = exact_distribution(models["target"], prompt, sp0, SEQ_LEN)
    target = Model(ModelSpec(tiny["target"], n_ctx=64, n_batch=16, n_threads=1))
    draft = Model(ModelSpec(tiny["draft"], n_ctx=64, n_batch=16, n_threads=1))
    flat = Calibration({1: 1e-3, 16: 1.05e-3}, 2e-4, "fixed")  # a GPU-like curve: the draft model pays
    eng = Engine(target, draft, drafter=drafter, spec=SpecConfig(draft_max=3), calibration=flat)
    try:
        from dataclasses import replace

        seqs, drafted, accepted = [], 0, 0
        for i in range(N_SEQ):
            # the lookup's acceptance estimate starts from its prior each time: learnt across 20,000 generations of a
            # random model it would stop drafting, and the accept/reject paths would go untested
            eng.learning.run_estimator = MatchLengthEstimator()
            r = eng.generate(tokens=prompt, sampling=replace(sp0, seed=i), max_tokens=SEQ_LEN)
            seqs.append(tuple(r.token_ids[:SEQ_LEN]))
            drafted += r.stats.n_drafted
            accepted += r.stats.n_accepted
    finally:
        eng.close()
    assert drafted > 0 and 0 < accepted < drafted
    p = chi_square(seqs, exact)
    assert p > ALPHA, f"{drafter}: chi-square p = {p:.2e} (N={N_SEQ})"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["T0.7", "T1.0", "T1.5", "T1.0-topk3", "T1.0-topp0.8", "T1.5-minp0.1", "T1.0-repeat1.5"])
def test_distribution_identity_token_trees(models, name):
    """Suffix-index trees (width 3, up to 8 nodes) verified in one decode, with one memory shared by all N runs
    (so candidates come from earlier sequences too)."""
    from edgespec.suffix_index import SuffixIndex

    sp = SETTINGS[name]
    exact = exact_distribution(models["target"], PROMPT, sp, SEQ_LEN)
    memory = SuffixIndex()
    stats = GenerationStats()
    seqs = sample_sequences(models["target"], sp, lambda: suffix_speculator(memory=memory), seed=SEEDS[name] + 100, stats=stats)
    assert stats.n_drafted > 1000 and 0 < stats.n_accepted < stats.n_drafted
    p = chi_square(seqs, exact)
    assert p > ALPHA, f"{name}: chi-square p = {p:.2e} (N={N_SEQ})"


@pytest.mark.slow
def test_draft_equal_to_target_is_always_accepted(models):
    sp = SETTINGS["T1.0-topp0.8"]
    stats = GenerationStats()
    target = models["target"]
    rng = np.random.default_rng(3)
    for _ in range(500):
        generate(target, PROMPT, sp, rng, 8, model_speculator(models["target_as_draft"], sp, 3), stats)
    assert stats.n_drafted > 1000
    assert stats.n_accepted == stats.n_drafted  # exactly 100%


@pytest.mark.slow
def test_control_accept_always_fails_the_test(models, monkeypatch):
    """The chi-square test has power: a broken rule that keeps every draft token is caught."""

    def accept_always(draft, q, p, rng):
        return Verdict(len(draft), sample(p[len(draft)], rng), True)

    monkeypatch.setattr(spec_mod, "accept_sampled", accept_always)
    sp = SETTINGS["T1.0"]
    exact = exact_distribution(models["target"], PROMPT, sp, SEQ_LEN)
    seqs = sample_sequences(models["target"], sp, lambda: model_speculator(models["draft"], sp, 2), seed=11)
    p = chi_square(seqs, exact)
    assert p < 1e-6, f"the broken rule passed (p = {p:.2e}): the test has no power"


@pytest.mark.slow
def test_acceptance_rate_matches_theory(models):
    sp = SETTINGS["T1.0"]
    target, draft = models["target"], models["draft"]
    p1 = warp(target.sync(PROMPT)[0], sp, PROMPT)
    q1 = warp(draft.sync(PROMPT)[0], sp, PROMPT)
    a1 = float(np.minimum(p1, q1).sum())
    n = 8000
    # one-cycle generations (max_tokens 2, k 1): every drafted token is drafted right after the prompt
    stats1 = GenerationStats()
    rng = np.random.default_rng(9)
    for _ in range(n):
        generate(target, PROMPT, sp, rng, 2, model_speculator(draft, sp, 1), stats1)
    rate = stats1.accepted_by_pos[0] / stats1.drafted_by_pos[0]
    se = np.sqrt(a1 * (1 - a1) / stats1.drafted_by_pos[0])
    assert abs(rate - a1) < 4 * se + 1e-9, f"measured {rate:.4f}, theory {a1:.4f}, se {se:.4f}"


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
    from tiny import token_id, write_tiny_model

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
