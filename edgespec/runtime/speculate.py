"""The speculation loop: purely token ids in, typed steps out. It imports no llama.cpp.

It does not know about text, chat templates or stop strings (the engine does); it knows a target language model
(the `LanguageModel` protocol, steps.py: backend.Model, or a fake in tests), a speculator (drafting/), the
sampling settings and the limits. Each cycle:

    d1..dk, q1..qk = speculator.propose(tokens, budget)   # k = 0: plain decoding
    p0..pk = target.decode([last, d1..dk])                # ONE batched decode, logits for those k+1 rows only
    n, t = accept(d, q, p)                                # exact rule (acceptance.py)
    target.truncate(len(tokens) + n)                      # rollback = truncate to the accepted length
    tokens += d1..dn, t
    speculator.observe(outcome)

Invariant between cycles: the target's cache holds every token but the last, which opens the next verify batch.
The prefill decodes the whole prompt and keeps the logits after its last token, so the first cycle decodes only its
drafts (plain decoding's first token costs no decode at all, as in llama.cpp's own tools).
Limits: a cycle never emits more tokens than max_tokens or the context allow (prompt + output <= n_ctx), so the
speculative and the plain path stop at the same length. A drafted id the target's vocabulary lacks (draft and
target vocabularies may differ by up to 128 ids) has p = 0: it is rejected with certainty, so it is never decoded;
the target's token at that position comes from the exact residual max(0, p - q).

Constraints (constrained.py): every row's logits are masked for that row's own prefix before `warp`, so the exact
rules hold on the masked distribution; a draft the constraint forbids is a certain rejection, the tokens it forces
open every cycle's draft (`forced_drafts`), and a constraint that dead-ends stops the generation with stop_reason
"constraint".

With SamplingParams.infill, every target row goes through the infill sampler with the target's vocabulary
(`target.infill_vocab()`, passed to `warp` on every path), so plain and speculative decoding share that p too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Generator, NamedTuple, Sequence

import numpy as np

from edgespec.config import SamplingParams
from edgespec.decoding.acceptance import Verdict, accept_coupled, accept_greedy, accept_sampled, expected_acceptance
from edgespec.decoding.constraint import TokenConstraint, apply_mask
from edgespec.decoding.sampling import NonFiniteLogitsError, PositionalUniforms, Probs, warp_probs
from edgespec.decoding.sampling import greedy as greedy_token
from edgespec.decoding.warp_spec import finite_argmax_rows
from edgespec.decoding.tree import TokenTree, accept_tree, accept_tree_coupled, accept_tree_greedy
from edgespec.drafting.base import Outcome, Proposal, Speculator
from edgespec.errors import ConfigError, ContextFullError, StopRequested, non_finite_logits
from edgespec.prompts.infill import InfillVocab
from edgespec.stats import GenerationStats

from .constrained import advance_all, after_forced, bind_constraint, chain_masks, follow, known_rows, tree_masks
from .steps import LanguageModel, Step, TokenLogprob, Verify, token_logprobs
from .tree_rows import TreeRows, chain_chances, prune


def verify(
    draft: Sequence[int],
    q: Sequence[np.ndarray | Probs | None],
    logits: np.ndarray,
    history: list[int],
    sampling: SamplingParams,
    rng: np.random.Generator | PositionalUniforms,
    stats: GenerationStats | None = None,
    masks: Sequence[np.ndarray | None] | None = None,
    sampled_chances: bool = False,
    infill_vocab: InfillVocab | None = None,
) -> Verdict:
    """Target rows -> verdict. Row i predicts the token after history + draft[:i]; the same `warp` (with the same
    penalty history) defines p as on the plain path. With a Generator the exact rule min(1, p/q) applies
    (accept_sampled); with PositionalUniforms (a seeded generation) common random numbers (accept_coupled).

    `logits` has len(draft) + 1 rows, or len(draft) rows when the last drafted id lies outside the target's
    vocabulary or the constraint (it was not decoded): that position is a certain rejection, answered from its
    residual. masks[i] (a constraint's allowed tokens for row i) is applied to row i before warping; infill_vocab is
    warp's (needed with sampling.infill).

    At temperature > 0 the verdict carries `chances` (the acceptance probability of each position the rule examined)
    where they are cheap or asked for: a deterministic draft's is p(d), one entry of a row verify computed anyway; a
    sampled draft's is sum min(p, q), a pass over the vocabulary per position (about a quarter of a `warp`), computed
    only with `sampled_chances` and never for a seeded verify (common random numbers accept a sampled draft with a
    different probability). Where any examined position lacks its chance, there are none.
    """
    k = len(draft)
    n_rows = logits.shape[0]
    if n_rows not in (k, k + 1):
        raise ValueError(f"need {k} or {k + 1} logits rows for {k} drafted tokens, got {n_rows}")
    uses_history = sampling.uses_history
    ctx = list(history) if uses_history else []  # the penalties' history grows with the drafts (a copy: O(context))
    if masks is not None:
        if len(masks) < n_rows:
            raise ValueError(f"need a mask per row: {len(masks)} masks for {n_rows} rows")
        logits = np.stack([apply_mask(logits[i], masks[i]) for i in range(n_rows)])
    if sampling.greedy:
        if not uses_history and masks is None and n_rows > 1:  # a verify without penalties: the rows in one pass
            argmax = finite_argmax_rows(logits)
        else:
            argmax = []
            for i in range(n_rows):
                argmax.append(greedy_token(logits[i], sampling, ctx))
                if i < k and uses_history:
                    ctx.append(draft[i])
        if n_rows == k:  # d_{k-1} is impossible for the target: its row is never reached as a bonus row
            argmax.append(argmax[-1])
        return accept_greedy(draft, argmax)
    p: list[Probs] = []
    for i in range(n_rows):
        p.append(warp_probs(logits[i], sampling, ctx, infill_vocab))
        if i < k and uses_history:
            ctx.append(draft[i])
    if n_rows == k:
        p.append(p[-1])
    if stats is not None and k:
        _expected_acceptance(draft, q, p[:n_rows], stats)
    if isinstance(rng, PositionalUniforms):  # seeded: common random numbers, output = plain output
        L = len(history)
        verdict = accept_coupled(draft, p, [rng.at(L + i) for i in range(k + 1)])
        sampled_chances = False
    else:
        verdict = accept_sampled(draft, q, p, rng)
    examined = min(verdict.n_accepted + 1, k)
    if not sampled_chances and any(q[i] is not None for i in range(examined)):
        return verdict
    return replace(verdict, chances=tuple(expected_acceptance(p[i], q[i], draft[i]) for i in range(examined)))


def _expected_acceptance(draft: Sequence[int], q: Sequence[Any], p: Sequence[Probs], stats: GenerationStats) -> None:
    """Expected accepted count on these drafts for the exact rule (Π min(1, p/q)) and for match verification
    (accept d_i iff an independent target sample equals it: Π p(d))."""
    chain_exact = chain_match = 1.0
    for i in range(min(len(draft), len(p))):
        d = draft[i]
        pd = p[i].prob(d)
        qi = q[i]
        qd = 1.0 if qi is None else (float(qi[d]) if d < len(qi) else 0.0)
        chain_exact *= min(1.0, pd / qd) if qd > 0 else 0.0
        chain_match *= pd
        stats.expected_exact_accepted += chain_exact
        stats.expected_match_accepted += chain_match


def _cut_impossible(proposal: Proposal, budget: int, n_vocab: int) -> tuple[list[int], list[np.ndarray | Probs | None], int]:
    """(draft, q, tokens to decode): the proposal capped at `budget`, and cut after its first id outside [0, n_vocab)
    (kept as a certain rejection but never decoded)."""
    draft = [int(t) for t in proposal.tokens[:budget]]
    q = list(proposal.q[: len(draft)])
    if len(q) != len(draft):
        raise ValueError(f"the {proposal.source} speculator gave {len(q)} q rows for {len(draft)} tokens")
    for i, d in enumerate(draft):
        if d < 0:
            raise ValueError(f"the {proposal.source} speculator drafted a negative token id {d}")
        if d >= n_vocab:
            return draft[: i + 1], q[: i + 1], i
    return draft, q, len(draft)


def speculate(target: LanguageModel, tokens: Sequence[int], sampling: SamplingParams, rng: Any, **kw: Any) -> Generator[Step, None, None]:
    """Generate up to `max_tokens` tokens after `tokens`, yielding one Step per cycle (speculate_steps, with every
    target decode run at once, here)."""
    steps = speculate_steps(target, tokens, sampling, rng, **kw)
    try:
        item = next(steps)
        while True:
            if isinstance(item, Verify):
                item = steps.send(item.run())
            else:
                yield item
                item = next(steps)
    except StopIteration:
        return
    finally:
        steps.close()


def speculate_steps(
    target: LanguageModel,
    tokens: Sequence[int],
    sampling: SamplingParams,
    rng: np.random.Generator | PositionalUniforms,
    *,
    max_tokens: int,
    speculator: Speculator | None = None,
    stats: GenerationStats | None = None,
    stop_at_eog: bool = True,
    should_stop: Callable[[], bool] | None = None,
    on_prefill: Callable[[int, int], None] | None = None,
    after_cycle: Callable[[], None] | None = None,
    clock: Callable[[], float] = time.perf_counter,
    constraint: TokenConstraint | None = None,
    forced_drafts: bool = True,
    logprobs: int | None = None,
) -> Generator[Step | Verify, np.ndarray, None]:
    """Generate up to `max_tokens` tokens after `tokens`, yielding one Step per cycle, and before it the cycle's
    target decode as a Verify, whose logits the caller sends back (the prefill and the draft's decodes run here).

    Stops at an end-of-generation token (included in the last step), at max_tokens, when the context is full, or
    when `should_stop()` turns true (checked before every cycle and between prefill chunks), or where the constraint
    dead-ends; stats.stop_reason says which ("eos", "length", "context", "cancelled", "constraint"). `constraint`
    must start at the beginning of the output (nothing advanced); `forced_drafts` drafts the tokens it forces
    (constrained.py). `logprobs` (None = off, else how many top alternatives): every Step carries TokenLogprobs.
    `on_prefill(done, total)` reports prefill progress;
    `after_cycle()` runs between cycles (a hook for tools; the engine measures nothing there). `clock()` gives
    the seconds the stats and the policies see (a replay passes a virtual clock). The caller may stop iterating at
    any time; the target's cache stays consistent. Each cycle runs _Loop's phases: propose, verify, accept, observe.
    """
    if not tokens:
        raise ConfigError("speculate needs at least one context token")
    if speculator is not None:
        bind_constraint(speculator, constraint)
    if max_tokens < 0:  # 0: the prompt is evaluated into the cache and nothing is generated
        raise ConfigError(f"max_tokens must be at least 0, got {max_tokens}")
    stats = stats if stats is not None else GenerationStats()
    loop = _Loop(target, sampling, rng, max_tokens, speculator, stats, constraint, forced_drafts, logprobs, stop_at_eog, should_stop, clock)
    loop.begin(tokens)
    try:
        if not loop.prefill(on_prefill):
            return
        while (reason := loop.stop_reason()) is None:
            cycle = yield from loop.cycle()
            if cycle is None:  # computing the forced tokens found the constraint's dead end
                reason = "constraint"
                break
            yield cycle.step()
            if cycle.end is not None:
                reason = cycle.end
                break
            if after_cycle is not None:
                after_cycle()
        stats.stop_reason = reason
    finally:
        stats.finish(clock() - loop.start)


@dataclass(eq=False)
class _Loop:
    """One generation's loop: its settings (speculate_steps' arguments) and its state between cycles. A cycle runs four
    phases, each a method filling in a _Cycle: propose (the tokens a constraint forces, then the speculator's drafts),
    verify (one target decode and the exact rule), accept (the verified tokens join the output) and observe (the
    speculator learns the outcome)."""

    target: LanguageModel
    sampling: SamplingParams
    rng: np.random.Generator | PositionalUniforms
    max_tokens: int
    speculator: Speculator | None
    stats: GenerationStats
    constraint: TokenConstraint | None
    forced_drafts: bool
    n_top: int | None  # speculate_steps' `logprobs`
    stop_at_eog: bool
    should_stop: Callable[[], bool] | None
    clock: Callable[[], float]
    vocab: InfillVocab | None = None  # for the infill sampler (SamplingParams.infill)
    ctx: list[int] = field(default_factory=list)  # the prompt, then every token generated
    start: float = 0.0
    pending: np.ndarray | None = None  # the prefill's logits after the last prompt token, until the first cycle
    n_gen: int = 0
    t_last: float | None = None  # when the last cycle was observed (its period runs from there: Outcome.t_cycle)

    def begin(self, tokens: Sequence[int]) -> None:
        """Check the prompt and start the clock."""
        # the infill sampler reads the target's vocabulary (greedy rows are one-hot: it changes nothing there)
        self.vocab = self.target.infill_vocab() if self.sampling.infill and not self.sampling.greedy else None
        self.ctx = [int(t) for t in tokens]
        if min(self.ctx) < 0 or max(self.ctx) >= self.target.n_vocab:
            raise ConfigError(f"token ids must be in [0, {self.target.n_vocab}) for this model")
        self.start = self.clock()
        self.stats.n_prompt = len(self.ctx)
        if len(self.ctx) > self.target.n_ctx:
            raise ContextFullError(f"the prompt has {len(self.ctx)} tokens but the context holds {self.target.n_ctx}")

    def prefill(self, on_prefill: Callable[[int, int], None] | None) -> bool:
        """Decode the whole prompt, keeping the logits after its last token (the first cycle starts from them); False
        when should_stop() stopped it."""
        target, stats = self.target, self.stats
        before = target.n_decoded
        try:
            self.pending = target.sync(self.ctx, rows=(-1,), should_stop=self.should_stop, progress=on_prefill)
        except StopRequested:
            stats.stop_reason = "cancelled"
            return False
        finally:
            stats.n_prefill = target.n_decoded - before
            stats.n_cached = len(self.ctx) - stats.n_prefill
            stats.timings.prefill = self.clock() - self.start
        return True

    def room(self) -> int:
        """The most tokens the next cycle may emit (max_tokens and the context both hold them)."""
        return min(self.max_tokens - self.n_gen, self.target.n_ctx - len(self.ctx))

    def stop_reason(self) -> str | None:
        """Why the generation ends before another cycle ("length", "context", "cancelled", "constraint"), or None."""
        if self.n_gen >= self.max_tokens:
            return "length"
        if self.room() <= 0:
            return "context"
        if self.should_stop is not None and self.should_stop():
            return "cancelled"
        if self.constraint is not None and self.constraint.error:
            return "constraint"
        return None

    def cycle(self) -> Generator[Verify, np.ndarray, _Cycle | None]:
        """One cycle, phase by phase (its target decode is yielded); None where proposing found the constraint's dead
        end."""
        c = _Cycle(self.clock(), self.room() - 1)
        if not self.propose(c):
            return None
        yield from self.verify(c)
        self.accept(c)
        self.observe(c)
        return c

    def propose(self, c: _Cycle) -> bool:
        """Propose: the tokens the constraint forces, then the speculator's drafts after them (the matcher follows the
        forced tokens while it drafts: a draft model masks its q). False where computing the forced tokens found the
        constraint's dead end."""
        constraint, budget = self.constraint, c.budget
        forced = constraint.forced()[:budget] if constraint is not None and self.forced_drafts and budget > 0 else []
        if constraint is not None and constraint.error:
            return False
        proposal = Proposal()
        if self.speculator is not None and budget - len(forced) > 0:
            n_in = advance_all(constraint, forced) if constraint is not None else 0
            forced = forced[:n_in]
            try:
                proposal = self.speculator.propose(self.ctx + forced, budget - len(forced), self.rng)
            finally:
                if constraint is not None:
                    constraint.rollback(n_in)
        c.forced, c.n_own = forced, len(proposal)
        c.proposal = after_forced(forced, proposal) if forced else proposal
        c.t1 = self.clock()
        return True

    def verify(self, c: _Cycle) -> Generator[Verify, np.ndarray, None]:
        """Verify: one target decode of the proposal (a chain or a tree) and the exact rule; the target's cache keeps
        what was accepted. The target's rows are checked as they are sampled (the backend skips its own pass:
        check_logits)."""
        tree, want_rows = c.proposal.tree, self.n_top is not None
        try:
            if tree is not None and len(tree):
                if self.pending is not None:  # the tree's verify batch opens with the last token: decode it again there
                    self.target.truncate(len(self.ctx) - 1)
                    self.pending = None
                c.verified = yield from _tree_cycle(
                    self.target, tree, c.budget, self.ctx, self.sampling, self.rng, self.constraint, want_rows,
                    c.proposal.sampled_chances, self.vocab,
                )
            else:
                c.verified = yield from _chain_cycle(
                    self.target, c.proposal, c.budget, self.ctx, self.sampling, self.rng, self.stats, self.pending,
                    self.constraint, want_rows, self.vocab,
                )
                self.pending = None
        except NonFiniteLogitsError as e:
            raise non_finite_logits(getattr(self.target, "name", None) or "the target model") from e
        c.t2 = self.clock()
        # the first cycle's decode is not a verify of n_drafted + 1 tokens, nor is one that skipped rows (known rows)
        # or ran with other generations' rows: their time must not teach the costs
        v = c.verified
        c.t_verify = c.t2 - c.t1 if self.stats.n_cycles and not v.skipped and not v.shared else 0.0

    def accept(self, c: _Cycle) -> None:
        """Accept: the verified tokens join the output, cut after an end-of-generation token (stop_at_eog) and before a
        token the constraint refuses (a dead end: a limit of its matcher), with their TokenLogprobs when asked for;
        the cycle goes into the stats."""
        v, stats = c.verified, self.stats
        new = v.tokens
        eog_at = next((i for i, t in enumerate(new) if self.target.is_eog(t)), None) if self.stop_at_eog else None
        if eog_at is not None:
            new = new[: eog_at + 1]
        lps = token_logprobs(v.rows, new, self.ctx, self.sampling, self.n_top, self.vocab) if self.n_top is not None and v.rows is not None else None
        n_in = follow(self.constraint, new) if self.constraint is not None else len(new)
        c.dead_end = n_in < len(new)
        if c.dead_end:  # the grammar gave up there: stop before that token
            new, lps = new[:n_in], (lps[:n_in] if lps is not None else None)
        self.ctx.extend(new)
        self.n_gen += len(new)
        c.new, c.lps, c.eog = new, lps, eog_at is not None
        c.source = c.proposal.source if v.n_drafted else "plain"
        c.n_kept = min(v.n_kept, len(new))
        if stats.n_cycles == 0:
            stats.ttft = self.clock() - self.start
        stats.record_cycle(v.n_drafted, c.n_kept, len(new), c.source, c.t1 - c.t0, c.t2 - c.t1)

    def observe(self, c: _Cycle) -> None:
        """Observe: the speculator learns the cycle's outcome. t_cycle is the whole period since the last cycle was
        observed (the caller's work on its tokens included; 0 for the first cycle, whose decode is the prefill's
        tail). t_draft includes the drafter catching up on tokens it has not seen (after plain cycles): resuming
        drafting really costs that, and the policy must see it or it resumes too eagerly (the model speculator tells
        its controller how many tokens a draft caught up on, so that a batched catch-up counts against the run it
        starts without inflating the per-token draft cost). After forced tokens the speculator sees its own drafts
        only (its proposal starts after them) and no verify time: the batch size was not its choice."""
        if self.speculator is None:
            return
        t_obs = self.clock()
        t_cycle, self.t_last = (t_obs - self.t_last if self.t_last is not None else 0.0), t_obs
        v, new = c.verified, c.new
        t_draft = c.t1 - c.t0  # with the drafter's catch-up on tokens it has not seen
        if c.forced:
            nf = len(c.forced)
            n_drafted, n_kept = min(c.n_own, max(0, v.n_drafted - nf)), min(max(0, c.n_kept - nf), c.n_own)
            outcome = Outcome(n_drafted, n_kept, len(new), t_draft, 0.0, tuple(new[nf:]), v.chances[nf:], t_cycle)
        else:
            outcome = Outcome(v.n_drafted, c.n_kept, len(new), t_draft, c.t_verify, tuple(new), v.chances, t_cycle)
        self.speculator.observe(outcome)


@dataclass(eq=False)
class _Cycle:
    """One cycle as _Loop's phases fill it in."""

    t0: float  # when it began
    budget: int  # the most tokens it may draft: each accepted one plus the target's own must fit
    forced: list[int] = field(default_factory=list)  # the tokens the constraint forces, leading the proposal
    n_own: int = 0  # the tokens the speculator proposed after them
    proposal: Proposal = field(default_factory=Proposal)
    t1: float = 0.0  # when propose ended
    verified: _Verified = field(init=False)
    t2: float = 0.0  # when verify ended
    t_verify: float = 0.0  # the verify seconds the costs may learn from (0: none)
    new: list[int] = field(default_factory=list)  # the tokens it adds
    lps: list[TokenLogprob] | None = None
    eog: bool = False  # they end with an end-of-generation token
    dead_end: bool = False  # the constraint dead-ended: they stop before the token it refused
    n_kept: int = 0  # the drafts kept among them
    source: str = "plain"

    def step(self) -> Step:
        return Step(self.new, self.verified.n_drafted, self.n_kept, self.source, self.t1 - self.t0, self.t2 - self.t1,
                    self.eog and not self.dead_end, self.lps)

    @property
    def end(self) -> str | None:
        """The stop reason this cycle's step ends the generation with, if any."""
        return "constraint" if self.dead_end else "eos" if self.eog else None


# Rows of a chain verify whose mask allows one token are not computed (see constrained.known_rows); False computes
# every row (tests compare the two).
SKIP_KNOWN_ROWS = True


def _decode_rows(
    target: LanguageModel, tokens: Sequence[int], start_pos: int, known: dict[int, int], shared: list[bool]
) -> Generator[Verify, np.ndarray, np.ndarray]:
    """The target's decode of `tokens` at start_pos (yielded as a Verify) with every row, except that a row in `known`
    ({row: token}) is not computed and stands as a one-hot logits row (0 at its token, -inf elsewhere): after its
    mask, the same distribution. shared: [True] once the decode was run together with other rows (Verify.shared)."""
    n = len(tokens)
    need = [i for i in range(n) if i not in known]
    v = Verify(target, list(tokens), need, start_pos)
    got = yield v
    shared[0] = shared[0] or v.shared
    if not known:
        return got
    out = np.full((n, target.n_vocab), -np.inf, dtype=np.float32)
    for j, i in enumerate(need):
        out[i] = got[j]
    for i, t in known.items():
        out[i, t] = 0.0
    return out


class _Verified(NamedTuple):
    """A verified cycle: the tokens it adds, the drafts (or tree nodes) verified, the drafts kept, with want_rows the
    masked logits row of each added token, how many rows the target did not compute (see known_rows), and the
    acceptance chances of the chain positions the rule examined (Verdict.chances; a tree's first-child chain)."""

    tokens: list[int]
    n_drafted: int
    n_kept: int
    rows: list[np.ndarray] | None
    skipped: int
    chances: tuple[float, ...]
    shared: bool = False  # its decode ran together with other generations' rows (Verify.shared)


def _chain_cycle(
    target: LanguageModel,
    proposal: Proposal,
    budget: int,
    ctx: list[int],
    sampling: SamplingParams,
    rng: np.random.Generator | PositionalUniforms,
    stats: GenerationStats | None,
    pending: np.ndarray | None,
    constraint: TokenConstraint | None = None,
    want_rows: bool = False,
    infill_vocab: InfillVocab | None = None,
) -> Generator[Verify, np.ndarray, _Verified]:
    """Verify a chain of drafts in one decode."""
    L = len(ctx)
    draft, q, n_decode = _cut_impossible(proposal, budget, target.n_vocab)
    masks: list[np.ndarray] | None = None
    if constraint is not None:
        masks, n_ok = chain_masks(constraint, draft[:n_decode])
        if n_ok < n_decode:
            d, m = draft[n_ok], masks[n_ok]
            if d < m.size and m[d]:  # allowed, but the matcher hit a limit taking it (a dead end): not drafted
                draft, q, n_decode = draft[:n_ok], q[:n_ok], n_ok
            else:  # forbidden: a certain rejection, never decoded, and nothing after it
                draft, q, n_decode = draft[: n_ok + 1], q[: n_ok + 1], n_ok
    known = known_rows(masks, n_decode, target.n_vocab) if masks is not None and SKIP_KNOWN_ROWS else {}
    shared = [False]
    if pending is None:  # the cache holds all but the last token, which opens the verify batch
        logits = yield from _decode_rows(target, [ctx[-1]] + draft[:n_decode], L - 1, known, shared)
    else:  # first cycle: the prefill decoded the last prompt token already; only drafts are decoded
        known.pop(0, None)  # row 0 is the prefill's, computed already
        rows = (yield from _decode_rows(target, draft[:n_decode], L, {i - 1: t for i, t in known.items()}, shared)) if n_decode else pending[:0]
        logits = np.concatenate([pending, rows])
    verdict = verify(draft, q, logits, ctx, sampling, rng, stats, masks, proposal.sampled_chances, infill_vocab)
    n = verdict.n_accepted
    target.truncate(L + n)
    own_rows = [apply_mask(logits[i], masks[i] if masks is not None else None) for i in range(n + 1)] if want_rows else None
    return _Verified(draft[:n] + [verdict.token], len(draft), n, own_rows, len(known), verdict.chances, shared[0])


def _tree_cycle(
    target: Any,
    tree: TokenTree,
    budget: int,
    ctx: list[int],
    sampling: SamplingParams,
    rng: np.random.Generator | PositionalUniforms,
    constraint: TokenConstraint | None = None,
    want_rows: bool = False,
    sampled_chances: bool = False,
    infill_vocab: InfillVocab | None = None,
) -> Generator[Verify, np.ndarray, _Verified]:
    """Verify a token tree in one decode and keep the accepted path (n_drafted: the nodes decoded; skipped: 0, except in
    the plain step of a tree that does not fit, see _chain_cycle).
    Nodes deeper than `budget` are dropped first, then the last nodes (insertion order: a node's children keep a prefix
    of their ranks, which keeps the rule exact) past what the target's context and batch hold; ids the target lacks,
    or the constraint forbids, are certain rejections, never decoded."""
    L = len(ctx)
    room = target.n_ctx - L  # cells for the tree's nodes after the context and the root
    n_batch = getattr(target, "n_batch", None)
    if n_batch is not None:  # one decode: the root and the nodes must fit a batch (a draft's chain and siblings may not)
        room = min(room, int(n_batch) - 1)
    if tree.max_depth > budget or len(tree) > room:
        tree = prune(tree, budget, room)
    if not len(tree):  # nothing fits: a plain step
        return (yield from _chain_cycle(target, Proposal(), 0, ctx, sampling, rng, None, None, constraint, want_rows, infill_vocab))
    masks, skip = tree_masks(constraint, tree) if constraint is not None else (None, set())
    tb = tree.batch(ctx[-1], L - 1, target.n_vocab, skip)
    v = Verify(target, list(tb.tokens), depths=[p - (L - 1) for p in tb.positions], seq_ids=tb.seq_ids)
    logits = yield v
    rows = TreeRows(tree, logits, tb.node_row, ctx, sampling, masks, infill_vocab)
    if sampling.greedy:
        verdict = accept_tree_greedy(tree, rows)
    elif isinstance(rng, PositionalUniforms):
        verdict = accept_tree_coupled(tree, rows, [rng.at(L + d) for d in range(tree.max_depth + 1)])
    else:
        verdict = accept_tree(tree, rows, rng)
    path = tb.seq_ids[tb.node_row[verdict.path[-1]]][0] if verdict.path else 0
    target.keep_tree_path(path, verdict.tokens)
    own_rows: list[np.ndarray] | None = None
    if want_rows:
        keys = [0] + [node + 1 for node in verdict.path]
        own_rows = [
            apply_mask(logits[0 if k == 0 else tb.node_row[k - 1]], masks[k] if masks is not None else None) for k in keys
        ]
    chances = chain_chances(tree, rows, verdict.path, sampled_chances and not isinstance(rng, PositionalUniforms)) if not sampling.greedy else ()
    return _Verified(verdict.emitted, len(tb.tokens) - 1, verdict.n_accepted, own_rows, 0, chances, v.shared)


__all__ = ["LanguageModel", "Step", "TokenLogprob", "speculate", "token_logprobs", "verify"]
