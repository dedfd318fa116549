"""How much to draft: the draft-length policies the speculators use. Pure: timings are passed in, nothing reads
a clock, nothing touches a model.

* `AcceptanceEstimator` estimates a_j (the chance draft position j is accepted given 1..j-1 were) online.
* `Controller` plans a draft model's cycles: k per cycle from the cost model (costs.py) and the estimates, an early
  stop inside the cycle from the draft's own confidence, and plain decoding with re-probes when drafting does not
  pay.
* `MatchLengthEstimator` + `NgramPolicy` plan n-gram lookups, whose draft length is chosen after the lookup from
  how far the lookup's source agrees with the context (the match run).
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter

import numpy as np

from .config import SpecConfig
from .tree_shape import TreeShape, best_tree, from_conditional
from .costs import CostModel, argmax_rate, best_k, best_rate, draft_model_pays, expected_tokens, rates, speculation_ceiling


class AcceptanceEstimator:
    """Online estimate of a_j, the chance that draft position j (1..k_max) is accepted given 1..j-1 were.

    Each position keeps decayed counts of acceptances s_j and rejections f_j. A cycle that drafted n tokens
    and had m accepted observes positions 1..m as accepted, position m+1 as rejected when m < n, and leaves
    later positions unobserved. Counts are multiplied by `decay` per emitted token (plain tokens included,
    via `age`), so the estimate follows the text being written: evidence from ~1/(1-decay) tokens ago
    weighs 1/e.

    Deep positions are observed rarely, so they borrow strength from the pooled rate (shrinkage):

        pooled = (sum_j s_j + w * prior_mean) / (sum_j (s_j + f_j) + w)
        a_j    = (s_j + w * pooled) / (s_j + f_j + w)              with w = prior_strength,

    i.e. a Beta(w * pooled, w * (1 - pooled)) prior per position whose mean is itself estimated.
    """

    def __init__(
        self, k_max: int, prior_mean: float = 0.5, prior_strength: float = 2.0, decay: float = 0.99
    ) -> None:
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        if not (0.0 < prior_mean < 1.0) or not (prior_strength > 0) or not (0.0 < decay <= 1.0):
            raise ValueError("need 0 < prior_mean < 1, prior_strength > 0, 0 < decay <= 1")
        self.k_max = k_max
        self.prior_mean = prior_mean
        self.prior_strength = prior_strength
        self.decay = decay
        self.accepted = np.zeros(k_max)
        self.rejected = np.zeros(k_max)

    def age(self, n_tokens: int = 1) -> None:
        """Let n_tokens of text pass: multiply all counts by decay ** n_tokens."""
        factor = self.decay ** max(n_tokens, 0)
        self.accepted *= factor
        self.rejected *= factor

    def update(self, n_drafted: int, n_accepted: int) -> None:
        """Fold in one cycle (ageing the counts by the n_accepted + 1 tokens it emitted)."""
        if not (0 <= n_accepted <= n_drafted):
            raise ValueError(f"need 0 <= n_accepted <= n_drafted, got {n_accepted}, {n_drafted}")
        self.age(n_accepted + 1)
        n_drafted, n_accepted = min(n_drafted, self.k_max), min(n_accepted, self.k_max)
        self.accepted[:n_accepted] += 1.0
        if n_accepted < n_drafted:
            self.rejected[n_accepted] += 1.0

    def pooled(self) -> float:
        """Acceptance rate over all positions, shrunk towards prior_mean."""
        w = self.prior_strength
        s, n = self.accepted.sum(), self.accepted.sum() + self.rejected.sum()
        return float((s + w * self.prior_mean) / (n + w))

    def rates(self) -> np.ndarray:
        """Estimates a_1..a_k_max (an array of length k_max)."""
        w = self.prior_strength
        return (self.accepted + w * self.pooled()) / (self.accepted + self.rejected + w)


class Controller:
    """Chooses the draft length of each cycle; see the module docstring for the cost model.

    Protocol, once per cycle: `k = next_k()`; if k > 0 draft up to k tokens, calling
    `keep_drafting(i, c)` after the i-th and stopping when it says False; verify; then
    `observe(n_drafted, n_accepted, t_draft, t_verify)`. A next_k() of 0 counts as one plain token (for
    the probe schedule and the estimator's ageing), so observing plain steps is optional; when they are
    observed, as observe(0, 0, 0.0, t_verify), they refine verify(1).

    Policy (adaptive): speculating, each cycle drafts best_k(estimated a, cost). When that is 0 the
    controller decodes plainly and, after `probe_interval` plain tokens, spends one probe cycle drafting
    `probe_k` tokens. If the probe's evidence makes speculation pay, it resumes; otherwise the interval
    doubles (up to `max_probe_interval`). When a resumed run falls back to plain, it is judged by what it
    actually delivered: tokens per second over the run (probe included) above the plain rate 1 / T(0)
    resets the interval, below it counts as one more failed probe. With spec.adaptive False it always
    drafts spec.draft_max and never stops early.

    The hardware gate (costs.draft_model_pays) is asked on every next_k, from the live cost model: a drafter that
    cannot pay on this machine drafts nothing (no probes either), and one that the curve later shows can pay is
    used from then on. When the cost model is frozen (seeded runs) run times are judged on the model's cycle times,
    never on the clock, so the same seed makes the same decisions.
    """

    def __init__(
        self,
        spec: SpecConfig,
        cost: CostModel,
        *,
        estimator: AcceptanceEstimator | None = None,
        probe_k: int = 2,
        probe_interval: int = 16,
        max_probe_interval: int = 256,
        confidence_weight: float = 0.5,
        optimistic_a: float = 0.9,
        min_gain: float = 0.10,
    ) -> None:
        if probe_interval < 1 or max_probe_interval < probe_interval:
            raise ValueError("need 1 <= probe_interval <= max_probe_interval")
        if not (0.0 <= confidence_weight <= 1.0):
            raise ValueError(f"confidence_weight must be in [0, 1], got {confidence_weight}")
        self.spec = spec
        self.cost = cost
        k_cap = max(spec.draft_max, 1)
        self.estimator = estimator if estimator is not None else AcceptanceEstimator(k_cap)
        if self.estimator.k_max < spec.draft_max:
            raise ValueError(f"the estimator covers {self.estimator.k_max} positions, draft_max is {spec.draft_max}")
        self.probe_k = min(max(probe_k, spec.draft_min), spec.draft_max)
        self.base_interval = probe_interval
        self.max_interval = max_probe_interval
        self.confidence_weight = confidence_weight
        self.optimistic_a = optimistic_a
        self.min_gain = min_gain
        self._gate: tuple[tuple[int, float], bool] | None = None
        # Start plain with a probe due: the first cycle gathers evidence at a small cost.
        self._plain = True
        self._interval = probe_interval
        self._plain_run = probe_interval
        self._run_tokens = 0  # tokens and seconds of the current speculative run (since leaving plain)
        self._run_seconds = 0.0
        self._planned = 0
        self._confidences: dict[int, float] = {}
        # Statistics.
        self.decisions: Counter[int] = Counter()
        self.drafted: Counter[int] = Counter()
        self.cycles = 0
        self.probes = 0
        self.failed_probes = 0
        self.tokens_drafted = 0
        self.tokens_accepted = 0

    # -- decisions -----------------------------------------------------------------------------------

    def _a(self) -> np.ndarray:
        return self.estimator.rates()[: self.spec.draft_max]

    def _best(self) -> int:
        return best_k(self._a(), self.cost, self.spec.draft_max, self.spec.draft_min)

    @property
    def plain(self) -> bool:
        """True while the controller has fallen back to plain decoding (probes aside)."""
        return self.spec.adaptive and self._plain

    @property
    def probe_interval(self) -> int:
        """Plain tokens between probes at present."""
        return self._interval

    def next_k(self) -> int:
        """Draft length for the coming cycle: 0 = plain decoding, else the most tokens to draft."""
        spec = self.spec
        if spec.draft_max == 0 or self.disabled:
            k = 0
        elif not spec.adaptive:
            k = spec.draft_max
        else:
            if not self._plain:
                k = self._best()
                if k == 0:
                    self._enter_plain()
            if self._plain:
                k = self.probe_k if self._plain_run >= self._interval else 0
            if k == 0:  # one plain token is about to pass
                self._plain_run += 1
                self.estimator.age(1)
        self.decisions[k] += 1
        self._planned = k
        self._confidences = {}
        return k

    def keep_drafting(self, position: int, confidence: float) -> bool:
        """After drafting token i = position (1-based) with confidence c, should it draft token i + 1?

        c is the draft's probability of the token it just drafted (or its max probability for the next
        position). Acceptance is predicted by blending with the position estimates, weight w:

            â_j     = w c_j + (1 - w) a_j        for the drafted positions j <= i (their confidences)
            â_{i+1} = w c_i + (1 - w) a_{i+1}    (confidence carries over to the next position)
            â_m     = a_m                        for m > i + 1

        With ρ* the best long-run rate (best_rate of the plain estimates, plain decoding included), drafting
        on to some length m > i pays when it adds more tokens than the time it costs is worth at ρ*:

            continue  ⇔  max_{m>i} [E(m) - E(i)] - ρ* [T(m) - T(i)] > 0,

        with E computed from â. (Stopping restarts a cycle whose rate is ρ*; renewal-reward.) Probe cycles
        draft their full length, no cycle stops before spec.draft_min, and with adaptive False it is simply
        i < draft_max.
        """
        i, c = position, float(confidence)
        spec = self.spec
        if i >= spec.draft_max:
            return False
        if not spec.adaptive:
            return True
        self._confidences[i] = c
        if self._plain:  # a probe gathers evidence: draft all of it
            return i < self._planned
        if i < spec.draft_min:
            return True
        a = self._a()
        w = self.confidence_weight
        a_hat = a.copy()
        for j, cj in self._confidences.items():
            if 1 <= j <= i:
                a_hat[j - 1] = w * cj + (1.0 - w) * a[j - 1]
        a_hat[i] = w * c + (1.0 - w) * a[i]
        rho = best_rate(a, self.cost, spec.draft_max, spec.draft_min)
        e_i = expected_tokens(a_hat, i)
        t_i = self.cost.cycle_time(i)
        run, e = float(np.prod(a_hat[:i])), e_i
        for m in range(i + 1, spec.draft_max + 1):
            run *= float(a_hat[m - 1])
            e += run
            if (e - e_i) - rho * (self.cost.cycle_time(m) - t_i) > 0:
                return True
        return False

    # -- feedback ------------------------------------------------------------------------------------

    def observe(self, n_drafted: int, n_accepted: int, t_draft: float, t_verify: float) -> None:
        """Fold in one finished cycle: n_drafted tokens drafted (0 = a plain step), n_accepted of them
        accepted, t_draft seconds drafting, t_verify seconds in the target decode of n_drafted + 1 tokens.
        """
        if not (0 <= n_accepted <= n_drafted):
            raise ValueError(f"need 0 <= n_accepted <= n_drafted, got {n_accepted}, {n_drafted}")
        self.cycles += 1
        self.drafted[n_drafted] += 1
        self.tokens_drafted += n_drafted
        self.tokens_accepted += n_accepted
        self.cost.update_verify(n_drafted + 1, t_verify)
        if n_drafted == 0:  # a plain step: next_k already counted it
            return
        self.cost.update_draft(t_draft / n_drafted)
        self.estimator.update(n_drafted, n_accepted)
        if not self.spec.adaptive:
            return
        if self._plain:  # the result of a probe
            self.probes += 1
            if self._best() > 0:
                self._plain, self._run_tokens, self._run_seconds = False, 0, 0.0
            else:
                self._probe_failed()
                return
        self._run_tokens += n_accepted + 1
        # a frozen (seeded) plan judges the run on modelled times: the clock must not change decisions
        self._run_seconds += self.cost.cycle_time(n_drafted) if self.cost.frozen else t_draft + t_verify + self.cost.overhead

    @property
    def ceiling(self) -> float:
        """The best speedup this drafter could reach on the current costs at optimistic_a acceptance."""
        return speculation_ceiling(self.cost, self.spec.draft_max, self.spec.draft_min, self.optimistic_a)

    @property
    def disabled(self) -> bool:
        """The hardware gate on the current costs (cached per curve version and draft cost); never with a fixed
        draft length, which is always obeyed."""
        if not self.spec.adaptive:
            return False
        key = (self.cost.curve.version, self.cost.c_draft)
        if self._gate is None or self._gate[0] != key:
            pays = draft_model_pays(
                self.cost, self.spec.draft_max, self.spec.draft_min, optimistic_a=self.optimistic_a, min_gain=self.min_gain
            )
            self._gate = (key, not pays)
        return self._gate[1]

    def _probe_failed(self) -> None:
        self.failed_probes += 1
        self._interval = min(2 * self._interval, self.max_interval)
        self._plain_run = 0

    def _enter_plain(self) -> None:
        self._plain = True
        if self._run_tokens * self.cost.cycle_time(0) > self._run_seconds:  # the run beat plain decoding
            self._interval = self.base_interval
            self._plain_run = 0
        else:  # the probe that started this run did not really pay
            self._probe_failed()

    def stats(self) -> dict:
        """Decisions and outcomes so far, for reports."""
        return {
            "k_chosen": dict(sorted(self.decisions.items())),
            "k_drafted": dict(sorted(self.drafted.items())),
            "cycles": self.cycles,
            "probes": self.probes,
            "failed_probes": self.failed_probes,
            "probe_interval": self._interval,
            "plain": self.plain,
            "disabled": self.disabled,
            "ceiling": round(self.ceiling, 4),
            "tokens_drafted": self.tokens_drafted,
            "tokens_accepted": self.tokens_accepted,
            "acceptance": self.tokens_accepted / self.tokens_drafted if self.tokens_drafted else None,
            "a_estimate": [round(float(x), 4) for x in self._a()],
            "c_draft": self.cost.c_draft,
            "verify": self.cost.points,
        }


# --------------------------------------------------------------------------------------------- n-gram policy
def _isotonic_increasing(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least-squares non-decreasing fit of y (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [value, weight, count]
    for yi, wi in zip(y, w):
        blocks.append([float(yi), float(wi), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, c2 = blocks.pop()
            v1, w1, c1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return np.array([v for v, _, c in blocks for _ in range(int(c))])


class MatchLengthEstimator:
    """α(m): the chance that the next token of an n-gram proposal is accepted when its source agrees with the
    context on the last m tokens (the match's `run`).

    Model: an accepted token extends the agreement by one, so a proposal made at run m has per-position
    acceptance a_j = α(m + j - 1). Every drafted position is then one observation of α at its own run, deep
    positions teach the long-run buckets, and a plain step whose emitted token can be compared with what the
    lookup would have proposed is one free "shadow" observation (unbiased at any temperature: with a one-hot
    proposal d the acceptance probability is p(d), the chance that the target's own token is d).

    Runs are pooled in buckets (BUCKET_EDGES[b] <= m < BUCKET_EDGES[b + 1]). Each keeps decayed counts of
    acceptances and rejections (multiplied by `decay` per emitted token); its estimate is shrunk towards the
    pooled rate with weight `prior_strength` (as in AcceptanceEstimator) and the bucket estimates are then fitted
    non-decreasing in m (weighted isotonic regression): a longer agreement is never taken as a worse sign, and a
    bucket not yet observed inherits from the shorter runs.
    """

    BUCKET_EDGES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)

    def __init__(self, prior_mean: float = 0.5, prior_strength: float = 2.0, decay: float = 0.995) -> None:
        if not (0.0 < prior_mean < 1.0) or not (prior_strength > 0) or not (0.0 < decay <= 1.0):
            raise ValueError("need 0 < prior_mean < 1, prior_strength > 0, 0 < decay <= 1")
        self.prior_mean = prior_mean
        self.prior_strength = prior_strength
        self.decay = decay
        nb = len(self.BUCKET_EDGES)
        self.accepted = np.zeros(nb)
        self.rejected = np.zeros(nb)
        self._alphas: np.ndarray | None = None

    def bucket(self, run: int) -> int:
        return max(bisect_right(self.BUCKET_EDGES, run) - 1, 0)

    def age(self, n_tokens: int = 1) -> None:
        factor = self.decay ** max(n_tokens, 0)
        self.accepted *= factor
        self.rejected *= factor
        self._alphas = None

    def observe(self, run: int, accepted: bool) -> None:
        """One drafted (or shadow) position at run `run`."""
        b = self.bucket(run)
        if accepted:
            self.accepted[b] += 1.0
        else:
            self.rejected[b] += 1.0
        self._alphas = None

    def observe_cycle(self, run: int, n_drafted: int, n_accepted: int) -> None:
        """A cycle that drafted n_drafted tokens at run `run` and had the first n_accepted accepted."""
        if not (0 <= n_accepted <= n_drafted):
            raise ValueError(f"need 0 <= n_accepted <= n_drafted, got {n_accepted}, {n_drafted}")
        self.age(n_accepted + 1)
        for i in range(n_accepted):
            self.observe(run + i, True)
        if n_accepted < n_drafted:
            self.observe(run + n_accepted, False)

    def alphas(self) -> np.ndarray:
        """α per bucket (shrunk, then fitted non-decreasing)."""
        if self._alphas is None:
            w = self.prior_strength
            n = self.accepted + self.rejected
            pooled = (self.accepted.sum() + w * self.prior_mean) / (n.sum() + w)
            raw = (self.accepted + w * pooled) / (n + w)
            self._alphas = _isotonic_increasing(raw, n + w)
        return self._alphas

    def rates(self, run: int, k: int) -> np.ndarray:
        """a_1..a_k for a proposal made at run `run`: α(run), α(run + 1), ..."""
        al = self.alphas()
        return np.array([al[self.bucket(run + i)] for i in range(k)])


class NgramPolicy:
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
        self.spec = spec
        self.min_gain = min_gain
        if cost.c_draft:  # a lookup is free: plan on a zero-draft-cost view of the same curve
            cost = cost.view(0.0)
        self.cost = cost
        self.estimator = estimator if estimator is not None else MatchLengthEstimator()
        self.k_max = spec.ngram_draft_max if spec.adaptive else spec.draft_max
        self.decisions: Counter[int] = Counter()
        self.cycles = 0
        self.tokens_drafted = 0
        self.tokens_accepted = 0
        self.shadow_seen = 0
        self.shadow_hits = 0

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
        self.decisions[k] += 1
        return k

    def observe_cycle(self, run: int, n_drafted: int, n_accepted: int, t_verify: float) -> None:
        """A verified n-gram draft (n_drafted >= 1) made at run `run`."""
        self.cycles += 1
        self.tokens_drafted += n_drafted
        self.tokens_accepted += n_accepted
        self.cost.update_verify(n_drafted + 1, t_verify)
        self.estimator.observe_cycle(run, n_drafted, n_accepted)

    def observe_plain(self, t_verify: float, n_tokens: int = 1) -> None:
        """A cycle without an n-gram draft (plain, or drafted by another drafter) that emitted n_tokens."""
        if t_verify > 0 and n_tokens == 1:
            self.cost.update_verify(1, t_verify)
        self.estimator.age(n_tokens)

    def observe_shadow(self, run: int, hit: bool) -> None:
        """A declined proposal at run `run` whose first token turned out to be (hit) or not be the next token."""
        self.shadow_seen += 1
        self.shadow_hits += bool(hit)
        self.estimator.observe(run, hit)

    def stats(self) -> dict:
        return {
            "k_chosen": dict(sorted(self.decisions.items())),
            "cycles": self.cycles,
            "tokens_drafted": self.tokens_drafted,
            "tokens_accepted": self.tokens_accepted,
            "acceptance": self.tokens_accepted / self.tokens_drafted if self.tokens_drafted else None,
            "shadow": {"seen": self.shadow_seen, "hits": self.shadow_hits},
            "alpha_by_run": {
                str(e): round(float(a), 4) for e, a in zip(MatchLengthEstimator.BUCKET_EDGES, self.estimator.alphas())
            },
            "verify": self.cost.points,
        }




# --------------------------------------------------------------------------------------------- tree policy
class TreePolicy:
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
        self.spec = spec
        self.cost = cost if not cost.c_draft else cost.view(0.0)
        self.max_nodes = max_nodes
        self.max_width = max_width
        self.max_depth = min(spec.ngram_draft_max, max_nodes) if spec.adaptive else spec.draft_max
        self.min_gain = min_gain
        self.estimator = estimator if estimator is not None else MatchLengthEstimator()
        self.decay = decay
        self.rank_hits = np.zeros(max_width)
        self.rank_tries = np.zeros(max_width)
        self.shapes: Counter[tuple[int, int]] = Counter()  # (nodes, width) chosen
        self.cycles = 0
        self.nodes_drafted = 0
        self.tokens_accepted = 0
        self.shadow_seen = 0
        self.shadow_hits = 0

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
        factor = self.decay ** max(1, sum(1 for _, _, ok in tried if ok) + 1)
        self.rank_hits *= factor
        self.rank_tries *= factor
        self.estimator.age(sum(1 for _, _, ok in tried if ok) + 1)
        for depth, rank, ok in tried:
            self.tokens_accepted += int(ok)
            if rank == 0:
                self.estimator.observe(run + depth - 1, ok)
            elif rank < self.max_width:
                self.rank_tries[rank] += 1
                self.rank_hits[rank] += float(ok)

    def observe_plain(self, t_verify: float, n_tokens: int = 1) -> None:
        if t_verify > 0 and n_tokens == 1:
            self.cost.update_verify(1, t_verify)
        self.estimator.age(n_tokens)

    def observe_shadow(self, run: int, hit: bool) -> None:
        self.shadow_seen += 1
        self.shadow_hits += bool(hit)
        self.estimator.observe(run, hit)

    def stats(self) -> dict:
        return {
            "shapes": {f"{n}x{w}": c for (n, w), c in sorted(self.shapes.items())},
            "cycles": self.cycles,
            "nodes_drafted": self.nodes_drafted,
            "tokens_accepted": self.tokens_accepted,
            "rank_acceptance": [round(float(x), 4) for x in self.rank_rates()[1:]],
            "shadow": {"seen": self.shadow_seen, "hits": self.shadow_hits},
            "alpha_by_run": {
                str(e): round(float(a), 4) for e, a in zip(MatchLengthEstimator.BUCKET_EDGES, self.estimator.alphas())
            },
            "verify": self.cost.points,
        }


__all__ = ["AcceptanceEstimator", "Controller", "MatchLengthEstimator", "NgramPolicy", "TreePolicy"]
