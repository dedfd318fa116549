"""The speculation loop against a fake target in pure numpy: control flow in milliseconds, no llama.cpp.

The fake model (tests/support/fakes.py) has logits that are a fixed function of (last token, context length). The exact
laws of whole generations on these fakes (foreign draft ids, trees, and the controls that plant broken rules) are
enumerated in tests/runtime/test_loop_laws.py; here: limits, control flow, greedy and seeded identity.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from edgespec.config import SamplingParams
from edgespec.errors import ContextFullError
from edgespec.decoding.sampling import PositionalUniforms
from edgespec.drafting import Proposal

from support import ROOT
from support.fake_speculators import EOG, OracleSpeculator, SampledSpeculator, TreeSpeculator, run
from support.fakes import V, FakeModel, FakeTreeModel

# ------------------------------------------------------------------------------------------------ limits
@pytest.mark.parametrize("n_ctx", range(8, 41))
def test_context_limit_speculative_stops_where_plain_stops(n_ctx):
    """A cycle whose drafts are all accepted at the end of the context must not add its bonus token past n_ctx."""
    sp = SamplingParams(temperature=0)
    prompt = [1, 2, 3]
    plain, ps = run(FakeModel(n_ctx), prompt, sp, np.random.default_rng(0), 1000)
    target = FakeModel(n_ctx)
    oracle = OracleSpeculator(target, 4, sp)
    spec, ss = run(target, prompt, sp, np.random.default_rng(0), 1000, oracle)
    assert spec == plain and len(plain) == n_ctx - len(prompt)
    assert ps.stop_reason == ss.stop_reason == "context"
    assert ss.n_drafted > 0 and ss.n_accepted == ss.n_drafted  # every draft accepted: the worst case for the limit
    assert all(len(b) + len(prompt) - 1 <= n_ctx for b in target.decoded_batches)


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5, 9, 17])
def test_max_tokens_exact_and_budget_never_exceeded(max_tokens):
    sp = SamplingParams(temperature=0)
    target = FakeModel(256)
    oracle = OracleSpeculator(target, 8, sp)
    out, st = run(target, [1, 2], sp, np.random.default_rng(0), max_tokens, oracle)
    plain, _ = run(FakeModel(256), [1, 2], sp, np.random.default_rng(0), max_tokens)
    assert out == plain and len(out) == max_tokens and st.stop_reason == "length"
    # the speculator was asked for at most what could still be emitted minus the target's own token
    assert all(b >= 1 for b in oracle.budgets)
    assert sum(o.n_emitted for o in oracle.outcomes) == max_tokens
    assert all(o.n_drafted <= b for o, b in zip(oracle.outcomes, oracle.budgets))


def test_context_limit_length_distribution_at_temperature_one():
    """At T = 1 every run has the same length as plain decoding (no end token): min(max_tokens, n_ctx - prompt)."""
    sp = SamplingParams(temperature=1.0)
    rng = np.random.default_rng(5)
    for n_ctx in (9, 12, 20):
        for _ in range(200):
            target = FakeModel(n_ctx)
            out, _ = run(target, [0, 1], sp, rng, 50, SampledSpeculator(target, 3))
            assert len(out) == n_ctx - 2


def test_eog_cuts_a_cycle_and_is_the_last_token():
    sp = SamplingParams(temperature=0)
    for seed in range(30):
        target = FakeModel(128, seed=seed, eog=EOG)
        plain, ps = run(FakeModel(128, seed=seed, eog=EOG), [1, 2], sp, np.random.default_rng(0), 60)
        spec, ss = run(target, [1, 2], sp, np.random.default_rng(0), 60, OracleSpeculator(target, 5, sp))
        assert spec == plain and ps.stop_reason == ss.stop_reason
        if EOG in plain:
            assert plain.index(EOG) == len(plain) - 1 and ss.stop_reason == "eos"


# ------------------------------------------------------------------------------------------------ vocabularies
# the exact law with foreign draft ids: test_loop_laws.test_draft_ids_outside_the_target_vocabulary_are_rejected_exactly
def test_foreign_draft_ids_count_as_drafted_and_rejected():
    target = FakeModel(64, seed=3)

    class Foreign:
        name = "foreign"

        def propose(self, context, budget, rng):
            return Proposal([V + 1, 0, 0][:budget], [None] * min(3, budget), "foreign")

        def observe(self, o):
            self.last = o

        def stats(self):
            return {}

    f = Foreign()
    out, st = run(target, [1, 2], SamplingParams(temperature=1.0), np.random.default_rng(0), 5, f)
    assert st.n_drafted >= 1 and st.n_accepted == 0 and len(out) == 5
    assert all(len(b) == 1 for b in target.decoded_batches)  # only the last context token: the foreign id never


# ------------------------------------------------------------------------------------------------ seeded
@pytest.mark.parametrize("temperature", [0.7, 1.0, 1.5])
def test_seeded_speculative_equals_seeded_plain_token_for_token(temperature):
    sp = SamplingParams(temperature=temperature, top_p=0.95)
    for seed in range(40):
        plain, _ = run(FakeModel(96, seed=seed % 4), [1, 2], sp, PositionalUniforms(seed), 40)
        target = FakeModel(96, seed=seed % 4)
        spec, st = run(target, [1, 2], sp, PositionalUniforms(seed), 40, SampledSpeculator(target, 1 + seed % 5))
        assert spec == plain, f"seed {seed}"
        assert st.n_drafted > 0


# ------------------------------------------------------------------------------------------------ control flow
def test_cancel_before_a_cycle_and_between_prefill_chunks():
    sp = SamplingParams(temperature=0)
    calls = {"n": 0}

    def stop_after_3():
        calls["n"] += 1
        return calls["n"] > 3

    target = FakeModel(256)
    out, st = run(target, [1, 2], sp, np.random.default_rng(0), 100, should_stop=stop_after_3)
    assert st.stop_reason == "cancelled" and 0 < len(out) < 100
    assert target.cached == ([1, 2] + out)[:-1]  # the cache still holds all but the last token
    # a long prompt: the stop request is seen between prefill chunks
    target = FakeModel(256)
    out, st = run(target, list(range(8)) * 10, sp, np.random.default_rng(0), 100, should_stop=lambda: True)
    assert out == [] and st.stop_reason == "cancelled" and 0 < target.n_past < 79


def test_progress_after_cycle_and_observe_every_cycle():
    sp = SamplingParams(temperature=0)
    target = FakeModel(256)
    oracle = OracleSpeculator(target, 3, sp)
    seen, cycles = [], []
    out, st = run(target, list(range(8)) * 3, sp, np.random.default_rng(0), 20, oracle,
                  on_prefill=lambda done, total: seen.append((done, total)), after_cycle=lambda: cycles.append(1))
    assert seen and seen[-1][0] == seen[-1][1] == 24  # the whole prompt
    assert len(oracle.outcomes) == len(cycles) == st.n_cycles  # after_cycle runs after every cycle but an end token
    assert st.n_generated == len(out) == 20 and st.ttft > 0


def test_bad_inputs_are_config_errors():
    from edgespec.errors import ConfigError

    sp = SamplingParams(temperature=0)
    with pytest.raises(ConfigError):
        run(FakeModel(), [], sp, np.random.default_rng(0), 5)
    with pytest.raises(ConfigError):
        run(FakeModel(), [1, V], sp, np.random.default_rng(0), 5)
    with pytest.raises(ConfigError):
        run(FakeModel(), [1], sp, np.random.default_rng(0), -1)
    out, _ = run(FakeModel(), [1], sp, np.random.default_rng(0), 0)  # 0: the prompt only (llama-server's n_predict 0)
    assert out == []
    with pytest.raises(ContextFullError):
        run(FakeModel(8), list(range(7)) * 2, sp, np.random.default_rng(0), 5)


def test_the_loop_imports_without_llama_cpp():
    code = "import sys; sys.modules['llama_cpp'] = None; import edgespec.runtime.speculate, edgespec.drafting.costs, " \
        "edgespec.drafting.model_policy, edgespec.drafting.lookup_policy, edgespec.drafting.rate_guard"
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert p.returncode == 0, p.stderr


# ------------------------------------------------------------------------------------------------ trees


def test_trees_greedy_equal_plain_and_stop_where_plain_stops():
    sp = SamplingParams(temperature=0)
    for seed in range(6):
        for n_ctx in (12, 17, 64):
            plain, ps = run(FakeModel(n_ctx, seed=seed, eog=EOG), [1, 2], sp, np.random.default_rng(0), 40)
            target = FakeTreeModel(n_ctx, seed=seed, eog=EOG)
            out, st = run(target, [1, 2], sp, np.random.default_rng(0), 40, TreeSpeculator(target))
            assert out == plain and st.stop_reason == ps.stop_reason
            assert st.n_accepted > 0


# exactness of trees at T = 1 (deterministic and sampled siblings) and the control with a broken tree rule: exact laws
# in test_loop_laws (test_fixed_trees_are_exact, test_a_broken_tree_rule_is_caught)


def test_seeded_trees_equal_seeded_plain():
    sp = SamplingParams(temperature=1.0)
    for seed in range(20):
        plain, _ = run(FakeModel(96, seed=1), [3, 4], sp, PositionalUniforms(seed), 30)
        target = FakeTreeModel(96, seed=1)
        out, st = run(target, [3, 4], sp, PositionalUniforms(seed), 30, TreeSpeculator(target))
        assert out == plain and st.n_drafted > 0
