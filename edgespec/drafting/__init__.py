"""drafting/: what to draft and how much. Drafting strategies, one object each (see base.py for the contract), and
the one function that builds them (make_speculator).

    model         a draft GGUF model; its Controller picks k per cycle and stops drafts early
    ngram         prompt lookup; its NgramPolicy picks k after the lookup from the match run
    suffix        a suffix index over everything the engine has seen; its TreePolicy picks a tree (or chain)
    model+ngram   the lookup when it has a proposal worth verifying, the draft model otherwise
    model+suffix  the same with the suffix index
    none          plain decoding

A draft of another vocabulary is wrapped in cross_vocab.CrossVocabDraft (the draft in target ids).

Owns also what those objects use: the cost model (costs), acceptance estimators (estimators), the draft-length and
tree policies (model_policy, lookup_policy, tree_shape), the live-rate check (rate_guard), the hardware curves
measured once per machine (calibration), what the engine carries between generations (learning), and the lookup and
suffix indexes (ngram; suffix_index with suffix_ladder and suffix_proposal).

May import: edgespec's base modules, prompts/ and decoding/. Never llama/ (a draft model is any object with the
DraftModel protocol), runtime/, server/ or cli/.
"""

from __future__ import annotations

from edgespec.config import SamplingParams, SpecConfig
from .costs import CostModel, draft_model_pays
from .ngram import NgramIndex
from .estimators import AcceptanceEstimator, MatchLengthEstimator
from .lookup_policy import NgramPolicy, TreePolicy
from .model_policy import Controller, SiblingPolicy
from edgespec.config import DrafterKind
from .suffix_index import SuffixIndex
from .base import Outcome, Proposal, Speculator
from .guard import GuardedSpeculator, guarded, unguarded
from .hybrid import HybridSpeculator
from .lookup import LookupSpeculator
from .model import DraftModel, ModelSpeculator
from .suffix import SuffixSpeculator

KINDS = tuple(DrafterKind)
TREE_KINDS = tuple(k for k in DrafterKind if k.uses_tree)  # need a memory and a target loaded with tree sequences
MODEL_KINDS = tuple(k for k in DrafterKind if k.needs_draft_model)  # need a draft model


def model_draft_used(kind: str, spec: SpecConfig, cost: CostModel, gate_open: bool = False) -> bool:
    """Whether a speculator of this kind would run the draft model at all on these costs: never for "ngram" and
    "none"; for the others only where the hardware gate says a draft model can pay (or the draft length is fixed).
    gate_open: the gate was open at the end of the last generation (draft_gate_open), which it holds on to
    (costs.draft_model_pays, held)."""
    if kind not in MODEL_KINDS or spec.draft_max == 0:
        return False
    return not spec.adaptive or draft_model_pays(cost, spec.draft_max, spec.draft_min, held=gate_open)


def draft_gate_open(speculator: Speculator | None, kind: str, spec: SpecConfig, was_open: bool) -> bool:
    """The draft model's hardware gate after a generation of `kind` with `speculator` (what an engine hands the next
    generation's make_speculator as gate_open, so that the gate's hysteresis spans generations): open where the
    speculator runs a draft model whose gate is open now; as it was (was_open) after a generation that did not ask the
    gate (a kind without the draft model, a fixed draft length)."""
    speculator = unguarded(speculator)
    if kind not in MODEL_KINDS or not spec.adaptive:
        return was_open
    model = speculator.model if isinstance(speculator, HybridSpeculator) else speculator
    return isinstance(model, ModelSpeculator) and not model.controller.disabled


