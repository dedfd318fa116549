"""How much a draft model drafts. Pure: timings are passed in, nothing reads a clock, nothing touches a model.

* `Controller` plans a draft model's cycles: k per cycle from the cost model (costs.py) and the acceptance estimates
  (estimators.py), an early stop inside the cycle from the draft's own confidence, and plain decoding with re-probes
  when drafting does not pay.
* `SiblingPolicy` (asked through `Controller.siblings`) decides where the chain carries the draft's next-best
  candidates as extra leaves of the verify batch (draft-model trees).

The lookups' policies are in lookup_policy.py; the live-rate check on every drafter is rate_guard.py.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import numpy as np

from edgespec.config import SpecConfig
from .estimators import AcceptanceEstimator
from .costs import GATE_MIN_GAIN, GATE_OPTIMISTIC_A, CostModel, best_k, best_rate, draft_model_pays, expected_tokens, rates, speculation_ceiling


CHANCES_BELOW = 8.0  # Controller.wants_chances: decayed observations at position 1 below which a draft asks for chances
# Controller._probe_affordable: after max_probe_interval plain tokens a due probe may cost this many times probe_budget.
# A catch-up grows with the tokens behind, so where its cost per token (the draft's cost times the curve's slope)
# reaches probe_budget a probe would otherwise never be affordable again in that generation.
LATE_PROBE_BUDGET = 2.0


class Controller:
    """Chooses the draft length of each cycle; see the module docstring for the cost model.

    Protocol, once per cycle: `k = next_k()`; if k > 0 draft up to limit(k) tokens, calling
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
    cannot pay on this machine drafts nothing (no probes either), and one that the curve later shows can pay is used
    from then on. An open gate stays open down to half its margin (costs.GATE_HOLD; `gate_open`: it was open at the
    end of the engine's last generation), so that a learnt draft cost drifting across the threshold does not shut
    out, for good, a drafter that pays (a shut gate learns no more draft costs). Within it every cycle is one
    decision by expected tokens per second on the curve with the live estimates: plain, or draft k (and, token by
    token, on past k while the draft's confidence pays, up to draft_max: `limit`). The per-token draft cost is
    learnt only from steady cycles: a batched catch-up after plain or lookup cycles (observe's n_catchup) is not a
    per-token cost, and a due probe waits while its catch-up would cost more than `probe_budget` of the plain time
    since the last probe (next_k's `behind`; LATE_PROBE_BUDGET times that after max_probe_interval plain tokens).
    When the cost model is frozen (seeded runs) run times are judged on the model's cycle times, never on the clock,
    so the same seed makes the same decisions.
    """

    STEADY_CATCHUP = 2  # tokens a drafter catches up on per cycle in a run of drafts (see observe)

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
        optimistic_a: float = GATE_OPTIMISTIC_A,
        min_gain: float = GATE_MIN_GAIN,
        extend: bool = True,
        probe_budget: float = 0.1,
        siblings: "SiblingPolicy | None" = None,
        chances_below: float = CHANCES_BELOW,
        gate_open: bool = False,
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
        self.extend = extend
        self.probe_budget = probe_budget
        self.sibling_policy = siblings
        self.chances_below = chances_below
        self._rho: float | None = None  # the long-run rate of this cycle's plan (keep_drafting / siblings), cached
        # the gate's last answer, (key, shut), for the key (curve version, draft cost) it was asked on; None: not asked
        # yet, its state is gate_open (hysteresis, see disabled)
        self._gate: tuple[tuple[int, float] | None, bool] = (None, not gate_open)
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

    def next_k(self, behind: int | None = None) -> int:
        """Draft length for the coming cycle: 0 = plain decoding, else the most tokens to draft.

        behind: how many context tokens the drafter would catch up on before drafting (None = unknown). A probe
        that is due waits while that catch-up (one batched draft decode, see catchup_seconds) plus the probe itself
        would cost more than `probe_budget` of the plain decoding time since the last probe: where a batch is dear
        (a CPU, or a GPU past a kernel cliff) probes come rarer, where it is almost free nothing changes. After
        max_probe_interval plain tokens the budget is LATE_PROBE_BUDGET times larger, so that a catch-up whose cost
        grows as fast as the budget does not keep the draft off for the rest of a long generation."""
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
                k = self.probe_k if self._plain_run >= self._interval and self._probe_affordable(behind) else 0
            if k == 0:  # one plain token is about to pass
                self._plain_run += 1
                self.estimator.age(1)
        self.decisions[k] += 1
        self._planned = k
        self._confidences = {}
        self._rho = None
        return k

    @property
    def wants_chances(self) -> bool:
        """Should this cycle's sampled drafts have their acceptance chances worked out (Proposal.sampled_chances)? While
        position 1 holds less than `chances_below` decayed observations: there a few draws swing the estimates (a fresh
        engine, a long plain stretch) and one pass over the vocabulary per position buys a noiseless observation. Never
        for a fixed k (not adaptive): no decision reads the estimates there."""
        return self.spec.adaptive and self.estimator.evidence(1) < self.chances_below

    def _probe_affordable(self, behind: int | None) -> bool:
        if behind is None or self.probe_budget <= 0:
            return True
        c = self.cost
        probe = self.catchup_seconds(behind) + self.probe_k * c.c_draft + c.verify(self.probe_k + 1) - c.verify(1)
        budget = self.probe_budget * (LATE_PROBE_BUDGET if self._plain_run >= self.max_interval else 1.0)
        return probe <= budget * self._plain_run * c.cycle_time(0)

    def limit(self, k: int) -> int:
        """The most tokens a cycle planned at k (next_k) may draft. k is what the estimates alone pay for; while
        speculating (not a probe, adaptive), the draft's own confidence, token by token, decides in keep_drafting
        whether to go on past it, up to draft_max (the curve's cost of every extra token, cliffs included, is in
        that rule). Otherwise k."""
        if k and self.extend and self.spec.adaptive and not self._plain:
            return max(k, self.spec.draft_max)
        return k

    def keep_drafting(self, position: int, confidence: float, extra_rows: int = 0) -> bool:
        """After drafting token i = position (1-based) with confidence c, should it draft token i + 1?

        c is the draft's probability of the token it just drafted (or its max probability for the next
        position). Acceptance is predicted by blending with the position estimates, weight w:

            â_j     = w c_j + (1 - w) a_j        for the drafted positions j <= i (their confidences)
            â_{i+1} = w c_i + (1 - w) a_{i+1}    (confidence carries over to the next position)
            â_m     = a_m                        for m > i + 1

        With ρ* the best long-run rate (best_rate of the plain estimates, plain decoding included), drafting
        on to some length m > i pays when it adds more tokens than the time it costs is worth at ρ*:

            continue  ⇔  max_{m>i} [E(m) - E(i)] - ρ* [T(m) - T(i)] > 0,

        with E computed from â. (Stopping restarts a cycle whose rate is ρ*; renewal-reward.) extra_rows: verify rows
        the cycle already holds beyond its chain (a draft-model tree's siblings), so that T counts them: a chain that
        would push the verify over a cliff with them stops before it. Probe cycles
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
        a_hat = self._blended(a, i)
        a_hat[i] = w * c + (1.0 - w) * a[i]
        rho = self._long_run_rate()
        e_i = expected_tokens(a_hat, i)
        t_i = self.cost.cycle_time(i, extra_rows)
        run, e = float(np.prod(a_hat[:i])), e_i
        for m in range(i + 1, spec.draft_max + 1):
            run *= float(a_hat[m - 1])
            e += run
            if (e - e_i) - rho * (self.cost.cycle_time(m, extra_rows) - t_i) > 0:
                return True
        return False

    def _blended(self, a: np.ndarray, upto: int) -> np.ndarray:
        """The position estimates a with the draft's confidences of this cycle blended in at positions 1..upto
        (â_j = w c_j + (1 - w) a_j, keep_drafting's rule)."""
        w = self.confidence_weight
        a_hat = a.copy()
        for j, cj in self._confidences.items():
            if 1 <= j <= upto:
                a_hat[j - 1] = w * cj + (1.0 - w) * a[j - 1]
        return a_hat

    def _long_run_rate(self) -> float:
        """ρ*: the best long-run rate on the plain estimates (plain decoding included), once per cycle."""
        if self._rho is None:
            self._rho = best_rate(self._a(), self.cost, self.spec.draft_max, self.spec.draft_min)
        return self._rho

    def siblings(self, position: int, confidence: float, n_rows: int, available: int) -> int:
        """How many of the draft's next-best candidates at `position` to verify beside its drafted token there, as
        leaves (draft-model trees, `SiblingPolicy`): 0 without a sibling policy, while plain (probes draft chains)
        or with a fixed draft length. confidence: the draft's for the token it drafted at `position` (as
        keep_drafting's); n_rows: the verify batch's rows so far (the root, the drafted tokens, earlier siblings);
        available: the most it may add. The chance the chain reaches `position` is prod â_j over j < position
        (blended as keep_drafting blends), and the drafted token's doubt is the draft's own, 1 - confidence."""
        pol = self.sibling_policy
        if pol is None or available <= 0 or not self.spec.adaptive or self._plain or position < 1:
            return 0
        a = self._a()
        if position > len(a):
            return 0
        self._confidences[position] = float(confidence)
        reach = float(np.prod(self._blended(a, position - 1)[: position - 1]))
        miss = 1.0 - float(confidence)  # the draft's own doubt: where it is sure, its alternatives are not worth a row
        c = self.cost
        marginal = [c.verify(n_rows + j + 1) - c.verify(n_rows + j) for j in range(available)]
        return pol.count(reach * miss, marginal, self._long_run_rate())

    # -- feedback ------------------------------------------------------------------------------------

    def observe(
        self, n_drafted: int, n_accepted: int, t_draft: float, t_verify: float, *, n_catchup: int | None = None,
        n_verified: int | None = None, bonus: int = 0, chances: Sequence[float] = (),
    ) -> None:
        """Fold in one finished cycle: n_drafted tokens drafted (0 = a plain step), n_accepted of them
        accepted, t_draft seconds drafting, t_verify seconds in the target decode of n_drafted + 1 tokens.

        n_catchup: how many context tokens the drafter decoded before drafting (None = unknown). A steady run of drafts
        catches up on 1-2 tokens a cycle (the target's own token, the last accepted draft), which the per-token draft
        cost covers; a larger catch-up (after plain or lookup cycles) is one batched decode whose time would inflate
        the per-token cost if divided by n_drafted, and with it every later decision (the draft would look dearer
        than it is): such a cycle does not update the draft's cost. Its time still counts against the run it starts.

        A draft-model tree (siblings beside the chain): n_drafted and n_accepted are the chain's (what the position
        estimates learn from), n_verified the nodes the verify decoded (what the curve learns from), bonus 1 when a
        sibling was kept (a token the run delivered beyond the chain's).

        chances: the acceptance probability of each chain position the verify examined (Outcome.chances), which the
        position estimates learn from in place of the draws where given (AcceptanceEstimator.update).
        """
        if not (0 <= n_accepted <= n_drafted):
            raise ValueError(f"need 0 <= n_accepted <= n_drafted, got {n_accepted}, {n_drafted}")
        self.cycles += 1
        self._rho = None
        self.drafted[n_drafted] += 1
        self.tokens_drafted += n_drafted
        self.tokens_accepted += n_accepted
        extra_rows = 0 if n_verified is None else n_verified - n_drafted
        self.cost.update_verify(n_drafted + 1 + extra_rows, t_verify)
        if n_drafted == 0:  # a plain step: next_k already counted it
            return
        if n_catchup is None or n_catchup <= self.STEADY_CATCHUP:
            self.cost.update_draft(t_draft / n_drafted)
        self.estimator.update(n_drafted, n_accepted, chances)
        if not self.spec.adaptive:
            return
        if self._plain:  # the result of a probe
            self.probes += 1
            if self._best() > 0:
                self._plain, self._run_tokens, self._run_seconds = False, 0, 0.0
            else:
                self._probe_failed()
                return
        self._run_tokens += n_accepted + 1 + bonus
        # a frozen (seeded) plan judges the run on modelled times: the clock must not change decisions
        self._run_seconds += self.cost.cycle_time(n_drafted, extra_rows) if self.cost.frozen else t_draft + t_verify + self.cost.overhead

    def skipped(self, n_tokens: int) -> None:
        """n_tokens passed in a cycle another drafter made (a lookup's): while plain they count towards the next probe
        as plain tokens do, so a drafter whose cycles a lookup mostly takes is not left plain for many times the probe
        interval (next_k, which counts plain tokens, is not asked on those cycles)."""
        if self.spec.adaptive and self._plain and n_tokens > 0:
            self._plain_run += int(n_tokens)

    def expected_rate(self, extra_seconds: float = 0.0) -> float | None:
        """Tokens per second the coming cycle is expected to deliver if it drafts (the best rate over k on the live
        estimates and costs, the cycle costing extra_seconds more: a catch-up), or None while the controller decodes
        plainly or cannot draft. Changes nothing."""
        spec = self.spec
        if spec.draft_max == 0 or not spec.adaptive or self._plain or self.disabled:
            return None
        table = rates(self._a(), self.cost, spec.draft_max, spec.draft_min, extra=extra_seconds)
        best = max((r for k, r in table.items() if k), default=0.0)
        return best if best > table[0] else None

    def catchup_seconds(self, n_tokens: int) -> float:
        """What catching up on n_tokens context tokens costs beyond the one a drafting cycle always decodes (which
        c_draft covers): one batched draft decode, shaped like the target's verify curve (the draft's own batch
        curve is not measured)."""
        if n_tokens <= 1:
            return 0.0
        return max(0.0, self.cost.c_draft * (self.cost.verify(n_tokens) / self.cost.verify(1) - 1.0))

    @property
    def ceiling(self) -> float:
        """The best speedup this drafter could reach on the current costs at optimistic_a acceptance."""
        return speculation_ceiling(self.cost, self.spec.draft_max, self.spec.draft_min, self.optimistic_a)

    @property
    def disabled(self) -> bool:
        """The hardware gate on the current costs (cached per curve version and draft cost, with hysteresis: see the
        class docstring); never with a fixed draft length, which is always obeyed."""
        if not self.spec.adaptive:
            return False
        key = (self.cost.curve.version, self.cost.c_draft)
        if self._gate[0] != key:
            pays = draft_model_pays(
                self.cost, self.spec.draft_max, self.spec.draft_min, optimistic_a=self.optimistic_a, min_gain=self.min_gain,
                held=not self._gate[1],
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
            **({"siblings": self.sibling_policy.stats()} if self.sibling_policy is not None else {}),
        }


class SiblingPolicy:
    """Where a draft model's chain carries siblings: the draft's next-best candidates at a position, verified as
    leaves beside its drafted token in the same decode (a draft-model tree; tree.py's exact rules verify it).

    A draft model drafts one chain d_1..d_k. Where it is unsure of d_i, its next candidates at i (its top tokens
    after d_i when it drafts greedily; draws without replacement from q_i with d_i removed when it samples) can ride
    in the verify batch: if the target rejects d_i and keeps a sibling, the cycle gains that token and the target's
    own after it (the sibling's row is decoded). Siblings stay leaves: extending them would need draft decodes on
    other branches. The shape follows the curve, one node at a time: sibling r (1-based among the siblings at a
    position) is added when its expected gain

        g_r = reach (1 - β_1) ... (1 - β_{r-1}) β_r,    reach = P(the chain gets to i) (1 - c_i)

    beats both `min_gain` and ρ* Δt_r, with ρ* the controller's long-run rate and Δt_r what one more row costs the
    verify on the curve (the renewal-reward rule keep_drafting uses for one more chain token). Where rows are dear (a
    CPU) nothing is added; where a row is almost free (a GPU) unsure positions get siblings. β_r is the chance that
    sibling r is kept given that d_i and the better siblings were not: learnt per rank from what verification tried
    (decayed counts shrunk to PRIOR). Kept small: at most `width` - 1 siblings at a position and `max_siblings` in
    a cycle (each is one more root-to-leaf path: llama.cpp sequence ids the target must be loaded with).
    """

    PRIOR = 0.15
    PRIOR_WEIGHT = 2.0

    def __init__(self, max_siblings: int, width: int = 3, *, min_gain: float = 0.02, decay: float = 0.995) -> None:
        if max_siblings < 0 or width < 1:
            raise ValueError("need max_siblings >= 0 and width >= 1")
        self.max_siblings = max_siblings
        self.width = width
        self.min_gain = min_gain
        self.decay = decay
        self.hits = np.zeros(max(width - 1, 0))
        self.tries = np.zeros(max(width - 1, 0))
        self.added = 0  # siblings verified
        self.kept = 0  # siblings the target kept

    def rates(self) -> np.ndarray:
        """β_r for sibling ranks r = 1..width - 1."""
        return (self.hits + self.PRIOR_WEIGHT * self.PRIOR) / (self.tries + self.PRIOR_WEIGHT)

    def count(self, reach: float, marginal: list[float], rho: float) -> int:
        """How many siblings to add at a position the chain reaches and loses with probability `reach`; marginal[j]:
        the verify's extra seconds for sibling j + 1 (at most len(marginal) are added); rho: tokens per second."""
        n = 0
        for beta, dt in zip(self.rates(), marginal):
            gain = reach * float(beta)
            if gain <= self.min_gain or gain <= rho * dt:
                break
            n += 1
            reach *= 1.0 - float(beta)
        return n

    def observe(self, tried: int, kept: bool, n_emitted: int = 1) -> None:
        """At a position where the drafted token was rejected, `tried` siblings were tried in rank order and the last
        one was kept (kept True) or all were rejected; n_emitted tokens passed (ages the counts)."""
        factor = self.decay ** max(n_emitted, 0)
        self.hits *= factor
        self.tries *= factor
        for r in range(min(tried, len(self.tries))):
            self.tries[r] += 1
            self.hits[r] += float(kept and r == tried - 1)
        self.kept += int(kept and tried > 0)

    def stats(self) -> dict:
        return {"added": self.added, "kept": self.kept, "rank_acceptance": [round(float(x), 4) for x in self.rates()]}


__all__ = ["CHANCES_BELOW", "LATE_PROBE_BUDGET", "Controller", "SiblingPolicy"]
