"""The learning state (edgespec.drafting.learning.LearningState): what an engine carries from one generation to the next, one
object that the engine and the replay (edgespec/bench/replay.py) both drive, so that the replay cannot drift.

* Its methods: a new calibration starts the costs, the gate and the guards over and keeps the estimates and the memory;
  a generation's speculator is built on the state (guarded when adaptive); its end hands back the draft's cost and gate.
* The engine and the replay use the class as it is, through the same methods (counted on both sides).
* On the same greedy decode trace (tiny models; a fixed draft length, or adaptive on the costs the engine fixed) two
  generations teach the engine's state and the replay's alike: the same cycles, estimator counts, gate and guards.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.bench import curves, oracle, recorded, replay, speedup

from edgespec.drafting.calibration import Calibration
from edgespec.config import SamplingParams, SpecConfig
from edgespec.drafting.costs import CostModel
from edgespec.drafting.learning import LearningState
from edgespec.drafting.rate_guard import RateGuard
from edgespec.drafting import GuardedSpeculator, HybridSpeculator, LookupSpeculator, unguarded
from edgespec.drafting.suffix_index import SuffixIndex

from support.replay_data import FLAT, record_tiny, synthetic_data

GREEDY = SamplingParams(temperature=0)
CPU = {1: 0.060, 2: 0.096, 4: 0.15, 8: 0.30, 16: 0.60}  # no draft model pays here


class _FakeDraft:
    """Never called: make_speculator only keeps it (the tests below build speculators, they do not run them)."""

    n_vocab = 100


def test_set_costs_starts_the_costs_over_and_keeps_what_does_not_depend_on_the_machine():
    memory = SuffixIndex()
    st = LearningState.from_costs(FLAT, 0.002, memory=memory)
    assert st.curve.points == FLAT and st.draft_cost == 0.002 and not st.curve.frozen and st.memory is memory
    st.run_estimator.observe(3, True)
    st.draft_estimator.update(4, 2)
    st.draft_gate_open = True
    st.rate_guards["model"] = RateGuard()
    runs, drafts = st.run_estimator, st.draft_estimator
    st.set_costs(CPU, 0.01, frozen=True)
    assert st.curve.points == CPU and st.curve.frozen and st.draft_cost == 0.01
    assert not st.draft_gate_open and st.rate_guards == {}
    assert st.run_estimator is runs and st.draft_estimator is drafts and st.memory is memory
    assert st.run_estimator.accepted.sum() == 1.0 and st.draft_estimator.accepted.sum() == 2.0


def test_a_generation_is_built_on_the_state_and_hands_its_draft_cost_and_gate_back():
    spec = SpecConfig(draft_max=4)
    st = LearningState.from_costs(FLAT, 0.001)
    cost = st.cost_model()
    assert cost.curve is st.curve and cost.c_draft == 0.001  # the curve is shared, the draft cost the generation's own
    sp = st.speculator("model+ngram", spec, GREEDY, cost, _FakeDraft())  # type: ignore[arg-type]
    assert isinstance(sp, GuardedSpeculator) and sp.guard is st.rate_guards["model+ngram"]
    inner = unguarded(sp)
    assert isinstance(inner, HybridSpeculator)
    assert inner.lookup.policy.estimator is st.run_estimator and inner.model.controller.estimator is st.draft_estimator
    assert st.speculator("model+ngram", spec, GREEDY, st.cost_model(), _FakeDraft()).guard is sp.guard  # type: ignore[union-attr, arg-type]
    fixed = st.speculator("ngram", SpecConfig(draft_max=4, adaptive=False), GREEDY, cost)
    assert isinstance(fixed, LookupSpeculator) and "ngram" not in st.rate_guards  # a fixed length is never guarded
    cost.update_draft(0.003)
    st.end_generation(sp, "model+ngram", spec, cost)
    assert st.draft_cost == cost.c_draft > 0.001 and st.draft_gate_open  # the draft model ran: its gate is open
    # where no draft model pays, the same kind is the lookup alone, and its end closes the gate
    cpu = LearningState.from_costs(CPU, 0.03)
    cpu.draft_gate_open = False
    assert not cpu.model_draft_used("model+ngram", spec)
    lookup = cpu.speculator("model+ngram", spec, GREEDY, cpu.cost_model())
    assert isinstance(unguarded(lookup), LookupSpeculator)
    cpu.draft_gate_open = True
    cpu.end_generation(lookup, "model+ngram", spec, cpu.cost_model())
    assert not cpu.draft_gate_open
    cpu.end_generation(None, "ngram", spec, CostModel(CPU))  # a kind that does not ask the gate leaves it as it was
    assert not cpu.draft_gate_open


def test_the_engine_and_the_replay_drive_the_same_class(tiny, monkeypatch):
    """The replay's state IS the engine's class (no copy of it), and both call its generation methods: once per
    generation on the engine, once per replayed prompt and drafter kind in the replay."""
    from edgespec.llama.backend import Model
    from edgespec.config import ModelSpec
    from edgespec.runtime.engine import Engine

    assert not any(hasattr(m, "EngineState") for m in (curves, oracle, recorded, replay, speedup))  # no copy of the class
    assert type(replay.new_state(curves.Curve(verify=dict(FLAT), draft=0.001))) is LearningState
    calls: list[str] = []
    for name in ("cost_model", "speculator", "end_generation"):
        orig = getattr(LearningState, name)
        monkeypatch.setattr(LearningState, name, lambda self, *a, _o=orig, _n=name, **k: (calls.append(_n), _o(self, *a, **k))[1])
    data = synthetic_data(3)
    speedup.predict(data, curves.Curve(verify=dict(FLAT), draft=0.003), SpecConfig(), kinds=("model+ngram", "ngram"))
    n = len(data["prompts"]) * 2  # prompts x kinds (plain decoding builds only a cost model)
    assert calls.count("speculator") == n and calls.count("end_generation") == n
    assert calls.count("cost_model") >= n + len(data["prompts"])  # (and the report's gate on a fresh state)
    calls.clear()
    target = Model(ModelSpec(tiny["target"], n_ctx=256, n_threads=1))
    draft = Model(ModelSpec(tiny["draft"], n_ctx=256, n_threads=1))
    with Engine(target, draft, calibration=Calibration(dict(FLAT), 0.001, "fixed")) as eng:
        assert type(eng.learning) is LearningState
        assert eng.curve is eng.learning.curve and eng.draft_cost == eng.learning.draft_cost
        for _ in range(2):
            eng.generate(tokens=[ord(c) for c in "abc d ab"], sampling=GREEDY, max_tokens=8)
    assert calls == ["cost_model", "speculator", "end_generation"] * 2


@pytest.mark.parametrize("adaptive", [False, True])
@pytest.mark.parametrize("kind", ["model+ngram", "model", "ngram"])
def test_two_generations_teach_the_engine_and_the_replay_alike(tiny, kind, adaptive):
    """The engine on tiny models and the replay of the recorded trace, two generations each. With a fixed draft length
    (no decision depends on the costs): the same cycles, estimator counts, gate and guards (none) after each.
    Adaptive, on the costs the engine fixed (a flat curve: the draft model pays) that the replay charges (and learns
    from its virtual clock): the same cycles, estimator counts, gate and guard counts (verdicts, samples, held
    tokens)."""
    from edgespec.llama.backend import Model
    from edgespec.config import ModelSpec
    from edgespec.runtime.engine import Engine

    prompt = [ord(c) for c in "abc d ab"]
    n = 48
    spec = SpecConfig(draft_max=4, adaptive=adaptive, ngram_n_min=1)
    target = Model(ModelSpec(tiny["target"], n_ctx=512, n_threads=1))
    draft = Model(ModelSpec(tiny["draft"], n_ctx=512, n_threads=1))
    plain, data = record_tiny(target, draft, prompt, n)
    target.reset()
    draft.reset()
    curve = curves.Curve(verify=dict(FLAT), draft=0.001)
    replayed = replay.new_state(curve)
    with Engine(target, draft, drafter=kind, spec=spec, calibration=Calibration(dict(FLAT), 0.001, "fixed")) as eng:
        for _ in range(2):
            r = eng.generate(tokens=prompt, sampling=GREEDY, max_tokens=n)
            rep, _ = replay.run_one(data["prompts"][0], data, kind, curve, replayed, spec)
            assert r.token_ids == plain
            assert (rep.n_cycles, rep.n_drafted, rep.n_accepted) == (r.stats.n_cycles, r.stats.n_drafted, r.stats.n_accepted)
            assert rep.n_drafted > 0
            mine = eng.learning
            assert mine.draft_gate_open == replayed.draft_gate_open == ("model" in kind and adaptive)
            assert mine.draft_cost == pytest.approx(replayed.draft_cost, rel=1e-2)
            for a, b in ((mine.run_estimator, replayed.run_estimator), (mine.draft_estimator, replayed.draft_estimator)):
                np.testing.assert_allclose(a.accepted, b.accepted, rtol=1e-12, atol=0)
                np.testing.assert_allclose(a.rejected, b.rejected, rtol=1e-12, atol=0)
            if not adaptive:
                assert mine.rate_guards == replayed.rate_guards == {}
            else:
                counts = lambda st: {k: (g.verdicts, g.samples, g.held_tokens) for k, g in st.rate_guards.items()}  # noqa: E731
                assert counts(mine) == counts(replayed) and set(mine.rate_guards) == {kind}
        # the generations taught the state: the lookup's estimate and the draft's where they drafted
        if "ngram" in kind:
            assert mine.run_estimator.accepted.sum() + mine.run_estimator.rejected.sum() > 0
        if "model" in kind:
            assert mine.draft_estimator.evidence(1) > 0
