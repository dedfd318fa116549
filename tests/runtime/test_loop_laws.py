"""The exact law of whole generations through the speculation loop, on numpy fakes (tests/support/fakes.py).

Every test here computes the law of what `speculate` emits, the first SEQ_LEN tokens of a generation, by replaying
the generation once per path of its random decisions (fakes.generation_law: every uniform the loop draws, in the
acceptance rules, the tree rule, the drafters' sampling and residuals, is a branch with its exact probability), and
compares it with the target's own law of those tokens, enumerated from the target's rows alone
(fakes.exact_distribution, the plain path's warp and masks), to TOL = 1e-9 on every sequence. Nothing is sampled,
nothing is pruned: a wrong rule fails whatever its seed, and the controls plant bugs that must fail.

The fakes: a target FakeModel with V tokens (4 or 5 for full-support settings, 8 where top-k or a grammar keeps the
law small), prompts of a few tokens, 3 generated tokens; each test's docstring says what the drafter is. Drafts and
policies are built afresh for each replay (the enumeration replays from scratch), with a virtual clock (the
policies' choices depend on what was accepted only).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import edgespec.runtime.speculate as spec_mod
from edgespec.decoding.acceptance import Verdict
from edgespec.config import SamplingParams, SpecConfig
from edgespec.drafting.costs import CostModel
from edgespec.drafting.estimators import MatchLengthEstimator
from edgespec.drafting.ngram import NgramIndex
from edgespec.drafting.lookup_policy import NgramPolicy, TreePolicy
from edgespec.drafting.model_policy import Controller
from edgespec.decoding.sampling import sample, warp
from edgespec.runtime.speculate import speculate
from edgespec.drafting import HybridSpeculator, LookupSpeculator, ModelSpeculator, SuffixSpeculator
from edgespec.stats import GenerationStats
from edgespec.drafting.suffix_index import SuffixIndex

from support.fakes import FakeModel, FakeTreeModel, exact_distribution, generation_law, marginal, max_gap
from support.shared import SETTINGS

TOL = 1e-9
SEQ_LEN = 3
PROMPT = [1, 2]
FLAT = {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.3}  # a verify curve on which drafting pays, frozen


class Run:
    """One generation on fresh fakes; returns (tokens, drafted, accepted, sources) so a test can look at both the law
    of the output and what the speculator did on each path."""

    def __init__(
        self, make_target, sp: SamplingParams, make_speculator=None, prompt=PROMPT, max_tokens=SEQ_LEN, make_constraint=None, **kw: Any
    ):
        self.make_target, self.sp, self.make_speculator = make_target, sp, make_speculator
        self.prompt, self.max_tokens, self.make_constraint, self.kw = prompt, max_tokens, make_constraint, kw

    def __call__(self, rng: np.random.Generator) -> tuple:
        target = self.make_target()
        spec = self.make_speculator(target) if self.make_speculator is not None else None
        stats = GenerationStats()
        out: list[int] = []
        kw = dict(self.kw)
        if self.make_constraint is not None:
            kw["constraint"] = self.make_constraint()
        steps = speculate(
            target, self.prompt, self.sp, rng, max_tokens=self.max_tokens, speculator=spec, stats=stats, clock=lambda: 0.0, **kw
        )
        for step in steps:
            out.extend(step.tokens)
        sources = tuple(sorted(stats.source_counts))
        return tuple(out[:SEQ_LEN]), stats.n_drafted, stats.n_accepted, sources, tuple(stats.drafted_by_pos)


def check(run: Run, exact: dict, *, must_draft: bool = True) -> dict:
    """The law of run's output equals `exact` to TOL; with must_draft, paths with drafts accepted and rejected both
    have positive probability (both branches of the rule were enumerated). Returns the full law."""
    law = generation_law(run)
    out = marginal(law, lambda v: v[0])
    assert abs(sum(out.values()) - 1.0) < TOL
    gap = max_gap(out, exact)
    assert gap < TOL, f"the loop's law differs from the target's by {gap:.3e}"
    if must_draft:
        accepted = sum(w for v, w in law.items() if v[2] > 0)
        rejected = sum(w for v, w in law.items() if v[2] < v[1])
        assert accepted > 1e-3 and rejected > 1e-3, (accepted, rejected)
    return law


def target_of(v: int, seed: int = 2, tree: bool = False, eog: int | None = None):
    cls = FakeTreeModel if tree else FakeModel
    return lambda: cls(64, v, seed=seed, eog=eog)


def model_speculator(draft: FakeModel, sp, k, *, adaptive=False, draft_temperature=None, c_draft=0.02) -> ModelSpeculator:
    spec = SpecConfig(draft_max=k, adaptive=adaptive, draft_temperature=draft_temperature)
    return ModelSpeculator(draft, sp, Controller(spec, CostModel(FLAT, c_draft=c_draft, frozen=True)), draft_temperature)


def draft_of(v: int, seed: int = 5, sharp: float = 1.0):
    return FakeModel(64, v, seed=seed, sharp=sharp)


# ------------------------------------------------------------------------------------------------ chains
@pytest.mark.parametrize("name", list(SETTINGS))
def test_model_draft_chains_are_exact(name):
    """A sampling draft model (FakeModel, other weights, blurrier) drafting k = 2 with a fixed length, V = 5 at T = 1,
    V = 4 elsewhere (V = 8 at top-k 3): every draft pair, every accept/reject branch, every residual and bonus token of every cycle of the
    3-token generation. Also the plain loop's law (no speculator) against the same enumeration."""
    sp = SETTINGS[name]
    v = 8 if "topk" in name else 5 if name in ("T1.0", "T1.0-topp0.8") else 4
    exact = exact_distribution(target_of(v)(), PROMPT, sp, SEQ_LEN)
    check(Run(target_of(v), sp), exact, must_draft=False)
    check(Run(target_of(v), sp, lambda t: model_speculator(draft_of(v), sp, 2)), exact)


