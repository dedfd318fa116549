"""A draft GGUF model as a drafter: samples each token from its own warped distribution q and reports that q."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Sequence

import numpy as np

from ..backend import Model
from ..config import SamplingParams
from ..sampling import greedy as greedy_token
from ..sampling import sample, warp
from .base import KeepDrafting, Proposal


def top_probability(logits: np.ndarray) -> float:
    """max softmax(logits): the model's confidence in its argmax (temperature 1, no filters)."""
    m = float(logits.max())
    return 1.0 / float(np.exp(logits - m, dtype=np.float32).sum(dtype=np.float64))


class ModelDrafter:
    """Drafts with a small model that shares the target's tokenizer.

    The draft's KV cache follows the conversation through `Model.sync` (common-prefix reuse): each cycle it
    decodes only the tokens it has not seen, then one token per drafted position. Drafting stops at an
    end-of-generation token, at k, or when `keep_drafting` says the next token is unlikely to pay.

    Sampling: with `sampling.temperature == 0` (or a draft temperature of 0) drafts are greedy and reported as
    deterministic (q = None, a one-hot); otherwise d_i ~ q_i = warp(draft logits, draft settings) and q_i is
    reported exactly.
    """

    name = "model"

    def __init__(self, model: Model, sampling: SamplingParams, draft_temperature: float | None = None) -> None:
        self.model = model
        self.set_sampling(sampling, draft_temperature)
        self.cost_per_token_hint = 0.0

    def set_sampling(self, sampling: SamplingParams, draft_temperature: float | None = None) -> None:
        self.params = sampling if draft_temperature is None else replace(sampling, temperature=draft_temperature)

    def propose(
        self, tokens: Sequence[int], k: int, rng: np.random.Generator, keep_drafting: KeepDrafting
    ) -> Proposal:
        t0 = time.perf_counter()
        prop = Proposal(source=self.name)
        if k <= 0:
            return prop
        room = self.model.n_ctx - len(tokens)
        k = min(k, room)
        if k <= 0:
            return prop
        logits = self.model.sync(tokens)[0]  # catches up on tokens the draft has not seen
        history = list(tokens)
        greedy = self.params.greedy
        for i in range(1, k + 1):
            if greedy:
                d = greedy_token(logits, self.params, history)
                q_row = None
                conf = top_probability(logits)
            else:
                q_row = warp(logits, self.params, history)
                d = sample(q_row, rng)
                conf = float(q_row[d])
            prop.tokens.append(d)
            prop.q.append(q_row)
            history.append(d)
            if i == k or self.model.is_eog(d) or not keep_drafting(i, conf):
                break
            logits = self.model.decode([d], self.model.n_past, (0,))[0]
        prop.seconds = time.perf_counter() - t0
        return prop

    def close(self) -> None:
        """Nothing to free: the Engine owns the draft model and closes it."""
