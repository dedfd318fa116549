"""A draft model as a speculator: it samples each token from its own warped distribution q and reports that q;
a `Controller` (model_policy.py) decides how many tokens each cycle drafts and stops a draft early when the draft's own
confidence says the next token is not worth its cost."""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Protocol, Sequence, cast

import numpy as np

from edgespec.config import SamplingParams
from edgespec.decoding.constraint import TokenConstraint, apply_mask
from edgespec.errors import EdgespecError, non_finite_logits
from edgespec.prompts.infill import InfillVocab
from .model_policy import Controller
from edgespec.config import DrafterKind
from edgespec.decoding.sampling import greedy as greedy_token
from edgespec.decoding.sampling import NonFiniteLogitsError, PositionalUniforms, Probs, sample, sample_at, warp_probs
from edgespec.decoding.tree import ROOT, TokenTree, sample_children, walk
from .base import Outcome, Proposal


class DraftModel(Protocol):
    """What the speculator needs from a model (backend.Model has it)."""

    @property
    def n_ctx(self) -> int: ...

    @property
    def n_vocab(self) -> int: ...

    @property
    def n_past(self) -> int: ...

    def sync(self, tokens: Sequence[int], rows: Sequence[int] = (-1,)) -> np.ndarray: ...

    def decode(self, tokens: Sequence[int], start_pos: int, rows: Sequence[int] = (-1,)) -> np.ndarray: ...

    def is_eog(self, token: int) -> bool: ...

    def common_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading `tokens` the model's cache holds (what `sync` would not decode again)."""
        ...


_CONFIDENCE_GAP = 20.0  # top_probability sums the logits within this of the max: the rest adds < V e^-20 (3e-4 at 152k)


def top_probability(logits: np.ndarray) -> float:
    """max softmax(logits): the model's confidence in its argmax (temperature 1, no filters), a heuristic for the
    controller. Summed over the logits within _CONFIDENCE_GAP of the max (one comparison pass; exp on those alone):
    the others would add less than len(logits) * e^-20 to the normaliser, 3e-4 relative at 152k entries."""
    m = float(logits.max())
    above = logits >= m - _CONFIDENCE_GAP
    if 8 * int(np.count_nonzero(above)) < logits.size:
        w = np.exp(logits[above] - m, dtype=np.float32)
    else:  # a flat row: every entry counts, in one float32 pass
        w = np.subtract(logits, m, dtype=np.float32)
        np.exp(w, out=w)
    return 1.0 / float(w.sum())


