"""A draft model of another vocabulary, seen as a draft of the target's (the DraftModel protocol in target ids), so
that the ordinary `ModelSpeculator` drafts with it unchanged (docs/vocabularies.md).

Out: every logits row the draft gives is `vocab_map.restrict_logits` of it, a row over the target's ids with -inf
outside the shared tokens; the speculator samples from its warp and reports that q, so its proposal is the draft's
distribution restricted to the shared tokens and renormalised, in target ids, and the acceptance rules keep the
target's distribution exactly. In: the target's context is fed to the draft in draft ids. A token with a draft image
is that image; another is the draft token with its bytes, else the draft's own tokenization of its text (or of its
bytes, one byte token each, where they are not UTF-8). In "intersection" mode the prompt (the context first seen) is
the draft's own tokenization of its text, the draft's BOS included. The draft's cache follows the translation by
common prefix (`sync`), rolled back as for a draft of the same vocabulary. How the draft is fed changes only how
often it is right: exactness never depends on it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from edgespec.decoding.vocab_map import VocabMap, restrict_logits
from .model import DraftModel

Tokenize = Callable[[bytes, bool, bool], list[int]]  # (data, add_special, parse_special) -> the draft's ids


class CrossVocabDraft:
    """`draft` (ids of its own vocabulary) as a draft model over the target's vocabulary (see the module docstring).

    target_piece(t): the target token's bytes (control tokens as their text); tokenize: the draft's tokenizer;
    retokenize_prompt: the first context seen is tokenized by the draft as text ("intersection"), else it is fed
    token by token ("mapped")."""

    def __init__(
        self, draft: DraftModel, vmap: VocabMap, *, target_piece: Callable[[int], bytes], tokenize: Tokenize,
        retokenize_prompt: bool,
    ) -> None:
        self.draft = draft
        self.vmap = vmap
        self._piece = target_piece
        self._tokenize = tokenize
        self._retokenize = retokenize_prompt
        self._t: list[int] = []  # the target context translated so far
        self._d: list[int] = []  # its translation
        self._fixed = 0  # the leading target tokens translated as one text (no boundary inside)
        self._bounds: list[int] = [0]  # _bounds[j]: len(_d) after _t[: _fixed + j]
        self._memo: dict[int, tuple[int, ...]] = {}
        self._buf: np.ndarray | None = None  # decode_next's row
        self.name = getattr(draft, "name", "draft")

    @property
    def vocabulary(self) -> dict[str, Any]:
        """How the draft pairs with the target (GenerationStats.controller["vocabulary"])."""
        return {
            "mode": "intersection" if self._retokenize else "mapped", "shared": self.vmap.n_shared,
            "coverage": round(self.vmap.coverage, 4),
        }

    # -- the DraftModel protocol, in target ids -------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self.vmap.n_target

    @property
    def n_ctx(self) -> int:
        """The draft's window less what the translation adds over the target's count (drafted tokens map one to
        one), so that a draft the speculator plans fits the draft's own context."""
        return self.draft.n_ctx - max(0, len(self._d) - len(self._t))

    @property
    def n_past(self) -> int:
        return self.draft.n_past

    def sync(self, tokens: Sequence[int], rows: Sequence[int] = (-1,)) -> np.ndarray:
        out = self.draft.sync(self.translate(tokens), rows)
        return np.stack([restrict_logits(r, self.vmap) for r in out])

    def decode(self, tokens: Sequence[int], start_pos: int, rows: Sequence[int] = (-1,)) -> np.ndarray:
        """Drafted tokens (shared ones) after what the draft holds (start_pos is the target's; the draft's own
        position is its n_past)."""
        ids = [self._draft_id(t) for t in tokens]
        out = self.draft.decode(ids, self.draft.n_past, rows)
        return np.stack([restrict_logits(r, self.vmap) for r in out])

    def decode_next(self, token: int) -> np.ndarray:
        """The row after a drafted token, in a buffer lent until the next decode (as the draft's own decode_next):
        -inf outside the shared ids, which are all written every time."""
        step = getattr(self.draft, "decode_next", None)
        d = self._draft_id(token)
        row = step(d) if step is not None else self.draft.decode([d], self.draft.n_past, (0,))[0]
        if self._buf is None or self._buf.dtype != row.dtype:
            self._buf = restrict_logits(row, self.vmap)
            return self._buf
        return restrict_logits(row, self.vmap, out=self._buf)

    def is_eog(self, token: int) -> bool:
        d = int(self.vmap.t2d[token]) if 0 <= token < self.vmap.n_target else -1
        return d >= 0 and self.draft.is_eog(d)

    def common_prefix(self, tokens: Sequence[int]) -> int:
        """Target tokens less the draft tokens the draft would decode for them (what ModelSpeculator._behind reads)."""
        d = self.translate(tokens)
        return max(0, len(tokens) - (len(d) - self.draft.common_prefix(d)))

    # -- translation ------------------------------------------------------------------------------------------
    def _draft_id(self, token: int) -> int:
        d = int(self.vmap.t2d[token])
        if d < 0:
            raise ValueError(f"target token {token} has no draft image: it cannot have been drafted")
        return d

    def translate(self, tokens: Sequence[int]) -> list[int]:
        """The target context in draft ids (kept and extended incrementally; see the module docstring)."""
        n = min(len(tokens), len(self._t))
        a = np.asarray(tokens[:n], dtype=np.int64)
        diff = np.flatnonzero(a != np.asarray(self._t[:n], dtype=np.int64))
        common = int(diff[0]) if diff.size else n
        if not self._t or common < self._fixed:
            self._start(tokens)
            return self._d
        j = common - self._fixed
        del self._t[common:]
        del self._d[self._bounds[j]:]
        del self._bounds[j + 1:]
        for t in tokens[common:]:
            self._t.append(int(t))
            self._d.extend(self.feed(int(t)))
            self._bounds.append(len(self._d))
        return self._d

    def _start(self, tokens: Sequence[int]) -> None:
        self._t = [int(t) for t in tokens]
        if self._retokenize:
            # whole characters only (a context may end inside one): the draft's tokenizer reads UTF-8
            text = b"".join(self._piece(t) for t in self._t).decode("utf-8", "replace").encode("utf-8")
            self._d = list(self._tokenize(text, True, True))
            self._fixed, self._bounds = len(self._t), [len(self._d)]
            return
        self._d, self._fixed, self._bounds = [], 0, [0]
        for t in self._t:
            self._d.extend(self.feed(t))
            self._bounds.append(len(self._d))

    def feed(self, token: int) -> tuple[int, ...]:
        """What the draft reads for one target token (memoised per id)."""
        hit = self._memo.get(token)
        if hit is not None:
            return hit
        d = int(self.vmap.t2d[token]) if 0 <= token < self.vmap.n_target else -1
        if d >= 0:
            out: tuple[int, ...] = (d,)
        else:
            data = self._piece(token) if 0 <= token < self.vmap.n_target else b""
            one = self.vmap.draft_index.get(data)
            if one is not None:
                out = (one,)
            elif not data:
                out = ()
            else:
                try:
                    data.decode("utf-8")
                    out = tuple(self._tokenize(data, False, False))
                except UnicodeDecodeError:  # part of a character: its bytes, as the draft's byte tokens
                    out = tuple(i for b in data if (i := self.vmap.draft_index.get(bytes([b]))) is not None)
        self._memo[token] = out
        return out


__all__ = ["CrossVocabDraft"]
