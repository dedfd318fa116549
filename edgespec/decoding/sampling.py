"""Draw a token from a distribution, and the one import for sampling. Pure numpy.

`sample(probs, rng)` draws one id by inverse CDF with a single `rng.random()` (`sample_at(probs, u)` with a given
u), from a dense row or a `Probs`. `PositionalUniforms` fixes the uniform of each position for seeded generations
(see its docstring).

The distribution itself: warp_spec.py (`warp`, the readable specification: penalties, top-k, softmax/T, top-p, min-p,
infill; `greedy`), warp_fast.py (`warp_probs`, the same distribution candidates first, what the loop runs) and
probs.py (`Probs`, its row type). Their public names are re-exported here: `from edgespec.decoding.sampling import
warp` works as before.
"""

from __future__ import annotations

import numpy as np

from .probs import BLOCK, SPARSE_MIN_SIZE, Probs, block_sums
from .warp_fast import warp_probs
from .warp_spec import NonFiniteLogitsError, apply_penalties, greedy, top_k_indices, top_p_mask, warp


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
    if probs.size > SPARSE_MIN_SIZE:
        positive = probs > 0.0
        n_positive = int(np.count_nonzero(positive))
        if 8 * n_positive < probs.size:  # a filtered row: cumulate only its support (same partial sums)
            support = np.flatnonzero(positive)
            values = probs[support]
    i = _inverse_cdf(values, u)
    return i if support is None else int(support[i])


def _inverse_cdf(values: np.ndarray, u: float, blocks: np.ndarray | None = None) -> int:
    """sample_at on a 1-D array of non-negative weights: the first index whose cumulative weight exceeds u * total.
    A long row is searched in two steps, the same inverse CDF up to rounding: the block sums (`blocks`, computed here
    when not given) find the block holding u * total, and only that block is cumulated (a full cumulative sum of 152k
    entries costs ~10x more)."""
    if values.ndim != 1:
        raise ValueError(f"probs must be 1-D, got shape {values.shape}")
    if values.size == 0 or not (values.min() >= 0.0):
        raise ValueError("probs must be non-negative with a positive entry (and no NaN)")
    if values.size > SPARSE_MIN_SIZE:
        starts = np.arange(0, values.size, BLOCK)
        block_cdf = (blocks if blocks is not None else block_sums(values)).cumsum()
        total = float(block_cdf[-1])
        if not (0.0 < total < np.inf):
            raise ValueError(f"probs must be finite with a positive entry, sum is {total}")
        target = u * total
        b = int(block_cdf.searchsorted(target, side="right"))
        if b == block_cdf.size:  # rounded up onto the total: the last block with weight
            b = int(np.flatnonzero(np.diff(block_cdf, prepend=0.0) > 0.0)[-1])
        base = float(block_cdf[b - 1]) if b else 0.0
        seg = values[starts[b] : starts[b] + BLOCK]
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
    "NonFiniteLogitsError", "apply_penalties", "greedy", "sample", "sample_at", "PositionalUniforms", "Probs", "top_k_indices",
    "top_p_mask", "warp", "warp_probs",
]
