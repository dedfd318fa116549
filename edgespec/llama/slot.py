"""A slot: one generation's share of a loaded model's context (context.py), its main sequence and its tree-path
sequences, and the bookkeeping of what they hold. A slot's state is the list of token ids its main sequence holds,
`cached` (n_past = its length). `decode(tokens, start_pos, rows)` appends tokens at `start_pos` (which must equal
`n_past`: the cache is never silently out of step) and returns logits only for the requested rows; `truncate(n_past)`
rolls the cache back; `sync(tokens)` makes the cache hold exactly `tokens`, decoding only what it does not hold
already (or restoring a snapshot from the prompt cache, prompt_cache.py); `decode_tree` verifies a token tree, one
sequence per path, and `keep_tree_path` keeps the accepted one; `decode_parts` runs several slots' decodes in one
llama_decode.

Bookkeeping survives any exception (a Ctrl-C, an error raised by a test after any llama.cpp call): `cached` is
always a prefix of what llama.cpp holds, never more. Growing, llama.cpp decodes first and `cached` grows after;
shrinking, `cached` shrinks first and llama.cpp after; and every decode first drops whatever llama.cpp may hold past
`cached` (an interrupted step's leftovers: `_beyond` is set before each call that can leave some and cleared once the
bookkeeping matches, so a step that ran to its end costs no llama.cpp call here). Whatever lands between a llama.cpp
call and the bookkeeping, the next call starts from a consistent cache.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from edgespec.errors import BackendError, ContextFullError, StopRequested, non_finite_logits
from edgespec.prompts.infill import InfillVocab
from .context import Context
from .prompt_cache import PromptCache, common_prefix
from .vocab import Vocab


@dataclass(frozen=True)
class DecodePart:
    """One slot's share of a batched decode (Slot.decode_parts): a chain of `tokens` appended at the slot's n_past
    (start_pos, when given, must equal it) with logits for `rows`; or, with depths and seq_ids, a token tree laid out
    as for decode_tree."""

    slot: "Slot"
    tokens: Sequence[int]
    rows: Sequence[int] = (-1,)
    start_pos: int | None = None
    depths: Sequence[int] | None = None
    seq_ids: Sequence[Sequence[int]] | None = None


def _bad_row(r: int, n: int) -> int:
    raise BackendError(f"logits row {r} is outside the {n} tokens decoded")


class Slot:
    """Slot `index` of a context: its sequences are index * (1 + tree_paths) (the main one, `seq`) .. seq +
    tree_paths (the tree paths). It shares the context, the vocabulary and the prompt cache with the other slots of
    its model (backend.Model.slot); one thread at a time may decode in any of them (the engine's worker)."""

    def __init__(self, context: Context, vocab: Vocab, prompt_cache: PromptCache | None, index: int) -> None:
        self.context = context
        self.vocab = vocab
        self.prompt_cache = prompt_cache
        self.seq = index * (1 + context.tree_paths)
        self.n_ctx = context.n_ctx
        self.n_vocab = context.n_vocab
        self.n_batch = context.n_batch
        self.tree_paths = context.tree_paths
        self.cached: list[int] = []  # the token ids the main sequence holds, in order (a prefix of llama.cpp's content)
        self._tree: tuple[int, int] | None = None  # (start, paths) of the last decode_tree
        self._tree_seqs = False  # tree sequences may hold cells (from decode_tree until they are dropped)
        self._beyond = True  # the main sequence may hold cells past `cached` (see the module's docstring)

    # ----------------------------------------------------------------- facts
    @property
    def slot_index(self) -> int:
        return self.seq // (1 + self.tree_paths)

    @property
    def n_past(self) -> int:
        return len(self.cached)

    @property
    def name(self) -> str:
        return self.context.name

    @property
    def n_decoded(self) -> int:
        """Tokens pushed through llama_decode since load, in every slot of the context (a work counter for tests and stats)."""
        return self.context.n_decoded

    @property
    def decode_seconds(self) -> float:
        """Seconds spent inside llama_decode since load, in every slot of the context: what a generation's wall time
        less this is the engine's own (host) work."""
        return self.context.decode_seconds

    def threads_info(self) -> dict[str, Any]:
        return self.context.threads_info()

    def is_eog(self, token: int) -> bool:
        return token in self.vocab.eog_ids

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return self.vocab.token_bytes(token, special=special)

    def infill_vocab(self) -> InfillVocab:
        return self.vocab.infill_vocab()

    # ----------------------------------------------------------------- the cache
    def common_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading `tokens` the cache already holds (the reusable prefix)."""
        return common_prefix(self.cached, tokens)

    def sync(
        self,
        tokens: Sequence[int],
        rows: Sequence[int] = (-1,),
        *,
        should_stop: Callable[[], bool] | None = None,
        progress: Callable[[int, int], None] | None = None,
        view: bool = False,
    ) -> np.ndarray:
        """Make the cache hold exactly `tokens`, decoding only what it does not hold already (common-prefix reuse,
        or a snapshot from the prompt cache when one shares more), and return logits for `rows` of the newly
        decoded part. At least the last token is always decoded when rows are wanted, so its logits are fresh.
        view: as for decode() (rows read before this context's next decode).

        should_stop() is asked between chunks of n_batch tokens (StopRequested when it says yes; the cache then
        holds the chunks decoded so far); progress(done, total) is called after each chunk."""
        self.context.live()
        tokens = list(tokens)
        keep = self.common_prefix(tokens)
        if self.prompt_cache is not None and (keep < self.n_past or len(tokens) - keep >= PromptCache.MIN_TOKENS):
            keep = self.prompt_cache.swap(self, tokens, keep)
        if rows and keep == len(tokens):
            keep -= 1
        self.truncate(keep)
        if len(tokens) == keep:
            return np.empty((0, self.n_vocab), np.float32)
        return self._decode(tokens[keep:], keep, rows, should_stop, progress, view=view)

    def sync_view(self, tokens: Sequence[int]) -> np.ndarray:
        """sync(tokens)'s row after the last token as a view of llama.cpp's buffer, valid until this context's next
        decode (any slot's): for a caller that reads it at once (a draft model catching up before it drafts)."""
        return self.sync(tokens, view=True)[0]

    def truncate(self, n_past: int) -> None:
        """Forget every cached token at position >= n_past."""
        self.context.live()
        if n_past < 0 or n_past > self.n_past:
            raise BackendError(f"cannot truncate to {n_past}: the cache holds {self.n_past} tokens")
        if n_past == self.n_past:
            return
        self._beyond = True
        del self.cached[n_past:]  # first: llama.cpp may hold more than `cached`, never less
        if not self.context.seq_rm(self.seq, n_past, -1):
            raise BackendError(f"llama.cpp could not truncate the cache to {n_past} tokens")
        self._beyond = False

    def reset(self) -> None:
        """Empty this slot's cache (the prompt cache's snapshots stay)."""
        self.context.live()
        self._beyond = True
        self.cached = []
        self._tree_seqs = False
        self.context.clear(self.seq, 1 + self.tree_paths)
        self._beyond = False

    def save_state(self) -> bytes:
        """The cache's contents (the main sequence) as bytes (loadable into any slot); restore with
        load_state(a copy of `cached`, data)."""
        self.context.live()
        return self.context.save_seq(self.seq)

    def load_state(self, tokens: Sequence[int], data: bytes) -> bool:
        """Make the cache hold `tokens` from a snapshot saved by save_state (False if llama.cpp refused it; the
        cache is then empty)."""
        self.context.live()
        self._beyond = True
        self.cached = []  # first: llama.cpp clears the sequence before it reads the snapshot
        if not self.context.load_seq(self.seq, data):
            return False
        self.cached = list(tokens)
        self._beyond = False
        return True

    def _clean(self) -> None:
        """Drop whatever llama.cpp holds past `cached` in the main sequence, and every tree sequence (an interrupted
        step's leftovers): the next decode starts from exactly `cached`."""
        if self._beyond:
            self.context.seq_rm(self.seq, self.n_past, -1)
            self._beyond = False
        self._drop_tree_seqs()

    def _drop_tree_seqs(self) -> None:
        if self._tree_seqs:
            for s in range(1, 1 + self.tree_paths):
                self.context.seq_rm(self.seq + s, -1, -1)
            self._tree_seqs = False

    # ----------------------------------------------------------------- chains
    def decode(self, tokens: Sequence[int], start_pos: int, rows: Sequence[int] = (-1,), *, view: bool = False) -> np.ndarray:
        """Append `tokens` at positions start_pos.. and return float32 logits for the requested `rows` (indices into
        `tokens`, negative allowed), shape (len(rows), n_vocab). llama.cpp computes output only for those rows.
        `start_pos` must equal `n_past` (call `truncate` first to rewrite history). view=True: where the rows come out
        of one llama_decode in the order asked (ascending, within n_batch), they are a view of llama.cpp's own buffer,
        valid until this context's next decode (any slot's), instead of a copy."""
        self.context.live()
        if start_pos != self.n_past:
            raise BackendError(f"decode at position {start_pos} but the cache holds {self.n_past} tokens")
        if view and len(tokens) == 1 and len(rows) == 1 and rows[0] in (0, -1):
            return self._decode_one(int(tokens[0]))
        return self._decode(list(tokens), start_pos, rows, None, None, view=view)

    def decode_next(self, token: int) -> np.ndarray:
        """Append one token at n_past and return the logits after it (float32, n_vocab) as a view of llama.cpp's own
        buffer, not a copy: valid until this context's next decode (any slot's). For a caller that reads the row at
        once (a draft model drafting token by token); everything else takes decode()'s copies."""
        self.context.live()
        return self._decode_one(int(token))[0]

    def _decode_one(self, token: int) -> np.ndarray:
        """_decode of one token at n_past with its row as a view (a plain step, a drafted token): the same checks and
        bookkeeping without the general case's row plans."""
        if not 0 <= token < self.n_vocab:
            raise BackendError(f"token id out of range [0, {self.n_vocab})")
        start = len(self.cached)
        if start + 1 > self.n_ctx:
            raise ContextFullError(f"context full: {start + 1} tokens do not fit in n_ctx={self.n_ctx}")
        ctx = self.context
        self._clean()
        ctx.put_chain(0, self.seq, start, (token,), (0,))
        self._beyond = True
        rc = ctx.decode_batch(1)
        if rc != 0:
            ctx.seq_rm(self.seq, start, -1)
            raise BackendError(f"llama_decode failed with code {rc}")
        out = ctx.logits_view(1)
        self.cached.append(token)
        self._beyond = False
        ctx.n_decoded += 1
        if ctx.check_logits and not math.isfinite(out[0].max()):
            raise non_finite_logits(self.name)
        return out

    def _decode(
        self,
        tokens: list[int],
        start_pos: int,
        rows: Sequence[int],
        should_stop: Callable[[], bool] | None,
        progress: Callable[[int, int], None] | None,
        view: bool = False,
    ) -> np.ndarray:
        """decode() in chunks of n_batch tokens, the bookkeeping after each."""
        n = len(tokens)
        if n == 0:
            if rows:
                raise BackendError("no tokens to decode")
            return np.empty((0, self.n_vocab), dtype=np.float32)
        if start_pos + n > self.n_ctx:
            raise ContextFullError(f"context full: {start_pos + n} tokens do not fit in n_ctx={self.n_ctx}")
        if len(rows) == 1 and -n <= rows[0] < n:  # the common case: one row (a plain step, a drafted token)
            want = [rows[0] % n]
        else:
            want = sorted({r % n if -n <= r < n else _bad_row(r, n) for r in rows})
        order = {r: i for i, r in enumerate(want)}
        view = view and n <= self.n_batch and [r % n for r in rows] == want
        out = np.empty((0 if view else len(want), self.n_vocab), dtype=np.float32)
        if min(tokens) < 0 or max(tokens) >= self.n_vocab:
            raise BackendError(f"token id out of range [0, {self.n_vocab})")
        ctx = self.context
        self._clean()
        for c0 in range(0, n, self.n_batch):
            if should_stop is not None and c0 > 0 and should_stop():
                raise StopRequested()
            c1 = min(n, c0 + self.n_batch)
            chunk_rows = [r for r in want if c0 <= r < c1]
            ctx.put_chain(0, self.seq, start_pos + c0, tokens[c0:c1], [r - c0 for r in chunk_rows])
            self._beyond = True
            rc = ctx.decode_batch(c1 - c0)
            if rc != 0:
                ctx.seq_rm(self.seq, self.n_past, -1)  # drop whatever part of this call was stored
                raise BackendError(f"llama_decode failed with code {rc}")
            if view and want:  # the outputs in batch order: exactly the rows asked, in their order
                out = ctx.logits_view(len(want))
            elif chunk_rows:  # the chunk's outputs, in batch order: its rows, ascending
                got = ctx.logits_view(len(chunk_rows))
                for j, r in enumerate(chunk_rows):
                    out[order[r]] = got[j]
            self.cached += tokens[c0:c1]  # one list operation: the bookkeeping is never half done
            self._beyond = False
            ctx.n_decoded += c1 - c0
            if progress is not None:
                progress(c1, n)
        # NaN propagates into the max; +inf is the max; all -inf too (skipped where the caller samples every row it reads,
        # which checks the same: check_logits False)
        if ctx.check_logits and not np.isfinite(out.max(axis=1)).all():
            raise non_finite_logits(self.name)
        if list(rows) == want:
            return out
        return out[[order[r % n] for r in rows]]

    # ----------------------------------------------------------------- trees and batches
    def decode_tree(self, tokens: Sequence[int], depths: Sequence[int], seq_ids: Sequence[Sequence[int]]) -> np.ndarray:
        """Verify a token tree in one llama_decode (layout: tree.TokenTree.batch). Row 0 is the root: the context's
        last token, which the cache does not hold yet; row i sits at depth depths[i] (the root's is 0) and belongs to
        the tree paths seq_ids[i] (0-based; path s is this slot's sequence + s + 1, and the context is shared with
        every path). Returns the logits of every row. The cache then holds the context and the root in the main
        sequence; `keep_tree_path` keeps the accepted path and drops the rest."""
        return self.decode_parts([DecodePart(self, tokens, depths=depths, seq_ids=seq_ids)])[0]

    def keep_tree_path(self, path: int, tokens: Sequence[int]) -> None:
        """After decode_tree: keep the accepted drafts `tokens`, the first nodes after the root of tree path `path`,
        in the main sequence, and drop every tree sequence."""
        self.context.live()
        if self._tree is None or self.n_past != self._tree[0] + 1 or not 0 <= path < self._tree[1]:
            raise BackendError("keep_tree_path does not match the last decode_tree")
        start = self._tree[0]
        if tokens:
            self._beyond = True
            self.context.seq_cp(self.seq + path + 1, self.seq, start + 1, start + 1 + len(tokens))
        self._drop_tree_seqs()
        self.cached += [int(t) for t in tokens]
        self._beyond = False

    def decode_parts(self, parts: Sequence[DecodePart]) -> list[np.ndarray]:
        """Several slots' decodes of this context in ONE llama_decode (each part a chain appended at its slot's n_past,
        like decode(), or a token tree, like decode_tree(); at most one part per slot, all of them within n_batch
        tokens). Returns each part's logits (a chain's requested rows, a tree's every row). On a failure every slot
        is left holding exactly its `cached` tokens and BackendError is raised."""
        ctx = self.context
        ctx.live()
        if not parts:
            return []
        slots = [pt.slot for pt in parts]
        if any(s.context is not ctx for s in slots) or len({id(s) for s in slots}) != len(slots):
            raise BackendError("decode_parts takes at most one part per slot of this model")
        total = sum(len(pt.tokens) for pt in parts)
        if total > self.n_batch:
            raise BackendError(f"{total} tokens do not fit one batch of {self.n_batch}")
        plans = [pt.slot._prepare(pt) for pt in parts]  # checks (nothing held yet), then each slot's leftovers dropped
        off = 0
        for pt, (toks, want, n_paths) in zip(parts, plans):
            s = pt.slot
            if n_paths:
                assert pt.depths is not None and pt.seq_ids is not None
                ctx.put_tree(off, s.seq, s.n_past, toks, pt.depths, pt.seq_ids)
            else:
                ctx.put_chain(off, s.seq, s.n_past, toks, want)
            off += len(pt.tokens)
        for s in slots:
            s._beyond = True
        try:
            rc = ctx.decode_batch(total)
        except BaseException:
            for s in slots:
                s._clean()
            raise
        if rc != 0:
            for s in slots:
                s._clean()
            raise BackendError(f"llama_decode failed with code {rc}")
        out = []
        first = 0  # the part's first output row: the outputs come in batch order
        for pt, plan in zip(parts, plans):
            out.append(pt.slot._finish(first, pt, plan))
            first += len(plan[1])
        for got in out:
            if len(got) and ctx.check_logits and not np.isfinite(got.max(axis=1)).all():
                raise non_finite_logits(self.name)
        return out

    def _prepare(self, pt: DecodePart) -> tuple[np.ndarray, list[int], int]:
        """Check one part against this slot (token range, context, batch, tree paths) and drop the slot's leftovers:
        (token ids, the rows whose logits are wanted, the number of tree paths; 0 for a chain)."""
        n = len(pt.tokens)
        if n == 0:
            raise BackendError("no tokens to decode")
        toks = np.asarray(pt.tokens, dtype=np.int64)
        if toks.min() < 0 or toks.max() >= self.n_vocab:
            raise BackendError(f"token id out of range [0, {self.n_vocab})")
        start = self.n_past
        if pt.depths is None:
            if pt.start_pos is not None and pt.start_pos != start:
                raise BackendError(f"decode at position {pt.start_pos} but the cache holds {start} tokens")
            if start + n > self.n_ctx:
                raise ContextFullError(f"context full: {start + n} tokens do not fit in n_ctx={self.n_ctx}")
            want = sorted({r % n if -n <= r < n else _bad_row(r, n) for r in pt.rows})
            self._clean()
            return toks, want, 0
        seq_ids = pt.seq_ids or []
        n_paths = 1 + max((s for ids in seq_ids for s in ids), default=0)
        if n_paths > self.tree_paths:
            raise BackendError(f"a tree of {n_paths} paths needs a model loaded with tree_paths >= {n_paths}")
        if n > self.n_batch:
            raise BackendError(f"a tree of {n} nodes does not fit a batch of {self.n_batch}")
        if start + n > self.n_ctx or start + max(pt.depths) >= self.n_ctx:
            raise ContextFullError(f"context full: a tree of {n} nodes after {start} tokens does not fit n_ctx={self.n_ctx}")
        self._clean()
        self._tree_seqs = True
        for s in range(n_paths):
            self.context.seq_cp(self.seq, self.seq + s + 1, -1, -1)  # the context is visible to every path
        return toks, list(range(n)), n_paths

    def _finish(self, first: int, pt: DecodePart, plan: tuple[np.ndarray, list[int], int]) -> np.ndarray:
        """After the decode: this part's logits (a copy of output rows first.., its wanted rows in batch order), and
        the slot's bookkeeping (what its cache now holds)."""
        toks, want, n_paths = plan
        n = len(toks)
        if want:
            out = self.context.logits_view(first + len(want))[first:].copy()
        else:  # no rows asked (llama.cpp may have no logits buffer at all then)
            out = np.empty((0, self.n_vocab), dtype=np.float32)
        start = self.n_past
        self.context.n_decoded += n
        if n_paths:
            self.cached += [int(toks[0])]
            self._tree = (start, n_paths)
            self._beyond = False
            return out
        self.cached += [int(t) for t in toks]
        self._beyond = False
        rows = list(pt.rows)
        if rows == want:
            return out
        order = {r: i for i, r in enumerate(want)}
        return out[[order[r % n] for r in rows]]


__all__ = ["DecodePart", "Slot"]
