"""`Probs`: a distribution over token ids as its support's ids and weights, the row type the loop passes around
(what warp_fast.warp_probs returns and the acceptance rules read). Pure numpy.

A `Probs` answers p(t) from its normaliser (`prob`), is sampled by the same inverse CDF as a dense row
(sampling.sample_at: the support's weights in id order, so the same u picks the same token as on the dense row up to
rounding), and becomes the dense row on demand (`np.asarray`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

SPARSE_MIN_SIZE = 4096  # sample: rows longer than this are checked for sparsity first
BLOCK = 1024  # sample: rows longer than SPARSE_MIN_SIZE are searched block by block (block sums, then one block)
_ONES32 = np.ones(BLOCK, dtype=np.float32)


def block_sums(values: np.ndarray) -> np.ndarray:
    """The sums of values[0:B], values[B:2B], ... (B = BLOCK; the last block may be short), as float64: each block
    summed in its own dtype (numpy's pairwise sum, vectorised), then widened."""
    n_full = values.size // BLOCK * BLOCK
    if values.dtype == np.float32:  # a matrix-vector product (BLAS): ~4x faster than numpy's row-wise reduction
        sums = (values[:n_full].reshape(-1, BLOCK) @ _ONES32).astype(np.float64)
    else:
        sums = values[:n_full].reshape(-1, BLOCK).sum(axis=1).astype(np.float64)
    if n_full < values.size:
        sums = np.append(sums, float(values[n_full:].sum(dtype=np.float64)))
    return sums


class Probs:
    """A distribution over the ids [0, n): id ids[j] has probability w[j] / total and every other id 0 (ascending ids,
    w > 0 on the support after the filters); ids None: w covers every id (a dense row, float32 weights). What
    `warp_probs` returns and the acceptance rules read: p(t) by `prob` (or `row[t]`), a sample by `sample_at`, the
    dense float64 row by np.asarray(row). Immutable by convention: nothing writes into w after it is made."""

    __slots__ = ("n", "ids", "w", "total", "blocks")

    def __init__(
        self, n: int, ids: np.ndarray | None, w: np.ndarray, total: float | None = None, blocks: np.ndarray | None = None
    ) -> None:
        self.n, self.ids, self.w = int(n), ids, w
        # a long row's block sums: its normaliser, and the first step of every inverse-CDF search on it
        self.blocks = blocks if blocks is not None else block_sums(w) if w.size > SPARSE_MIN_SIZE else None
        if total is not None:
            self.total = float(total)
        elif self.blocks is not None:
            self.total = float(self.blocks.sum())
        else:
            self.total = float(w.sum(dtype=np.float64))

    @classmethod
    def dense_row(cls, probs: np.ndarray) -> "Probs":
        """A Probs of a dense probability row (its non-zero entries as the support)."""
        p = np.asarray(probs, dtype=np.float64)
        ids = np.flatnonzero(p > 0.0)
        return cls(p.size, ids, p[ids])

    @property
    def shape(self) -> tuple[int]:
        return (self.n,)

    def __len__(self) -> int:
        return self.n

    def prob(self, t: int) -> float:
        """p(t): 0 for an id outside the support (or past n)."""
        t = int(t)
        if not 0 <= t < self.n:
            return 0.0
        if self.ids is None:
            return float(self.w[t]) / self.total
        j = int(self.ids.searchsorted(t))
        return float(self.w[j]) / self.total if j < self.ids.size and int(self.ids[j]) == t else 0.0

    def probs_of(self, ids: np.ndarray) -> np.ndarray:
        """p at each of the (valid, ascending or not) ids, float64."""
        ids = np.asarray(ids, dtype=np.intp)
        if self.ids is None:
            return self.w[ids].astype(np.float64) / self.total
        j = np.minimum(self.ids.searchsorted(ids), self.ids.size - 1)
        hit = self.ids[j] == ids
        return np.where(hit, self.w[j], 0.0).astype(np.float64) / self.total

    def __getitem__(self, t: Any) -> float:
        return self.prob(t)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = np.zeros(self.n)
        if self.ids is None:
            out[:] = self.w
            out /= self.total
        else:
            out[self.ids] = self.w
            out[self.ids] /= self.total
        return out if dtype is None else out.astype(dtype, copy=False)

    def top(self) -> int:
        """The most likely id (ties: the lowest)."""
        j = int(np.argmax(self.w))
        return j if self.ids is None else int(self.ids[j])

    def minus(self, q: "Probs | np.ndarray | None", d: int) -> "Probs":
        """max(0, p - q) over p's ids, unnormalised (its total may be 0); q None: one-hot at d (p without d)."""
        if q is None:
            w = self.w.copy()
            if self.ids is None:
                if 0 <= d < self.n:
                    w[d] = 0.0
            else:
                j = int(self.ids.searchsorted(d))
                if j < self.ids.size and int(self.ids[j]) == d:
                    w[j] = 0.0
            return Probs(self.n, self.ids, w)
        if isinstance(q, Probs) and self.ids is not None:  # only p's support can stay positive
            r = self.w / self.total - q.probs_of(np.minimum(self.ids, q.n - 1)) * (self.ids < q.n)
            np.maximum(r, 0.0, out=r)
            return Probs(self.n, self.ids, r)
        if isinstance(q, Probs) and q.ids is None and self.n == q.n:  # two dense rows: in their own dtype
            r = self.w * (1.0 / self.total)
            r -= q.w * (1.0 / q.total)
            np.maximum(r, 0.0, out=r)
            return Probs(self.n, None, r)
        p = np.asarray(self, dtype=np.float64)
        qd = np.asarray(q, dtype=np.float64)
        m = min(p.size, qd.size)
        p[:m] -= qd[:m]
        np.maximum(p, 0.0, out=p)
        return Probs(self.n, None, p)

    def overlap(self, q: "Probs | np.ndarray") -> float:
        """sum_t min(p(t), q(t)) (rows padded with zeros to a common length)."""
        if self.ids is not None:
            ids = self.ids[self.ids < len(q)]
            qv = q.probs_of(ids) if isinstance(q, Probs) else np.asarray(q, dtype=np.float64)[ids]
            return float(np.minimum(self.w[: ids.size] / self.total, qv).sum())
        if isinstance(q, Probs) and q.ids is not None:
            return q.overlap(self)
        if isinstance(q, Probs) and self.n == q.n:  # two dense rows: in their own dtype
            return float(np.minimum(self.w * (1.0 / self.total), q.w * (1.0 / q.total)).sum(dtype=np.float64))
        p = np.asarray(self, dtype=np.float64)
        qd = np.asarray(q, dtype=np.float64)
        m = min(p.size, qd.size)
        return float(np.minimum(p[:m], qd[:m]).sum())


__all__ = ["BLOCK", "SPARSE_MIN_SIZE", "Probs", "block_sums"]
