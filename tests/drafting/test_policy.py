"""Pure tests of the draft-length policies and the cost model: best_k, acceptance estimates, Controller, NgramPolicy.

Simulations use scripted costs and a scripted acceptance process (position j accepted with probability a_j,
independently, until the first rejection) with fixed seeds, so every run is deterministic.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from edgespec.config import SpecConfig
from edgespec.drafting.costs import CostModel, best_k, best_rate, expected_tokens
from edgespec.drafting.estimators import AcceptanceEstimator, MatchLengthEstimator
from edgespec.drafting.lookup_policy import NgramPolicy
from edgespec.drafting.model_policy import Controller

# Measured on the 2-core CPU: batched decode of n tokens relative to one token (80 ms); draft token 37 ms.
CPU_REL = {1: 1.0, 4: 1.7, 5: 2.2, 8: 3.4, 16: 4.2}
C_TOKEN = 0.080
C_DRAFT = 0.037


def cpu_costs(c_draft: float = C_DRAFT) -> CostModel:
    return CostModel.from_relative(C_TOKEN, CPU_REL, c_draft=c_draft)


def gpu_costs(c_draft: float = 0.004) -> CostModel:
    return CostModel({1: 0.020, 64: 0.021}, c_draft=c_draft)


# -- reference implementations ------------------------------------------------------------------------


def brute_rate(a, cost: CostModel, k: int) -> float:
    e = 1.0
    for i in range(1, k + 1):
        e += math.prod(a[:i])
    t = k * cost.c_draft + cost.verify(k + 1) + cost.overhead
    return e / t


def brute_best_k(a, cost: CostModel, k_max: int, k_min: int = 1) -> int:
    best, best_r = 0, brute_rate(a, cost, 0)
    for k in range(k_min, k_max + 1):
        r = brute_rate(a, cost, k)
        if r > best_r:
            best, best_r = k, r
    return best


def simulate(ctrl: Controller, truth: CostModel, a_of, n_cycles: int, rng, observe_plain: bool = True):
    """Run n_cycles; a_of(tokens so far) gives the per-position acceptance rate(s). Returns (tokens, seconds,
    list of k per cycle)."""
    tokens, seconds, ks = 0, 0.0, []
    for _ in range(n_cycles):
        k = ctrl.next_k()
        ks.append(k)
        if k == 0:
            tv = truth.verify(1)
            if observe_plain:
                ctrl.observe(0, 0, 0.0, tv)
            tokens, seconds = tokens + 1, seconds + tv
            continue
        a = np.broadcast_to(np.asarray(a_of(tokens), dtype=float), (k,))
        n = 0
        while n < k and rng.random() < a[n]:
            n += 1
        td, tv = k * truth.c_draft, truth.verify(k + 1)
        ctrl.observe(k, n, td, tv)
        tokens, seconds = tokens + n + 1, seconds + td + tv
    return tokens, seconds, ks


def probe_gaps(ks: list[int]) -> list[int]:
    """Plain cycles between consecutive drafting cycles, while plain."""
    idx = [i for i, k in enumerate(ks) if k > 0]
    return [j - i - 1 for i, j in zip(idx, idx[1:]) if j - i > 1]


# -- expected_tokens ----------------------------------------------------------------------------------


def test_expected_tokens_formula():
    assert expected_tokens([0.5, 0.5], 0) == 1.0
    assert expected_tokens([0.5, 0.5], 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens([1.0] * 5, 5) == 6.0
    assert expected_tokens([0.9, 0.0, 1.0], 3) == pytest.approx(1.9)
    with pytest.raises(ValueError):
        expected_tokens([0.5], 2)


# -- CostModel ----------------------------------------------------------------------------------------


def test_cost_model_interpolates_and_extrapolates():
    c = cpu_costs()
    for n, r in CPU_REL.items():
        assert c.verify(n) == pytest.approx(C_TOKEN * r)
    assert c.verify(2) == pytest.approx(C_TOKEN * (1 + 0.7 / 3))
    assert c.verify(12) == pytest.approx(C_TOKEN * 3.8)
    assert c.verify(20) == pytest.approx(C_TOKEN * (4.2 + 4 * 0.1))  # slope of the last two points
    assert c.cycle_time(3) == pytest.approx(3 * C_DRAFT + C_TOKEN * 1.7)
    assert c.cycle_time(0) == pytest.approx(C_TOKEN)
    vs = [c.verify(n) for n in range(1, 40)]
    assert all(b >= a for a, b in zip(vs, vs[1:]))


def test_cost_model_monotone_and_below_first_point():
    c = CostModel({2: 0.10, 4: 0.09, 8: 0.20})  # a noisy, non-monotone measurement at 4
    assert c.verify(4) == pytest.approx(0.10)
    vs = [c.verify(n) for n in range(1, 20)]
    assert all(b >= a for a, b in zip(vs, vs[1:]))
    assert c.verify(1) == pytest.approx(0.10)  # extrapolated along the (flat) first two points
    steep = CostModel({2: 0.10, 4: 0.30})
    assert steep.verify(1) == pytest.approx(0.05)  # but never below v(2) * 1/2
    single = CostModel({1: 0.02})
    assert single.verify(1) == single.verify(9) == 0.02  # flat until other sizes are observed
    with pytest.raises(ValueError):
        CostModel({})
    with pytest.raises(ValueError):
        CostModel({0: 0.1})


def test_cost_model_online_updates():
    c = CostModel({1: 0.08, 8: 0.16}, c_draft=0.03, alpha=0.5)
    c.update_verify(8, 0.24)
    assert c.verify(8) == pytest.approx(0.20)  # EMA per n
    assert c.verify(1) == pytest.approx(0.08)  # other sizes untouched
    # a new size starts from the interpolated curve (0.08 + 3/7 * 0.12) and moves halfway (alpha 0.5) towards
    # the measurement, which counts at most twice the current estimate
    c.update_verify(4, 0.30)
    start = 0.08 + 3 / 7 * 0.12
    assert c.verify(4) == pytest.approx((start + min(0.30, 2 * start)) / 2)
    assert c.verify(8) == pytest.approx(0.20)
    # one stalled decode (a machine hiccup) cannot make every larger batch look 100x dearer
    c.update_verify(2, 50.0)
    assert c.verify(16) < 0.5
    c.update_draft(0.05)
    assert c.c_draft == pytest.approx(0.04)
    c.update_overhead(0.002)
    assert c.overhead == pytest.approx(0.001)


# -- best_k -------------------------------------------------------------------------------------------


def _random_cost(rng) -> CostModel:
    kind = rng.integers(4)
    c_draft = float(rng.choice([0.0, rng.uniform(0.001, 0.05)]))
    overhead = float(rng.choice([0.0, rng.uniform(0.0, 0.01)]))
    if kind == 0:  # the measured CPU
        return CostModel.from_relative(C_TOKEN, CPU_REL, c_draft=c_draft, overhead=overhead)
    if kind == 1:  # GPU-like: flat
        v = float(rng.uniform(0.005, 0.05))
        return CostModel({1: v, 64: v * float(rng.uniform(1.0, 1.1))}, c_draft=c_draft, overhead=overhead)
    if kind == 2:  # exactly flat, free drafter: ties everywhere when a = 0
        v = float(rng.uniform(0.005, 0.05))
        return CostModel({1: v}, c_draft=0.0, overhead=overhead)
    ns = sorted(set(rng.integers(1, 24, size=int(rng.integers(2, 6))).tolist()))
    vs = np.sort(rng.uniform(0.01, 0.3, size=len(ns)))
    return CostModel(dict(zip(ns, vs.tolist())), c_draft=c_draft, overhead=overhead)


def _random_a(rng, k_max: int) -> list[float]:
    kind = rng.integers(4)
    if kind == 0:
        return [float(rng.uniform(0, 1))] * k_max
    if kind == 1:
        return rng.uniform(0, 1, size=k_max).tolist()
    if kind == 2:
        return np.sort(rng.uniform(0.3, 1.0, size=k_max))[::-1].tolist()
    return rng.choice([0.0, 0.5, 0.9, 0.99, 1.0], size=k_max).tolist()


def test_best_k_matches_brute_force():
    rng = np.random.default_rng(1234)
    for _ in range(3000):
        k_max = int(rng.integers(0, 17))
        k_min = int(rng.integers(1, max(k_max, 1) + 1))
        a = _random_a(rng, max(k_max, 1))
        cost = _random_cost(rng)
        got = best_k(a, cost, k_max, k_min)
        want = brute_best_k(a, cost, min(k_max, len(a)), k_min)
        assert got == 0 or k_min <= got <= k_max
        if got != want:  # only a floating-point tie may differ, and then towards the smaller k
            assert got < want
            assert brute_rate(a, cost, got) == pytest.approx(brute_rate(a, cost, want), rel=1e-9)
        assert best_rate(a, cost, k_max, k_min) == pytest.approx(brute_rate(a, cost, got), rel=1e-12)


@pytest.mark.parametrize("cost", [cpu_costs(), gpu_costs(), cpu_costs(0.0), CostModel({1: 0.02})])
def test_best_k_useless_drafts_pick_plain(cost):
    assert best_k([0.0] * 8, cost, 8) == 0  # E = 1 for every k, T(k) >= T(0): a tie at best -> 0
    if cost.c_draft > 0:
        assert best_k([0.02] * 8, cost, 8) == 0


def test_best_k_free_drafter_high_acceptance_on_gpu_drafts_long():
    assert best_k([0.95] * 16, gpu_costs(0.0), 16) >= 12
    assert best_k([0.95] * 8, gpu_costs(0.0), 8) == 8


def test_best_k_cpu_model_draft_values():
    # The measured CPU: a model draft only pays with high acceptance, and then only short drafts.
    assert best_k([0.6] * 8, cpu_costs(), 8) == 0
    assert best_k([0.9] * 8, cpu_costs(), 8) == 2
    assert best_k([0.95] * 8, cpu_costs(), 8) == 3
    assert best_k([0.95] * 8, cpu_costs(), 8, k_min=4) == 4


# -- AcceptanceEstimator -----------------------------------------------------------------------------


def test_estimator_update_semantics():
    est = AcceptanceEstimator(4, decay=1.0)
    est.update(3, 1)  # position 1 accepted, 2 rejected, 3 unobserved
    assert est.accepted.tolist() == [1, 0, 0, 0]
    assert est.rejected.tolist() == [0, 1, 0, 0]
    est.update(2, 2)  # both accepted, nothing rejected
    assert est.accepted.tolist() == [2, 1, 0, 0]
    assert est.rejected.tolist() == [0, 1, 0, 0]
    a = est.rates()
    assert a[0] > a[1]
    assert a[2] == a[3] == pytest.approx(est.pooled())  # unobserved positions fall back to the pooled rate
    with pytest.raises(ValueError):
        est.update(1, 2)


def test_estimator_decay_and_prior():
    est = AcceptanceEstimator(3, prior_mean=0.5, prior_strength=2.0, decay=0.9)
    assert est.rates() == pytest.approx([0.5, 0.5, 0.5])
    for _ in range(50):
        est.update(1, 0)
    assert est.rates()[0] < 0.15
    est.age(1000)  # long ago: back to the prior
    assert est.rates() == pytest.approx([0.5, 0.5, 0.5], abs=1e-3)


def test_estimator_evidence_counts_decayed_observations_per_position():
    est = AcceptanceEstimator(3, decay=0.5)
    assert est.evidence(1) == est.evidence(3) == 0.0
    est.update(3, 1)  # positions 1 and 2 examined (1 accepted, 2 rejected), 3 not
    assert (est.evidence(1), est.evidence(2), est.evidence(3)) == (1.0, 1.0, 0.0)
    est.update(1, 1, chances=[0.25])  # ages by 2 tokens (x 0.25), then one chance at position 1
    assert est.evidence(1) == pytest.approx(1.25) and est.evidence(2) == pytest.approx(0.25)


def test_estimator_recovers_per_position_rates():
    rng = np.random.default_rng(7)
    true = np.array([0.9, 0.8, 0.6, 0.95])
    est = AcceptanceEstimator(4, decay=1.0)
    for _ in range(20000):
        n = 0
        while n < 4 and rng.random() < true[n]:
            n += 1
        est.update(4, n)
    assert est.rates() == pytest.approx(true, abs=0.02)


# -- Controller -----------------------------------------------------------------------------------------

SCENARIOS = [  # (name, truth costs, draft is free, a)
    ("cpu-model-0.9", cpu_costs(), False, 0.9),
    ("cpu-model-0.95", cpu_costs(), False, 0.95),
    ("cpu-ngram-0.7", cpu_costs(0.0), True, 0.7),
    ("cpu-ngram-0.9", cpu_costs(0.0), True, 0.9),
    ("gpu-model-0.8", gpu_costs(), False, 0.8),
    ("gpu-model-0.95", gpu_costs(), False, 0.95),
    ("gpu-model-0.5", gpu_costs(), False, 0.5),
    ("cpu-model-0.5", cpu_costs(), False, 0.5),
]


@pytest.mark.parametrize("name,truth,free,a", SCENARIOS, ids=[s[0] for s in SCENARIOS])
def test_controller_converges_to_optimal_rate(name, truth, free, a):
    spec = SpecConfig(draft_max=8)
    ctrl = Controller(spec, CostModel(truth.points, 0.0 if free else truth.c_draft))
    rng = np.random.default_rng(42)
    simulate(ctrl, truth, lambda _: a, 1500, rng)  # warm up
    tokens, seconds, ks = simulate(ctrl, truth, lambda _: a, 1500, rng)
    opt_k = best_k([a] * 8, truth, 8)
    opt = best_rate([a] * 8, truth, 8)
    assert tokens / seconds >= 0.95 * opt, (name, opt_k, Counter(ks))
    mode = Counter(ks[-500:]).most_common(1)[0][0]
    assert brute_rate([a] * 8, truth, mode) >= 0.95 * opt, (name, opt_k, Counter(ks[-500:]))
    if opt_k == 0:
        assert mode == 0
    else:
        assert abs(mode - opt_k) <= 1


def test_controller_learns_costs_online():
    """Calibrated as if verify were flat (one point), run on the CPU: it measures the sizes it uses."""
    truth = cpu_costs()
    ctrl = Controller(SpecConfig(draft_max=8), CostModel({1: C_TOKEN}, c_draft=C_DRAFT))
    rng = np.random.default_rng(3)
    simulate(ctrl, truth, lambda _: 0.95, 1500, rng)
    tokens, seconds, _ = simulate(ctrl, truth, lambda _: 0.95, 1000, rng)
    assert tokens / seconds >= 0.95 * best_rate([0.95] * 8, truth, 8)
    assert ctrl.cost.verify(3) == pytest.approx(truth.verify(3), rel=0.01)


@pytest.mark.parametrize("observe_plain", [True, False])
def test_controller_falls_back_probes_and_resumes(observe_plain):
    truth = cpu_costs()
    ctrl = Controller(SpecConfig(draft_max=8), CostModel(truth.points, truth.c_draft))
    rng = np.random.default_rng(5)
    switch = 3000  # tokens of useless drafts, then good ones
    _, _, ks = simulate(
        ctrl, truth, lambda t: 0.05 if t < switch else 0.95, 3400, rng, observe_plain=observe_plain
    )
    # Phase 1: plain almost everywhere, with probes at growing intervals (capped).
    bad = ks[:2900]
    assert Counter(bad)[0] >= 0.98 * len(bad)
    gaps = probe_gaps(bad)
    assert len(gaps) >= 5
    assert gaps[:4] == [32, 64, 128, 256]
    assert all(g == ctrl.max_interval for g in gaps[4:])
    # Phase 2: after the switch it resumes speculating within one probe interval (+ a few cycles).
    first_after = next(i for i in range(2900, len(ks)) if ks[i] > 0 and all(ks[i : i + 20]))
    assert first_after < 3000 + ctrl.max_interval + 20
    assert not ctrl.plain
    assert Counter(ks[-200:])[0] == 0
    assert ctrl.probe_interval == ctrl.base_interval or ctrl.failed_probes >= 5


@pytest.mark.parametrize("free", [False, True])
def test_controller_growing_intervals_on_gpu(free):
    """On a flat GPU a free draft costs almost nothing, so even a tiny estimated acceptance keeps a probe's
    run going for a while; runs that did not beat plain decoding still count as failed probes."""
    truth = gpu_costs(0.0 if free else 0.004)
    ctrl = Controller(SpecConfig(draft_max=8), CostModel(truth.points, truth.c_draft))
    tokens, seconds, ks = simulate(ctrl, truth, lambda _: 0.0, 3000, np.random.default_rng(0))
    gaps = probe_gaps(ks)
    assert gaps == sorted(gaps) and gaps[-1] == ctrl.max_interval
    assert Counter(ks)[0] >= (0.7 if free else 0.98) * len(ks)
    assert tokens / seconds >= (0.999 if free else 0.99) / truth.verify(1)  # never (measurably) slower


def test_keep_drafting_uses_confidence():
    truth = gpu_costs()
    ctrl = Controller(SpecConfig(draft_max=8), CostModel(truth.points, truth.c_draft))
    simulate(ctrl, truth, lambda _: 0.8, 500, np.random.default_rng(1))
    assert ctrl.next_k() >= 3
    assert not ctrl.keep_drafting(1, 0.02)
    ctrl.next_k()
    assert ctrl.keep_drafting(1, 0.99)
    assert ctrl.keep_drafting(2, 0.99)
    assert not ctrl.keep_drafting(3, 0.01)
    ctrl.next_k()
    assert not ctrl.keep_drafting(8, 1.0)  # never beyond draft_max


def test_keep_drafting_earlier_low_confidence_lowers_value_of_continuing():
    truth = gpu_costs()
    ctrl = Controller(SpecConfig(draft_max=8), CostModel(truth.points, truth.c_draft))
    simulate(ctrl, truth, lambda _: 0.8, 500, np.random.default_rng(1))
    ctrl.next_k()
    ctrl.keep_drafting(1, 0.95)
    assert ctrl.keep_drafting(2, 0.6)
    ctrl.next_k()  # a new cycle forgets the old confidences
    ctrl.keep_drafting(1, 0.2)
    assert not ctrl.keep_drafting(2, 0.6)  # position 1 is unlikely to survive: drafting on is waste


def test_keep_drafting_respects_draft_min_and_probes():
    truth = gpu_costs()
    ctrl = Controller(SpecConfig(draft_max=8, draft_min=3), CostModel(truth.points, truth.c_draft))
    simulate(ctrl, truth, lambda _: 0.8, 500, np.random.default_rng(1))
    ctrl.next_k()
    assert ctrl.keep_drafting(1, 0.0) and ctrl.keep_drafting(2, 0.0)
    # A probe drafts its full length whatever the confidence.
    cpu = cpu_costs()
    probe = Controller(SpecConfig(draft_max=8), CostModel(cpu.points, cpu.c_draft))
    assert probe.plain and probe.next_k() == probe.probe_k == 2
    assert probe.keep_drafting(1, 0.0)
    assert not probe.keep_drafting(2, 1.0)


def test_not_adaptive_is_fixed_k():
    truth = cpu_costs()
    spec = SpecConfig(draft_max=5, adaptive=False)
    ctrl = Controller(spec, CostModel(truth.points, truth.c_draft))
    _, _, ks = simulate(ctrl, truth, lambda _: 0.05, 300, np.random.default_rng(0))
    assert set(ks) == {5}
    assert all(ctrl.keep_drafting(i, 0.0) for i in range(1, 5))
    assert not ctrl.keep_drafting(5, 1.0)
    assert ctrl.stats()["k_chosen"] == {5: 300}


def test_draft_max_zero_is_plain():
    truth = cpu_costs()
    for adaptive in (True, False):
        ctrl = Controller(SpecConfig(draft_max=0, adaptive=adaptive), CostModel(truth.points))
        assert [ctrl.next_k() for _ in range(50)] == [0] * 50


def test_stats_are_recorded():
    truth = cpu_costs(0.0)
    ctrl = Controller(SpecConfig(draft_max=8), CostModel(truth.points, c_draft=0.0))
    _, _, ks = simulate(ctrl, truth, lambda _: 0.9, 400, np.random.default_rng(2))
    ctrl.observe(4, 2, 0.0, truth.verify(5))
    s = ctrl.stats()
    assert sum(s["k_chosen"].values()) == 400
    assert s["k_chosen"] == dict(sorted(Counter(ks).items()))
    assert s["cycles"] == 401
    assert 0.0 < s["acceptance"] <= 1.0


def test_controller_is_deterministic():
    def run():
        truth = cpu_costs()
        ctrl = Controller(SpecConfig(draft_max=8), CostModel(truth.points, truth.c_draft))
        return simulate(ctrl, truth, lambda t: 0.9 if (t // 500) % 2 else 0.2, 2000, np.random.default_rng(9))

    assert run() == run()


def test_observe_validates():
    ctrl = Controller(SpecConfig(), cpu_costs())
    with pytest.raises(ValueError):
        ctrl.observe(2, 3, 0.0, 0.1)


def test_costly_drafter_is_switched_off_where_it_cannot_pay():
    """On the measured 2-core CPU a 0.5B draft cannot beat plain decoding even at 90% acceptance per position:
    the controller never drafts with it. On GPU-like flat verify costs it does. A free drafter is never switched
    off."""
    spec = SpecConfig(draft_max=8)
    cpu = CostModel.from_relative(0.076, {1: 1.0, 2: 1.46, 4: 2.11, 8: 4.9, 16: 5.9}, c_draft=0.0305)
    ctl = Controller(spec, cpu)
    assert ctl.disabled and ctl.ceiling < 1.10
    assert all(ctl.next_k() == 0 for _ in range(600))
    gpu = CostModel({1: 0.02, 16: 0.021}, c_draft=0.004)
    assert not Controller(spec, gpu).disabled
    free = Controller(spec, CostModel.from_relative(0.076, {1: 1.0, 2: 1.46, 4: 2.11, 8: 4.9}, c_draft=0.0))
    assert not free.disabled
    assert not Controller(SpecConfig(draft_max=4, adaptive=False), cpu).disabled  # fixed K is always obeyed


# -- n-gram policy: acceptance by match run ---------------------------------------------------------------


def test_match_length_buckets():
    est = MatchLengthEstimator()
    edges = MatchLengthEstimator.BUCKET_EDGES
    assert [est.bucket(m) for m in (0, 1, 2, 3, 4, 5, 6, 7, 8)] == [0, 0, 1, 2, 3, 3, 4, 4, 5]
    assert est.bucket(edges[-1]) == est.bucket(10_000) == len(edges) - 1


def test_match_length_cycle_observations_follow_the_run():
    # A draft made at run 4 that had 3 of 5 tokens accepted: runs 4, 5, 6 accepted (a copy extends the match by
    # one per token), run 7 rejected, runs 8.. unobserved.
    est = MatchLengthEstimator(decay=1.0)
    est.observe_cycle(4, 5, 3)
    b = est.bucket
    assert est.accepted[b(4)] == 2 and est.accepted[b(6)] == 1 and est.rejected[b(7)] == 1
    assert est.accepted.sum() == 3 and est.rejected.sum() == 1
    est.observe_cycle(10, 2, 2)  # all accepted: no rejection recorded
    assert est.rejected.sum() == 1 and est.accepted[b(10)] == 2  # runs 10 and 11 share the bucket 8..11
    with pytest.raises(ValueError):
        est.observe_cycle(3, 2, 3)


def test_match_length_estimates_are_monotone_and_unobserved_runs_inherit():
    est = MatchLengthEstimator(decay=1.0)
    for _ in range(200):  # short runs: 30 %, long runs: 95 % (a pure-numpy stream, deterministic)
        est.observe(2, False)
    for _ in range(60):
        est.observe(2, True)
    rng = np.random.default_rng(0)
    for _ in range(400):
        est.observe(40, bool(rng.random() < 0.95))
    al = est.alphas()
    assert np.all(np.diff(al) >= -1e-12)
    assert al[est.bucket(2)] == pytest.approx(60 / 260, abs=0.02)
    assert al[est.bucket(40)] == pytest.approx(0.95, abs=0.03)
    # Runs 3..39 were never observed; monotone fit keeps them between the two.
    for m in (3, 8, 20):
        assert al[est.bucket(2)] - 1e-9 <= al[est.bucket(m)] <= al[est.bucket(40)] + 1e-9
    # a non-monotone observation is pooled away: a bucket seen worse than a shorter one is averaged with it
    est2 = MatchLengthEstimator(decay=1.0)
    for _ in range(100):
        est2.observe(4, True)
        est2.observe(8, False)
    al2 = est2.alphas()
    assert al2[est2.bucket(4)] == pytest.approx(al2[est2.bucket(8)])
    assert np.all(np.diff(al2) >= -1e-12)
    assert list(est.rates(40, 3)) == [al[est.bucket(40)], al[est.bucket(41)], al[est.bucket(42)]]


def test_match_length_decay_forgets():
    est = MatchLengthEstimator(decay=0.9)
    est.observe(5, True)
    est.age(10)
    assert est.accepted.sum() == pytest.approx(0.9**10)


def _trained(alpha_of, decay=1.0, n=3000, seed=0) -> MatchLengthEstimator:
    est = MatchLengthEstimator(decay=decay)
    rng = np.random.default_rng(seed)
    for _ in range(n):
        m = int(rng.integers(1, 70))
        est.observe(m, bool(rng.random() < alpha_of(m)))
    return est


# Measured later on the same kind of 2-core machine (AVX2 only), 84 ms per token: a steeper, irregular curve.
CPU2_REL = {1: 1.0, 2: 1.62, 3: 1.71, 4: 2.37, 5: 2.64, 6: 4.03, 8: 5.05, 16: 6.66}


def test_ngram_policy_picks_the_brute_force_k_for_its_estimates():
    cost = CostModel.from_relative(0.084, CPU2_REL)
    est = _trained(lambda m: min(0.99, 0.35 + 0.02 * m))
    pol = NgramPolicy(SpecConfig(ngram_draft_max=16), cost, est, min_gain=0.0)
    for run in (1, 2, 4, 8, 16, 32, 64):
        for cap in (1, 3, 16):
            want = brute_best_k(list(est.rates(run, cap)), cost, cap)
            assert pol.choose(run, cap) == want, (run, cap)
    # Long copies on this CPU curve: a long draft; barely-matching text: none.
    assert pol.choose(64, 16) >= 4
    assert pol.choose(1, 16) == 0
    assert pol.choose(64, 0) == 0
    assert pol.stats()["k_chosen"]


def test_ngram_policy_margin_declines_marginal_drafts():
    cost = CostModel.from_relative(0.084, CPU2_REL)
    est = _trained(lambda m: min(0.99, 0.35 + 0.02 * m))
    strict = NgramPolicy(SpecConfig(ngram_draft_max=16), cost, est, min_gain=0.05)
    for run in range(1, 65):
        a = list(est.rates(run, 16))
        k = brute_best_k(a, cost, 16)
        gain = brute_rate(a, cost, k) * cost.cycle_time(0) - 1.0
        assert strict.choose(run, 16) == (k if gain >= 0.05 else 0), (run, k, gain)
    with pytest.raises(ValueError):
        NgramPolicy(SpecConfig(), cost, est, min_gain=-0.1)


def test_ngram_policy_drafts_longer_where_verify_is_flat():
    est = _trained(lambda m: 0.9)
    gpu = NgramPolicy(SpecConfig(ngram_draft_max=16), gpu_costs(), est)
    cpu = NgramPolicy(SpecConfig(ngram_draft_max=16), CostModel.from_relative(0.084, CPU2_REL), est)
    assert gpu.choose(8, 16) == 16
    assert 0 < cpu.choose(8, 16) < 16


def test_ngram_policy_fixed_k_and_draft_min():
    est = _trained(lambda m: 0.01)
    fixed = NgramPolicy(SpecConfig(draft_max=3, adaptive=False), cpu_costs(), est)
    assert fixed.k_max == 3 and fixed.choose(2, 10) == 3 and fixed.choose(2, 2) == 2
    gpu_good = NgramPolicy(SpecConfig(draft_min=4, ngram_draft_max=8), gpu_costs(), _trained(lambda m: 0.9))
    assert gpu_good.choose(10, 8) in (0,) + tuple(range(4, 9))
    assert gpu_good.choose(10, 2) in (0, 2)  # draft_min cannot exceed what the proposal offers


def test_ngram_policy_recovers_through_shadow_observations():
    # Learnt: nothing pays. Then the text turns repetitive; declined proposals are scored as shadows and the
    # policy starts drafting again without ever paying for a probe.
    pol = NgramPolicy(SpecConfig(ngram_draft_max=8), cpu_costs(), MatchLengthEstimator(decay=0.99))
    for _ in range(200):
        pol.estimator.observe_cycle(6, 2, 0)
    assert pol.choose(6, 8) == 0
    hits = 0
    while pol.choose(6, 8) == 0:
        pol.observe_shadow(6, True)
        pol.observe_plain(C_TOKEN)
        hits += 1
        assert hits < 300
    assert pol.stats()["shadow"] == {"seen": hits, "hits": hits}


def test_ngram_policy_updates_costs_and_plans_free():
    cost = cpu_costs(c_draft=0.05)
    pol = NgramPolicy(SpecConfig(), cost)
    assert pol.cost.c_draft == 0.0 and cost.c_draft == 0.05  # a free view of the same (shared) verify curve
    before = cost.verify(5)
    pol.observe_cycle(8, 4, 4, before * 1.5)
    assert cost.verify(5) > before
    assert pol.stats()["tokens_accepted"] == 4
