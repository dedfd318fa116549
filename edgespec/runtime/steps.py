"""What the speculative loop (speculate.py) exchanges with its caller: the `LanguageModel` it drives, the target decode
it waits for (`Verify`), the `Step` each cycle yields, and the `TokenLogprob`s a step carries when asked for. Pure:
no llama.cpp."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from edgespec.config import SamplingParams
from edgespec.decoding.sampling import warp
from edgespec.prompts.infill import InfillVocab


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


__all__ = ["LanguageModel", "Step", "TokenLogprob", "Verify", "token_logprobs"]
