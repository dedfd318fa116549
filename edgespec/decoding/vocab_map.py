"""Drafting across vocabularies: which draft tokens are target tokens, and a draft row restricted to them. Pure numpy.

Two tokenizers share a token when its bytes are exactly one token of each (control tokens: when their text is the
same). `VocabMap` pairs those ids one to one (`t2d`, `d2t`). A draft that does not share the target's vocabulary
proposes from its distribution restricted to the shared tokens and renormalised, expressed in target ids
(`restrict_logits` for the logits a draft samples from, `restrict_probs` for a probability row): the proposal and its
q are then an ordinary draft over the target's vocabulary, and every acceptance rule (chains, trees, constraints,
greedy, seeded) keeps the target's distribution exactly, at any temperature. How the draft is fed (which draft ids
stand for the target's accepted tokens) moves only how often it is right, never the law of what is emitted.

Modes of a pair (`pair_mode`):
    same          the same vocabulary (pair compatibility as today): nothing is mapped
    mapped        the same ordinary tokens (tokenizer model and pre-tokenizer too); control tokens or a few added ones
                  differ: the ids are mapped one to one and the draft is fed token by token
    intersection  the shared tokens cover at least MIN_COVERAGE of the target's ordinary tokens: the draft proposes
                  among them; it reads its own tokenization of the prompt's text
    none          too little is shared for a draft to pay: not drafted
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

# GGUF token types (llama.cpp's llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
MIN_COVERAGE = 0.25  # intersection: the least share of the target's ordinary tokens a draft must know
MAPPED_MIN = 0.99  # mapped: each side's ordinary tokens that must have their image in the other


def _gpt2_byte_decoder() -> dict[str, int]:
    """GPT-2's printable character -> byte (the inverse of its byte -> unicode map)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


_GPT2 = _gpt2_byte_decoder()


def _piece(text: str, ttype: int, model: str | None) -> bytes | None:
    if ttype in (UNKNOWN, CONTROL, UNUSED):
        return None
    if ttype == BYTE and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        try:
            return bytes([int(text[3:5], 16)])
        except ValueError:
            return None
    if ttype != USER_DEFINED and model == "gpt2":
        try:
            return bytes(_GPT2[c] for c in text)
        except KeyError:
            pass
    if model == "llama":  # SentencePiece: U+2581 stands for a space
        text = text.replace("\u2581", " ")
    return text.encode("utf-8", "surrogateescape") or None


@dataclass(frozen=True)
class TokenTable:
    """A vocabulary as the map needs it: each id's bytes (None for control, unknown and unused tokens), whether it is a
    byte-fallback token, and the control tokens by text."""

    pieces: list[bytes | None]
    byte_token: list[bool]
    control: dict[str, int]
    model: str | None = None
    pre: str | None = None

    @classmethod
    def from_gguf(cls, tokens: Sequence[str], types: Sequence[int], model: str | None, pre: str | None = None) -> "TokenTable":
        """From a GGUF header's tokenizer.ggml.tokens / token_type / model (types missing: all normal)."""
        tt = list(types) if len(types) == len(tokens) else [NORMAL] * len(tokens)
        pieces = [_piece(t, ty, model) for t, ty in zip(tokens, tt)]
        control: dict[str, int] = {}
        for i, (t, ty) in enumerate(zip(tokens, tt)):
            if ty == CONTROL and t not in control:
                control[t] = i
        return cls(pieces, [ty == BYTE for ty in tt], control, model, pre)

    def __len__(self) -> int:
        return len(self.pieces)

    def ordinary(self) -> int:
        return sum(1 for p in self.pieces if p is not None)


@dataclass(frozen=True)
class VocabMap:
    """Target <-> draft ids of the shared tokens (one to one), and what feeds the draft.

    t2d[t]: the draft id of target token t, -1 where none; d2t the inverse. shared_t / shared_d: the pairs, ascending
    target ids. draft_index: every draft token's bytes -> its id (ordinary tokens before byte-fallback ones), for
    feeding the draft a target token whose bytes are one draft token. coverage: the share of the target's ordinary
    tokens that have a draft image; draft_coverage the same from the draft's side."""

    t2d: np.ndarray
    d2t: np.ndarray
    shared_t: np.ndarray
    shared_d: np.ndarray
    coverage: float
    draft_coverage: float
    draft_index: dict[bytes, int] = field(repr=False, default_factory=dict)

    @property
    def n_target(self) -> int:
        return int(self.t2d.size)

    @property
    def n_draft(self) -> int:
        return int(self.d2t.size)

    @property
    def n_shared(self) -> int:
        return int(self.shared_t.size)


