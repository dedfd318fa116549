"""N-gram lookup as a speculator (LookupSpeculator) and the model+ngram hybrid, driven by a scripted target: no
model, deterministic."""

from __future__ import annotations

import numpy as np

from edgespec.config import SpecConfig
from edgespec.drafting.costs import CostModel
from edgespec.drafting.ngram import NgramIndex
from edgespec.drafting.estimators import MatchLengthEstimator
from edgespec.drafting.lookup_policy import NgramPolicy
from edgespec.drafting.model_policy import Controller
from edgespec.drafting import HybridSpeculator, LookupSpeculator, Outcome, Proposal, make_speculator

# The CPU curve measured on this project's 2-core machine (relative to one token).
CPU = {1: 1.0, 2: 1.62, 3: 1.71, 4: 2.37, 5: 2.64, 6: 4.03, 8: 5.05, 16: 6.66}


def speculator(rel=CPU, **spec) -> LookupSpeculator:
    cost = CostModel.from_relative(0.08, rel)
    return LookupSpeculator(NgramIndex(4, 2), NgramPolicy(SpecConfig(**spec), cost))


def run_greedy(spec: LookupSpeculator, prompt: list[int], truth: list[int]) -> list[tuple[int, int]]:
    """The loop against a target that emits `truth`: returns (drafted, accepted) per cycle."""
    ctx, cycles, j = list(prompt), [], 0
    while j < len(truth):
        budget = len(truth) - j - 1
        d = spec.propose(ctx, budget) if budget > 0 else Proposal()
        assert len(d.tokens) <= max(budget, 0)
        n = 0
        while n < len(d.tokens) and d.tokens[n] == truth[j + n]:
            n += 1
        new = truth[j : j + n + 1]
        spec.observe(Outcome(len(d.tokens), n, len(new), 0.0, 0.08))
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
    assert spec.propose([1, 2, 3, 4, 5, 1, 2], 3).tokens == [3, 4, 5]
    assert spec.propose([1, 2, 3, 4, 5, 1, 2], 2).tokens == [3, 4]  # never more than the budget


class _ScriptedModel:
    """Stands in for ModelSpeculator: proposes [7] * budget and records the calls."""

    name = "model"

    def __init__(self) -> None:
        self.calls = 0
        self.observed: list[Outcome] = []
        self.foreign: list[Outcome] = []  # the lookup's cycles, as the hybrid reports them

    def propose(self, tokens, budget, rng=None) -> Proposal:
        self.calls += 1
        return Proposal(tokens=[7] * budget, q=[None] * budget, source="model")

    def observe(self, outcome: Outcome) -> None:
        self.observed.append(outcome)

    def observe_foreign(self, outcome: Outcome) -> None:
        self.foreign.append(outcome)

    def stats(self) -> dict:
        return {}


def test_hybrid_routes_to_the_lookup_when_it_wants_a_draft_else_to_the_model():
    gpu = {1: 1.0, 64: 1.01}  # flat verify: the lookup drafts whatever it finds
    lookup = speculator(rel=gpu)
    model = _ScriptedModel()
    hybrid = HybridSpeculator(model, lookup)  # type: ignore[arg-type]
    # a repeated block: the lookup proposes its continuation
    d = hybrid.propose([1, 2, 3, 4, 5, 6, 1, 2, 3, 4], 4, None)
    assert d.source == "ngram" and d.tokens[:2] == [5, 6] and model.calls == 0
    hybrid.observe(Outcome(len(d.tokens), 2, 3, 0.0, 1.0))
    assert lookup.policy.cycles == 1 and model.observed == []
    assert [o.n_emitted for o in model.foreign] == [3]  # the model only hears how many tokens passed (its probe schedule)
    # nothing to look up: the draft model drafts, and only it learns from the cycle
    d = hybrid.propose([9, 8, 7, 6], 4, None)
    assert d.source == "model" and d.tokens == [7] * 4 and model.calls == 1
    hybrid.observe(Outcome(4, 1, 2, 0.04, 1.0))
    assert len(model.observed) == 1 and lookup.policy.cycles == 1
    # a plain cycle teaches both, and its timing reaches the shared verify curve once
    hybrid.observe(Outcome(0, 0, 1, 0.0, 1.0))
    assert len(model.observed) == 2 and model.observed[-1].t_verify == 1.0
    assert set(hybrid.stats()) == {"model", "ngram"}


def test_make_speculator_runs_the_lookup_alone_where_the_draft_model_cannot_pay():
    cpu = CostModel({n: 0.08 * r for n, r in CPU.items()}, c_draft=0.032)  # the 2-core CPU: a 0.4x draft cannot pay
    gpu = CostModel({1: 0.02, 64: 0.021}, c_draft=0.004)
    from edgespec.config import SamplingParams

    sp = SamplingParams(temperature=0)
    model = _ScriptedModel()
    assert isinstance(make_speculator("model+ngram", SpecConfig(), sp, cpu, model), LookupSpeculator)  # type: ignore[arg-type]
    assert make_speculator("model", SpecConfig(), sp, cpu, model) is None  # type: ignore[arg-type]
    assert isinstance(make_speculator("model+ngram", SpecConfig(), sp, gpu, model), HybridSpeculator)  # type: ignore[arg-type]
    # a fixed K is always obeyed, whatever the hardware
    fixed = SpecConfig(draft_max=3, adaptive=False)
    assert isinstance(make_speculator("model+ngram", fixed, sp, cpu, model), HybridSpeculator)  # type: ignore[arg-type]
    assert make_speculator("none", SpecConfig(), sp, gpu, model) is None  # type: ignore[arg-type]
    assert make_speculator("ngram", SpecConfig(draft_max=0), sp, gpu) is None  # 0 = never speculate
    assert isinstance(Controller(SpecConfig(), cpu).disabled, bool)