def tree_paths_for(kind: str, spec: SpecConfig, draft: bool, batch: int | None = None) -> int:
    """The tree sequences a target needs for drafter `kind`: the suffix drafters' spec.tree_nodes; a draft model's
    spec.draft_siblings + 1 (draft-model trees; `draft`: there is a draft model), cut to what a batch of `batch`
    tokens holds (a root and one path more than the siblings; none below 2 paths): siblings are an optimisation,
    fitted rather than refused."""
    paths = spec.tree_nodes if kind in TREE_KINDS else 0
    if kind in MODEL_KINDS and draft and spec.draft_siblings and spec.tree_width > 1:
        fit = spec.draft_siblings + 1 if batch is None else min(spec.draft_siblings + 1, batch - 1)
        paths = max(paths, fit if fit >= 2 else 0)
    return paths


def make_speculator(
    kind: str,
    spec: SpecConfig,
    sampling: SamplingParams,
    cost: CostModel,
    draft_model: DraftModel | None = None,
    memory: SuffixIndex | None = None,
    run_estimator: MatchLengthEstimator | None = None,
    draft_estimator: AcceptanceEstimator | None = None,
    tree_paths: int = 0,
    gate_open: bool = False,
) -> Speculator | None:
    """The speculator for `kind` (None = plain decoding). `cost` carries the target's verify curve and the draft
    model's per-token cost; lookups plan on a zero-draft-cost view of the same curve. Where the draft model cannot
    pay on this hardware, "model+ngram" is the lookup alone and "model" is plain decoding: the draft does no work.
    run_estimator: how reliable lookups are by match run, learnt so far (the engine keeps one across generations:
    a new generation need not learn it again); draft_estimator: the same for the draft model's acceptance by position
    (covering at least spec.draft_max positions, else a fresh one is used). tree_paths: the tree sequences the target
    was loaded with; a draft model's chain carries up to min(spec.draft_siblings, tree_paths - 1) siblings a cycle
    (draft-model trees, SiblingPolicy), none with fewer than 2. gate_open: the draft model's hardware gate was open
    at the end of the last generation (draft_gate_open; see model_draft_used)."""
    if kind not in KINDS:
        raise ValueError(f"speculator kind must be one of {', '.join(KINDS)}, got {kind!r}")
    kind = DrafterKind(kind)
    if kind is DrafterKind.NONE or spec.draft_max == 0:
        return None
    lookup: LookupSpeculator | SuffixSpeculator | None = None
    if kind.uses_ngram:
        lookup = LookupSpeculator(NgramIndex(spec.ngram_n_max, spec.ngram_n_min), NgramPolicy(spec, cost.view(0.0), run_estimator))
    elif kind in TREE_KINDS:
        if memory is None:
            raise ValueError(f"speculator '{kind}' needs a suffix index (memory)")
        lookup = SuffixSpeculator(memory, TreePolicy(spec, cost.view(0.0), spec.tree_nodes, spec.tree_width, estimator=run_estimator))
    if not model_draft_used(kind, spec, cost, gate_open):
        return lookup
    if draft_model is None:
        raise ValueError(f"speculator '{kind}' needs a draft model")
    if draft_estimator is not None and draft_estimator.k_max < spec.draft_max:
        draft_estimator = None  # learnt for shorter drafts than this generation's: start afresh
    n_siblings = min(spec.draft_siblings, tree_paths - 1) if spec.adaptive else 0
    siblings = SiblingPolicy(n_siblings, spec.tree_width) if n_siblings > 0 and spec.tree_width > 1 else None
    controller = Controller(spec, cost, estimator=draft_estimator, siblings=siblings, gate_open=gate_open)
    model = ModelSpeculator(draft_model, sampling, controller, spec.draft_temperature)
    return model if lookup is None else HybridSpeculator(model, lookup)


__all__ = [
    "DrafterKind",
    "KINDS",
    "TREE_KINDS",
    "MODEL_KINDS",
    "Proposal",
    "Outcome",
    "Speculator",
    "ModelSpeculator",
    "LookupSpeculator",
    "HybridSpeculator",
    "GuardedSpeculator",
    "guarded",
    "unguarded",
    "SuffixSpeculator",
    "make_speculator",
    "model_draft_used",
    "draft_gate_open",
    "tree_paths_for",
]
