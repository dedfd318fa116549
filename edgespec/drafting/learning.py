"""What an engine learns across generations, in one object: the engine carries one, the replay
(edgespec/bench/replay.py, behind research/predict_speedup.py) builds one per drafter kind and drives it through the same methods, so the two cannot
drift apart.

    state = LearningState.from_costs(verify, draft_cost, memory=SuffixIndex())
    cost = state.cost_model()                                   # a generation's costs, over the shared live curve
    speculator = state.speculator(kind, spec, sampling, cost, draft_model, tree_paths=n)
    ... speculate(..., speculator=speculator) ...               # every cycle teaches the curve, estimators, guard
    state.end_generation(speculator, kind, spec, cost)          # the draft's cost and its gate carry over

Within a generation the speculators update the shared parts in place, cycle by cycle: the verify curve (through the
CostModel, costs.VerifyCurve.update), the lookups' acceptance by match run and the draft's by position (estimators),
the live-rate check of the kind (rate_guard.RateGuard, through drafting.guard) and the suffix memory (the suffix
drafters' index). What a generation holds apart and hands back at its end: the draft's per-token cost (the
CostModel's c_draft, learnt while the draft drafts) and whether the draft model's hardware gate is open (its
hysteresis spans generations). New measured costs (set_costs) start the curve, the draft's cost, its gate and the
guards over; the acceptance estimates and the memory stay (they do not depend on the machine).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from edgespec.config import SamplingParams, SpecConfig
from .costs import CostModel, VerifyCurve
from .estimators import AcceptanceEstimator, MatchLengthEstimator
from .rate_guard import RateGuard
from edgespec.drafting import draft_gate_open, guarded, make_speculator, model_draft_used
from .base import Speculator
from .model import DraftModel
from .suffix_index import SuffixIndex

DRAFT_POSITIONS = 64  # the draft model's acceptance is estimated at this many positions (covers any draft_max)


@dataclass
class LearningState:
    """An engine's cross-generation learning state (see the module docstring).

    curve: the target's live verify curve (shared by every generation's CostModel); draft_cost: the draft's seconds
    per token after the last generation; draft_gate_open: the draft model's hardware gate after the last generation
    that asked it; run_estimator: lookups' acceptance by match run; draft_estimator: the draft model's acceptance by
    position; rate_guards: the live-rate check per drafter kind (what one drafter delivers says nothing of another's);
    memory: the suffix drafters' index of everything seen (None: an engine without a suffix drafter)."""

    curve: VerifyCurve
    draft_cost: float = 0.0
    draft_gate_open: bool = False
    run_estimator: MatchLengthEstimator = field(default_factory=MatchLengthEstimator)
    draft_estimator: AcceptanceEstimator = field(default_factory=lambda: AcceptanceEstimator(DRAFT_POSITIONS))
    rate_guards: dict[str, RateGuard] = field(default_factory=dict)
    memory: SuffixIndex | None = None

    @classmethod
    def from_costs(
        cls, verify: Mapping[int, float], draft_cost: float = 0.0, *, frozen: bool = False, memory: SuffixIndex | None = None
    ) -> "LearningState":
        """A fresh state planning with these costs: verify {n: seconds} (a live curve, or frozen: never refined) and
        the draft's seconds per token."""
        return cls(VerifyCurve(verify, frozen=frozen), float(draft_cost), memory=memory)

    def set_costs(self, verify: Mapping[int, float], draft_cost: float, *, frozen: bool = False) -> None:
        """Plan with new measured costs: the curve, the draft's cost, its gate and the rate guards start over; the
        acceptance estimates and the memory are kept."""
        self.curve = VerifyCurve(verify, frozen=frozen)
        self.draft_cost = float(draft_cost)
        self.draft_gate_open = False
        self.rate_guards = {}

    def cost_model(self) -> CostModel:
        """A generation's cost model: the live curve (shared: what the generation measures refines it) and the draft's
        cost as learnt so far (the generation's own copy until end_generation)."""
        return CostModel(self.curve, c_draft=self.draft_cost)

    def model_draft_used(self, kind: str, spec: SpecConfig, cost: CostModel | None = None) -> bool:
        """Whether a generation of `kind` would run the draft model on these costs (default: the current ones), with
        the gate's state after the last generation (drafting.model_draft_used)."""
        return model_draft_used(kind, spec, cost if cost is not None else self.cost_model(), self.draft_gate_open)

    def speculator(
        self, kind: str, spec: SpecConfig, sampling: SamplingParams, cost: CostModel, draft: DraftModel | None = None, *,
        tree_paths: int = 0,
    ) -> Speculator | None:
        """The speculator of one generation (None: plain decoding), built on this state (make_speculator with the
        memory, the estimators and the gate) and, with an adaptive spec, under the kind's rate guard (a fixed draft
        length is always obeyed)."""
        speculator = make_speculator(
            kind, spec, sampling, cost, draft, self.memory, self.run_estimator, draft_estimator=self.draft_estimator,
            tree_paths=tree_paths, gate_open=self.draft_gate_open,
        )
        if spec.adaptive:
            speculator = guarded(speculator, self.rate_guards.setdefault(kind, RateGuard()), cost)
        return speculator

    def end_generation(self, speculator: Speculator | None, kind: str, spec: SpecConfig, cost: CostModel) -> None:
        """What a generation hands the next: the draft's cost it learnt and the gate's state at its end."""
        self.draft_cost = cost.c_draft
        self.draft_gate_open = draft_gate_open(speculator, kind, spec, self.draft_gate_open)


__all__ = ["LearningState", "DRAFT_POSITIONS"]
