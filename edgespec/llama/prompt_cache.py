"""Snapshots of a model's KV cache in host memory, found by content: a conversation the engine left for another is
restored instead of decoded again. No llama.cpp here: a snapshot is what `Model.save_state` returns, and
`Model.load_state` puts it back.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Any, Sequence


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if list(a[:n]) == list(b[:n]):
        return n
    lo, hi = 0, n  # the first difference lies in [lo, hi)
    while hi - lo > 32:
        mid = (lo + hi) // 2
        if list(a[lo:mid]) == list(b[lo:mid]):
            lo = mid
        else:
            hi = mid
    while lo < hi and a[lo] == b[lo]:
        lo += 1
    return lo


class PromptCache:
    """Snapshots of one model's cache in host memory, found by content, evicted least-recently-used beyond
    `max_bytes`.

    `swap(model, tokens, keep)` is asked before `sync` rewrites the cache for `tokens` when only the first `keep`
    tokens can be reused: when that would throw away at least MIN_TOKENS cached tokens, the current contents are
    saved first; when a snapshot shares at least MIN_TOKENS more with `tokens` than the cache does, it is
    restored. So two conversations that alternate on one engine each decode only their new tokens.
    """

    MIN_TOKENS = 32

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self._entries: OrderedDict[int, tuple[list[int], bytes]] = OrderedDict()
        self._next = 0
        self.bytes = 0
        self.saves = self.restores = self.evictions = 0
        self.seconds = 0.0

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0

    def swap(self, model: Any, tokens: list[int], keep: int) -> int:
        t0 = time.perf_counter()
        try:
            best_key, best = None, keep
            for key, (toks, _) in self._entries.items():
                n = common_prefix(toks, tokens)
                if n > best:
                    best_key, best = key, n
            restore = best_key is not None and best >= keep + self.MIN_TOKENS
            if model.n_past - keep >= self.MIN_TOKENS:  # the rewrite would throw these away: keep a copy
                self._save(model)
            if not restore or best_key is None:
                return keep
            toks, data = self._entries[best_key]
            self._entries.move_to_end(best_key)
            if not model.load_state(toks, data):
                self._drop(best_key)
                return 0
            self.restores += 1
            return best
        finally:
            self.seconds += time.perf_counter() - t0

    def _save(self, model: Any) -> None:
        toks = list(model.cached)
        for key, (old, _) in list(self._entries.items()):
            if common_prefix(old, toks) == len(toks):  # already saved (or saved longer)
                self._entries.move_to_end(key)
                return
            if common_prefix(old, toks) == len(old):  # an older, shorter state of the same conversation
                self._drop(key)
        data = model.save_state()
        if len(data) > self.max_bytes:
            return
        self._entries[self._next] = (toks, data)
        self._next += 1
        self.bytes += len(data)
        self.saves += 1
        while self.bytes > self.max_bytes and self._entries:
            self._drop(next(iter(self._entries)))
            self.evictions += 1

    def _drop(self, key: int) -> None:
        _, data = self._entries.pop(key)
        self.bytes -= len(data)

    def stats(self) -> dict[str, float]:
        return {
            "entries": len(self._entries),
            "bytes": self.bytes,
            "saves": self.saves,
            "restores": self.restores,
            "evictions": self.evictions,
            "seconds": round(self.seconds, 4),
        }


__all__ = ["PromptCache", "common_prefix"]
