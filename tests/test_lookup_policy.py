"""The n-gram drafter as its own policy (LookupSpeculator) and the model+ngram hybrid, driven by a scripted
target: no model, deterministic."""

from __future__ import annotations

import numpy as np

from edgespec.config import SpecConfig
from edgespec.controller import CostModel, MatchLengthEstimator, NgramPolicy
from edgespec.drafters import NgramDrafter, Proposal
from edgespec.drafters.policy import LookupSpeculator

# The CPU curve measured on this project's 2-core machine (relative to one token).
CPU = {1: 1.0, 2: 1.62, 3: 1.71, 4: 2.37, 5: 2.64, 6: 4.03, 8: 5.05, 16: 6.66}


def speculator(rel=CPU, **spec) -> LookupSpeculator:
    cost = CostModel.from_relative(0.08, rel)
    return LookupSpeculator(NgramDrafter(4, 2), NgramPolicy(SpecConfig(**spec), cost))


def run_greedy(spec: LookupSpeculator, prompt: list[int], truth: list[int]) -> list[tuple[int, int]]:
    """The loop against a target that emits `truth`: returns (drafted, accepted) per cycle."""
    ctx, cycles, j = list(prompt), [], 0
    while j < len(truth):
        k = min(spec.next_k(), len(truth) - j - 1)
        d = spec.propose(ctx, k) if k > 0 else Proposal()
        n = 0
        while n < len(d.tokens) and d.tokens[n] == truth[j + n]:
            n += 1
        spec.observe(len(d.tokens), n, 0.0, 0.08)
        new = truth[j : j + n + 1]
        ctx += new
        j += len(new)
        cycles.append((len(d.tokens), n))
    return cycles


def test_copying_a_block_drafts_long_and_accepts():
    rng = np.random.default_rng(0)
    block = [int(t) for t in rng.integers(1000, 5000, 300)]
    noise = [int(t) for t in rng.integers(5000, 9000, 80)]
    prompt = noise + block + noise[:5]
    spec = speculator()
    cycles = run_greedy(spec, prompt, block)  # the answer copies the block
    drafted = [d for d, _ in cycles]
    assert sum(n + 1 for _, n in cycles) == len(block)
    assert len(cycles) < len(block) / 2.5  # >= 2.5 tokens per verify on average
    assert max(drafted[-20:]) >= 4  # long drafts once the run is long
    st = spec.stats()
    assert st["acceptance"] > 0.9


def test_novel_text_stays_plain_after_learning():
    rng = np.random.default_rng(1)
    vocab = [int(t) for t in rng.integers(0, 40, 2000)]  # small alphabet: many short spurious matches
    spec = speculator()
    cycles = run_greedy(spec, vocab[:50], vocab[50:1000])
    late = cycles[-200:]
    assert sum(d for d, _ in late) <= 0.2 * len(late)  # mostly declined once the estimates say it cannot pay
    assert spec.stats()["shadow"]["seen"] > 100  # ... yet every declined proposal was still measured


def test_shadow_scores_only_continuations():
    spec = speculator()
    spec.policy.estimator = MatchLengthEstimator()
    for _ in range(50):  # make every run look hopeless so that proposals are declined
        spec.policy.estimator.observe_cycle(2, 3, 0)
    ctx = [1, 2, 3, 4, 9, 1, 2]
    assert spec.propose(ctx, 8).tokens == []
    assert spec.propose(ctx + [3], 8).tokens == []  # the target emitted 3: a hit at position 7
    assert spec.policy.shadow_hits == 1 and spec.policy.shadow_seen == 1
    assert spec.propose([7, 7, 7, 8, 1, 2, 5], 8).tokens == []  # a different context: not scored
    assert spec.policy.shadow_seen == 1


def test_fixed_k_drafts_what_it_is_told():
    spec = speculator(draft_max=3, adaptive=False)
    assert spec.next_k() == 3
    assert spec.propose([1, 2, 3, 4, 5, 1, 2], 3).tokens == [3, 4, 5]


class _ScriptedModel:
    """Stands in for ModelDrafter: proposes [7] * k and records the calls."""

    name = "model"
    cost_per_token_hint = 0.4

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, tokens, k, rng=None, keep_drafting=None) -> Proposal:
        self.calls += 1
        return Proposal(tokens=[7] * k, q=[None] * k, source="model")


def test_hybrid_routes_to_the_lookup_when_it_wants_a_draft_else_to_the_model():
    from edgespec.controller import Controller
    from edgespec.drafters.policy import HybridDrafter

    gpu = {1: 1.0, 64: 1.01}  # flat verify: the model controller is enabled and drafts
    model_ctl = Controller(SpecConfig(draft_max=4, adaptive=False), CostModel(gpu, c_draft=0.01))
    lookup = speculator(rel=gpu)
    model = _ScriptedModel()
    hybrid = HybridDrafter(model, lookup, model_ctl)  # type: ignore[arg-type]
    # a repeated block: the lookup proposes its continuation
    k = hybrid.next_k()
    d = hybrid.propose([1, 2, 3, 4, 5, 6, 1, 2, 3, 4], k, None, hybrid.keep_drafting)
    assert d.source == "ngram" and d.tokens[:2] == [5, 6] and model.calls == 0
    hybrid.observe(len(d.tokens), 2, 0.0, 1.0)
    assert lookup.policy.cycles == 1 and model_ctl.cycles == 0
    # nothing to look up: the draft model drafts, and only its controller learns from the cycle
    k = hybrid.next_k()
    d = hybrid.propose([9, 8, 7, 6], k, None, hybrid.keep_drafting)
    assert d.source == "model" and d.tokens == [7] * 4 and model.calls == 1
    hybrid.observe(4, 1, 0.04, 1.0)
    assert model_ctl.cycles == 1 and lookup.policy.cycles == 1
    assert set(hybrid.stats()) == {"model", "ngram"}


def test_engine_runs_the_lookup_alone_where_the_draft_model_cannot_pay(tiny):
    from edgespec.config import SamplingParams
    from edgespec.engine import Engine
    from edgespec.drafters.policy import HybridDrafter

    cpu = {n: 0.08 * r for n, r in CPU.items()}  # the 2-core CPU: the gate switches a 0.4x draft off
    gpu = {1: 0.02, 64: 0.021}
    with Engine.load(tiny["target"], tiny["draft"], calibrate_costs=False) as eng:
        eng.verify_costs, eng.draft_cost = cpu, 0.032
        assert not eng.model_draft_pays
        drafter, policy = eng._make_drafter(SamplingParams(temperature=0), True)
        assert isinstance(drafter, LookupSpeculator) and policy is drafter
        r = eng.generate("abcabcabc", sampling=SamplingParams(temperature=0), max_tokens=8)
        assert "model" not in r.stats.source_counts
        eng.verify_costs, eng.draft_cost = gpu, 0.004
        assert eng.model_draft_pays
        assert isinstance(eng._make_drafter(SamplingParams(temperature=0), True)[0], HybridDrafter)
        # a fixed K is always obeyed, whatever the hardware
        eng.spec = SpecConfig(draft_max=3, adaptive=False)
        eng.verify_costs, eng.draft_cost = cpu, 0.032
        assert eng.model_draft_pays
