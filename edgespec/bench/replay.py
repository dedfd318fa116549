"""The speedup replay: recorded prompts (traces.py) replayed through edgespec's own code, the speculation loop
(runtime.speculate) and the speculators an engine makes (drafting.make_speculator: Controller, NgramPolicy, the real
NgramIndex, the hardware gate), on a cost model built from a curve file (curves.py) as the engine builds it. Only the
two models are fakes (recorded.py): the target answers with the recording, the draft with its recorded
continuations, and each advances a virtual clock by what the curve says the call costs (no wall clock).

The engine's online learning runs as in a bench, fed with these modelled times: each drafter kind replays through
one edgespec.drafting.learning.LearningState, the engine's own (the curve, the draft's cost and gate, the estimators,
the rate guard and the suffix memory carry over from prompt to prompt), driven through the methods the engine calls
(`new_state`, `run_one`). The suffix-index drafters' token trees are verified by the fake target as llama.cpp's tree
decode would (one decode of the tree's nodes costs verify(nodes + 1); the memory starts empty and holds every prompt
and output replayed before, as one engine's would in a bench run).

`replay_streams` and `predict_streams` replay several prompts together in an engine's slots (issue 34): batched
verifies where the learnt curve says they pay. speedup.py turns replays into predicted speedups per suite.

Importing this module loads nothing of llama.cpp.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from edgespec.config import DrafterKind
from edgespec.drafting.learning import LearningState

from .curves import Clock, Curve
from .recorded import RecordedDraft, SampledDraft, SampledPrompt, SampledTarget, TraceTarget, sampled_params

# the chain drafters (an oracle each) and the default set; the suffix-index drafters: token trees (no oracle: it is over
# chains). DrafterKind is a str Enum: its members are the report's keys as they are.
KINDS = (DrafterKind.MODEL, DrafterKind.NGRAM, DrafterKind.MODEL_NGRAM)
TREE_KINDS = (DrafterKind.SUFFIX, DrafterKind.MODEL_SUFFIX)


def new_state(cost: Curve) -> LearningState:
    """What an engine starts a bench with on this curve (edgespec.drafting.learning.LearningState, the engine's own class):
    its live verify curve and the draft's cost from the file, a closed gate, fresh estimators and rate guards, and an
    empty suffix memory (it will hold every prompt and output replayed through this state)."""
    from edgespec.drafting.suffix_index import SuffixIndex

    return LearningState.from_costs(cost.verify, cost.draft, memory=SuffixIndex())


def replay_tree_paths(kind: str, spec: Any, meta: Mapping[str, Any]) -> int:
    """The tree sequences Engine.load gives the target for `kind` (speculators.tree_paths_for), a draft model's
    siblings only from format-2 and format-3 recordings, which record the draft's alternatives (its distributions)."""
    from edgespec.drafting import tree_paths_for

    return tree_paths_for(kind, spec, meta.get("format", 1) >= 2)


def run_one(
    rec: Mapping[str, Any], meta: Mapping[str, Any], kind: str | None, cost: Curve, state: LearningState, spec: Any,
    sampled: SampledPrompt | None = None, seed: int | Sequence[int] = 0,
) -> tuple[Any, bool]:
    """Replay one recorded prompt with drafter `kind` (None = plain decoding): its GenerationStats (decode seconds on
    the virtual clock) and whether the loop's prefill computed the last prompt token's logits. With `sampled` (a
    format-3 recording's prompt), the replay samples with the recording's settings from its rows, drawing from a
    source seeded with `seed`, and up to as many tokens as the recorded trajectory. `state` (a LearningState,
    new_state) carries what the engine learns from one prompt to the next, driven as Engine._run drives its own."""
    from edgespec.config import SamplingParams
    from edgespec.drafting.costs import VerifyCurve
    from edgespec.runtime.speculate import speculate
    from edgespec.stats import GenerationStats

    prompt, trace = list(rec["prompt"]), list(rec["trace"])
    eog = frozenset(meta["eog_ids"])
    truth = VerifyCurve(cost.verify)  # what a decode really costs (the file), apart from what the engine learns
    clock = Clock(real=cost.python_time)
    target: TraceTarget
    draft: RecordedDraft
    if sampled is not None:
        prompt, trace, eog = sampled.prompt, sampled.trace, frozenset(sampled.vocab.map(sorted(eog)))
        target = SampledTarget(sampled, eog, truth, cost.overhead, clock, cost.verify_factor)
        draft = SampledDraft(sampled, eog, cost, clock)
        sampling = sampled_params(meta)
    else:
        target = TraceTarget(prompt + trace, int(meta["n_vocab"]), eog, truth, cost.overhead, clock, cost.verify_factor)
        draft = RecordedDraft(len(prompt), rec["segments"], int(meta["draft_len"]), eog, cost, clock)
        sampling = SamplingParams(temperature=0)
    speculator = None
    cm = state.cost_model()
    if kind is not None:
        speculator = state.speculator(kind, spec, sampling, cm, draft, tree_paths=replay_tree_paths(kind, spec, meta))
        if state.model_draft_used(kind, spec, cm) and len(prompt) > 1:
            draft.cached = prompt[:-1]  # the bench's warm draft: prompt processed apart, not in decode time
    stats = GenerationStats()
    max_tokens = int(meta["max_tokens"]) if rec.get("stop") == "eos" and sampled is None else len(trace)
    out: list[int] = []
    rng = np.random.default_rng(seed)  # greedy: never drawn from, but speculate's signature asks for a source
    for step in speculate(target, prompt, sampling, rng, max_tokens=max_tokens, speculator=speculator, stats=stats, clock=clock.perf_counter):
        out += step.tokens
    if sampled is None and (out != trace[: len(out)] or len(out) != len(trace)):
        raise RuntimeError(f"{rec['name']}: the replay produced {len(out)} tokens that differ from the recorded trace")
    if kind is not None:
        state.end_generation(speculator, kind, spec, cm)
    return stats, target.prefill_rows


def _open_stream(rec: Mapping[str, Any], meta: Mapping[str, Any], kind: str | None, cost: Curve, state: LearningState, spec: Any,
                 clock: Clock, truth: Any, rng: np.random.Generator) -> dict[str, Any]:
    """One greedy recorded prompt as a stream of replay_streams: its fakes on the shared clock, its speculator from
    `state`, and the loop's step generator (speculate_steps), not started."""
    from edgespec.config import SamplingParams
    from edgespec.runtime.speculate import speculate_steps
    from edgespec.stats import GenerationStats

    sampling = SamplingParams(temperature=0)
    prompt, trace = list(rec["prompt"]), list(rec["trace"])
    eog = frozenset(meta["eog_ids"])
    target = TraceTarget(prompt + trace, int(meta["n_vocab"]), eog, truth, cost.overhead, clock, cost.verify_factor)
    draft = RecordedDraft(len(prompt), rec["segments"], int(meta["draft_len"]), eog, cost, clock)
    cm = state.cost_model()
    spc = None
    if kind is not None:
        spc = state.speculator(kind, spec, sampling, cm, draft, tree_paths=replay_tree_paths(kind, spec, meta))
        if state.model_draft_used(kind, spec, cm) and len(prompt) > 1:
            draft.cached = prompt[:-1]
    stats = GenerationStats()
    max_tokens = int(meta["max_tokens"]) if rec.get("stop") == "eos" else len(trace)
    gen = speculate_steps(target, prompt, sampling, rng, max_tokens=max_tokens, speculator=spc, stats=stats, clock=clock.perf_counter)
    return {"gen": gen, "target": target, "cm": cm, "spc": spc, "stats": stats, "out": [], "trace": trace, "rec": rec, "item": None}


def _run_verifies(reqs: Sequence[Any], state: LearningState, cost: Curve, truth: Any, clock: Clock) -> tuple[list[Any], bool]:
    """A round's verify decodes as the engine's slots run them: in one decode charged verify(all rows) at the deepest
    stream's depth where the learnt curve says that costs less than BATCH_GAIN of the separate decodes (the curve
    learns the batch's time), else one by one. Returns their results and whether they were batched."""
    from edgespec.runtime.slots import BATCH_GAIN

    sizes = [r.n_rows for r in reqs]
    curve = state.curve
    if not (len(reqs) > 1 and curve(sum(sizes)) < BATCH_GAIN * sum(curve(n) for n in sizes)):
        return [r.run() for r in reqs], False
    depth = max(r.model.n_past + r.n_rows for r in reqs)
    results = []
    for r in reqs:
        r.model.charge = False
        results.append(r.run())
        r.model.charge = True
        r.shared = True
    seconds = truth(sum(sizes)) * cost.verify_factor(sum(sizes), depth)
    clock.now += seconds
    curve.update(sum(sizes), seconds)
    return results, True


def replay_streams(
    recs: Sequence[Mapping[str, Any]], meta: Mapping[str, Any], kind: str | None, cost: Curve, state: LearningState, spec: Any,
) -> dict[str, float]:
    """Replay greedy recorded prompts as streams running together in an engine's slots (issue 34), on one virtual
    clock: each round every stream drafts (its draft's decodes charged one after another, as the engine runs them)
    and the rounds' verify decodes run as the engine's slots run them (_run_verifies); each stream plans its drafts
    with the others' rows beside it (CostModel.others), as the engine does. One stream is the engine alone. Returns
    the clock's seconds, the tokens, drafted tokens and cycles."""
    from edgespec.drafting.costs import VerifyCurve
    from edgespec.runtime.speculate import Verify

    clock = Clock()
    truth = VerifyCurve(cost.verify)
    rng = np.random.default_rng(0)
    streams = [_open_stream(rec, meta, kind, cost, state, spec, clock, truth, rng) for rec in recs]
    last_rows: dict[int, int] = {}
    active = list(range(len(streams)))

    def advance(i: int, value: Any) -> bool:
        """Stream i on to its next Verify (True) or the end of its cycle (False; finished streams leave `active`)."""
        st = streams[i]
        try:
            item = st["gen"].send(value)
        except StopIteration:
            active.remove(i)
            last_rows.pop(i, None)
            if st["spc"] is not None:
                state.end_generation(st["spc"], kind, spec, st["cm"])  # type: ignore[arg-type]
            if st["out"] != st["trace"][: len(st["out"])]:
                raise RuntimeError(f"{st['rec']['name']}: the replay left the recorded trace") from None
            return False
        if isinstance(item, Verify):
            st["item"] = item
            return True
        st["out"] += item.tokens
        return False

    while active:
        waiting = []
        for i in list(active):
            streams[i]["cm"].others = sum(n for j, n in last_rows.items() if j != i) if i in last_rows else 0
            if advance(i, None):
                waiting.append(i)
        while waiting:
            reqs = [streams[i]["item"] for i in waiting]
            results, batched = _run_verifies(reqs, state, cost, truth, clock)
            for i, r in zip(waiting, reqs):
                if batched:
                    last_rows[i] = r.n_rows
                else:
                    last_rows.pop(i, None)
            waiting = [i for i, res in zip(waiting, results) if advance(i, res)]
    return {"seconds": clock.now, "tokens": float(sum(len(st["out"]) for st in streams)),
            "drafted": float(sum(st["stats"].n_drafted for st in streams)), "cycles": float(sum(st["stats"].n_cycles for st in streams))}


def predict_streams(data: Mapping[str, Any], cost: Curve, spec: Any, n: int, suites: Sequence[str] = (),
                    kinds: Sequence[str] = KINDS) -> dict[str, Any]:
    """The aggregate rate of n streams together against the same prompts one after another (replay_streams), per suite
    (its prompts in groups of n, each way from a fresh engine state), for plain decoding and each drafter kind; with
    the drafted tokens per cycle each way (shorter drafts beside others on flat curves)."""
    if data.get("format") == 3:
        raise ValueError("the streams replay takes greedy recordings")
    out: dict[str, Any] = {"curve": cost.name, "streams": n, "suites": {}}
    by_suite: dict[str, list[Any]] = {}
    for p in data["prompts"]:
        if not suites or p["suite"] in suites:
            by_suite.setdefault(p["suite"], []).append(p)
    for suite, recs in by_suite.items():
        groups = [recs[i:i + n] for i in range(0, len(recs) - n + 1, n)] or [recs]
        row: dict[str, Any] = {}
        plain_alone = 1.0
        for kind in (None, *kinds):
            ways = {}
            for way in ("alone", "together"):
                state = new_state(cost)
                tot = {"seconds": 0.0, "tokens": 0.0, "drafted": 0.0, "cycles": 0.0}
                for g in groups:
                    parts = [replay_streams([r], data, kind, cost, state, spec) for r in g] if way == "alone" else \
                        [replay_streams(g, data, kind, cost, state, spec)]
                    for part in parts:
                        for k in tot:
                            tot[k] += part[k]
                ways[way] = tot
            a, t = ways["alone"], ways["together"]
            if kind is None:
                plain_alone = a["tokens"] / a["seconds"]
            row[str(kind or "plain")] = {
                "ratio": round((t["tokens"] / t["seconds"]) / (a["tokens"] / a["seconds"]), 3),
                "together_vs_plain_alone": round((t["tokens"] / t["seconds"]) / plain_alone, 3),
                "drafted_per_cycle": [round(a["drafted"] / max(a["cycles"], 1), 2), round(t["drafted"] / max(t["cycles"], 1), 2)],
            }
        out["suites"][suite] = row
    return out


def format_streams(res: Mapping[str, Any]) -> str:
    lines = [f"{res['curve']}: {res['streams']} streams, aggregate tok/s together / the same kind one after another "
             "[together / plain one after another] (drafted per cycle alone -> together)"]
    for suite, row in res["suites"].items():
        cells = [f"{k} {v['ratio']:.2f} [{v['together_vs_plain_alone']:.2f}] ({v['drafted_per_cycle'][0]} -> {v['drafted_per_cycle'][1]})"
                 for k, v in row.items()]
        lines.append(f"  {suite:16} " + "  ".join(cells))
    return "\n".join(lines)
