"""Issue 37 (5): never slower under load. The live-rate check (rate_guard.RateGuard, speculators.GuardedSpeculator) compares
the tokens per second speculative cycles really deliver with those of plain cycles and decodes plainly where
speculation loses, whatever the curve says; it re-probes later. Pure tests on fake clocks and fake costs (no model):
every simulation has a fixed seed."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.config import SamplingParams, SpecConfig
from edgespec.drafting.costs import CostModel
from edgespec.drafting.model_policy import Controller
from edgespec.drafting.rate_guard import RateGuard
from edgespec.runtime.speculate import speculate
from edgespec.drafting import GuardedSpeculator, ModelSpeculator, Outcome, guarded, unguarded
from edgespec.stats import GenerationStats

from support.cost_curves import FLAT, costs
from support.fake_speculators import OracleSpeculator
from support.fakes import FakeModel, ScriptedDraft


def drive_guard(guard: RateGuard, spec_seconds: float, spec_tokens: int, plain_seconds: float, n_tokens: int, seed: int = 0):
    """Feed the guard cycles until n_tokens are emitted: a speculative cycle (when allowed) emits spec_tokens in about
    spec_seconds, a plain one 1 token in about plain_seconds (+-20% noise). Returns (tokens/s relative to plain,
    whether each cycle was allowed to speculate)."""
    rng = np.random.default_rng(seed)
    tokens, seconds, allowed = 0, 0.0, []
    while tokens < n_tokens:
        ok = guard.allow()
        allowed.append(ok)
        n, t = (spec_tokens, spec_seconds) if ok else (1, plain_seconds)
        t *= rng.uniform(0.8, 1.2)
        guard.observe(ok, n, t)
        tokens, seconds = tokens + n, seconds + t
    return tokens / seconds * plain_seconds, allowed


def test_speculation_that_loses_goes_plain_and_is_probed_again():
    guard = RateGuard()
    # 7 tokens a cycle (33/33 lookups accepted) in 0.72 s against 0.08 s a plain token: 9.7 against 12.5 tok/s
    speed, allowed = drive_guard(guard, 0.72, 7, 0.08, 3000)
    assert guard.verdicts >= 3 and guard.held_tokens > 0.9 * 3000
    assert speed > 0.97  # plain speed, less what the re-probes cost
    # it re-probes: speculative cycles come back after every hold, further and further apart
    starts = [i for i in range(1, len(allowed)) if allowed[i] and not allowed[i - 1]]
    assert len(starts) >= 3
    gaps = np.diff(starts)
    assert all(b >= a - 3 for a, b in zip(gaps, gaps[1:])) and gaps[-1] > 4 * gaps[0]  # the hold doubles, up to max_hold


def test_speculation_that_pays_keeps_drafting():
    guard = RateGuard()
    speed, allowed = drive_guard(guard, 0.3, 7, 0.08, 3000)  # 23 tok/s against 12.5
    assert guard.verdicts == 0
    assert guard.held_tokens < 0.02 * 3000  # a few short plain samples, no more
    assert speed > 0.97 * (7 / 0.3 * 0.08)


def test_a_probe_that_wins_ends_the_plain_stretch():
    guard = RateGuard()
    drive_guard(guard, 0.72, 7, 0.08, 600)  # losing: plain, with a long hold by now
    assert guard.verdicts >= 1
    before = guard.verdicts
    # the machine got quiet for batches (or the text changed): speculation pays again; after the hold it is probed
    speed, allowed = drive_guard(guard, 0.2, 7, 0.08, 4000, seed=1)
    assert guard.verdicts == before
    assert sum(allowed[-200:]) > 0.95 * 200  # drafting again


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        RateGuard(margin=1.0)
    with pytest.raises(ValueError):
        RateGuard(hold=64, max_hold=32)
    with pytest.raises(ValueError):
        RateGuard(decay=0.0)


# -- a draft model's controller under the guard: the curve says speculation pays -----------------------------------


def simulate_controller(spec_slowdown: float, n_tokens: int = 1200, seed: int = 0) -> tuple[GuardedSpeculator, float, int]:
    """A draft model that is always right (confidence 0.99) on a flat curve: the controller's cost model says drafting
    pays several times over. The fake clock charges plain cycles what the curve says and speculative ones
    spec_slowdown times that, in the cycle's period (work the timed draft and verify do not show the curve: what the
    guard measures). Returns the guarded speculator, tokens/s relative to plain, and the drafting cycles in the second
    half."""
    cost = costs(FLAT, 0.3)
    spec = SpecConfig(draft_max=4)
    draft = ScriptedDraft([5])
    model = ModelSpeculator(draft, SamplingParams(temperature=0), Controller(spec, cost))
    g = GuardedSpeculator(model, RateGuard(), cost)
    rng = np.random.default_rng(seed)
    ctx = list(range(10, 30))
    tokens, seconds, late_spec = 0, 0.0, 0
    while tokens < n_tokens:
        p = g.propose(ctx, 64, rng)
        k = len(p)
        tv = cost.verify(k + 1)
        td = k * cost.c_draft
        period = (td + tv) * (spec_slowdown if k else 1.0) * rng.uniform(0.9, 1.1)
        new = (list(p.tokens) + [5]) if k else [5]
        g.observe(Outcome(k, k, len(new), td, tv, tuple(new), (), period))
        ctx += new
        tokens, seconds = tokens + len(new), seconds + period
        late_spec += int(bool(k) and tokens > n_tokens // 2)
    return g, tokens / seconds * cost.cycle_time(0), late_spec


def test_a_controller_whose_curve_says_speculation_pays_goes_plain_where_its_cycles_lose():
    g, speed, late_spec = simulate_controller(spec_slowdown=8.0)
    assert not g.inner.controller.plain  # the controller itself still wants to draft: its curve says so
    assert g.guard.verdicts >= 2 and g.guard.plain_rate > g.guard.speculative_rate
    assert speed > 0.85  # about plain speed (learning and the probes cost a little); without the guard about 0.3
    assert 0 < late_spec < 40  # it re-probed later, rarely


def test_a_controller_whose_speculation_really_pays_keeps_drafting():
    g, speed, late_spec = simulate_controller(spec_slowdown=1.0)
    assert g.guard.verdicts == 0
    assert speed > 2.0  # 5 tokens a cycle in 2.25 plain-token times (a verify of 5 at 1.05, 4 drafts at 0.3)
    assert late_spec > 100


def test_a_frozen_cost_model_decides_from_model_times_not_the_clock():
    """Seeded runs: with a frozen cost model the guard is fed the model's cycle times, so two runs whose clocks
    disagree wildly make the same decisions."""
    def run(slowdown: float) -> list[bool]:
        cost = CostModel.from_relative(0.01, FLAT, c_draft=0.003)
        cost = CostModel(cost.curve, c_draft=cost.c_draft, frozen=True)
        g = GuardedSpeculator(ModelSpeculator(ScriptedDraft([5]), SamplingParams(temperature=0), Controller(SpecConfig(draft_max=4), cost)), RateGuard(), cost)
        ctx, out = list(range(10, 30)), []
        for _ in range(300):
            p = g.propose(ctx, 64, np.random.default_rng(0))
            k = len(p)
            out.append(bool(k))
            new = (list(p.tokens) + [5]) if k else [5]
            g.observe(Outcome(k, k, len(new), 0.0, 0.0, tuple(new), (), (slowdown if k else 1.0) * 0.01))
            ctx += new
        return out

    assert run(1.0) == run(50.0)
    assert sum(run(50.0)) > 200  # and the model says drafting pays


# -- through the loop: a fake clock that charges batched decodes dearly ---------------------------------------------


class ClockedModel(FakeModel):
    """FakeModel whose decodes advance a fake clock: `per_token` seconds a token, batches charged `batch_factor`
    times their size (a machine whose batched decodes another process slows)."""

    def __init__(self, batch_factor: float, **kw) -> None:
        super().__init__(n_ctx=4096, **kw)
        self.now, self.batch_factor = 0.0, batch_factor

    def decode(self, tokens, start_pos, rows=(-1,)):
        n = len(list(tokens))
        self.now += 0.01 * (n * self.batch_factor if n > 1 else 1.0)
        return super().decode(tokens, start_pos, rows)


@pytest.mark.parametrize("batch_factor, expect_spec", [(3.0, False), (0.2, True)])
def test_the_loop_feeds_the_guard_whole_cycle_periods(batch_factor, expect_spec):
    sp = SamplingParams(temperature=0)
    target = ClockedModel(batch_factor)
    oracle = OracleSpeculator(FakeModel(n_ctx=4096), 4, sp)
    cost = CostModel.from_relative(0.01, FLAT)
    g = guarded(oracle, RateGuard(), cost)
    assert isinstance(g, GuardedSpeculator) and unguarded(g) is oracle and guarded(None, RateGuard(), cost) is None
    stats = GenerationStats()
    prompt = [1, 2, 3]
    out = [t for s in speculate(target, prompt, sp, np.random.default_rng(0), max_tokens=400, speculator=g, stats=stats,
                                stop_at_eog=False, clock=lambda: target.now) for t in s.tokens]
    plain = [t for s in speculate(FakeModel(n_ctx=4096), prompt, sp, np.random.default_rng(0), max_tokens=400, stop_at_eog=False) for t in s.tokens]
    assert out == plain  # exact, whatever the guard decides
    assert oracle.outcomes[0].t_cycle == 0.0 and all(o.t_cycle > 0 for o in oracle.outcomes[1:])
    late = oracle.outcomes[len(oracle.outcomes) // 2:]
    spec_share = sum(1 for o in late if o.n_drafted) / len(late)
    assert (spec_share > 0.9) if expect_spec else (spec_share < 0.2)
    assert "guard" in g.stats()


def test_a_reprobe_is_not_judged_on_its_catch_up_cycle():
    """The first speculative cycle after a hold pays the draft's catch-up on the hold's tokens: judged on it, a re-probe
    of speculation that now wins (20 tok/s against 10 plain) would look losing and double the hold."""
    g = RateGuard(hold=32)
    for _ in range(40):
        g.observe(False, 1, 0.1)  # plain: 10 tok/s
    while g.allow():
        g.observe(True, 4, 1.0)  # losing: 4 tok/s
    assert g.verdicts == 1
    while not g.allow():
        g.observe(False, 1, 0.1)
    g.observe(True, 4, 3.2 + 0.2)  # the re-probe's first cycle: 32 tokens of catch-up, then the cycle itself
    for _ in range(12):
        g.observe(True, 4, 0.2)  # steady: 20 tok/s
    assert g.verdicts == 1 and g.allow()
    assert g.speculative_rate is not None and g.speculative_rate > 15