class ModelSpeculator:
    """Drafts with a small model that shares the target's tokenizer (a draft of another vocabulary comes wrapped in a
    cross_vocab.CrossVocabDraft, which makes it one).

    The draft's KV cache follows the conversation through `sync` (common-prefix reuse): each cycle it decodes only
    the tokens it has not seen, then one token per drafted position. Drafting stops at an end-of-generation token,
    at k, or when the controller's keep_drafting says the next token is unlikely to pay.

    Sampling: with temperature 0 (the target's, or the draft's own) drafts are greedy and reported as
    deterministic (q = None); otherwise d_i ~ q_i = warp(draft logits, draft settings) and q_i is reported exactly.
    A seeded generation (PositionalUniforms) samples d_i with the uniform of its position, the one the target's
    own sample there uses.

    A context token the draft's vocabulary lacks (vocabularies may differ by up to 128 ids) can never be fed to
    the draft: from then on this speculator drafts nothing.

    `constraint` (set by the loop for a constrained generation, advanced to the end of the context it proposes for):
    each drafted position's logits are masked as the target's will be, so the draft never proposes a token the
    grammar forbids there; q is the masked distribution it really sampled from (exactness needs nothing more). The
    matcher is left where it was.

    Draft-model trees (the controller has a `SiblingPolicy`): after each drafted token the controller says how many
    of the draft's next-best candidates at that position to verify beside it (`Controller.siblings`, from the curve
    and the draft's confidence), and the proposal becomes a tree (the chain, with those candidates as leaves). Greedy:
    the draft's top tokens after d_i, deterministic children. Sampling: draws without replacement from q_i with d_i
    removed (sibling j carries q_i without d_i and siblings 1..j-1, renormalised: tree.sample_children), so the tree
    rule is recursive rejection sampling over d_i and its siblings; how many are drawn is decided before drawing them
    (from q_i(d_i) and the estimates), which keeps it exact. Seeded generations draft chains.
    """

    name: str = DrafterKind.MODEL

    def __init__(
        self, model: DraftModel, sampling: SamplingParams, controller: Controller, draft_temperature: float | None = None
    ) -> None:
        self.model = model
        self.controller = controller
        self.params = sampling if draft_temperature is None else replace(sampling, temperature=draft_temperature)
        # the infill sampler with the draft's own vocabulary, so that q follows the target's p; a draft that cannot
        # give one samples without it (q may differ from p: exactness never depends on it)
        self._infill_vocab = self._draft_infill_vocab(model) if self.params.infill and not self.params.greedy else None
        if self.params.infill and self._infill_vocab is None:
            self.params = replace(self.params, infill=False)
        self._checked = 0  # context tokens already checked against the draft's vocabulary
        self.constraint: TokenConstraint | None = None
        self.foreign = False  # the context holds an id the draft lacks: drafting is over for this generation
        self._catchup = 0  # context tokens the last draft had to catch up on before drafting
        self._tree: tuple[TokenTree, int, list[int]] | None = None  # the last tree: (tree, chain length, siblings per position)

    @staticmethod
    def _draft_infill_vocab(model: DraftModel) -> InfillVocab | None:
        get = getattr(model, "infill_vocab", None)
        if get is None:
            return None
        try:
            return cast(InfillVocab, get())
        except EdgespecError:
            return None

    # -- the contract -------------------------------------------------------------------------------------------
    def propose(self, context: Sequence[int], budget: int, rng: np.random.Generator | PositionalUniforms) -> Proposal:
        if self._has_foreign(context):
            return Proposal()
        behind = self._behind(context)
        # the draft decodes context + d_1..d_{k-1}: that must fit its own context window
        k = self.controller.next_k(behind=behind)
        k = min(self.controller.limit(k), budget, self.model.n_ctx - len(context) + 1)
        if k <= 0:
            return Proposal()
        return self._draft(context, k, rng, behind)

    def observe(self, outcome: Outcome) -> None:
        catchup = self._catchup if outcome.n_drafted else None
        if self._tree is not None and outcome.n_drafted:
            self._observe_tree(outcome, catchup)
        else:
            self.controller.observe(
                outcome.n_drafted, outcome.n_accepted, outcome.t_draft, outcome.t_verify, n_catchup=catchup, chances=outcome.chances
            )
        self._catchup = 0
        self._tree = None

    def _observe_tree(self, outcome: Outcome, catchup: int | None) -> None:
        """A verified draft-model tree: the chain's part teaches the controller's position estimates, the siblings'
        the sibling policy, the nodes decoded the curve."""
        assert self._tree is not None
        tree, k, per_position = self._tree
        path = walk(tree, outcome.tokens[: outcome.n_accepted])  # the accepted nodes: every entry up to the last hit
        kept = [(d, r) for d, r, hit in path if hit]
        m = sum(1 for _, r in kept if r == 0)  # chain tokens kept (a kept sibling ends the path: it is a leaf)
        sibling = kept[-1][1] if len(kept) > m else 0  # its rank among the children (1 = the best sibling)
        self.controller.observe(
            k, m, outcome.t_draft, outcome.t_verify, n_catchup=catchup, n_verified=outcome.n_drafted, bonus=int(sibling > 0),
            chances=outcome.chances,
        )
        pol = self.controller.sibling_policy
        # d_{m+1} was rejected with siblings beside it; a tree cut to fit the batch (fewer nodes decoded) teaches nothing
        if pol is not None and m < k and per_position[m] and outcome.n_drafted == len(tree):
            pol.observe(sibling if sibling else per_position[m], sibling > 0, outcome.n_emitted)

    def observe_foreign(self, outcome: Outcome) -> None:
        """A cycle another speculator drafted (the hybrid's lookup) emitted outcome.n_emitted tokens."""
        self.controller.skipped(outcome.n_emitted)

    def stats(self) -> dict[str, Any]:
        out = self.controller.stats()
        vocabulary = getattr(self.model, "vocabulary", None)  # a draft of another vocabulary says how it pairs
        return {**out, "vocabulary": vocabulary} if vocabulary else out

    def expected_rate(self, context: Sequence[int]) -> float | None:
        """Tokens per second a draft for `context` is expected to deliver now (Controller.expected_rate), counting
        the catch-up on the tokens the draft has not seen (after lookup or plain cycles); None = it would not draft."""
        return self.controller.expected_rate(self.controller.catchup_seconds(self._behind(context)))

    def _behind(self, context: Sequence[int]) -> int:
        """Context tokens the draft would decode before drafting: those after its cache's common prefix with the
        context, asked of the model itself (no copy of its cache is kept here); at least the last token is decoded."""
        return max(1, len(context) - self.model.common_prefix(context))

    # -- drafting -----------------------------------------------------------------------------------------------
    def _has_foreign(self, context: Sequence[int]) -> bool:
        if not self.foreign and len(context) > self._checked:
            if max(context[self._checked :]) >= self.model.n_vocab:
                self.foreign = True
            self._checked = len(context)
        return self.foreign

    def _draft(self, context: Sequence[int], k: int, rng: np.random.Generator | PositionalUniforms, behind: int) -> Proposal:
        prop = Proposal(source=self.name, sampled_chances=self.controller.wants_chances)
        # what the sync will decode (behind = _behind(context)): 1-2 tokens in a steady run of drafts, every skipped
        # token after plain or lookup cycles (a batched catch-up, whose cost is not a per-token draft cost: the
        # controller keeps them apart)
        self._catchup = behind
        logits = self._sync(context)  # catches up on tokens the draft has not seen
        history = list(context)
        c = self.constraint
        advanced = 0
        pol = self.controller.sibling_policy
        branch = pol is not None and pol.max_siblings > 0 and not isinstance(rng, PositionalUniforms)
        siblings: list[list[tuple[int, np.ndarray | None]]] = []  # per drafted position
        n_siblings = 0
        try:
            for i in range(1, k + 1):
                if c is not None:
                    mask = c.mask()
                    if not mask.any():
                        break
                    logits = apply_mask(logits, mask)
                d, q_row, conf = self._pick(logits, history, rng)
                prop.tokens.append(d)
                prop.q.append(q_row)
                history.append(d)
                alts: list[tuple[int, np.ndarray | None]] = []
                if branch:
                    assert pol is not None
                    available = min(pol.width - 1, pol.max_siblings - n_siblings)
                    b = self.controller.siblings(i, conf, i + n_siblings + 1, available)
                    if b:
                        alts = _alternatives(logits, d, q_row, b, rng)  # type: ignore[arg-type]
                        n_siblings += len(alts)
                siblings.append(alts)
                if i == k or self.model.is_eog(d) or not self.controller.keep_drafting(i, conf, n_siblings):
                    break
                if c is not None:
                    if not c.advance(d):  # pragma: no cover - d came from the masked row
                        break
                    advanced += 1
                logits = self._next(d)
        finally:
            if c is not None:
                c.rollback(advanced)
        if n_siblings:
            assert pol is not None
            pol.added += n_siblings
            tree = _chain_with_siblings(prop.tokens, prop.q, siblings)
            self._tree = (tree, len(prop.tokens), [len(a) for a in siblings])
            return Proposal(source=self.name, tree=tree, sampled_chances=prop.sampled_chances)
        return prop

    def _sync(self, context: Sequence[int]) -> np.ndarray:
        """The draft's logits after `context` (caught up): a view of its buffer where the model lends one (read before
        its next decode, as every row here is), else a copy."""
        lend = getattr(self.model, "sync_view", None)
        if lend is not None:
            return cast(np.ndarray, lend(context))
        return self.model.sync(context)[0]

    def _next(self, d: int) -> np.ndarray:
        """The draft's logits after d: a view of its buffer where the model lends one (read before its next decode)."""
        step = getattr(self.model, "decode_next", None)
        if step is not None:
            return cast(np.ndarray, step(d))
        return self.model.decode([d], self.model.n_past, (0,))[0]

    def _pick(
        self, logits: np.ndarray, history: list[int], rng: np.random.Generator | PositionalUniforms
    ) -> tuple[int, Probs | None, float]:
        """One drafted token, the q it was drawn from (None = greedy), and the draft's confidence in it. The row is
        checked as it is sampled (NaN or +inf: this model's BackendError; the backend skips its own pass)."""
        try:
            return self._sample(logits, history, rng)
        except NonFiniteLogitsError as e:
            raise non_finite_logits(getattr(self.model, "name", None) or "the draft model") from e

    def _sample(
        self, logits: np.ndarray, history: list[int], rng: np.random.Generator | PositionalUniforms
    ) -> tuple[int, Probs | None, float]:
        if self.params.greedy:
            d = greedy_token(logits, self.params, history)
            # the confidence steers an adaptive controller only: a fixed draft length never reads it
            return d, None, top_probability(logits) if self.controller.spec.adaptive else 1.0
        q_row = warp_probs(logits, self.params, history if self.params.uses_history else (), self._infill_vocab)
        # seeded: the uniform of this position, shared with the target's own sample there
        d = sample_at(q_row, rng.at(len(history))) if isinstance(rng, PositionalUniforms) else sample(q_row, rng)
        return d, q_row, q_row.prob(d)


