"""The speculation loop: purely token ids in, typed steps out. It imports no llama.cpp.

It does not know about text, chat templates or stop strings (the engine does); it knows a target language model
(the `LanguageModel` protocol below: backend.Model, or a fake in tests), a speculator (drafting/), the
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

Constraints (constraint.py): with a `TokenConstraint`, every row's logits are masked for that row's own prefix before
`warp` (row i of a chain: history + drafts[:i]; a tree node's row: history + its path), on the plain path and in
verification alike, so the exact rules hold on the masked distribution. A draft the constraint forbids is a certain
rejection and is never decoded (like an id past the vocabulary). The matcher is rolled back to the cycle's start
after the masks are computed and then advanced along the tokens the cycle adds. With `forced_drafts`, the tokens the
grammar forces next open every cycle's draft as deterministic drafts (q = None); where the mask allows that token
alone its p is 1 and it is accepted without fail, so forced scaffolding (braces, keys, quotes) costs one batched
decode instead of one decode per token. The speculator drafts after them (it is asked for the context + forced
tokens). On every path a row whose mask allows one token is not computed at all (_known_rows): its distribution is
fixed, and llama.cpp skips the output projection for it. A constraint that dead-ends stops the generation with
stop_reason "constraint".

With SamplingParams.infill, every target row goes through the infill sampler with the target's vocabulary
(`target.infill_vocab()`, passed to `warp` on every path), so plain and speculative decoding share that p too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Generator, NamedTuple, Protocol, Sequence

import numpy as np

from edgespec.decoding.acceptance import Verdict, accept_coupled, accept_greedy, accept_sampled, expected_acceptance
from edgespec.decoding.tree import ROOT, TokenTree, accept_tree, accept_tree_coupled, accept_tree_greedy
from edgespec.config import SamplingParams
from edgespec.decoding.constraint import TokenConstraint, apply_mask
from edgespec.prompts.infill import InfillVocab
from edgespec.drafting.guard import unguarded
from edgespec.errors import ConfigError, ContextFullError, StopRequested, non_finite_logits
from edgespec.decoding.sampling import greedy as greedy_token
from edgespec.decoding.sampling import NonFiniteLogitsError, PositionalUniforms, Probs, warp, warp_probs
from edgespec.drafting.base import Outcome, Proposal, Speculator
from edgespec.stats import GenerationStats


class LanguageModel(Protocol):
    """What the loop needs from a model's context (backend.Model implements it)."""

    n_ctx: int
    n_vocab: int

    @property
    def n_decoded(self) -> int: ...

    @property
    def n_past(self) -> int: ...

    def sync(
        self,
        tokens: Sequence[int],
        rows: Sequence[int] = (-1,),
        *,
        should_stop: Callable[[], bool] | None = None,
        progress: Callable[[int, int], None] | None = None,
    ) -> np.ndarray: ...

    def decode(self, tokens: Sequence[int], start_pos: int, rows: Sequence[int] = (-1,)) -> np.ndarray: ...

    def truncate(self, n_past: int) -> None: ...

    def is_eog(self, token: int) -> bool: ...

    def infill_vocab(self) -> InfillVocab:
        """The vocabulary for SamplingParams.infill (asked only when that is on)."""
        ...