@pytest.mark.parametrize("variant", ["adaptive", "draft-temperature", "hybrid", "bad-draft", "lookup"])
def test_controller_paths_and_other_drafters_are_exact(variant):
    """T = 1, top-p 0.9, V = 4 (a 6-token prompt with repeats, so that a lookup matches): the adaptive controller
    (k up to 4, a probe first, early stops from the draft's confidence, plain steps), a draft sampling at its own
    temperature 0.6, the hybrid (model + n-gram lookup), a bad draft (sharp and unlike the target), and the n-gram
    lookup with its estimate frozen at 0.9 (so that it really drafts on every path that matches)."""
    sp = SamplingParams(temperature=1.0, top_p=0.9)
    v = 4
    prompt = [1, 2, 3, 0, 1, 2]

    class Frozen(MatchLengthEstimator):
        def observe(self, run: int, accepted: bool) -> None:
            pass

    def lookup(n_max: int = 2) -> LookupSpeculator:
        policy = NgramPolicy(SpecConfig(), CostModel({1: 1.0, 2: 1.3, 3: 1.6}, frozen=True), Frozen(prior_mean=0.9))
        return LookupSpeculator(NgramIndex(n_max, 1), policy)

    makers = {
        "adaptive": lambda t: model_speculator(draft_of(v), sp, 4, adaptive=True, c_draft=0.3),
        "draft-temperature": lambda t: model_speculator(draft_of(v), sp, 3, draft_temperature=0.6),
        "hybrid": lambda t: HybridSpeculator(model_speculator(draft_of(v), sp, 2), lookup()),
        "bad-draft": lambda t: model_speculator(draft_of(v, seed=9, sharp=4.0), sp, 2),
        "lookup": lambda t: lookup(),
    }
    if variant == "hybrid":  # the lookup matches on some paths only (where an output token repeats one)
        prompt = [0, 1, 2]
    exact = exact_distribution(target_of(v, seed=0)(), prompt, sp, SEQ_LEN)
    assert len(exact) >= 12
    law = check(Run(target_of(v, seed=0), sp, makers[variant], prompt=prompt), exact)
    if variant == "adaptive":  # the controller really varied its decisions across paths
        assert any("plain" in val[3] for val in law) and any(len([n for n in val[4] if n]) >= 2 for val in law)
    if variant == "hybrid":
        assert {s for val in law for s in val[3]} >= {"model", "ngram"}