def _index(table: TokenTable) -> dict[bytes, int]:
    out: dict[bytes, int] = {}
    for flag in (False, True):  # ordinary tokens first: a byte-fallback token never stands for one of them
        for i, p in enumerate(table.pieces):
            if p is not None and table.byte_token[i] == flag and p not in out:
                out[p] = i
    return out


def build_map(target: TokenTable, draft: TokenTable) -> VocabMap:
    """Pair each target token with the draft token of the same bytes (control tokens: the same text), one to one:
    ordinary tokens before byte-fallback ones, lower ids first; a draft token already taken is not paired again."""
    index = _index(draft)
    t2d = np.full(len(target), -1, dtype=np.int64)
    d2t = np.full(len(draft), -1, dtype=np.int64)
    for flag in (False, True):
        for t, p in enumerate(target.pieces):
            if p is None or target.byte_token[t] != flag:
                continue
            d = index.get(p)
            if d is not None and d2t[d] < 0:
                t2d[t], d2t[d] = d, t
    for text, t in target.control.items():
        d = draft.control.get(text)
        if d is not None and d2t[d] < 0 and t2d[t] < 0:
            t2d[t], d2t[d] = d, t
    shared_t = np.flatnonzero(t2d >= 0)
    shared_d = t2d[shared_t]
    paired_t = sum(1 for t, p in enumerate(target.pieces) if p is not None and t2d[t] >= 0)
    paired_d = sum(1 for d, p in enumerate(draft.pieces) if p is not None and d2t[d] >= 0)
    return VocabMap(
        t2d, d2t, shared_t, shared_d, paired_t / max(1, target.ordinary()), paired_d / max(1, draft.ordinary()), index
    )


def pair_mode(target: TokenTable, draft: TokenTable, vmap: VocabMap, same: bool) -> str:
    """"same" (same: the pair check found one vocabulary), "mapped", "intersection" or "none" (module docstring)."""
    if same:
        return "same"
    if (
        target.model == draft.model and target.pre == draft.pre
        and vmap.coverage >= MAPPED_MIN and vmap.draft_coverage >= MAPPED_MIN
    ):
        return "mapped"
    return "intersection" if vmap.coverage >= MIN_COVERAGE else "none"


def restrict_logits(draft_logits: np.ndarray, vmap: VocabMap, out: np.ndarray | None = None) -> np.ndarray:
    """A draft's logits row as a target row: the shared tokens' logits at their target ids, -inf elsewhere. Any
    softmax, temperature or filter of it is the draft's distribution restricted to the shared tokens and renormalised
    (`restrict_probs` of the same distribution). out: a row of -inf outside the shared ids to write into (a buffer
    reused from row to row: only the shared ids are written)."""
    row = np.asarray(draft_logits)
    if out is None:
        out = np.full(vmap.n_target, -np.inf, dtype=row.dtype if row.dtype.kind == "f" else np.float32)
    out[vmap.shared_t] = row[vmap.shared_d]
    return out


def restrict_probs(q_draft: np.ndarray, vmap: VocabMap) -> np.ndarray:
    """q over the draft's ids -> q restricted to the shared tokens, renormalised, over the target's ids (float64; all
    zeros where q gives the shared tokens nothing: such a draft proposes nothing)."""
    q = np.asarray(q_draft, dtype=np.float64)
    out = np.zeros(vmap.n_target)
    out[vmap.shared_t] = q[vmap.shared_d]
    total = out.sum()
    return out / total if total > 0.0 else out


__all__ = [
    "MIN_COVERAGE", "MAPPED_MIN", "TokenTable", "VocabMap", "build_map", "pair_mode", "restrict_logits", "restrict_probs",
]