@dataclass(frozen=True)
class TokenLogprob:
    """The target's log-probability of one generated token, and its `top` most likely tokens at that position
    (id, log-probability), most likely first. The distribution is the one the token was sampled from: the
    (constraint-masked) logits through `warp` with the generation's settings; at temperature 0, where that
    distribution is one-hot, the penalised and masked logits at temperature 1 instead (the model's own view). A token
    from an accepted draft gets exactly what the target's own sample there would have got."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def token_logprobs(
    rows: Sequence[np.ndarray],
    tokens: Sequence[int],
    history: Sequence[int],
    sampling: SamplingParams,
    n_top: int,
    infill_vocab: InfillVocab | None = None,
) -> list[TokenLogprob]:
    """TokenLogprob for tokens[j] from its (already masked) logits row rows[j]; the penalty history of row j is
    history + tokens[:j] (infill_vocab: as for warp)."""
    from edgespec.decoding.sampling import apply_penalties

    out = []
    ctx = list(history)
    for row, tok in zip(rows, tokens):
        if sampling.greedy:
            x = np.asarray(apply_penalties(row, sampling, ctx), dtype=np.float64)
            m = float(np.max(x))
            lp = x - (m + float(np.log(np.exp(x - m).sum())))
        else:
            with np.errstate(divide="ignore"):
                lp = np.log(warp(row, sampling, ctx, infill_vocab))
        top: tuple[tuple[int, float], ...] = ()
        if n_top > 0:
            n = min(n_top, lp.size)
            idx = np.argpartition(-lp, n - 1)[:n]
            idx = idx[np.lexsort((idx, -lp[idx]))]
            top = tuple((int(i), float(lp[i])) for i in idx if np.isfinite(lp[i]))
        out.append(TokenLogprob(int(tok), float(lp[tok]) if tok < lp.size else float("-inf"), top))
        ctx.append(int(tok))
    return out


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
    logprobs: list[TokenLogprob] | None = None  # one per token, when asked for (speculate's `logprobs`)

    @property
    def from_draft(self) -> list[bool]:
        return [True] * self.n_accepted + [False] * (len(self.tokens) - self.n_accepted)


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
    ctx = list(history)
    if masks is not None:
        if len(masks) < n_rows:
            raise ValueError(f"need a mask per row: {len(masks)} masks for {n_rows} rows")
        logits = np.stack([apply_mask(logits[i], masks[i]) for i in range(n_rows)])
    if sampling.greedy:
        argmax = []
        for i in range(n_rows):
            argmax.append(greedy_token(logits[i], sampling, ctx))
            if i < k:
                ctx.append(draft[i])
        if n_rows == k:  # d_{k-1} is impossible for the target: its row is never reached as a bonus row
            argmax.append(argmax[-1])
        return accept_greedy(draft, argmax)
    p: list[Probs] = []
    for i in range(n_rows):
        p.append(warp_probs(logits[i], sampling, ctx if sampling.uses_history else (), infill_vocab))
        if i < k and sampling.uses_history:
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


@dataclass(eq=False)
class Verify:
    """A target decode a cycle waits for: speculate_steps yields it, and the caller sends back its logits (run() does
    it alone; a scheduler may run several generations' Verify in one llama_decode, backend.Model.decode_parts). A chain
    of `tokens` appended at the model's n_past with logits for `rows`, or a token tree (depths, seq_ids: as for
    decode_tree; start_pos, which must be the model's n_past, is checked there). `shared`: the caller ran it together
    with other rows, so its time is not this cycle's to learn from."""

    model: Any
    tokens: list[int]
    rows: Sequence[int] = ()
    start_pos: int | None = None
    depths: Sequence[int] | None = None
    seq_ids: Sequence[Sequence[int]] | None = None
    shared: bool = False

    @property
    def n_rows(self) -> int:
        return len(self.tokens)

    def run(self, view: bool = False) -> np.ndarray:
        """The decode, alone. view=True (a caller whose generation reads the rows before the model's next decode): a
        chain's rows may be a view of llama.cpp's buffer (backend.Model.decode) rather than a copy."""
        if self.depths is None:
            pos = self.start_pos if self.start_pos is not None else self.model.n_past
            if view:
                return self.model.decode(self.tokens, pos, self.rows, view=True)
            return self.model.decode(self.tokens, pos, self.rows)
        return self.model.decode_tree(self.tokens, self.depths, self.seq_ids)


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
    (module docstring). `logprobs` (None = off, else how many top alternatives): every Step carries TokenLogprobs.
    `on_prefill(done, total)` reports prefill progress;
    `after_cycle()` runs between cycles (a hook for tools; the engine measures nothing there). `clock()` gives
    the seconds the stats and the policies see (a replay passes a virtual clock). The caller may stop iterating at
    any time; the target's cache stays consistent.
    """
    if not tokens:
        raise ConfigError("speculate needs at least one context token")
    if speculator is not None:
        bind_constraint(speculator, constraint)
    if max_tokens < 0:  # 0: the prompt is evaluated into the cache and nothing is generated
        raise ConfigError(f"max_tokens must be at least 0, got {max_tokens}")
    stats = stats if stats is not None else GenerationStats()
    # the infill sampler reads the target's vocabulary (greedy rows are one-hot: it changes nothing there)
    vocab = target.infill_vocab() if sampling.infill and not sampling.greedy else None
    ctx = [int(t) for t in tokens]
    if min(ctx) < 0 or max(ctx) >= target.n_vocab:
        raise ConfigError(f"token ids must be in [0, {target.n_vocab}) for this model")
    start = clock()
    stats.n_prompt = len(ctx)
    if len(ctx) > target.n_ctx:
        raise ContextFullError(f"the prompt has {len(ctx)} tokens but the context holds {target.n_ctx}")
    try:
        before = target.n_decoded
        try:
            # the whole prompt, with the logits after its last token: the first cycle starts from them
            pending: np.ndarray | None = target.sync(ctx, rows=(-1,), should_stop=should_stop, progress=on_prefill)
        except StopRequested:
            stats.stop_reason = "cancelled"
            return
        finally:
            stats.n_prefill = target.n_decoded - before
            stats.n_cached = len(ctx) - stats.n_prefill
            stats.timings.prefill = clock() - start
        n_gen = 0
        t_last: float | None = None  # when the last cycle was observed (its period runs from there: Outcome.t_cycle)
        while True:
            if n_gen >= max_tokens:
                stats.stop_reason = "length"
                return
            L = len(ctx)
            room = min(max_tokens - n_gen, target.n_ctx - L)  # tokens this cycle may still emit
            if room <= 0:
                stats.stop_reason = "context"
                return
            if should_stop is not None and should_stop():
                stats.stop_reason = "cancelled"
                return
            if constraint is not None and constraint.error:
                stats.stop_reason = "constraint"
                return
            t0 = clock()
            budget = room - 1  # drafted tokens: each accepted one plus the target's own must fit
            forced = constraint.forced()[:budget] if constraint is not None and forced_drafts and budget > 0 else []
            if constraint is not None and constraint.error:  # computing the forced tokens can find the dead end
                stats.stop_reason = "constraint"
                return
            proposal = Proposal()
            if speculator is not None and budget - len(forced) > 0:
                # the matcher follows the forced tokens while the speculator drafts after them (a draft model masks its q)
                n_in = _advance_all(constraint, forced) if constraint is not None else 0
                forced = forced[:n_in]
                try:
                    proposal = speculator.propose(ctx + forced, budget - len(forced), rng)
                finally:
                    if constraint is not None:
                        constraint.rollback(n_in)
            n_own = len(proposal)
            if forced:
                proposal = _after_forced(forced, proposal)
            t1 = clock()
            try:  # the target's rows are checked as they are sampled (the backend skips its own pass: check_logits)
                if proposal.tree is not None and len(proposal.tree):
                    if pending is not None:  # the tree's verify batch opens with the last token: decode it again there
                        target.truncate(L - 1)
                        pending = None
                    cycle = yield from _tree_cycle(
                        target, proposal.tree, budget, ctx, sampling, rng, constraint, logprobs is not None,
                        proposal.sampled_chances, vocab,
                    )
                else:
                    cycle = yield from _chain_cycle(
                        target, proposal, budget, ctx, sampling, rng, stats, pending, constraint, logprobs is not None, vocab
                    )
                    pending = None
            except NonFiniteLogitsError as e:
                raise non_finite_logits(getattr(target, "name", None) or "the target model") from e
            new, n_drafted, n, rows, skipped = cycle.tokens, cycle.n_drafted, cycle.n_kept, cycle.rows, cycle.skipped
            t2 = clock()
            # the first cycle's decode is not a verify of n_drafted + 1 tokens, nor is one that skipped rows (known
            # rows, see _known_rows): their time must not teach the costs
            t_verify = t2 - t1 if stats.n_cycles and not skipped and not cycle.shared else 0.0
            eog_at = next((i for i, t in enumerate(new) if target.is_eog(t)), None) if stop_at_eog else None
            if eog_at is not None:
                new = new[: eog_at + 1]
            lps = token_logprobs(rows, new, ctx, sampling, logprobs, vocab) if logprobs is not None and rows is not None else None
            dead_end = False
            if constraint is not None:
                for i, t in enumerate(new):
                    if not constraint.advance(t):
                        if not constraint.error:  # pragma: no cover - every emitted token came from a masked row
                            raise RuntimeError(f"the constraint refused token {t} that its own mask allowed")
                        new, dead_end = new[:i], True  # the grammar gave up here (a limit): stop before this token
                        lps = lps[:i] if lps is not None else None
                        break
            ctx.extend(new)
            n_gen += len(new)
            source = proposal.source if n_drafted else "plain"
            n_kept = min(n, len(new))
            if stats.n_cycles == 0:
                stats.ttft = clock() - start
            stats.record_cycle(n_drafted, n_kept, len(new), source, t1 - t0, t2 - t1)
            if speculator is not None:
                t_obs = clock()
                # the whole period since the last cycle (the caller's work on its tokens included); the first cycle's
                # decode is the prefill's tail, not a cycle's: 0
                t_cycle, t_last = (t_obs - t_last if t_last is not None else 0.0), t_obs
                # t_draft includes the drafter catching up on tokens it has not seen (after plain cycles): resuming
                # drafting really costs that, and the policy must see it or it resumes too eagerly (the model
                # speculator tells its controller how many tokens a draft caught up on, so that a batched catch-up
                # counts against the run it starts without inflating the per-token draft cost).
                if forced:  # the speculator sees its own drafts only; the batch size was not its choice: no timing
                    nf = len(forced)
                    own_kept = min(max(0, n_kept - nf), n_own)
                    # tokens: those after the forced ones, where the speculator's own proposal starts
                    speculator.observe(Outcome(
                        min(n_own, max(0, n_drafted - nf)), own_kept, len(new), t1 - t0, 0.0, tuple(new[nf:]), cycle.chances[nf:],
                        t_cycle,
                    ))
                else:
                    speculator.observe(Outcome(n_drafted, n_kept, len(new), t1 - t0, t_verify, tuple(new), cycle.chances, t_cycle))
            yield Step(new, n_drafted, n_kept, source, t1 - t0, t2 - t1, eog_at is not None and not dead_end, lps)
            if dead_end:
                stats.stop_reason = "constraint"
                return
            if eog_at is not None:
                stats.stop_reason = "eos"
                return
            if after_cycle is not None:
                after_cycle()
    finally:
        stats.finish(clock() - start)


def _advance_all(constraint: TokenConstraint, tokens: Sequence[int]) -> int:
    """Advance along tokens while the constraint allows them; how many it took."""
    n = 0
    for t in tokens:
        if not constraint.advance(t):
            break
        n += 1
    return n


def bind_constraint(speculator: Any, constraint: TokenConstraint | None) -> None:
    """Let the draft models inside a speculator mask their proposals with the generation's constraint."""
    speculator = unguarded(speculator)
    for part in (speculator, getattr(speculator, "model", None)):
        if part is not None and hasattr(part, "constraint"):
            part.constraint = constraint


def _after_forced(forced: list[int], proposal: Proposal) -> Proposal:
    """The forced tokens as a deterministic chain, with the speculator's chain or tree (drafted after them) below."""
    if proposal.tree is not None and len(proposal.tree):
        tree = TokenTree.chain(forced)
        index = {ROOT: len(forced) - 1}
        own = proposal.tree
        for i in range(len(own)):
            index[i] = tree.add(index[own.parents[i]], own.token(i), own.q(i))
        return Proposal(source=proposal.source, tree=tree, sampled_chances=proposal.sampled_chances)
    source = proposal.source if proposal.tokens else "grammar"
    q: list[np.ndarray | Probs | None] = [None] * len(forced)
    return Proposal(forced + list(proposal.tokens), q + list(proposal.q), source, sampled_chances=proposal.sampled_chances)


def _chain_masks(constraint: TokenConstraint, draft: Sequence[int]) -> tuple[list[np.ndarray], int]:
    """The constraint's masks for the rows of a chain verify (row i: after draft[:i]) up to the first drafted token it
    forbids, and how many drafts lead the chain allowed. The matcher ends where it started."""
    masks = [constraint.mask()]
    n = 0
    for d in draft:
        m = masks[-1]
        if not (d < m.size and m[d]) or not constraint.advance(d):
            break
        n += 1
        masks.append(constraint.mask())
    constraint.rollback(n)
    return masks, n


# Rows of a chain verify whose mask allows one token are not computed (see _known_rows); False computes every row
# (tests compare the two).
SKIP_KNOWN_ROWS = True


def _known_rows(masks: Sequence[np.ndarray], n_decode: int, n_vocab: int) -> dict[int, int]:
    """{row: token} for the verify rows 0..n_decode whose mask allows exactly one token (below n_vocab). There the
    masked distribution is that token with probability 1 whatever the target's logits are (every other logit is -inf
    before `warp`; penalties, temperature and the filters keep a single finite logit the only one), so the row needs
    no output from the target: llama.cpp then skips the output projection over the vocabulary for it (a quarter of a
    token's cost on the default pair on a 2-core CPU). Grammar scaffolding (keys, braces, quotes) is such rows."""
    out = {}
    for i, m in enumerate(masks[: n_decode + 1]):
        if m is not None and np.count_nonzero(m) == 1:
            t = int(np.argmax(m))
            if t < n_vocab:
                out[i] = t
    return out


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
    masked logits row of each added token, how many rows the target did not compute (see _known_rows), and the
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
        masks, n_ok = _chain_masks(constraint, draft[:n_decode])
        if n_ok < n_decode:
            d, m = draft[n_ok], masks[n_ok]
            if d < m.size and m[d]:  # allowed, but the matcher hit a limit taking it (a dead end): not drafted
                draft, q, n_decode = draft[:n_ok], q[:n_ok], n_ok
            else:  # forbidden: a certain rejection, never decoded, and nothing after it
                draft, q, n_decode = draft[: n_ok + 1], q[: n_ok + 1], n_ok
    known = _known_rows(masks, n_decode, target.n_vocab) if masks is not None and SKIP_KNOWN_ROWS else {}
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


class _TreeRows(Sequence[Any]):
    """The target's rows for a tree, warped on first use (accept_tree reads only the rows along its walk): index 0
    is the root row, i + 1 node i's; None for nodes that were not decoded."""

    def __init__(
        self,
        tree: TokenTree,
        logits: np.ndarray,
        node_row: list[int],
        ctx: list[int],
        sampling: SamplingParams,
        masks: dict[int, np.ndarray] | None = None,
        infill_vocab: InfillVocab | None = None,
    ) -> None:
        self.tree, self.logits, self.node_row, self.ctx, self.sampling = tree, logits, node_row, ctx, sampling
        self.infill_vocab = infill_vocab
        self.masks = masks  # row index (0 = root, i + 1 = node i) -> the constraint's mask there
        self._rows: dict[int, np.ndarray | int | None] = {}

    def __len__(self) -> int:
        return len(self.tree) + 1

    def __getitem__(self, i: Any) -> Any:
        if i not in self._rows:
            r = 0 if i == 0 else self.node_row[i - 1]
            if r < 0:
                self._rows[i] = None
            else:
                # penalties read the history; without them, no copy of the context per row
                history = self.ctx + ([] if i == 0 else self.tree.path_tokens(i - 1)) if self.sampling.uses_history else []
                row = self.logits[r]
                if self.masks is not None:
                    row = apply_mask(row, self.masks[i])
                self._rows[i] = (
                    greedy_token(row, self.sampling, history) if self.sampling.greedy
                    else warp(row, self.sampling, history, self.infill_vocab)
                )
        return self._rows[i]


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
        tree = _prune(tree, budget, room)
    if not len(tree):  # nothing fits: a plain step
        return (yield from _chain_cycle(target, Proposal(), 0, ctx, sampling, rng, None, None, constraint, want_rows, infill_vocab))
    masks, skip = _tree_masks(constraint, tree) if constraint is not None else (None, set())
    tb = tree.batch(ctx[-1], L - 1, target.n_vocab, skip)
    v = Verify(target, list(tb.tokens), depths=[p - (L - 1) for p in tb.positions], seq_ids=tb.seq_ids)
    logits = yield v
    rows = _TreeRows(tree, logits, tb.node_row, ctx, sampling, masks, infill_vocab)
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
    chances = _chain_chances(tree, rows, verdict.path, sampled_chances and not isinstance(rng, PositionalUniforms)) if not sampling.greedy else ()
    return _Verified(verdict.emitted, len(tb.tokens) - 1, verdict.n_accepted, own_rows, 0, chances, v.shared)


def _chain_chances(tree: TokenTree, rows: "_TreeRows", path: Sequence[int], sampled: bool) -> tuple[float, ...]:
    """Verdict.chances (see verify: `sampled` as its sampled_chances) for a tree's chain of first children (a draft
    model's own chain; its siblings are later children): the acceptance probability of each first child the rule tried,
    from the root down to the first one it did not keep. The tree rule tries a node's first child before any other,
    with min(1, p/q) (the coupled rule keeps it when it is the target's sample, p(d) for a deterministic child), so its
    chance is that of a chain."""
    out: list[float] = []
    node = ROOT
    for depth in range(tree.max_depth):
        kids = tree.children(node)
        if not kids:
            break
        first = kids[0]
        if tree.q(first) is not None and not sampled:
            return ()
        out.append(expected_acceptance(rows[node + 1], tree.q(first), tree.token(first)))
        if depth >= len(path) or path[depth] != first:
            break
        node = first
    return tuple(out)


def _tree_masks(constraint: TokenConstraint, tree: TokenTree) -> tuple[dict[int, np.ndarray], set[int]]:
    """The constraint's mask for every row of a tree (key 0 = the root, i + 1 = node i: after the path to node i), and
    the nodes it forbids (left out of the decode with their subtrees). Depth first (depth <= 64); the matcher ends
    where it started."""
    masks = {0: constraint.mask()}
    skip: set[int] = set()

    def visit(node: int) -> None:
        m = masks[node + 1]
        for child in tree.children(node):
            t = tree.token(child)
            if not (t < m.size and m[t]):
                skip.add(child)
                continue
            if not constraint.advance(t):  # the matcher hit a limit (a dead end): the node is not drafted at all
                m = masks[node + 1] = m.copy()
                m[t] = False
                skip.add(child)
                continue
            masks[child + 1] = constraint.mask()
            visit(child)
            constraint.rollback(1)

    visit(ROOT)
    return masks, skip


def _prune(tree: TokenTree, max_depth: int, max_nodes: int) -> TokenTree:
    """The tree without nodes deeper than max_depth, and its first max_nodes nodes at most (insertion order: parents
    first, better ranks first); kept nodes keep their order and rank."""
    out, index = TokenTree(), {ROOT: ROOT}
    for i in range(len(tree)):
        parent = tree.parents[i]
        if len(out) < max_nodes and tree.depths[i] <= max_depth and parent in index:
            index[i] = out.add(index[parent], tree.token(i), tree.q(i))
    return out


__all__ = ["LanguageModel", "Step", "TokenLogprob", "speculate", "token_logprobs", "verify"]