@pytest.mark.parametrize("sp", [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_k=4)], ids=["T1", "T0.7-topk4"])
def test_draft_ids_outside_the_target_vocabulary_are_rejected_exactly(sp):
    """A sampled draft over V + 3 ids (fake_speculators.SampledSpeculator, k = 2; the 3 extra ids lie outside the
    target's vocabulary of 4): such a token is a certain rejection, never decoded (FakeModel asserts it), answered from
    the residual; every path enumerated."""
    from support.fake_speculators import SampledSpeculator

    exact = exact_distribution(target_of(4, seed=3)(), PROMPT, sp, SEQ_LEN)
    law = check(Run(target_of(4, seed=3), sp, lambda t: SampledSpeculator(t, 2, extra=3)), exact)
    assert any(val[1] > val[2] for val in law)


def test_acceptance_rate_at_position_one_is_sum_min_p_q():
    """One-cycle generations (k = 1, max_tokens 2), T = 1, V = 6: the enumerated probability that the first draft is
    accepted equals sum(min(p, q)) after the prompt, to 1e-9."""
    sp = SamplingParams(temperature=1.0)
    v = 6
    p1 = warp(target_of(v)().logits(PROMPT), sp, PROMPT)
    q1 = warp(draft_of(v).logits(PROMPT), sp, PROMPT)
    law = generation_law(Run(target_of(v), sp, lambda t: model_speculator(draft_of(v), sp, 1), max_tokens=2))
    accepted = marginal(law, lambda val: val[2] > 0)
    assert abs(accepted[True] - float(np.minimum(p1, q1).sum())) < TOL


def test_a_draft_equal_to_the_target_is_always_accepted():
    """The draft is the target's own weights, sampled at the same settings (q = p): on every path every draft is
    kept (probability of a rejection exactly 0), k = 2, V = 5, T = 1 top-p 0.8."""
    sp = SETTINGS["T1.0-topp0.8"]
    exact = exact_distribution(target_of(5)(), PROMPT, sp, SEQ_LEN)
    law = check(Run(target_of(5), sp, lambda t: model_speculator(FakeModel(64, 5, seed=2), sp, 2)), exact, must_draft=False)
    assert all(val[1] == val[2] for val in law) and all(val[1] > 0 for val in law)


def test_control_accept_always_is_caught(monkeypatch):
    """The control: a broken chain rule that keeps every draft token moves the law far past TOL (and the same
    enumeration passes without the bug, test_model_draft_chains_are_exact)."""

    def accept_always(draft, q, p, rng):
        return Verdict(len(draft), sample(p[len(draft)], rng), True)

    monkeypatch.setattr(spec_mod, "accept_sampled", accept_always)
    sp = SETTINGS["T1.0"]
    exact = exact_distribution(target_of(5)(), PROMPT, sp, SEQ_LEN)
    law = marginal(generation_law(Run(target_of(5), sp, lambda t: model_speculator(draft_of(5), sp, 2))), lambda v: v[0])
    assert max_gap(law, exact) > 1e-2


# ------------------------------------------------------------------------------------------------ trees
@pytest.mark.parametrize("sampled", [False, True], ids=["deterministic", "sampled"])
def test_fixed_trees_are_exact(sampled):
    """fake_speculators.TreeSpeculator (width 2, depth up to 3, verified in one decode_tree): the target's two best
    tokens at every node (deterministic), or two draws without replacement from a blurred target over V + 2 ids
    (sampled, foreign ids among them); T = 1 top-p 0.9, V = 5, 3 tokens (deterministic: depth-2 trees), 2 tokens
    (sampled: every pair of siblings drawn at depth 1 and every branch after it)."""
    from support.fake_speculators import TreeSpeculator

    sp = SamplingParams(temperature=1.0, top_p=0.9)
    n = 2 if sampled else SEQ_LEN
    exact = exact_distribution(target_of(5, tree=True)(), PROMPT, sp, n)
    make = lambda t: TreeSpeculator(t, sampled=sampled, extra=2 if sampled else 0)  # noqa: E731
    check(Run(target_of(5, tree=True), sp, make, max_tokens=n), exact)


