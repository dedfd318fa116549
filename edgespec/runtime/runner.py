"""The worker's side of one generation: the speculative loop over a Plan (what Engine.start checked), each step's
text pushed to the caller's handle token by token through the detokenizer, and what the generation learnt handed
back to the engine's LearningState at its end."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator, Mapping

from edgespec.decoding.constraint import Matcher
from edgespec.decoding.detok import StreamingDetokenizer
from edgespec.config import DrafterKind, SpecConfig
from edgespec.drafting.learning import LearningState
from edgespec.llama.backend import Slot
from edgespec.stats import GenerationStats

from .job import Chunk, Job
from .request import GenerationRequest
from .slots import Slots
from .speculate import speculate_steps
from .steps import Step, Verify


@dataclass(frozen=True)
class Plan:
    """What the worker runs for one request: the request, checked against this engine (Engine.start), with its
    context tokens, drafter kind, speculation settings and constraint matcher."""

    request: GenerationRequest
    ctx: list[int]
    max_tokens: int  # the request's, or what the context leaves
    kind: DrafterKind
    spec: SpecConfig
    matcher: Matcher | None


def generation_steps(
    job: Job, slot: int, plan: Plan, stats: GenerationStats, ids: list[int], texts: list[str], *,
    slots: Slots, learning: LearningState, rng: Any, costs_source: str,
) -> Generator[Verify | None, Any, None]:
    """The worker's side of one generation, in `slot`: speculate over the plan, each step's text to the handle
    (ids, texts). Yields each cycle's target decode (a Verify: the worker sends back its logits) and None at each
    cycle boundary (where the worker may let other generations run), except while `job.alone()` (Worker._alone: it
    is the only generation the worker could run): then it runs its decode itself through the same `slots.execute`
    and goes on to its next cycle without the worker's round in between. rng: the generation's uniforms (see
    Engine.generation_rng); costs_source: where the engine's costs came from (reported in the stats)."""
    target, draft = slots.models(slot)
    req, kind, spec, sampling = plan.request, plan.kind, plan.spec, plan.request.sampling
    logprobs = req.logprobs
    stats.timings.queue = job.started_at - job.enqueued
    cost = learning.cost_model()  # frozen with a frozen curve
    speculator = learning.speculator(kind, spec, sampling, cost, slots.drafting(draft), tree_paths=target.tree_paths)
    stats.costs = {**cost.describe(), "source": costs_source}
    detok = StreamingDetokenizer(target.token_bytes, req.stop or ())
    steps = speculate_steps(
        target, plan.ctx, sampling, rng, max_tokens=plan.max_tokens, speculator=speculator, stats=stats,
        should_stop=job.cancel_event.is_set, on_prefill=req.on_prefill,
        constraint=plan.matcher, forced_drafts=req.speculative, logprobs=logprobs, clock=job.clock,
    )
    models = [m for m in (target, draft) if m is not None]
    decodes_before = {m: dict(m.threads_info().get("decodes", {})) for m in models}
    llama_before = sum(m.decode_seconds for m in models)
    try:
        ended = False
        try:
            item = next(steps)
            alone = job.alone
            while True:
                if isinstance(item, Verify):
                    if alone():  # the only generation the worker could run: its decode here, as the worker would
                        got = slots.execute([item])[0]
                        if isinstance(got, BaseException):
                            raise got
                        item = steps.send(got)
                    else:
                        item = steps.send((yield item))
                    continue
                if emit(job, item, detok, ids, texts):
                    break
                if not alone():
                    yield None  # a cycle boundary
                cost.others = slots.rows_beside(slot)  # drafts are planned for the batch as a whole
                item = next(steps)
        except StopIteration:
            ended = True
        if ended:
            tail = detok.flush()
            if tail:  # (logprobs still carried belong to this text; an end token's has no text and is dropped)
                job.push(Chunk(tail, [], False, list(job.logprob_carry) if logprobs is not None else None, pieces=[tail]), texts=texts)
    finally:
        steps.close()
        slots.last_rows.pop(slot, None)
        if detok.stopped:
            stats.stop_reason = "stop"
        stats.n_generated = len(ids)
        stats.timings.waited = job.paused
        stats.timings.llama = sum(m.decode_seconds for m in models) - llama_before
        stats.timings.host = max(0.0, stats.wall - stats.timings.llama)
        if speculator is not None:
            stats.controller = speculator.stats()
        learning.end_generation(speculator, kind, spec, cost)
        stats.threads = {role: threads_used(m, decodes_before[m]) for role, m in (("target", target), ("draft", draft)) if m is not None}

def emit(job: Job, step: Step, detok: StreamingDetokenizer, ids: list[int], texts: list[str]) -> bool:
    """Hand a step's text to the caller: its accepted draft tokens, then the target's own, each pushed token by
    token through the detokenizer, so a stop string ends the generation at the token that completes it, as
    plain decoding would. True when it stopped."""
    n = step.n_accepted
    lps = step.logprobs
    carry = job.logprob_carry
    for toks, from_draft, first in ((step.tokens[:n], True, 0), (step.tokens[n:], False, n)):
        text, used, pieces = "", [], []
        for tok in toks:
            piece = detok.push([tok])
            text += piece
            pieces.append(piece)
            used.append(tok)
            if detok.stopped:
                break
        if lps is not None:
            carry.extend(lps[first : first + len(used)])
        chunk = None
        if text:
            chunk_lps = None
            if lps is not None:
                chunk_lps, carry[:] = list(carry), []
            chunk = Chunk(text, used, from_draft, chunk_lps, step.source if from_draft else "target", pieces)
        if used:
            job.push(chunk, ids=ids, used=used, texts=texts)  # the ids, the text and the chunk under one lock
        if detok.stopped:
            return True
    return False


def threads_used(model: Slot, before: Mapping[str, int]) -> dict[str, Any]:
    """A model's thread choice for one generation: how it chooses, the count at the end, and (when it chooses by
    itself) how many decodes ran with each count during the generation."""
    info = model.threads_info()
    if "decodes" in info:
        info["decodes"] = {c: n - before.get(c, 0) for c, n in info["decodes"].items()}
    return info


__all__ = ["Plan", "generation_steps", "emit", "threads_used"]
