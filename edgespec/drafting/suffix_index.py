"""A memory of every token sequence the engine has seen, as a source of tree candidates (SuffixDecoding-style).

Pure Python + numpy; no model. It indexes token ids only: it does not know text, tokenizers (the caller names the
vocabulary with a string and a file for another vocabulary is ignored), sampling, or whether a proposal is
accepted. Its proposals are deterministic candidates (q = None in a tree.TokenTree), so they never affect
exactness, only speed.

What it holds:

* the open document: the current context, appended to as the generation goes (`extend`, or `sync` / `propose`,
  which extend when the context continues the indexed one);
* finished documents: earlier contexts and outputs (a context that stops being continued is finished
  automatically, from a little before the point where the new context departs from it, so a regenerated answer
  does not store the shared prompt twice), and whatever the caller adds (`add_document`: a file the user points
  at, tokenized by the caller). Oldest documents are evicted beyond `max_tokens`.

Proposals (Oliaro et al. 2024, "SuffixDecoding: A Model-Free Approach to Speeding Up LLM Inference"): find the
longest n in LADDER such that the context's last n tokens occurred before (in a finished document or earlier in
the context, followed by a token), take the `max_occurrences` most recent occurrences from each of the two, and
for each its agreement with the context (`run`: how many tokens before the continuation equal the context's,
checked token by token, capped at `run_cap`; hash collisions have run < n and are dropped); keep the
max_occurrences with the longest runs, most recent first. Their continuations form a trie; each occurrence weighs
run_weight ** (best run - its run) (sources that agree longer count more) and a child's score is its share of its
siblings' weight: an empirical P(next token | path, match). The best `max_width` children per node, depth <=
max_depth, best first by path score (the product of scores; ties: the most recent) up to `max_nodes`, are the
proposal (SuffixDecoding's greedy tree; suffix_proposal.py). An occurrence in the open document that runs into
the context's end continues periodically (a repeating pattern goes on repeating), like ngram.NgramIndex.
Occurrences older than the max_occurrences most recent ones of an n-gram are not looked at: a longer agreement
hidden among them is found at the next LADDER level up, which has few occurrences.

Design: a ladder of hashed n-grams (n in LADDER = 1, 2, 3, 4, 6, 8, 12, 16) rather than a suffix automaton or a
suffix array, because it has to append cheaply, evict old documents and stay compact in numpy:

* per level (suffix_ladder.py), two sorted numpy arrays: the n-gram's hash (uint64, polynomial mod 2**64) and
  the position of the token after it (int32), sorted by (hash, position), so the most recent occurrences of an
  n-gram are the last of its range (a searchsorted finds them). Finished documents share one token array and one
  such set of arrays: about 100 bytes per token (8 levels x 12 bytes, plus the token). Adding a document merges its
  sorted pairs in (O(N) memory moves, no sort of what is held); eviction filters the arrays (O(N), no sort).
* the open document has its own set, plus a buffer of its newest TAIL = 256 positions' hashes that lookups scan
  linearly; every TAIL tokens the buffer is merged into the sorted arrays. Appending a token computes
  len(LADDER) hashes from prefix hashes; a long append (a new context) is done vectorised.

Occurrence is monotone in n (an occurrence of the last n tokens contains one of the last m < n), so a lookup
finds the longest level by binary search over LADDER (at most 4 probes), then does vectorised work on at most
2 x max_occurrences occurrences (runs, continuations) and builds a trie of at most max_occurrences x max_depth
nodes: none of it grows with the number of indexed tokens (`work` counts it; bench/bench_suffix_index.py
times it). A suffix automaton appends in O(1) but cannot evict without a rebuild and costs hundreds of bytes per
state in Python; a suffix array gives every match length at once but must be rebuilt to append.

Persistence (`save`, `SuffixIndex.load`): a versioned binary file, written atomically: MAGIC, format version,
a JSON header (vocabulary name, documents: id, length, source), the tokens as little-endian int32, and a SHA-256
of everything before it. Only the tokens are stored; the index is rebuilt on load. A damaged, truncated, foreign
or other-vocabulary file is ignored with a one-line warning (an empty index is returned), never an exception.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from edgespec.fsutil import atomic_write_bytes, read_regular_bytes
from .ngram import as_token_list
from .suffix_ladder import HASH_BASE, HASH_MASK, HASH_POW, LADDER, Levels, document_entries, prefix_hashes
from .suffix_proposal import SuffixProposal, trie_proposal

MAGIC = b"EDGESPEC-SUFFIX\x00"
FORMAT_VERSION = 1
MAX_TOKEN_ID = 2**31 - 1


@dataclass
class _Document:
    id: int
    start: int  # in the finished-token store
    length: int
    source: str


class SuffixIndex:
    """Everything seen, indexed for multi-candidate lookups (see the module docstring).

    max_tokens: the budget of finished + open tokens; oldest finished documents are evicted beyond it.
    vocab: the name of the token vocabulary (e.g. the target model's tokenizer fingerprint); a saved index is
        only loaded for the same name.
    run_cap, max_occurrences, run_weight: see the module docstring.
    """

    TAIL = 256  # the open context's newest n-grams are scanned linearly, then merged into sorted arrays

    def __init__(
        self,
        max_tokens: int = 1 << 18,
        *,
        vocab: str = "",
        run_cap: int = 64,
        max_occurrences: int = 16,
        run_weight: float = 0.5,
    ) -> None:
        if max_tokens < 1 or run_cap < max(LADDER) or max_occurrences < 1 or not (0.0 < run_weight <= 1.0):
            raise ValueError("need max_tokens >= 1, run_cap >= 16, max_occurrences >= 1, 0 < run_weight <= 1")
        if max_tokens > MAX_TOKEN_ID:
            raise ValueError(f"max_tokens must be below 2**31, got {max_tokens}")
        self.max_tokens = int(max_tokens)
        self.vocab = str(vocab)
        self.run_cap = int(run_cap)
        self.max_occurrences = int(max_occurrences)
        self.run_weight = float(run_weight)
        self.work: Counter[str] = Counter()  # operations done, for tests and benchmarks (not timings)
        self._next_id = 0
        self.clear()

    # ----------------------------------------------------------------------------------------------- state
    def clear(self) -> None:
        """Forget every document and the open context."""
        self._docs: list[_Document] = []
        self._store = np.zeros(0, dtype=np.int32)
        self._finished = Levels()
        self._doc_starts = np.zeros(0, dtype=np.int64)
        self._doc_ends = np.zeros(0, dtype=np.int64)
        self._reset_context()

    def _reset_context(self) -> None:
        self._ctx: list[int] = []
        self._ctx_arr = np.zeros(1024, dtype=np.int32)
        self._ctx_h = np.zeros(1025, dtype=np.uint64)  # prefix hashes H[0..L]
        self._frozen = Levels()  # n-grams followed by a position < self._frozen_upto
        self._frozen_upto = 0
        self._tail = np.zeros((len(LADDER), self.TAIL), dtype=np.uint64)  # [level, p - frozen_upto]: hash before p

    @property
    def context(self) -> list[int]:
        """The open document (do not modify)."""
        return self._ctx

    @property
    def n_finished_tokens(self) -> int:
        return int(self._store.shape[0])

    @property
    def n_documents(self) -> int:
        return len(self._docs)

    def __len__(self) -> int:
        """Tokens indexed: finished documents plus the open context."""
        return self.n_finished_tokens + len(self._ctx)

    def documents(self) -> list[tuple[int, int, str]]:
        """(id, length, source) of the finished documents, oldest first."""
        return [(d.id, d.length, d.source) for d in self._docs]

    def document_tokens(self, doc_id: int) -> list[int]:
        """The tokens of a finished document (KeyError when it is not held, e.g. evicted)."""
        for d in self._docs:
            if d.id == doc_id:
                return self._store[d.start : d.start + d.length].tolist()
        raise KeyError(doc_id)

    def memory_bytes(self) -> int:
        """Approximate bytes held: the arrays, plus the context as a Python list (~36 bytes a token)."""
        arrays = self._store.nbytes + self._doc_starts.nbytes + self._doc_ends.nbytes + self._finished.nbytes
        arrays += self._ctx_arr.nbytes + self._ctx_h.nbytes + self._frozen.nbytes + self._tail.nbytes
        return arrays + 36 * len(self._ctx)

    # ----------------------------------------------------------------------------------------------- the open context
    def extend(self, tokens: Sequence[int]) -> None:
        """Append tokens to the open document (the current context): len(LADDER) hashes per token, written to a
        small buffer that is merged into sorted arrays every TAIL tokens; long appends are done vectorised."""
        new = as_token_list(tokens)
        if not new:
            return
        if min(new) < 0 or max(new) > MAX_TOKEN_ID:
            raise ValueError("token ids must be in [0, 2**31)")
        L, m = len(self._ctx), len(new)
        if L + m + 1 > self._ctx_h.shape[0]:
            size = max(L + m + 1, 2 * self._ctx_h.shape[0])
            self._ctx_arr = np.concatenate([self._ctx_arr[:L], np.zeros(size - L, dtype=np.int32)])
            self._ctx_h = np.concatenate([self._ctx_h[: L + 1], np.zeros(size - L - 1, dtype=np.uint64)])
        self._ctx.extend(new)
        self._ctx_arr[L : L + m] = new
        if m > 32:
            self._extend_bulk(L, m)
            return
        h = self._ctx_h
        tail = self._tail
        for p in range(L, L + m):
            if p - self._frozen_upto == self.TAIL:
                self._freeze(p)
            recent = h[max(0, p - max(LADDER)) : p + 1].tolist()  # H[p - 16 .. p] as Python ints
            hp = recent[-1]
            keys = [(hp - recent[-1 - n] * HASH_POW[n]) & HASH_MASK if n <= p else 0 for n in LADDER]
            tail[:, p - self._frozen_upto] = keys
            h[p + 1] = (hp * HASH_BASE + self._ctx[p] + 1) & HASH_MASK
            self.work["hash_writes"] += len(LADDER)

    def _extend_bulk(self, L: int, m: int) -> None:
        """extend() for m tokens at once (a new context): hashes and keys vectorised, merged straight into the
        sorted arrays."""
        self._freeze(L)
        part = prefix_hashes(self._ctx_arr[L : L + m])  # hashes of the new tokens alone
        powers = np.full(m + 1, HASH_BASE, dtype=np.uint64)
        powers[0] = 1
        powers = np.cumprod(powers, dtype=np.uint64)  # B**0..B**m
        self._ctx_h[L : L + m + 1] = self._ctx_h[L] * powers + part  # H[L + i] = H[L] * B**i + part[i]
        h = self._ctx_h[: L + m + 1]
        for n in LADDER:
            first = max(L, n)
            if first < L + m:
                p = np.arange(first, L + m, dtype=np.int64)
                self._frozen.merge(n, h[p] - h[p - n] * np.uint64(HASH_POW[n]), p)
        self._frozen_upto = L + m
        self.work["hash_writes"] += len(LADDER) * m

    def _freeze(self, upto: int) -> None:
        """Merge the buffered n-grams (positions frozen_upto..upto-1) into the sorted arrays."""
        start = self._frozen_upto
        if upto > start:
            for i, n in enumerate(LADDER):
                first = max(start, n)
                if first < upto:
                    self._frozen.merge(n, self._tail[i, first - start : upto - start].copy(), np.arange(first, upto, dtype=np.int64))
        self._frozen_upto = upto

    def _context_contains(self, n: int, key: np.uint64) -> bool:
        if self._frozen.contains(n, key):
            return True
        start, L = self._frozen_upto, len(self._ctx)
        if start >= n:
            return bool((self._tail[LADDER.index(n), : L - start] == key).any())
        return self._context_occurrences(n, key, 1).size > 0

    def _context_occurrences(self, n: int, key: np.uint64, count: int) -> np.ndarray:
        """Positions in the context after earlier occurrences of its n-gram with this hash (the `count` latest)."""
        frozen = self._frozen.recent(n, key, count)
        start, L = self._frozen_upto, len(self._ctx)
        hits = np.flatnonzero(self._tail[LADDER.index(n), : L - start] == key) + start
        if start < n:  # buffered positions p < n hold no n-gram
            hits = hits[hits >= n]
        return np.concatenate([frozen, hits])[-count:] if hits.size else frozen

    def sync(self, context: Sequence[int]) -> None:
        """Make the open document `context`: extend it when it continues the indexed one; otherwise finish the old
        one's departing tail (from max(LADDER) tokens before the first difference) as a document and start over."""
        toks = as_token_list(context)
        m = len(self._ctx)
        if len(toks) >= m and toks[:m] == self._ctx:
            if len(toks) > m:
                self.extend(toks[m:])
            return
        limit = min(m, len(toks))
        differ = np.flatnonzero(np.asarray(toks[:limit], dtype=np.int64) != self._ctx_arr[:limit])
        common = int(differ[0]) if differ.size else limit
        tail = self._ctx[max(0, common - max(LADDER)) :]
        self._reset_context()
        self.add_document(tail, source="context")
        self.extend(toks)

    def finish_context(self, source: str = "context") -> None:
        """Move the open document into the finished documents (at the end of a conversation or request)."""
        ctx = self._ctx
        self._reset_context()
        self.add_document(ctx, source=source)

    # ----------------------------------------------------------------------------------------------- documents
    def add_document(self, tokens: Sequence[int], source: str = "") -> int | None:
        """Index a finished document (earlier output, a file the user points at: token ids). Returns its id, or
        None when it is too short to propose anything (< 2 tokens). A document longer than max_tokens keeps its
        last max_tokens tokens. Older documents are evicted to stay within max_tokens."""
        arr = np.asarray(as_token_list(tokens), dtype=np.int64)
        if arr.size and (arr.min() < 0 or arr.max() > MAX_TOKEN_ID):
            raise ValueError("token ids must be in [0, 2**31)")
        arr = arr[-self.max_tokens :].astype(np.int32)
        if arr.size < 2:
            return None
        self._evict(self.max_tokens - arr.size - len(self._ctx))
        start = self.n_finished_tokens
        doc = _Document(self._next_id, start, int(arr.size), str(source))
        self._next_id += 1
        self._docs.append(doc)
        self._store = np.concatenate([self._store, arr])
        self._doc_starts = np.append(self._doc_starts, start)
        self._doc_ends = np.append(self._doc_ends, start + arr.size)
        for n, keys, pos in document_entries(arr, start):
            self._finished.merge(n, keys, pos)
        return doc.id

    def _evict(self, room: int) -> None:
        """Drop the oldest finished documents until they hold at most `room` tokens."""
        room = max(room, 0)
        if self.n_finished_tokens <= room:
            return
        drop, remaining = 0, self.n_finished_tokens
        while drop < len(self._docs) and remaining > room:
            remaining -= self._docs[drop].length
            drop += 1
        base = self._docs[drop].start if drop < len(self._docs) else self.n_finished_tokens
        self._docs = self._docs[drop:]
        for d in self._docs:
            d.start -= base
        self._store = self._store[base:].copy()
        self._doc_starts = self._doc_starts[drop:] - base
        self._doc_ends = self._doc_ends[drop:] - base
        self._finished.drop_below(base)
        self.work["evictions"] += drop

    def _rebuild(self) -> None:
        """Index every finished document from scratch (after a load): one sort per level."""
        parts: dict[int, list[tuple[np.ndarray, np.ndarray]]] = {n: [] for n in LADDER}
        for d in self._docs:
            for n, keys, pos in document_entries(self._store[d.start : d.start + d.length], d.start):
                parts[n].append((keys, pos))
        for n in LADDER:
            if parts[n]:
                keys = np.concatenate([k for k, _ in parts[n]])
                pos = np.concatenate([p for _, p in parts[n]])
                order = np.argsort(keys, kind="stable")  # positions ascend within a key: concatenated in order
                self._finished.keys[n], self._finished.pos[n] = keys[order], pos[order].astype(np.int32)
        self._doc_starts = np.array([d.start for d in self._docs], dtype=np.int64)
        self._doc_ends = np.array([d.start + d.length for d in self._docs], dtype=np.int64)

    # ----------------------------------------------------------------------------------------------- lookups
    def propose(
        self,
        context: Sequence[int],
        max_depth: int = 8,
        max_width: int = 4,
        *,
        max_nodes: int | None = 32,
        min_score: float = 0.0,
    ) -> SuffixProposal:
        """Candidate continuations of `context` (syncs the open document to it first), see the module docstring: at
        most max_width children per node, max_depth tokens deep, the best max_nodes nodes (None: all) whose path
        score is >= min_score."""
        if max_depth < 1 or max_width < 1:
            raise ValueError("need max_depth >= 1 and max_width >= 1")
        self.sync(context)
        self.work["lookups"] += 1
        found = self._occurrences(max_depth)
        if found is None:
            return SuffixProposal()
        length, rows, runs, recency = found
        return trie_proposal(
            rows, runs, recency, length, max_width, max_nodes, min_score, run_weight=self.run_weight, run_cap=self.run_cap, work=self.work
        )

    def _suffix_key(self, n: int) -> int:
        h, L = self._ctx_h, len(self._ctx)
        return (int(h[L]) - int(h[L - n]) * HASH_POW[n]) & HASH_MASK

    def _occurrences(self, depth: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray] | None:
        """At the longest matching level: (n, continuation rows of `depth` tokens (-1 padded), runs, recency) of the
        kept occurrences (longest runs, then most recent, at most max_occurrences).

        Occurrence is monotone in n (an occurrence of the last n tokens contains one of the last m < n), so the
        longest level with an occurrence is found by binary search over LADDER: 3 probes for 8 levels. A level whose
        every hit turns out to be a hash collision hands over to the next shorter one."""
        L = len(self._ctx)
        C = self.max_occurrences
        levels = [n for n in LADDER if n <= L]
        keys = [np.uint64(self._suffix_key(n)) for n in levels]
        lo, hi = -1, len(levels)  # levels[lo] has a hit (or lo = -1); levels[hi:] have none
        while hi - lo > 1:
            mid = (lo + hi) // 2
            self.work["levels"] += 1
            if self._finished.contains(levels[mid], keys[mid]) or self._context_contains(levels[mid], keys[mid]):
                lo = mid
            else:
                hi = mid
        for i in range(lo, -1, -1):
            n = levels[i]
            ctx_pos = self._context_occurrences(n, keys[i], C)
            store_pos = self._finished.recent(n, keys[i], C)
            found = self._gather(n, depth, ctx_pos, store_pos) if ctx_pos.size or store_pos.size else None
            if found is not None:
                return (n,) + found
        return None

    def _gather(
        self, n: int, depth: int, c_pos: np.ndarray, s_pos: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """Runs, continuation rows and recency for occurrences at context positions c_pos and store positions
        s_pos (each the position of the token after the n-gram); None when all were hash collisions."""
        L = len(self._ctx)
        doc = np.searchsorted(self._doc_starts, s_pos, side="right") - 1
        lo = self._doc_starts[doc]
        R = min(self.run_cap, L)
        first = min(R, 2 * max(LADDER))  # most runs are short: compare this far, then go on for those that reach it
        runs_c, runs_s = self._agreement(c_pos, 0, s_pos, lo, 0, first)
        if first < R:
            far_c, far_s = runs_c == first, runs_s == first
            if far_c.any() or far_s.any():
                more_c, more_s = self._agreement(c_pos[far_c], 0, s_pos[far_s], lo[far_s], first, R)
                runs_c[far_c] += more_c
                runs_s[far_s] += more_s
        self.work["occurrences"] += c_pos.size + s_pos.size
        keep_c, keep_s = runs_c >= n, runs_s >= n  # shorter: a hash collision
        if not (keep_c.any() or keep_s.any()):
            return None
        c_pos, runs_c = c_pos[keep_c], runs_c[keep_c]
        s_pos, runs_s, doc = s_pos[keep_s], runs_s[keep_s], doc[keep_s]
        # continuation: in the context, periodic past its end (period L - s); in a document, up to its end
        fwd = np.arange(depth)
        after_c = self._ctx_arr[c_pos[:, None] + fwd % (L - c_pos)[:, None]]
        ia = s_pos[:, None] + fwd
        inside = ia < self._doc_ends[doc][:, None]
        after_s = np.where(inside, self._store[np.where(inside, ia, 0)], -1)
        rows = np.concatenate([after_c, after_s])
        self.work["continuation_tokens"] += rows.size
        runs = np.concatenate([runs_c, runs_s])
        recency = np.concatenate([c_pos + self.n_finished_tokens, s_pos])  # the open context is the newest
        order = np.lexsort((-recency, -runs))[: self.max_occurrences]  # longest runs first, then the most recent
        return rows[order], runs[order], recency[order]

    def _agreement(
        self, c_pos: np.ndarray, c_lo: int, s_pos: np.ndarray, s_lo: np.ndarray, skip: int, upto: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """For occurrences in the context (c_pos) and in documents (s_pos, each document starting at s_lo): how many
        of the tokens skip+1..upto before each position equal the context's tokens as far from its end, counting
        from the first and stopping at the first difference or at the document's start."""
        L = len(self._ctx)
        back = np.arange(skip + 1, upto + 1)
        tail = self._ctx_arr[L - upto : L - skip][::-1]  # the context backwards, from skip on
        out = []
        for src, pos, lo in ((self._ctx_arr, c_pos, c_lo), (self._store, s_pos, s_lo)):
            if pos.size == 0:
                out.append(np.zeros(0, dtype=np.int64))
                continue
            idx = pos[:, None] - back
            ok = idx >= (lo[:, None] if isinstance(lo, np.ndarray) else lo)
            eq = ok & (src[np.maximum(idx, 0)] == tail)
            eq = np.concatenate([eq, np.zeros((pos.size, 1), dtype=bool)], axis=1)
            out.append(eq.argmin(axis=1).astype(np.int64))
        return out[0], out[1]

    # ----------------------------------------------------------------------------------------------- persistence
    def save(self, path: str | os.PathLike[str]) -> None:
        """Write every document and the open context (as one more document) to `path`, atomically."""
        docs = [(d.id, d.length, d.source) for d in self._docs]
        parts = [self._store]
        if len(self._ctx) >= 2:
            docs.append((self._next_id, len(self._ctx), "context"))
            parts.append(self._ctx_arr[: len(self._ctx)])
        header = json.dumps(
            {"vocab": self.vocab, "documents": [list(d) for d in docs], "n_tokens": int(sum(d[1] for d in docs))},
            separators=(",", ":"),
        ).encode("utf-8")
        body = MAGIC + struct.pack("<II", FORMAT_VERSION, len(header)) + header
        body += np.concatenate(parts).astype("<i4").tobytes()
        Path(os.fspath(path)).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(path, body + hashlib.sha256(body).digest())

    @classmethod
    def load(cls, path: str | os.PathLike[str], *, vocab: str = "", **kwargs) -> "SuffixIndex":
        """The index saved at `path`; an empty one (with a one-line warning) when the file is missing (no warning),
        unreadable, damaged, of another format version, or for another vocabulary. kwargs go to the constructor."""
        index = cls(vocab=vocab, **kwargs)
        try:
            # a regular file only (a FIFO is never waited on), and never larger than a saved index can be: 4 bytes a
            # token for twice the budget (documents evicted at load), a header of a few bytes a document
            data = read_regular_bytes(path, 16 * index.max_tokens + (64 << 20))
        except FileNotFoundError:
            return index
        except OSError as e:
            return _ignored(index, path, f"cannot read it ({e.strerror or e})")
        problem = index._restore(data)
        if problem:
            return _ignored(cls(vocab=vocab, **kwargs), path, problem)
        return index

    def _restore(self, data: bytes) -> str | None:
        """Fill this (empty) index from file bytes; returns what is wrong with them, or None."""
        fixed = len(MAGIC) + 8
        if len(data) < fixed + 32 or not data.startswith(MAGIC):
            return "not an edgespec suffix index"
        body, digest = data[:-32], data[-32:]
        if hashlib.sha256(body).digest() != digest:
            return "checksum mismatch (damaged or truncated)"
        version, header_len = struct.unpack("<II", body[len(MAGIC) : fixed])
        if version != FORMAT_VERSION:
            return f"format version {version}, this edgespec reads {FORMAT_VERSION}"
        try:
            header = json.loads(body[fixed : fixed + header_len].decode("utf-8"))
            docs = [(int(i), int(n), str(s)) for i, n, s in header["documents"]]
            stored_vocab = str(header["vocab"])
        except (ValueError, KeyError, TypeError, OverflowError, RecursionError):  # UnicodeDecodeError is a ValueError
            return "unreadable header"
        if stored_vocab != self.vocab:
            return f"made for vocabulary {stored_vocab!r}, not {self.vocab!r}"
        raw = body[fixed + header_len :]
        total = sum(n for _, n, _ in docs)
        if len(raw) != 4 * total or any(n < 2 for _, n, _ in docs):
            return "token count does not match the header"
        tokens = np.frombuffer(raw, dtype="<i4").astype(np.int32)
        if tokens.size and tokens.min() < 0:
            return "negative token ids"
        # keep the newest documents within the budget
        keep, used = len(docs), 0
        while keep > 0 and used + docs[keep - 1][1] <= self.max_tokens:
            keep -= 1
            used += docs[keep][1]
        first = sum(n for _, n, _ in docs[:keep])
        self._store = tokens[first:].copy()
        start = 0
        for i, n, s in docs[keep:]:
            self._docs.append(_Document(i, start, n, s))
            start += n
        self._next_id = max((i for i, _, _ in docs), default=-1) + 1
        self._rebuild()
        return None


def _ignored(index: SuffixIndex, path: str | os.PathLike[str], why: str) -> SuffixIndex:
    warnings.warn(f"edgespec: ignoring the suffix index {os.fspath(path)}: {why}", RuntimeWarning, stacklevel=3)
    return index


def default_path(vocab: str) -> Path:
    """Where the engine keeps the index for a vocabulary: <cache dir>/suffix/<sha256(vocab)[:16]>.idx."""
    from edgespec.paths import cache_dir

    name = hashlib.sha256(vocab.encode("utf-8")).hexdigest()[:16]
    return cache_dir() / "suffix" / f"{name}.idx"


__all__ = ["FORMAT_VERSION", "MAGIC", "MAX_TOKEN_ID", "SuffixIndex", "default_path"]
