"""Turn one row of logits into the probability distribution p that the next token is drawn from, and draw it.

Pure numpy. The same `warp` defines the target distribution on the plain decoding path and in speculative
verification, so the two paths sample from exactly the same p.

`warp(logits, params, history)` applies, in this order:

1. Penalties on the raw logits, using the distinct tokens among the last `repeat_last_n` tokens of `history`
   (ids outside [0, V) are ignored). For a token t seen c_t > 0 times in that window (llama.cpp's order):
       l_t <- l_t / repeat_penalty      if l_t > 0
       l_t <- l_t * repeat_penalty      otherwise                  (once per distinct token)
       l_t <- l_t - c_t * frequency_penalty - presence_penalty
2. temperature == 0: return the one-hot distribution at argmax_t l_t (ties go to the lowest token id).
3. top-k (k > 0 and k < V): keep exactly the k largest logits; ties at the boundary go to the lower ids.
4. Softmax over the kept set K, in float64:  w_t = exp((l_t - max_K l) / T),  p_t = w_t / sum_K w.
5. top-p (< 1): order K by p descending (ties: lower id first) and keep the shortest prefix whose cumulative
   sum (float64, summed in that order) is >= top_p; at least one token is kept. This is exact on the whole
   distribution, but instead of sorting all of K it sorts only the candidates {p >= c} for falling cuts c
   (such a top-m set has exactly the cumulative sums of the full sort's first m) until they reach top_p.
6. min-p (> 0): drop t with p_t < min_p * max p. (With min-p as the only filter the normaliser cancels, so the
   test runs on the weights w of a cheap superset of survivors and exp() is skipped for the rest.)
7. Renormalise the surviving weights to sum to 1. Every dropped token has probability exactly 0.
8. infill (llama.cpp's FIM sampler, params.infill): infill.infill_filter on that distribution, with the model's
   vocabulary (token texts, EOG ids): it keeps a subset of the tokens (or ends the completion) and renormalises.
   At temperature 0 it changes nothing (a one-hot row), so step 2 returns before it.

`sample(probs, rng)` draws one id by inverse CDF with a single `rng.random()` (`sample_at(probs, u)` with a given
u); `greedy` is the temperature-0 choice. All functions are pure: inputs are never modified. `PositionalUniforms`
fixes the uniform of each position for seeded generations (see its docstring).

`warp` above is the readable specification. The loop runs `warp_probs`, the same distribution computed candidates
first, as a `Probs`: where a filter keeps few tokens (top-k, min-p, a top-p nucleus), only they are ever touched
after one or two comparison passes over the row, and the distribution is their ids and weights (float64, the same
arithmetic as `warp` on the same kept set); with no filter (temperature alone) the weights are one float32 pass of
exp over the row. tests/test_sampling_fast.py checks it against `warp` on many random rows. A `Probs` answers
p(t) from its normaliser (`prob`), is sampled by the same inverse CDF (`sample_at`: the support's weights in id
order, so the same u picks the same token as on the dense row up to rounding), and becomes the dense row on demand
(`np.asarray`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from edgespec.config import SamplingParams
from edgespec.prompts.infill import InfillVocab, infill_filter

_CUT_STEP = 1.0 / 64.0  # top-p: each candidate cut is this fraction of the previous one
_SPARSE_MIN_SIZE = 4096  # sample: rows longer than this are checked for sparsity first
_BLOCK = 1024  # sample: rows longer than _SPARSE_MIN_SIZE are searched block by block (block sums, then one block)
_ONES32 = np.ones(_BLOCK, dtype=np.float32)


class NonFiniteLogitsError(ValueError):
    """A logits row holds NaN or +inf, or no finite value at all: nothing can be sampled from it. The loop reads every
    row it uses through `greedy` or `warp_probs`/`warp`, which raise this, so a model's rows need no separate pass to
    check them (speculate turns it into the BackendError of the model that produced the row)."""


def _as_logits(logits: np.ndarray) -> np.ndarray:
    """A 1-D float32/float64 view of `logits` (other dtypes are converted to float64)."""
    x = np.asarray(logits)
    if x.dtype != np.float32 and x.dtype != np.float64:
        x = x.astype(np.float64)
    if x.ndim != 1 or x.size == 0:
        raise ValueError(f"logits must be a non-empty 1-D array, got shape {x.shape}")
    return x


def _history_window(history: Sequence[int], params: SamplingParams, n_vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """The distinct token ids among the last `repeat_last_n` tokens of history that lie in [0, n_vocab),
    with how often each occurs there."""
    n = params.repeat_last_n
    if n <= 0 or len(history) == 0:
        empty = np.empty(0, dtype=np.int64)
        return empty, empty
    window = np.asarray(history[-n:], dtype=np.int64)
    window = window[(window >= 0) & (window < n_vocab)]
    tokens, counts = np.unique(window, return_counts=True)
    return tokens, counts


def apply_penalties(logits: np.ndarray, params: SamplingParams, history: Sequence[int] = ()) -> np.ndarray:
    """Step 1: repeat / presence / frequency penalties on raw logits (see the module docstring).

    Returns a new array of the input's float dtype, or the input itself when no penalty applies; the input is
    never modified. The arithmetic is done in float64 and rounded once to the logits' dtype.
    """
    x = _as_logits(logits)
    if not params.uses_history:
        return x
    tokens, counts = _history_window(history, params, x.size)
    if tokens.size == 0:
        return x
    old = x[tokens].astype(np.float64)
    rp = float(params.repeat_penalty)
    new = np.where(old > 0.0, old / rp, old * rp)
    new = new - counts * float(params.frequency_penalty) - float(params.presence_penalty)
    out = x.copy()
    out[tokens] = new
    return out


def _argmax(x: np.ndarray) -> int:
    """Index of the largest finite value; ties go to the lowest index (np.argmax's rule)."""
    i = int(np.argmax(x))
    v = x[i]
    if not np.isfinite(v):
        # np.argmax returns the first NaN if there is one; +inf or all -inf are also unusable.
        raise NonFiniteLogitsError(f"logits must be finite or -inf with at least one finite value, got max {v}")
    return i


def greedy(logits: np.ndarray, params: SamplingParams, history: Sequence[int] = ()) -> int:
    """The temperature-0 choice: argmax of the penalised logits, ties to the lowest token id."""
    return _argmax(apply_penalties(logits, params, history))


def _first_ties(x: np.ndarray, value: float, count: int) -> np.ndarray:
    """The `count` lowest indices i with x[i] == value (ascending)."""
    if count <= 0:
        return np.empty(0, dtype=np.intp)
    return np.flatnonzero(x == value)[:count]


def _largest_mask(x: np.ndarray, n: int, threshold: float) -> np.ndarray:
    """Boolean mask of the n largest entries of x by (value descending, index ascending), given that the n-th
    largest value is `threshold`: everything strictly above it, then the lowest-index ties at it."""
    mask = x > threshold
    mask[_first_ties(x, threshold, n - int(np.count_nonzero(mask)))] = True
    return mask


def top_k_indices(x: np.ndarray, k: int) -> np.ndarray:
    """Ascending ids of exactly the k largest entries of x; ties at the boundary go to the lower ids.

    O(V): one np.partition for the k-th largest value, then a comparison pass (no sort of x).
    """
    n = x.size
    if k >= n:
        return np.arange(n)
    if k <= 0:
        return np.empty(0, dtype=np.intp)
    kth = x.dtype.type(np.partition(x, n - k)[n - k])
    return np.flatnonzero(_largest_mask(x, k, kth))


def _softmax_weights(x: np.ndarray, x_max: float, temperature: float) -> np.ndarray:
    """w = exp((x - max x) / T) in float64 (x_max = max x, finite); max w == 1 exactly, -inf logits give 0."""
    z = np.subtract(x, x_max, dtype=np.float64)
    with np.errstate(over="ignore"):  # a tiny temperature sends gaps to -inf: weight 0, as it should
        z /= temperature
    return np.exp(z, out=z)


def _nucleus_size(p: np.ndarray, top_p: float) -> tuple[float, int]:
    """For probabilities p: the smallest n such that the n largest p, summed largest first in float64, reach
    top_p (n = len(p) if they never do), and the n-th largest value.

    Exact without sorting p: for a cut c, the candidates {p >= c} are the top-m values of p (ties at c all
    included), so the cumulative sums of their sorted values are exactly the first m cumulative sums of the
    full sort. Cuts go down from max p in steps of 1/64 (a logit gap of ln 64 at T = 1) until the candidates
    reach top_p; once they would be half of p, p is sorted outright (a near-uniform distribution).
    """
    size = p.size
    cut = float(p.max())
    while True:
        cut *= _CUT_STEP
        candidates = p >= cut
        if 2 * int(np.count_nonzero(candidates)) >= size or cut == 0.0:
            top = np.sort(p)[::-1]
        else:
            top = np.sort(p[candidates])[::-1]
        cum = np.cumsum(top, dtype=np.float64)
        if cum[-1] >= top_p or top.size == size:
            n = min(int(np.searchsorted(cum, top_p, side="left")) + 1, top.size)
            return float(top[n - 1]), n


def top_p_mask(p: np.ndarray, top_p: float) -> np.ndarray:
    """Boolean mask of the nucleus of p: the shortest prefix of p sorted descending (ties: lower index first)
    whose float64 cumulative sum is >= top_p; never empty."""
    if top_p >= 1.0:
        return np.ones(p.size, dtype=bool)
    threshold, n = _nucleus_size(p, top_p)
    return _largest_mask(p, n, threshold)


def _min_p_candidates(x: np.ndarray, x_max: float, params: SamplingParams) -> np.ndarray:
    """Ascending ids that can survive min-p: a cheap superset of {t : exp((l_t - max l)/T) >= min_p},
    computed on the logits with a safety margin so that the exact test can run on far fewer exp() calls."""
    cut = x_max + params.temperature * math.log(params.min_p)
    cut -= 1e-4 * (1.0 + abs(x_max) + abs(cut))  # margin >> float32/float64 rounding of the exact test
    return np.flatnonzero(x >= cut)


def warp(
    logits: np.ndarray, params: SamplingParams, history: Sequence[int] = (), infill_vocab: InfillVocab | None = None
) -> np.ndarray:
    """The target distribution p for the next token: float64 probabilities of length V summing to 1, exact
    zeros outside the kept set. Steps and their order are in the module docstring; `infill_vocab` (the model's
    vocabulary, infill.InfillVocab) is needed with params.infill."""
    x = apply_penalties(logits, params, history)
    n_vocab = x.size
    if params.temperature == 0.0:
        probs = np.zeros(n_vocab)
        probs[_argmax(x)] = 1.0
        return probs
    x_max = float(x.max())
    if not math.isfinite(x_max):  # NaN anywhere, +inf, or every logit -inf
        raise NonFiniteLogitsError(f"logits must be finite or -inf with at least one finite value, got max {x_max}")
    if not math.isfinite(params.temperature):
        raise ValueError(f"temperature must be finite, got {params.temperature}")

    # ids: the kept set K as ascending token ids (None = the whole vocabulary); xk = the logits of K.
    ids: np.ndarray | None = None
    if 0 < params.top_k < n_vocab:
        ids = top_k_indices(x, params.top_k)
    elif params.top_p >= 1.0 and params.min_p > 0.0:
        # min-p alone: p_t / max p = w_t, so the full normaliser is not needed; exp() only the candidates.
        ids = _min_p_candidates(x, x_max, params)
    xk = x if ids is None else x[ids]

    w = _softmax_weights(xk, x_max, params.temperature)
    keep: np.ndarray | None = None  # boolean mask over K (None = all of K)
    if params.top_p < 1.0:
        w /= w.sum()  # p over K, in place (no second vocabulary-sized array)
        keep = top_p_mask(w, params.top_p)
    if params.min_p > 0.0:
        # w is p, or p times the normaliser: the test p_t >= min_p * max p is scale-free. The max of K is
        # always kept (top-p keeps the most likely token), so max over K is max over the kept set.
        survives = w >= params.min_p * float(w.max())
        keep = survives if keep is None else keep & survives

    if keep is not None:
        if 4 * int(np.count_nonzero(keep)) > keep.size:
            w[~keep] = 0.0
        else:  # a small kept set: gather it instead of touching every entry again
            sel = np.flatnonzero(keep)
            w = w[sel]
            ids = sel if ids is None else ids[sel]
    w /= w.sum()
    if ids is None:
        probs = w
    else:
        probs = np.zeros(n_vocab)
        probs[ids] = w
    if params.infill:
        if infill_vocab is None:
            raise ValueError("SamplingParams.infill needs the vocabulary (infill_vocab)")
        return infill_filter(probs, infill_vocab)
    return probs


def sample(probs: "np.ndarray | Probs", rng: np.random.Generator) -> int:
    """Draw one token id t with probability probs[t] / sum(probs), by inverse CDF with exactly one
    rng.random() draw (see sample_at)."""
    return sample_at(probs, rng.random())


def sample_at(probs: "np.ndarray | Probs", u: float) -> int:
    """The inverse CDF of probs / sum(probs) at u in [0, 1): the first id whose cumulative mass exceeds u * total.

    Never returns a zero-probability id: a zero adds exactly nothing to the cumulative sum, so the first
    cumulative value > u * total always belongs to a positive entry; a u that rounds onto the total goes to the
    last positive id.
    """
    if isinstance(probs, Probs):  # its support's weights in id order: the same cumulative sums as the dense row
        j = _inverse_cdf(probs.w, u, probs.blocks)
        return j if probs.ids is None else int(probs.ids[j])
    probs = np.asarray(probs)
    if probs.ndim != 1:
        raise ValueError(f"probs must be 1-D, got shape {probs.shape}")
    values, support = probs, None
    if probs.size > _SPARSE_MIN_SIZE:
        positive = probs > 0.0
        n_positive = int(np.count_nonzero(positive))
        if 8 * n_positive < probs.size:  # a filtered row: cumulate only its support (same partial sums)
            support = np.flatnonzero(positive)
            values = probs[support]
    i = _inverse_cdf(values, u)
    return i if support is None else int(support[i])


def _block_sums(values: np.ndarray) -> np.ndarray:
    """The sums of values[0:B], values[B:2B], ... (B = _BLOCK; the last block may be short), as float64: each block
    summed in its own dtype (numpy's pairwise sum, vectorised), then widened."""
    n_full = values.size // _BLOCK * _BLOCK
    if values.dtype == np.float32:  # a matrix-vector product (BLAS): ~4x faster than numpy's row-wise reduction
        sums = (values[:n_full].reshape(-1, _BLOCK) @ _ONES32).astype(np.float64)
    else:
        sums = values[:n_full].reshape(-1, _BLOCK).sum(axis=1).astype(np.float64)
    if n_full < values.size:
        sums = np.append(sums, float(values[n_full:].sum(dtype=np.float64)))
    return sums


def _inverse_cdf(values: np.ndarray, u: float, blocks: np.ndarray | None = None) -> int:
    """sample_at on a 1-D array of non-negative weights: the first index whose cumulative weight exceeds u * total.
    A long row is searched in two steps, the same inverse CDF up to rounding: the block sums (`blocks`, computed here
    when not given) find the block holding u * total, and only that block is cumulated (a full cumulative sum of 152k
    entries costs ~10x more)."""
    if values.ndim != 1:
        raise ValueError(f"probs must be 1-D, got shape {values.shape}")
    if values.size == 0 or not (values.min() >= 0.0):
        raise ValueError("probs must be non-negative with a positive entry (and no NaN)")
    if values.size > _SPARSE_MIN_SIZE:
        starts = np.arange(0, values.size, _BLOCK)
        block_cdf = (blocks if blocks is not None else _block_sums(values)).cumsum()
        total = float(block_cdf[-1])
        if not (0.0 < total < np.inf):
            raise ValueError(f"probs must be finite with a positive entry, sum is {total}")
        target = u * total
        b = int(block_cdf.searchsorted(target, side="right"))
        if b == block_cdf.size:  # rounded up onto the total: the last block with weight
            b = int(np.flatnonzero(np.diff(block_cdf, prepend=0.0) > 0.0)[-1])
        base = float(block_cdf[b - 1]) if b else 0.0
        seg = values[starts[b] : starts[b] + _BLOCK]
        cdf = seg.cumsum(dtype=np.float64)
        j = int(cdf.searchsorted(target - base, side="right"))
        if j == cdf.size:  # the block's own sum rounded below the target: its last positive entry
            j = int(np.flatnonzero(seg > 0.0)[-1])
        return int(starts[b]) + j
    cdf = values.cumsum(dtype=np.float64)
    total = float(cdf[-1])
    if not (0.0 < total < np.inf):
        raise ValueError(f"probs must be finite with a positive entry, sum is {total}")
    i = int(cdf.searchsorted(u * total, side="right"))
    if i == cdf.size:  # u * total rounded up onto the total: the last positive entry
        i = int(np.flatnonzero(values > 0.0)[-1])
    return i


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
        self.blocks = blocks if blocks is not None else _block_sums(w) if w.size > _SPARSE_MIN_SIZE else None
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


def _top_k_candidates(x: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """(ascending ids of exactly the k largest entries of x, ties at the boundary to the lower ids, as top_k_indices;
    max x), selected among candidates. View x as R rows of m columns (x[r * m + j]); column j's entries are a group.
    Take c = the k-th largest of the groups' maxima: at least k entries are >= c (one in each of those k groups), so
    {x >= c} holds every one of the k largest and every tie at the k-th value, and the exact selection runs on it
    alone; only the columns whose maximum reaches c are searched. The column maxima are one vectorised pass (an
    elementwise max down the rows), instead of a partition of the whole row."""
    n = x.size
    if 64 * k >= n:
        return top_k_indices(x, k), float(x.max())
    rows = _TOP_K_ROWS
    m = n // rows
    grid = x[: rows * m].reshape(rows, m)
    maxima = grid.max(axis=0)
    tail = x[rows * m :]
    every = np.concatenate([maxima, tail]) if tail.size else maxima
    x_max = float(every.max())
    c = np.partition(every, every.size - k)[every.size - k]
    cols = np.flatnonzero(maxima >= c)
    r, j = np.nonzero(grid[:, cols] >= c)
    cand = r * m + cols[j]
    if tail.size:
        cand = np.concatenate([cand, rows * m + np.flatnonzero(tail >= c)])
    if 4 * cand.size > n:  # a flat row: no gain
        return top_k_indices(x, k), x_max
    cand.sort()
    return cand[top_k_indices(x[cand], k)], x_max


_TOP_K_ROWS = 64  # _top_k_candidates: rows of the grid (n // 64 groups of 64 entries)


_SMALL_KEPT = 4096  # a kept set this small is filtered after one sort of it (_warp_small)


def _warp_small(xk: np.ndarray, ids: np.ndarray, x_max: float, params: SamplingParams, n_vocab: int) -> Probs:
    """Steps 4-7 of warp on a small kept set K (logits xk of the ascending ids), with one sort of K by (p descending,
    id ascending) instead of warp's masks: the top-p nucleus and the min-p survivors are both prefixes of that order
    (warp keeps the lowest ids among ties at a cut, as this order does). The same float64 arithmetic as warp: w, the
    normaliser summed in id order, the cumulative sums of the sorted p."""
    w = _softmax_weights(xk, x_max, params.temperature)
    n = w.size
    if params.top_p >= 1.0 and params.min_p <= 0.0:
        return Probs(n_vocab, ids, w)
    order = np.lexsort((ids, -w))
    test = w[order]
    if params.top_p < 1.0:
        test = test / w.sum()  # p over K, as warp normalises before top-p
        cum = np.cumsum(test)
        n = min(int(np.searchsorted(cum, params.top_p, side="left")) + 1, n)
    if params.min_p > 0.0:
        n = min(n, int(np.count_nonzero(test >= params.min_p * float(test[0]))))
    if n == w.size:
        return Probs(n_vocab, ids, w)
    sel = np.sort(order[:n])
    return Probs(n_vocab, ids[sel], w[sel])


_LOG2E = 1.0 / math.log(2.0)


def _temperature_row(x: np.ndarray, temperature: float) -> Probs | None:
    """A long float32 row under temperature alone, in three passes: float32 weights exp(l / T), as
    exp2(l * (log2(e) / T)) (the float32 rounding of that product makes each weight's relative error at most ~5e-6
    where |l / T| < 88), and their block sums.
    None where that does not hold warp's distribution to float32 rounding, and the caller's general path (which
    subtracts the maximum first, and names bad logits) takes over: a short or float64 row, T < 0.01, and any row
    whose normaliser is not finite (exp(l / T) overflowed; NaN or +inf logits) or below 4.5e-5 (then the largest
    weight could be tiny enough to lose precision; all logits -inf gives 0). With a normaliser in [4.5e-5, inf) the
    largest weight is at least 4.5e-5 / V, so every entry within 65 / T of the largest logit is a normal float32 and
    what falls below that weighs under e^-65 of the largest: the same arithmetic as exp((l - max l) / T) up to rounding,
    without the pass that finds the maximum."""
    if x.dtype != np.float32 or x.size <= _SPARSE_MIN_SIZE or not temperature >= 0.01 or not math.isfinite(temperature):
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        w = np.multiply(x, np.float32(_LOG2E / temperature))
        np.exp2(w, out=w)  # numpy's float32 exp2 is ~2x its exp
        blocks = _block_sums(w)
    total = float(blocks.sum())
    if not 4.5e-5 <= total < math.inf:
        return None
    return Probs(x.size, None, w, total, blocks)


def warp_probs(
    logits: np.ndarray, params: SamplingParams, history: Sequence[int] = (), infill_vocab: InfillVocab | None = None
) -> Probs:
    """`warp`'s distribution, computed candidates first, as a Probs (see the module docstring). With a filter that
    keeps a subset, the arithmetic on the kept set is warp's own (float64, same order); a long float32 row that no
    filter narrows has float32 weights exp(l / T) (or exp((l - max l) / T) where exp(l / T) could overflow) normalised
    by the float64 sum of their block sums. Rows of at most 4,096 entries are computed in float64 throughout (what the
    exact-law tests enumerate)."""
    x = apply_penalties(logits, params, history)
    n_vocab = x.size
    if params.temperature == 0.0:
        return Probs(n_vocab, np.array([_argmax(x)]), np.ones(1), 1.0)
    ids: np.ndarray | None = None
    if params.top_k <= 0 or params.top_k >= n_vocab:
        if params.top_p >= 1.0 and params.min_p <= 0.0 and not params.infill:
            row = _temperature_row(x, params.temperature)
            if row is not None:
                return row
    if 0 < params.top_k < n_vocab and np.isfinite(params.temperature):
        ids, x_max = _top_k_candidates(x, params.top_k)
    else:
        x_max = float(x.max())
    if not math.isfinite(x_max):  # NaN anywhere, +inf, or every logit -inf
        raise NonFiniteLogitsError(f"logits must be finite or -inf with at least one finite value, got max {x_max}")
    if not math.isfinite(params.temperature):
        raise ValueError(f"temperature must be finite, got {params.temperature}")
    if ids is not None:
        pass
    elif params.top_p >= 1.0 and params.min_p > 0.0:
        ids = _min_p_candidates(x, x_max, params)
    if ids is not None and ids.size <= _SMALL_KEPT and not params.infill:
        return _warp_small(x[ids], ids, x_max, params, n_vocab)
    if ids is None and x.dtype == np.float32 and x.size > _SPARSE_MIN_SIZE and params.temperature >= 0.01 and not params.infill:
        scale = 1.0 / params.temperature
        if -10.0 <= x_max * scale <= 80.0:  # exp(l / T) neither overflows nor loses the max: no subtraction pass
            w = np.multiply(x, np.float32(scale)) if scale != 1.0 else x
            w = np.exp(w, out=w if w is not x else None)
        else:
            w = np.subtract(x, np.float32(x_max))
            with np.errstate(over="ignore"):
                w *= np.float32(scale)
            np.exp(w, out=w)
    else:
        w = _softmax_weights(x if ids is None else x[ids], x_max, params.temperature)
    keep: np.ndarray | None = None
    test = w
    if params.top_p < 1.0:
        test = w / w.sum(dtype=np.float64)  # p over K, as warp normalises before top-p (and tests min-p on it)
        keep = top_p_mask(test, params.top_p)
    if params.min_p > 0.0:
        survives = test >= params.min_p * float(test.max())
        keep = survives if keep is None else keep & survives
    if keep is not None and not keep.all():
        sel = np.flatnonzero(keep)
        w = w[sel].astype(np.float64)
        ids = sel if ids is None else ids[sel]
    out = Probs(n_vocab, ids, w)
    if params.infill:
        if infill_vocab is None:
            raise ValueError("SamplingParams.infill needs the vocabulary (infill_vocab)")
        return Probs.dense_row(infill_filter(np.asarray(out), infill_vocab))
    return out


class PositionalUniforms:
    """Seeded randomness fixed by position: `at(t)` is the uniform for the token at context position t, the same
    whichever way the generation gets there. A seeded generation samples the target's token at t with at(t), and a
    draft samples its candidate for t with the same at(t) (common random numbers): a draft token is kept exactly
    when it equals the target's own sample, so speculative output equals plain output token for token, whatever
    the draft, the draft lengths or the machine's speed."""

    BLOCK = 1024

    def __init__(self, seed: int) -> None:
        self.seed = int(seed)
        self._blocks: dict[int, np.ndarray] = {}

    def at(self, position: int) -> float:
        b, i = divmod(int(position), self.BLOCK)
        block = self._blocks.get(b)
        if block is None:
            block = self._blocks[b] = np.random.default_rng([self.seed, b]).random(self.BLOCK)
        return float(block[i])


__all__ = [
    "apply_penalties", "greedy", "sample", "sample_at", "PositionalUniforms", "Probs", "top_k_indices", "top_p_mask", "warp",
    "warp_probs",
]
