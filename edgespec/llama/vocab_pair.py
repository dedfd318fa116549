"""How a draft's vocabulary pairs with the target's, decided from the two GGUF headers before any weights load:
the same vocabulary (gguf_check.check_pair), the same ordinary tokens with other control tokens ("mapped"), a shared
part large enough to draft from ("intersection"), or too little shared ("none", refused). decoding/vocab_map.py holds
the map and the math; docs/vocabularies.md says what each mode does."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgespec.decoding.vocab_map import MIN_COVERAGE, TokenTable, VocabMap, build_map, pair_mode
from edgespec.errors import IncompatiblePairError
from .gguf_check import GGUFInfo, check_pair

MODE_TEXT = {
    "same": "same vocabulary",
    "mapped": "same vocabulary, special tokens mapped",
    "intersection": "vocabulary intersection",
    "none": "not worth drafting",
}


@dataclass(frozen=True)
class VocabPair:
    """A pair's mode, its map (None for the same vocabulary) and the differences check_pair found."""

    mode: str
    vmap: VocabMap | None
    problems: tuple[str, ...]

    @property
    def coverage(self) -> float:
        return 1.0 if self.vmap is None else self.vmap.coverage

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode, "text": MODE_TEXT[self.mode], "coverage": round(self.coverage, 4)}
        if self.vmap is not None:
            out.update(shared=self.vmap.n_shared, draft_coverage=round(self.vmap.draft_coverage, 4))
        return out

    def line(self) -> str:
        s = MODE_TEXT[self.mode]
        if self.vmap is not None:
            s += (f": {self.vmap.n_shared:,} shared tokens, {self.vmap.coverage:.1%} of the target's ordinary tokens, "
                  f"{self.vmap.draft_coverage:.1%} of the draft's")
        if self.mode == "none":
            s += f" (at least {MIN_COVERAGE:.0%} needed)"
        return s


def table(info: GGUFInfo) -> TokenTable:
    return TokenTable.from_gguf(info.tokens, info.token_types, info.tokenizer_model, info.tokenizer_pre)


# the last few pairs by their headers' identity (inspect_gguf keeps a file's GGUFInfo while it is unchanged): Engine.load
# asks before loading, the engine after
_MEMO: list[tuple[GGUFInfo, GGUFInfo, "VocabPair"]] = []


def pair_vocab(target: GGUFInfo, draft: GGUFInfo) -> VocabPair:
    """The pair's mode and map, from the headers (under a second on 150-260k-token vocabularies, kept for the last few
    pairs of files)."""
    for t_info, d_info, known in _MEMO:
        if t_info is target and d_info is draft:
            return known
    c = check_pair(target, draft)
    if c.ok:
        pair = VocabPair("same", None, ())
    else:
        t, d = table(target), table(draft)
        vmap = build_map(t, d)
        pair = VocabPair(pair_mode(t, d, vmap, False), vmap, c.problems)
    _MEMO[:] = [*_MEMO[-3:], (target, draft, pair)]
    return pair


def require_pairable(target: GGUFInfo, draft: GGUFInfo) -> VocabPair:
    """pair_vocab, or IncompatiblePairError where the draft shares too little to draft from."""
    pair = pair_vocab(target, draft)
    if pair.mode == "none":
        raise IncompatiblePairError(
            f"draft {draft.path.name} cannot be used with target {target.path.name}: {pair.line()}; "
            + "; ".join(pair.problems)
        )
    return pair


__all__ = ["MODE_TEXT", "VocabPair", "pair_vocab", "require_pairable", "table"]