def _alternatives(
    logits: np.ndarray, d: int, q_row: np.ndarray | None, b: int, rng: np.random.Generator
) -> list[tuple[int, np.ndarray | None]]:
    """Up to b candidates at a drafted position besides its token d, each with the row it was drawn from. Greedy
    (q_row None): the draft's next-best tokens (logits not -inf, masked ones excluded), deterministic. Sampling: draws
    without replacement from q_row with d removed, renormalised (none when q_row has no other token)."""
    if q_row is None:
        top = np.argpartition(logits, -(b + 1))[-(b + 1) :]
        ranked = [int(t) for t in top[np.argsort(-logits[top], kind="stable")] if int(t) != d and np.isfinite(logits[t])]
        return [(t, None) for t in ranked[:b]]
    rest = np.array(q_row, dtype=np.float64)
    rest[d] = 0.0
    total = rest.sum()
    if not total > 0.0:
        return []
    return [(x, row) for x, row in sample_children(rest / total, b, rng)]


def _chain_with_siblings(
    tokens: Sequence[int], q: Sequence[np.ndarray | Probs | None], siblings: Sequence[Sequence[tuple[int, np.ndarray | None]]]
) -> TokenTree:
    """The drafted chain d_1..d_k with, beside each d_i (its first child), the siblings drafted at position i as
    leaves."""
    tree = TokenTree()
    parent = ROOT
    for d, q_row, alts in zip(tokens, q, siblings):
        node = tree.add(parent, d, None if q_row is None else np.asarray(q_row))  # trees keep dense rows
        for x, row in alts:
            tree.add(parent, x, row)
        parent = node
    return tree


__all__ = ["DraftModel", "ModelSpeculator", "top_probability"]
