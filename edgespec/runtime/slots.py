"""The engine's slots as the worker sees them (Slots): which models a slot's generation uses, which free slot a new
generation takes, how a slot's caches are set aside and put back, and how the generations' verify decodes run: one
llama_decode for several where the live cost curve says it pays."""

from __future__ import annotations

import time
from typing import Any

from edgespec.drafting.cross_vocab import CrossVocabDraft
from edgespec.drafting.learning import LearningState
from edgespec.drafting.model import DraftModel
from edgespec.errors import BackendError
from edgespec.llama.backend import DecodePart, Model, Slot
from edgespec.llama.vocab_pair import VocabPair

from .job import Job
from .steps import Verify

# Several generations' verify rows go to the target in one llama_decode when the live curve says that takes less than
# this share of their separate decodes (a margin over the curve's noise).
BATCH_GAIN = 0.97


class Slots:
    """The engine's slots as the worker sees them: which models a slot's generation uses, which free slot a new one
    takes, how its cache is set aside and put back, and how the generations' verify decodes run (one llama_decode
    for several where the live curve says it pays). Holds the models and the learnt costs, not the engine (the
    worker's thread must not keep the engine alive)."""

    def __init__(self, target: Model, draft: Model | None, learning: LearningState, vocab_pair: VocabPair | None = None) -> None:
        self.target, self.draft, self.learning = target, draft, learning
        self.vocab_pair = vocab_pair  # how the draft's vocabulary pairs with the target's (None: no draft)
        self._uses = 0
        self._last_use: dict[int, int] = {}  # slot -> when choose() last gave it out
        self.last_rows: dict[int, int] = {}  # slot -> rows of its generation's last verify decode, when it was batched
        self.batched_decodes = 0  # llama_decode calls that carried more than one generation's rows
        self.batched_rows = 0

    def rows_beside(self, slot: int) -> int:
        """The rows the other generations' last verify decodes put beside this slot's (0 when they ran apart)."""
        if slot not in self.last_rows:
            return 0
        return sum(n for s, n in self.last_rows.items() if s != slot)

    def models(self, slot: int) -> tuple[Slot, Slot | None]:
        return self.target.slot(slot), self.draft.slot(slot) if self.draft is not None else None

    def drafting(self, draft: Slot | None) -> DraftModel | None:
        """The draft slot as the speculator sees it: itself for a draft of the target's vocabulary, else a
        CrossVocabDraft over it (the draft in target ids: vocab_map.py's restriction out, its own ids in)."""
        pair = self.vocab_pair
        if draft is None or pair is None or pair.vmap is None or self.draft is None:
            return draft
        target, model = self.target, self.draft
        return CrossVocabDraft(
            draft, pair.vmap, target_piece=lambda t: target.token_bytes(t, special=True),
            tokenize=model.vocab.tokenize_bytes, retokenize_prompt=pair.mode == "intersection",
        )

    def choose(self, job: Job, free: list[int]) -> int:
        """The free slot whose target cache already holds the longest prefix of the job's prompt; on a tie the one
        used least recently (an empty slot first), so that another conversation's cache is kept where it can be."""
        self._uses += 1
        best = max(free, key=lambda s: (self.target.slot(s).common_prefix(job.prompt), -self._last_use.get(s, 0)))
        self._last_use[best] = self._uses
        return best

    def park(self, slot: int) -> list[tuple[Slot, list[int], bytes]]:
        """Set the slot's caches aside in host memory (both models) and empty the slot."""
        saved = []
        for m in self.models(slot):
            if m is not None:
                saved.append((m, list(m.cached), m.save_state() if m.n_past else b""))
        for m, _, _ in saved:
            m.reset()
        return saved

    def unpark(self, slot: int, saved: list[tuple[Slot, list[int], bytes]]) -> None:
        """Put caches set aside by park() back, token for token and byte for byte."""
        for m, tokens, data in saved:
            if not data:
                m.reset()
            elif not m.load_state(tokens, data):
                raise BackendError(f"{m.name}: llama.cpp could not restore the cache of a generation set aside for a shorter one")

    def execute(self, requests: list[Verify]) -> list[Any]:
        """Run the generations' verify decodes: together in one llama_decode when the live curve says one decode of all
        their rows costs less than their separate decodes (and they fit one batch), else one by one. Each result is
        its logits, or the exception its decode raised."""
        out: list[Any] = [None] * len(requests)
        curve = self.learning.curve
        alone = list(range(len(requests)))
        if len(requests) > 1:
            sizes = [r.n_rows for r in requests]
            if sum(sizes) <= self.target.n_batch and curve(sum(sizes)) < BATCH_GAIN * sum(curve(n) for n in sizes):
                alone = []
                parts = [
                    DecodePart(r.model, r.tokens, rows=r.rows, start_pos=r.start_pos, depths=r.depths, seq_ids=r.seq_ids)
                    for r in requests
                ]
                t0 = time.perf_counter()
                try:
                    got: list[Any] = self.target.decode_parts(parts)
                except Exception as e:
                    got = [e] * len(requests)
                else:
                    curve.update(sum(sizes), time.perf_counter() - t0)  # a verify of that many rows, as it was
                    self.batched_decodes += 1
                    self.batched_rows += sum(sizes)
                for i, (r, g) in enumerate(zip(requests, got)):
                    r.shared = True
                    out[i] = g
                    self.last_rows[r.model.slot_index] = r.n_rows
        for i in alone:
            self.last_rows.pop(getattr(requests[i].model, "slot_index", -1), None)
            try:
                # a lone decode's rows are read by its generation before any other decode of the target (the worker
                # steps it at once): a view of llama.cpp's buffer; several run one after another: copies
                out[i] = requests[i].run(view=len(requests) == 1)
            except Exception as e:
                out[i] = e
        return out


__all__ = ["Slots", "BATCH_GAIN"]
