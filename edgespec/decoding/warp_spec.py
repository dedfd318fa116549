"""Turn one row of logits into the probability distribution p that the next token is drawn from: the readable
specification. Pure numpy.

The same `warp` defines the target distribution on the plain decoding path and in speculative verification, so the
two paths sample from exactly the same p. The loop runs warp_fast.warp_probs, the same distribution computed
candidates first (tests/decoding/test_sampling_fast.py checks the two against each other).

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

`greedy` is the temperature-0 choice. All functions are pure: inputs are never modified.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from edgespec.config import SamplingParams
from edgespec.prompts.infill import InfillVocab, infill_filter

_CUT_STEP = 1.0 / 64.0  # top-p: each candidate cut is this fraction of the previous one


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


def finite_argmax(x: np.ndarray) -> int:
    """Index of the largest finite value; ties go to the lowest index (np.argmax's rule)."""
    i = int(x.argmax())
    v = x[i]
    if not math.isfinite(v):
        # np.argmax returns the first NaN if there is one; +inf or all -inf are also unusable.
        raise NonFiniteLogitsError(f"logits must be finite or -inf with at least one finite value, got max {v}")
    return i


def finite_argmax_rows(x: np.ndarray) -> list[int]:
    """finite_argmax of each row of a 2-D array, in one pass (the same rule and the same error)."""
    idx = x.argmax(axis=1)
    if not np.isfinite(x[np.arange(len(idx)), idx]).all():
        raise NonFiniteLogitsError("logits must be finite or -inf with at least one finite value in every row")
    return [int(i) for i in idx]


def greedy(logits: np.ndarray, params: SamplingParams, history: Sequence[int] = ()) -> int:
    """The temperature-0 choice: argmax of the penalised logits, ties to the lowest token id."""
    return finite_argmax(apply_penalties(logits, params, history))


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


def softmax_weights(x: np.ndarray, x_max: float, temperature: float) -> np.ndarray:
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


def min_p_candidates(x: np.ndarray, x_max: float, params: SamplingParams) -> np.ndarray:
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
        probs[finite_argmax(x)] = 1.0
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
        ids = min_p_candidates(x, x_max, params)
    xk = x if ids is None else x[ids]

    w = softmax_weights(xk, x_max, params.temperature)
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


__all__ = [
    "NonFiniteLogitsError", "apply_penalties", "finite_argmax", "greedy", "min_p_candidates", "softmax_weights", "top_k_indices",
    "top_p_mask", "warp",
]
