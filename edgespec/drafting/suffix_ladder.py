"""The suffix index's ladder of hashed n-grams (n in LADDER), per level a sorted pair of numpy arrays: the n-gram's
hash and the position of the token after it (suffix_index.py's docstring: design and costs). Pure numpy.

Hashes are polynomial mod 2**64 (uint64 arithmetic wraps, which is the mod): H[i + 1] = H[i] * B + (t_i + 1), and the
n-gram ending before position p hashes to H[p] - H[p - n] * B**n.
"""

from __future__ import annotations

import numpy as np

LADDER = (1, 2, 3, 4, 6, 8, 12, 16)

HASH_MASK = (1 << 64) - 1
HASH_BASE = 0x9E3779B97F4A7C15  # odd: invertible mod 2**64
_BASE_INV = pow(HASH_BASE, -1, 1 << 64)
HASH_POW = [pow(HASH_BASE, n, 1 << 64) for n in range(max(LADDER) + 1)]  # B**n mod 2**64 for the ladder
_NO_POSITIONS = np.zeros(0, dtype=np.int64)


def prefix_hashes(tokens: np.ndarray) -> np.ndarray:
    """H[0] = 0, H[i + 1] = H[i] * B + (t_i + 1) mod 2**64, vectorised: H[i + 1] = B**i * sum_{j <= i} (t_j + 1) *
    B**-j (uint64 arithmetic wraps, which is the mod)."""
    m = tokens.shape[0]
    h = np.zeros(m + 1, dtype=np.uint64)
    if m:
        powers = np.full(m, HASH_BASE, dtype=np.uint64)
        powers[0] = 1
        powers = np.cumprod(powers, dtype=np.uint64)  # B**i
        inv = np.full(m, _BASE_INV, dtype=np.uint64)
        inv[0] = 1
        inv = np.cumprod(inv, dtype=np.uint64)  # B**-i
        s = np.cumsum((tokens.astype(np.uint64) + np.uint64(1)) * inv, dtype=np.uint64)
        h[1:] = powers * s
    return h


def _level_keys(h: np.ndarray, n: int) -> np.ndarray:
    """Hashes of the n-grams ending before positions n..m (h = prefix hashes of m tokens): key[i] is the hash of
    tokens[i : i + n], i = 0..m - n."""
    return h[n:] - h[:-n] * np.uint64(HASH_POW[n])


class Levels:
    """Per LADDER level, (n-gram hash, position of the token after it) pairs sorted by hash, then position: the
    most recent occurrences of an n-gram are the last of its range."""

    def __init__(self) -> None:
        self.keys = {n: np.zeros(0, dtype=np.uint64) for n in LADDER}
        self.pos = {n: np.zeros(0, dtype=np.int32) for n in LADDER}

    def merge(self, n: int, keys: np.ndarray, pos: np.ndarray) -> None:
        """Add pairs whose positions all exceed the held ones: O(held) memory moves, no sort of the held ones."""
        order = np.argsort(keys, kind="stable")
        keys, pos = keys[order], pos[order]
        at = np.searchsorted(self.keys[n], keys, side="right")  # after equal keys: positions stay sorted
        self.keys[n] = np.insert(self.keys[n], at, keys)
        self.pos[n] = np.insert(self.pos[n], at, pos.astype(np.int32))

    def contains(self, n: int, key: np.uint64) -> bool:
        keys = self.keys[n]
        lo = int(keys.searchsorted(key, side="left"))
        return lo < keys.shape[0] and bool(keys[lo] == key)

    def recent(self, n: int, key: np.uint64, count: int) -> np.ndarray:
        """Positions of the `count` most recent occurrences of the n-gram with this hash (ascending)."""
        keys = self.keys[n]
        lo = int(keys.searchsorted(key, side="left"))
        if lo == keys.shape[0] or keys[lo] != key:
            return _NO_POSITIONS
        hi = int(keys.searchsorted(key, side="right"))
        return self.pos[n][max(lo, hi - count) : hi].astype(np.int64)

    def drop_below(self, base: int) -> None:
        """Forget positions < base and shift the others down by base."""
        for n in LADDER:
            keep = self.pos[n] >= base
            self.keys[n] = self.keys[n][keep]
            self.pos[n] = (self.pos[n][keep] - base).astype(np.int32)

    @property
    def nbytes(self) -> int:
        return sum(self.keys[n].nbytes + self.pos[n].nbytes for n in LADDER)


def document_entries(tokens: np.ndarray, start: int):
    """(n, hashes, positions) per level for one document placed at `start`: every n-gram followed by a token of the
    same document, with the position of that token."""
    h = prefix_hashes(tokens)
    m = tokens.size
    for n in LADDER:
        if m > n:
            yield n, _level_keys(h, n)[: m - n], np.arange(start + n, start + m, dtype=np.int64)


__all__ = ["HASH_BASE", "HASH_MASK", "HASH_POW", "LADDER", "Levels", "document_entries", "prefix_hashes"]
