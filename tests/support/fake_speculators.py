"""Speculators over the numpy fakes (fakes.FakeModel), and `run`: one generation through the loop, its tokens and
stats (test_loop, test_loop_laws, test_chances, test_draft_trees, test_rate_guard).

* OracleSpeculator drafts the target's own greedy continuation; SampledSpeculator samples a blurred target, foreign
  ids included; TreeSpeculator proposes a fixed-shape tree (greedy or sampled siblings).
* speculating: a draft model's Controller that is drafting, with siblings (draft-model trees); fake_speculator: a
  ModelSpeculator over a FakeModel draft that branches wherever rows are cheap.
"""

from __future__ import annotations

import numpy as np

from edgespec.config import SamplingParams, SpecConfig
from edgespec.decoding.sampling import sample, warp
from edgespec.drafting import ModelSpeculator, Outcome, Proposal
from edgespec.drafting.estimators import AcceptanceEstimator
from edgespec.drafting.model_policy import Controller, SiblingPolicy
from edgespec.runtime.speculate import speculate
from edgespec.stats import GenerationStats

from support.cost_curves import FLAT, frozen_costs
from support.fakes import FakeModel

EOG = 7  # the fakes' end-of-generation token where a test gives them one


class OracleSpeculator:
    """Drafts the target's own greedy continuation (always accepted at temperature 0), up to `k`, recording
    every budget it was given and every outcome."""

    name = "oracle"

    def __init__(self, target: FakeModel, k: int, sampling: SamplingParams) -> None:
        self.target, self.k, self.sp = target, k, sampling
        self.budgets: list[int] = []
        self.outcomes: list[Outcome] = []

    def propose(self, context, budget, rng):
        self.budgets.append(budget)
        ctx, out = list(context), []
        for _ in range(self.k + 3):  # deliberately more than the budget: the loop must cap it
            t = int(np.argmax(warp(self.target.logits(ctx), self.sp, ctx)))
            out.append(t)
            ctx.append(t)
        return Proposal(out, [None] * len(out), "oracle")

    def observe(self, outcome):
        self.outcomes.append(outcome)

    def stats(self):
        return {}


class SampledSpeculator:
    """Samples each draft token from q (a fixed sharpened/blurred version of the target, over V + extra ids: the
    extra ids lie outside the target's vocabulary) and reports q exactly."""

    name = "sampled"

    def __init__(self, target: FakeModel, k: int, extra: int = 0, temperature: float = 1.4) -> None:
        self.target, self.k, self.extra, self.t = target, k, extra, temperature

    def q(self, ctx):
        x = np.concatenate([self.target.logits(ctx) / self.t, np.full(self.extra, 0.5)])
        w = np.exp(x - x.max())
        return w / w.sum()

    def propose(self, context, budget, rng):
        ctx, toks, qs = list(context), [], []
        for _ in range(min(self.k, budget)):
            q = self.q(ctx)
            d = sample(q, rng) if isinstance(rng, np.random.Generator) else int(np.searchsorted(np.cumsum(q), rng.at(len(ctx)) * q.sum(), side="right"))
            toks.append(d)
            qs.append(q)
            ctx.append(d)
            if d >= self.target.n_vocab:  # this fake draft cannot continue after its own foreign id
                break
        return Proposal(toks, qs, "sampled")

    def observe(self, outcome):
        pass

    def stats(self):
        return {}


def run(target, prompt, sp, rng, max_tokens, speculator=None, **kw):
    """One generation through the loop (`speculate`): the tokens it emitted and its GenerationStats."""
    stats = GenerationStats()
    out = []
    for step in speculate(target, prompt, sp, rng, max_tokens=max_tokens, speculator=speculator, stats=stats, **kw):
        out.extend(step.tokens)
    return out, stats


class TreeSpeculator:
    """Proposes a fixed-shape tree: the target's greedy token and the next-best at every node (width 2, depth 3),
    deterministic; or, sampled=True, two draws without replacement from a blurred target (q reported)."""

    name = "tree"

    def __init__(self, target, sampled=False, extra=0):
        self.target, self.sampled, self.extra = target, sampled, extra

    def propose(self, context, budget, rng):
        from edgespec.decoding.tree import TokenTree, sample_children

        tree = TokenTree()

        def grow(node, ctx, depth):
            if depth > min(3, budget):
                return
            logits = self.target.logits(ctx)
            if self.sampled:
                x = np.concatenate([logits / 1.3, np.full(self.extra, 0.3)])
                q = np.exp(x - x.max())
                q /= q.sum()
                kids = [(int(t), row) for t, row in sample_children(q, 2, rng)] if isinstance(rng, np.random.Generator) else []
            else:
                order = np.argsort(-logits)[:2]
                kids = [(int(t), None) for t in order]
            for t, q_row in kids:
                c = tree.add(node, t, q_row)
                if t < self.target.n_vocab:
                    grow(c, ctx + [t], depth + 1)

        grow(-1, list(context), 1)
        return Proposal(source="tree", tree=tree)

    def observe(self, outcome):
        self.last = outcome

    def stats(self):
        return {}


def speculating(rel: dict[int, float], draft_max: int = 4, siblings: int = 4, a: float = 0.6) -> Controller:
    """A controller that is drafting (evidence in: every position accepted with probability about a)."""
    est = AcceptanceEstimator(draft_max, decay=1.0)
    n = 100
    for i in range(n):
        est.update(draft_max, int(i < a * n) * draft_max)
    ctrl = Controller(SpecConfig(draft_max=draft_max), frozen_costs(rel), estimator=est, siblings=SiblingPolicy(siblings, 3))
    ctrl._plain = False
    return ctrl


def fake_speculator(draft: FakeModel, sp: SamplingParams) -> ModelSpeculator:
    ctrl = speculating(FLAT, draft_max=3, siblings=4, a=0.5)
    ctrl.sibling_policy.min_gain = 0.0  # type: ignore[union-attr]  # branch wherever rows are cheap: the rule is exercised
    return ModelSpeculator(draft, sp, ctrl)
