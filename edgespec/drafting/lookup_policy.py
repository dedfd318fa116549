"""How much a lookup drafts. Pure: timings are passed in, nothing reads a clock, nothing touches a model.

* `NgramPolicy` plans n-gram lookups, whose draft length is chosen after the lookup from how far the lookup's
  source agrees with the context (the match run).
* `TreePolicy` plans suffix-index lookups as token trees (tree_shape.py) from the same run model and per-rank rates.

Both learn acceptance by match run (estimators.MatchLengthEstimator) and plan on the cost curve (costs.py) with
drafting free.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from edgespec.config import SpecConfig
from .estimators import MatchLengthEstimator
from .tree_shape import TreeShape, best_tree, from_conditional
from .costs import CostModel, argmax_rate, rates


class _LookupPolicy:
    """What the lookup policies share: a lookup is free, so they plan on a zero-draft-cost view of the curve; a
    MatchLengthEstimator learns acceptance by match run (from verified drafts, plain steps' ageing and shadow
    observations of declined proposals)."""

    def __init__(self, cost: CostModel, estimator: MatchLengthEstimator | None) -> None:
        self.cost = cost.view(0.0) if cost.c_draft else cost
        self.estimator = estimator if estimator is not None else MatchLengthEstimator()
        self.cycles = 0
        self.shadow_seen = 0
        self.shadow_hits = 0

    def observe_plain(self, t_verify: float, n_tokens: int = 1) -> None:
        """A cycle without a lookup draft (plain, or drafted by another drafter) that emitted n_tokens."""
        if t_verify > 0 and n_tokens == 1:
            self.cost.update_verify(1, t_verify)
        self.estimator.age(n_tokens)

    def observe_shadow(self, run: int, hit: bool) -> None:
        """A declined proposal at run `run` whose first token turned out to be (hit) or not be the next token."""
        self.shadow_seen += 1
        self.shadow_hits += bool(hit)
        self.estimator.observe(run, hit)

    def _learnt(self) -> dict:
        """The shared part of stats(): shadow observations, α by run bucket, the verify curve."""
        return {
            "shadow": {"seen": self.shadow_seen, "hits": self.shadow_hits},
            "alpha_by_run": {
                str(e): round(float(a), 4) for e, a in zip(MatchLengthEstimator.BUCKET_EDGES, self.estimator.alphas())
            },
            "verify": self.cost.points,
        }


class NgramPolicy(_LookupPolicy):
    """Draft length for n-gram (lookup) proposals, chosen after the lookup from the match's run m.

    a_j = α(m + j - 1) from a MatchLengthEstimator, and k = best_k(a, cost, k_cap) with drafting free: the only
    price of a draft is the larger verify batch, so k is as long as the expected accepted tokens pay for the
    batch. There is no plain fallback or probe schedule as in Controller: a lookup costs nothing, so every
    proposal the policy declines is still scored as a shadow observation (observe_shadow) and the estimate can
    recover by itself. A draft must promise `min_gain` (5%) over plain decoding: verify costs are estimates, and
    on a noisy CPU a draft that promises +2% is as likely to lose. With spec.adaptive False it always drafts k_cap
    (spec.draft_max).
    """

    def __init__(
        self, spec: SpecConfig, cost: CostModel, estimator: MatchLengthEstimator | None = None, min_gain: float = 0.05
    ) -> None:
        if min_gain < 0:
            raise ValueError(f"min_gain must be >= 0, got {min_gain}")
        super().__init__(cost, estimator)
        self.spec = spec
        self.min_gain = min_gain
        self.k_max = spec.ngram_draft_max if spec.adaptive else spec.draft_max
        self.last_rate = float("inf")  # expected tokens/s of the last choice (inf: not estimated, fixed k)
        self.decisions: Counter[int] = Counter()
        self.tokens_drafted = 0
        self.tokens_accepted = 0

    def choose(self, run: int, k_cap: int) -> int:
        """Tokens to draft from a proposal at run `run` that offers (up to) k_cap tokens; 0 = plain step."""
        k_cap = min(k_cap, self.k_max)
        if k_cap <= 0:
            return 0
        if not self.spec.adaptive:
            k = k_cap
        else:
            table = rates(self.estimator.rates(run, k_cap), self.cost, k_cap, min(self.spec.draft_min, k_cap))
            k = argmax_rate(table)
            if k and table[k] < (1.0 + self.min_gain) * table[0]:
                k = 0  # the expected gain is within the margin: not worth the risk of a costlier verify
            self.last_rate = table[k]
        self.decisions[k] += 1
        return k

    def observe_cycle(self, run: int, n_drafted: int, n_accepted: int, t_verify: float, chances: Sequence[float] = ()) -> None:
        """A verified n-gram draft (n_drafted >= 1) made at run `run` (chances: Outcome.chances)."""
        self.cycles += 1
        self.tokens_drafted += n_drafted
        self.tokens_accepted += n_accepted
        self.cost.update_verify(n_drafted + 1, t_verify)
        self.estimator.observe_cycle(run, n_drafted, n_accepted, chances)

    def stats(self) -> dict:
        return {
            "k_chosen": dict(sorted(self.decisions.items())),
            "cycles": self.cycles,
            "tokens_drafted": self.tokens_drafted,
            "tokens_accepted": self.tokens_accepted,
            "acceptance": self.tokens_accepted / self.tokens_drafted if self.tokens_drafted else None,
            **self._learnt(),
        }


class TreePolicy(_LookupPolicy):
    """The tree to verify for a lookup proposal with several candidates per node (a suffix-index trie).

    Acceptance is modelled per depth d and rank r as c(d, r), the chance that the rank-r candidate is accepted
    given that its parent was and the better-ranked siblings were not: c(d, 1) = α(m + d - 1) from a
    MatchLengthEstimator on the proposal's match run m (as NgramPolicy does for chains), and c(d, r >= 2) = β_r,
    learnt per rank (decayed counts shrunk to a prior). tree_shape.best_tree turns the table into the shape with the
    best expected tokens per second on the cost curve (a chain or plain decoding when those win); a tree must promise
    `min_gain` over plain decoding. With spec.adaptive False the shape is the full candidate trie.

    Feedback (`observe_walk`): for every node on the accepted path and the node where it stopped, which ranks were
    tried and which was accepted.
    """

    RANK_PRIOR = 0.15

    def __init__(
        self, spec: SpecConfig, cost: CostModel, max_nodes: int, max_width: int = 4, *, min_gain: float = 0.05,
        estimator: MatchLengthEstimator | None = None, decay: float = 0.995,
    ) -> None:
        if max_nodes < 1 or max_width < 1:
            raise ValueError("need max_nodes >= 1 and max_width >= 1")
        super().__init__(cost, estimator)
        self.spec = spec
        self.max_nodes = max_nodes
        self.max_width = max_width
        self.max_depth = min(spec.ngram_draft_max, max_nodes) if spec.adaptive else spec.draft_max
        self.min_gain = min_gain
        self.decay = decay
        self.rank_hits = np.zeros(max_width)
        self.rank_tries = np.zeros(max_width)
        self.shapes: Counter[tuple[int, int]] = Counter()  # (nodes, width) chosen
        self.nodes_drafted = 0
        self.tokens_accepted = 0

    def rank_rates(self) -> np.ndarray:
        """β_r for ranks 2..max_width (index 0 unused: rank 1 follows the match run)."""
        w = 2.0
        return (self.rank_hits + w * self.RANK_PRIOR) / (self.rank_tries + w)

    def table(self, run: int, depth: int) -> np.ndarray:
        """Positional acceptance a(d, r) for d = 1..depth (tree_shape's input)."""
        beta = self.rank_rates()
        alphas = self.estimator.rates(run, depth)
        rows = [from_conditional([alphas[d]] + list(beta[1 : self.max_width])) for d in range(depth)]
        return np.array(rows)

    def choose(self, run: int, depth: int, budget_nodes: int) -> TreeShape:
        depth = min(depth, self.max_depth)
        if depth < 1 or budget_nodes < 1:
            return TreeShape((), (), (), 1.0, self.cost.cycle_time(0))
        shape = best_tree(self.table(run, depth), self.cost, min(self.max_nodes, budget_nodes), min_gain=self.min_gain)
        self.shapes[(shape.n_nodes, shape.width)] += 1
        return shape

    def observe_walk(self, run: int, tried: list[tuple[int, int, bool]], t_verify: float, n_nodes: int) -> None:
        """tried: (depth, rank (0-based), accepted) for every candidate the verification tried, in order."""
        self.cycles += 1
        self.nodes_drafted += n_nodes
        self.cost.update_verify(n_nodes + 1, t_verify)
        n_emitted = sum(1 for _, _, ok in tried if ok) + 1  # the accepted candidates and the target's own token
        factor = self.decay**n_emitted
        self.rank_hits *= factor
        self.rank_tries *= factor
        self.estimator.age(n_emitted)
        for depth, rank, ok in tried:
            self.tokens_accepted += int(ok)
            if rank == 0:
                self.estimator.observe(run + depth - 1, ok)
            elif rank < self.max_width:
                self.rank_tries[rank] += 1
                self.rank_hits[rank] += float(ok)

    def stats(self) -> dict:
        return {
            "shapes": {f"{n}x{w}": c for (n, w), c in sorted(self.shapes.items())},
            "cycles": self.cycles,
            "nodes_drafted": self.nodes_drafted,
            "tokens_accepted": self.tokens_accepted,
            "rank_acceptance": [round(float(x), 4) for x in self.rank_rates()[1:]],
            **self._learnt(),
        }


__all__ = ["NgramPolicy", "TreePolicy"]