def suffix_speculator(documents: list[list[int]], adaptive: bool = False) -> SuffixSpeculator:
    memory = SuffixIndex()
    for doc in documents:
        memory.add_document(doc)
    spec = SpecConfig(adaptive=adaptive, draft_max=4)
    return SuffixSpeculator(memory, TreePolicy(spec, CostModel(FLAT, frozen=True), 8, 3, min_gain=0.0))


# earlier "outputs" in the memory: after the prompt [1, 2] they continue three different ways
DOCUMENTS = [[1, 2, 0, 3, 1], [1, 2, 3, 3, 0], [4, 1, 2, 4, 4, 2], [1, 2, 0, 1, 2, 3]]


@pytest.mark.parametrize("name", list(SETTINGS))
def test_suffix_trees_are_exact(name):
    """Suffix-index trees (width 3, up to 8 nodes, a fixed shape) from a memory of 4 earlier documents that continue
    the prompt several ways, verified in one decode; V = 5 (8 at top-k 3). Every accept/reject branch of the tree
    rule and every residual, at each cycle."""
    sp = SETTINGS[name]
    v = 8 if "topk" in name else 5
    exact = exact_distribution(target_of(v, tree=True)(), PROMPT, sp, SEQ_LEN)
    law = check(Run(target_of(v, tree=True), sp, lambda t: suffix_speculator(DOCUMENTS)), exact)
    assert any("suffix" in val[3] for val in law)


def test_a_broken_tree_rule_is_caught(monkeypatch):
    """The control: a tree rule that always keeps the first child's path moves the law far past TOL."""
    from support.fake_speculators import TreeSpeculator

    from edgespec.decoding.tree import RngDraws, TreeVerdict

    def broken(tree, rows, rng):
        path, node = [], -1
        while tree.children(node):
            node = tree.children(node)[0]
            path.append(node)
        return TreeVerdict(path, [tree.token(i) for i in path], RngDraws(rng).choose(rows[node + 1]), True)

    monkeypatch.setattr(spec_mod, "accept_tree", broken)
    sp = SamplingParams(temperature=1.0)
    exact = exact_distribution(target_of(5, tree=True)(), PROMPT, sp, SEQ_LEN)
    law = marginal(generation_law(Run(target_of(5, tree=True), sp, lambda t: TreeSpeculator(t))), lambda v: v[0])
    assert max_gap(law, exact) > 1e-2


@pytest.mark.parametrize(
    "sp", [SamplingParams(temperature=1.0, top_p=0.9), SamplingParams(temperature=0.7, top_k=3)], ids=["T1.0-topp0.9", "T0.7-topk3"]
)
def test_draft_model_trees_are_exact(sp):
    """Draft-model trees (fake_speculators.fake_speculator: a ModelSpeculator whose SiblingPolicy adds the draft's
    siblings, drawn without replacement from q without the drafted token, wherever rows are cheap): k up to 3 (2 fit
    the 3-token budget), V = 5 at top-p 0.9, 4 at top-k 3; siblings verified and kept on some paths."""
    from support.fake_speculators import fake_speculator

    v = 5 if sp.top_p < 1.0 else 4
    kept: list[int] = []

    def make(t):
        spec = fake_speculator(draft_of(v, seed=DRAFT_TREE_SEED), sp)
        kept.append(0)
        orig = spec.controller.sibling_policy
        return spec if orig is None else _Counting(spec, kept)

    exact = exact_distribution(target_of(v, tree=True)(), PROMPT, sp, SEQ_LEN)
    check(Run(target_of(v, tree=True), sp, make), exact)
    assert sum(kept) > 0  # on some paths a sibling was kept


DRAFT_TREE_SEED = 5


