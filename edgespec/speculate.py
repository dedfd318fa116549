"""The speculation loop: purely token ids in, typed steps out.

It does not know about text, chat templates or stop strings (the API layer does); it knows the target model, a
drafter, the sampling settings and a controller that picks the draft length. Each cycle:

    k = controller.next_k()                       # 0 = plain decoding this cycle
    d1..dk, q1..qk = drafter.propose(tokens, k)   # may stop early (EOS, low confidence)
    p0..pk = target.decode([last, d1..dk])        # ONE batched decode, logits for those k+1 rows only
    n, t = accept(d, q, p)                        # exact rule (acceptance.py)
    target.truncate(len(tokens) + n)              # rollback = truncate to the accepted length
    tokens += d1..dn, t

Invariant between cycles: the target's cache holds every token but the last, which opens the next verify batch.
The draft model's cache is re-synchronised by common prefix inside `propose`, so it needs no separate rollback.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Iterator, Protocol, Sequence

import numpy as np

from .acceptance import Verdict, accept_greedy, accept_sampled
from .backend import Model
from .config import DraftRatios, SamplingParams, Timings
from .drafters import Drafter, Proposal
from .sampling import greedy as greedy_token
from .sampling import warp


class DraftPolicy(Protocol):
    def next_k(self) -> int: ...

    def keep_drafting(self, position: int, confidence: float) -> bool: ...

    def observe(self, n_drafted: int, n_accepted: int, t_draft: float, t_verify: float) -> None: ...


@dataclass
class Step:
    """One cycle's outcome: the tokens it adds (accepted drafts, then the target's own token)."""

    tokens: list[int]
    n_drafted: int
    n_accepted: int
    source: str  # "plain", "model", "ngram"
    draft_seconds: float
    target_seconds: float
    eog: bool = False

    @property
    def from_draft(self) -> list[bool]:
        return [True] * self.n_accepted + [False] * (len(self.tokens) - self.n_accepted)


@dataclass
class GenerationStats(DraftRatios):
    n_prompt: int = 0
    n_prefill: int = 0  # prompt tokens actually decoded (the rest came from the KV cache)
    n_generated: int = 0
    n_cycles: int = 0
    n_spec_cycles: int = 0
    n_drafted: int = 0
    n_accepted: int = 0
    drafted_by_pos: list[int] = field(default_factory=list)
    accepted_by_pos: list[int] = field(default_factory=list)
    expected_match_accepted: float = 0.0  # what "match" verification would have accepted on the same drafts
    expected_exact_accepted: float = 0.0  # what this rule accepts in expectation on the same drafts
    timings: Timings = field(default_factory=Timings)
    wall: float = 0.0
    stop_reason: str = ""
    source_counts: dict[str, int] = field(default_factory=dict)

    @property
    def tokens_per_cycle(self) -> float:
        return self.n_generated / self.n_cycles if self.n_cycles else 0.0

    @property
    def decode_seconds(self) -> float:
        """Generation time after prefill."""
        return max(self.wall - self.timings.prefill, 1e-9)

    @property
    def tokens_per_second(self) -> float:
        return self.n_generated / self.decode_seconds if self.n_generated else 0.0

    def record(self, step: Step) -> None:
        self.n_cycles += 1
        self.n_generated += len(step.tokens)
        self.source_counts[step.source] = self.source_counts.get(step.source, 0) + 1
        if step.n_drafted:
            self.n_spec_cycles += 1
            self.n_drafted += step.n_drafted
            self.n_accepted += step.n_accepted
            while len(self.drafted_by_pos) < step.n_drafted:
                self.drafted_by_pos.append(0)
                self.accepted_by_pos.append(0)
            for i in range(step.n_drafted):
                self.drafted_by_pos[i] += 1
                if i < step.n_accepted:
                    self.accepted_by_pos[i] += 1
        self.timings.draft += step.draft_seconds
        self.timings.target += step.target_seconds

    def finish(self, wall: float) -> None:
        self.wall = wall
        self.timings.overhead = max(0.0, wall - self.timings.prefill - self.timings.draft - self.timings.target)

    def as_dict(self) -> dict[str, object]:
        return {
            "n_prompt": self.n_prompt,
            "n_prefill": self.n_prefill,
            "n_generated": self.n_generated,
            "n_cycles": self.n_cycles,
            "n_spec_cycles": self.n_spec_cycles,
            "n_drafted": self.n_drafted,
            "n_accepted": self.n_accepted,
            "mu": round(self.mu, 4),
            "acceptance": round(self.acceptance, 4),
            "acceptance_by_pos": [round(a / d, 4) if d else None for a, d in zip(self.accepted_by_pos, self.drafted_by_pos)],
            "drafted_by_pos": self.drafted_by_pos,
            "expected_match_accepted": round(self.expected_match_accepted, 3),
            "expected_exact_accepted": round(self.expected_exact_accepted, 3),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "seconds": {
                "prefill": round(self.timings.prefill, 4),
                "draft": round(self.timings.draft, 4),
                "target": round(self.timings.target, 4),
                "overhead": round(self.timings.overhead, 4),
                "wall": round(self.wall, 4),
            },
            "stop_reason": self.stop_reason,
            "sources": self.source_counts,
        }


class _PlainPolicy:
    def next_k(self) -> int:
        return 0

    def keep_drafting(self, position: int, confidence: float) -> bool:
        return False

    def observe(self, n_drafted: int, n_accepted: int, t_draft: float, t_verify: float) -> None:
        pass


def verify(
    draft: Sequence[int],
    q: Sequence[np.ndarray | None],
    logits: np.ndarray,
    history: list[int],
    sampling: SamplingParams,
    rng: np.random.Generator,
    stats: GenerationStats | None = None,
) -> Verdict:
    """Target rows -> verdict. Row i predicts the token after history + draft[:i]; the same `warp` (with the same
    penalty history) defines p as on the plain path."""
    k = len(draft)
    if sampling.greedy:
        ctx = list(history)
        target_tokens = []
        for i in range(k + 1):
            target_tokens.append(greedy_token(logits[i], sampling, ctx))
            if i < k:
                ctx.append(draft[i])
        return accept_greedy(draft, target_tokens)
    ctx = list(history)
    p = []
    for i in range(k + 1):
        p.append(warp(logits[i], sampling, ctx))
        if i < k:
            ctx.append(draft[i])
    p_arr = np.stack(p)
    if stats is not None and k:
        _expected_acceptance(draft, q, p_arr, stats)
    return accept_sampled(draft, q, p_arr, rng)


def _expected_acceptance(draft: Sequence[int], q: Sequence[np.ndarray | None], p: np.ndarray, stats: GenerationStats) -> None:
    """Expected accepted count on these drafts for the exact rule (Π min(1, p/q)) and for match verification
    (accept d_i iff an independent target sample equals it: Π p(d))."""
    chain_exact = chain_match = 1.0
    for i, d in enumerate(draft):
        pd = float(p[i][d]) if d < p.shape[1] else 0.0
        qi = q[i]
        qd = 1.0 if qi is None else (float(qi[d]) if d < len(qi) else 0.0)
        chain_exact *= min(1.0, pd / qd) if qd > 0 else 0.0
        chain_match *= pd
        stats.expected_exact_accepted += chain_exact
        stats.expected_match_accepted += chain_match


def speculate(
    target: Model,
    tokens: Sequence[int],
    sampling: SamplingParams,
    rng: np.random.Generator,
    *,
    max_tokens: int,
    drafter: Drafter | None = None,
    policy: DraftPolicy | None = None,
    stats: GenerationStats | None = None,
    stop_at_eog: bool = True,
) -> Iterator[Step]:
    """Generate up to `max_tokens` tokens after `tokens`, yielding one Step per cycle.

    Stops at an end-of-generation token (included in the last step), at max_tokens, or when the context is full
    (stats.stop_reason says which). The caller may stop iterating at any time; the caches stay consistent (the
    next call re-synchronises by common prefix).
    """
    if not tokens:
        raise ValueError("speculate needs at least one context token")
    if policy is None or drafter is None:
        policy = _PlainPolicy()
    stats = stats if stats is not None else GenerationStats()
    ctx = [int(t) for t in tokens]
    start = time.perf_counter()
    stats.n_prompt = len(ctx)
    if len(ctx) > target.n_ctx:
        stats.stop_reason = "context"
        from .backend import ContextFullError

        raise ContextFullError(f"the prompt has {len(ctx)} tokens but the context holds {target.n_ctx}")
    before = target.n_decoded
    target.sync(ctx[:-1], rows=())
    stats.n_prefill = target.n_decoded - before + 1  # +1: the last prompt token opens the first verify batch
    stats.timings.prefill = time.perf_counter() - start
    n_gen = 0
    try:
        while True:
            if n_gen >= max_tokens:
                stats.stop_reason = "length"
                return
            L = len(ctx)
            if L >= target.n_ctx:
                stats.stop_reason = "context"
                return
            k = min(policy.next_k(), max_tokens - n_gen - 1, target.n_ctx - L)
            t0 = time.perf_counter()
            if k > 0 and drafter is not None:
                proposal = drafter.propose(ctx, k, rng, policy.keep_drafting)
            else:
                proposal = Proposal(source="plain")
            t1 = time.perf_counter()
            draft = proposal.tokens
            logits = target.decode([ctx[-1]] + draft, L - 1, range(len(draft) + 1))
            t2 = time.perf_counter()
            verdict = verify(draft, proposal.q, logits, ctx, sampling, rng, stats)
            n = verdict.n_accepted
            target.truncate(L + n)
            new = draft[:n] + [verdict.token]
            eog_at = next((i for i, t in enumerate(new) if target.is_eog(t)), None) if stop_at_eog else None
            if eog_at is not None:
                new = new[: eog_at + 1]
            ctx.extend(new)
            n_gen += len(new)
            # t_draft includes the drafter catching up on tokens it has not seen (after plain cycles): resuming
            # drafting really costs that, and the controller must see it or it resumes too eagerly.
            policy.observe(len(draft), n, t1 - t0, t2 - t1)
            step = Step(
                tokens=new,
                n_drafted=len(draft),
                n_accepted=min(n, len(new)),
                source=proposal.source if draft else "plain",
                draft_seconds=t1 - t0,
                target_seconds=t2 - t1,
                eog=eog_at is not None,
            )
            stats.record(step)
            yield step
            if eog_at is not None:
                stats.stop_reason = "eos"
                return
    finally:
        stats.finish(time.perf_counter() - start)
