"""`warp_probs`: warp_spec.warp's distribution computed candidates first, as a `Probs` (probs.py); what the loop
runs. Pure numpy.

Where a filter keeps few tokens (top-k, min-p, a top-p nucleus), only they are ever touched after one or two comparison
passes over the row, and the distribution is their ids and weights (float64, the same arithmetic as `warp` on the same
kept set); with no filter (temperature alone) the weights are one float32 pass of exp over the row.
tests/decoding/test_sampling_fast.py checks it against `warp` on many random rows.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from edgespec.config import SamplingParams
from edgespec.prompts.infill import InfillVocab, infill_filter
from .probs import SPARSE_MIN_SIZE, Probs, block_sums
from .warp_spec import NonFiniteLogitsError, apply_penalties, finite_argmax, min_p_candidates, softmax_weights, top_k_indices, top_p_mask


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
    w = softmax_weights(xk, x_max, params.temperature)
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
    if x.dtype != np.float32 or x.size <= SPARSE_MIN_SIZE or not temperature >= 0.01 or not math.isfinite(temperature):
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        w = np.multiply(x, np.float32(_LOG2E / temperature))
        np.exp2(w, out=w)  # numpy's float32 exp2 is ~2x its exp
        blocks = block_sums(w)
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
        return Probs(n_vocab, np.array([finite_argmax(x)]), np.ones(1), 1.0)
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
        ids = min_p_candidates(x, x_max, params)
    if ids is not None and ids.size <= _SMALL_KEPT and not params.infill:
        return _warp_small(x[ids], ids, x_max, params, n_vocab)
    if ids is None and x.dtype == np.float32 and x.size > SPARSE_MIN_SIZE and params.temperature >= 0.01 and not params.infill:
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
        w = softmax_weights(x if ids is None else x[ids], x_max, params.temperature)
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


__all__ = ["warp_probs"]