class _Counting:
    """A speculator wrapper counting the siblings its policy kept (into the last slot of `kept`)."""

    def __init__(self, inner: ModelSpeculator, kept: list[int]) -> None:
        self.inner, self.kept, self.name = inner, kept, inner.name

    def propose(self, context, budget, rng):
        return self.inner.propose(context, budget, rng)

    def observe(self, outcome):
        self.inner.observe(outcome)
        self.kept[-1] = self.inner.controller.sibling_policy.kept  # type: ignore[union-attr]

    def stats(self):
        return self.inner.stats()


# ------------------------------------------------------------------------------------------------ constraints
# A vocabulary of 8 one-byte tokens and an end token for the real constraint matcher (llguidance), on the fakes.
CONSTRAINT_TOKENS = [b"a", b"b", b"c", b"x", b"d", b"e", b" ", b"<|end|>"]
END = 7
# a grammar that forbids some of the target's likely tokens, forces a token ("x") after the first one and then allows
# six: the masked law differs from the unmasked one everywhere
EXACT_REGEX = r"[abc]x[a-e ]{1,2}"


@pytest.fixture(scope="module")
def constraint_vocab():
    from edgespec.decoding.constraint import Vocabulary

    return Vocabulary(CONSTRAINT_TOKENS, [END], [END], lambda text: [CONSTRAINT_TOKENS.index(ch.encode()) for ch in text])


CONSTRAINED = [
    ("plain", "T1.5-topp0.9"),
    ("draft+forced", "T1.0"),
    ("draft+forced", "T1.0-topk3"),
    ("draft+forced", "T1.5-topp0.9"),
    ("draft", "T1.0"),
    ("tree+forced", "T1.0-topk3"),
    ("tree+forced", "T1.0"),
]


@pytest.mark.parametrize("how,name", CONSTRAINED)
def test_constrained_generations_are_exact(constraint_vocab, how, name):
    """The regex [abc]x[a-e ]{1,2} through the real Matcher over an 8-token fake vocabulary: the law of the first 3
    tokens of 3-token generations (5 with trees) equals the target's masked law (each row masked for its own prefix), enumerated
    over: plain constrained sampling; a draft model (k = 2, its q masked too) with and without the forced "x" as a
    deterministic draft; suffix-index trees after the forced token (every sibling kind the tree rule meets: forced,
    deterministic candidates, forbidden candidates never decoded)."""
    from edgespec.decoding.constraint import Constraint, Matcher

    sp = {"T1.0": SamplingParams(temperature=1.0), "T1.0-topk3": SamplingParams(temperature=1.0, top_k=3),
          "T1.5-topp0.9": SamplingParams(temperature=1.5, top_p=0.9)}[name]

    def matcher():
        return Matcher(Constraint.regex(EXACT_REGEX), constraint_vocab, len(CONSTRAINT_TOKENS))

    tree = how.startswith("tree")
    make_target = target_of(8, seed=11, tree=tree, eog=END)
    m = matcher()
    exact = marginal(exact_distribution(make_target(), PROMPT, sp, SEQ_LEN, constraint=m), lambda s: s)
    assert m.n_advanced == 0 and len(exact) >= 8
    docs = [[1, 2, 0, 3, 4, 5], [1, 2, 1, 3, 6, 6], [1, 2, 2, 3, 0], [2, 0, 3, 5, 4]]
    make = {
        "plain": None,
        "draft+forced": lambda t: model_speculator(FakeModel(64, 8, seed=12, sharp=1.0), sp, 2),
        "draft": lambda t: model_speculator(FakeModel(64, 8, seed=12, sharp=1.0), sp, 2),
        "tree+forced": lambda t: suffix_speculator(docs),
    }[how]
    # 5 tokens with trees, so that after the forced "x" a tree still has room; 3 (the whole law) with chains
    run = Run(make_target, sp, make, max_tokens=5 if tree else 3, make_constraint=matcher, forced_drafts=how != "draft")
    law = check(run, exact, must_draft=how != "plain")
    if tree:
        assert any("suffix" in val[3] for val in law)  # trees were really verified
