"""Online acceptance estimates for the draft-length policies (model_policy.py, lookup_policy.py). Pure numpy: counts in, rates out.

* `AcceptanceEstimator`: a_j, the chance that draft position j is accepted given 1..j-1 were (draft models).
* `MatchLengthEstimator`: α(m), the chance that a lookup's next token is accepted when its source agrees with the
  context on the last m tokens (n-gram and suffix lookups).
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Sequence

import numpy as np


def _examined(n_drafted: int, n_accepted: int, chances: Sequence[float]) -> np.ndarray:
    """What a cycle teaches about each draft position it examined (min(n_accepted + 1, n_drafted) of them): the weight
    of an acceptance there, its chance (clipped to [0, 1]) where one was given for every examined position, else the
    draw (1 for an accepted position, 0 for the first rejected one)."""
    if not (0 <= n_accepted <= n_drafted):
        raise ValueError(f"need 0 <= n_accepted <= n_drafted, got {n_accepted}, {n_drafted}")
    n = min(n_accepted + 1, n_drafted)
    if chances and len(chances) == n:
        return np.clip(np.asarray(chances, dtype=np.float64), 0.0, 1.0)
    return (np.arange(n) < n_accepted).astype(np.float64)


class AcceptanceEstimator:
    """Online estimate of a_j, the chance that draft position j (1..k_max) is accepted given 1..j-1 were.

    Each position keeps decayed counts of acceptances s_j and rejections f_j. A cycle that drafted n tokens
    and had m accepted observes positions 1..m as accepted, position m+1 as rejected when m < n, and leaves
    later positions unobserved. Where the verify knew each examined position's acceptance probability c_j (a sampled
    verify: sum min(p, q)), the position adds c_j to s_j and 1 - c_j to f_j instead of the draw's 1 and 0: the same
    expectation, without the draw's noise (Rao-Blackwell), which at temperature > 0 is most of the noise. Counts are
    multiplied by `decay` per emitted token (plain tokens included, via `age`), so the estimate follows the text
    being written: evidence from ~1/(1-decay) tokens ago weighs 1/e.

    Deep positions are observed rarely, so they borrow strength from the pooled rate (shrinkage):

        pooled = (sum_j s_j + w * prior_mean) / (sum_j (s_j + f_j) + w)
        a_j    = (s_j + w * pooled) / (s_j + f_j + w)              with w = prior_strength,

    i.e. a Beta(w * pooled, w * (1 - pooled)) prior per position whose mean is itself estimated.
    """

    def __init__(
        self, k_max: int, prior_mean: float = 0.5, prior_strength: float = 2.0, decay: float = 0.99
    ) -> None:
        if k_max < 1:
            raise ValueError(f"k_max must be >= 1, got {k_max}")
        if not (0.0 < prior_mean < 1.0) or not (prior_strength > 0) or not (0.0 < decay <= 1.0):
            raise ValueError("need 0 < prior_mean < 1, prior_strength > 0, 0 < decay <= 1")
        self.k_max = k_max
        self.prior_mean = prior_mean
        self.prior_strength = prior_strength
        self.decay = decay
        self.accepted = np.zeros(k_max)
        self.rejected = np.zeros(k_max)

    def age(self, n_tokens: int = 1) -> None:
        """Let n_tokens of text pass: multiply all counts by decay ** n_tokens."""
        factor = self.decay ** max(n_tokens, 0)
        self.accepted *= factor
        self.rejected *= factor

    def update(self, n_drafted: int, n_accepted: int, chances: Sequence[float] = ()) -> None:
        """Fold in one cycle (ageing the counts by the n_accepted + 1 tokens it emitted). chances: the acceptance
        probability of each examined position (min(n_accepted + 1, n_drafted) of them; anything else is ignored and
        the draws count)."""
        c = _examined(n_drafted, n_accepted, chances)[: self.k_max]
        self.age(n_accepted + 1)
        self.accepted[: c.size] += c
        self.rejected[: c.size] += 1.0 - c

    def evidence(self, position: int = 1) -> float:
        """How many (decayed) observations position `position` (1-based) holds."""
        i = position - 1
        return float(self.accepted[i] + self.rejected[i])

    def pooled(self) -> float:
        """Acceptance rate over all positions, shrunk towards prior_mean."""
        w = self.prior_strength
        s, n = self.accepted.sum(), self.accepted.sum() + self.rejected.sum()
        return float((s + w * self.prior_mean) / (n + w))

    def rates(self) -> np.ndarray:
        """Estimates a_1..a_k_max (an array of length k_max)."""
        w = self.prior_strength
        return (self.accepted + w * self.pooled()) / (self.accepted + self.rejected + w)


def _isotonic_increasing(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted least-squares non-decreasing fit of y (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [value, weight, count]
    for yi, wi in zip(y, w):
        blocks.append([float(yi), float(wi), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, c2 = blocks.pop()
            v1, w1, c1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, c1 + c2])
    return np.array([v for v, _, c in blocks for _ in range(int(c))])


class MatchLengthEstimator:
    """α(m): the chance that the next token of an n-gram proposal is accepted when its source agrees with the
    context on the last m tokens (the match's `run`).

    Model: an accepted token extends the agreement by one, so a proposal made at run m has per-position
    acceptance a_j = α(m + j - 1). Every drafted position is then one observation of α at its own run, deep
    positions teach the long-run buckets (from the acceptance probability p(d) of each examined position where the
    verify gave it, at temperature > 0, as AcceptanceEstimator does, else from the draw), and a plain step whose
    emitted token can be compared with what the lookup would have proposed is one free "shadow" observation (unbiased at any temperature: with a one-hot
    proposal d the acceptance probability is p(d), the chance that the target's own token is d).

    Runs are pooled in buckets (BUCKET_EDGES[b] <= m < BUCKET_EDGES[b + 1]). Each keeps decayed counts of
    acceptances and rejections (multiplied by `decay` per emitted token); its estimate is shrunk towards the
    pooled rate with weight `prior_strength` (as in AcceptanceEstimator) and the bucket estimates are then fitted
    non-decreasing in m (weighted isotonic regression): a longer agreement is never taken as a worse sign, and a
    bucket not yet observed inherits from the shorter runs.
    """

    BUCKET_EDGES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)

    def __init__(self, prior_mean: float = 0.5, prior_strength: float = 2.0, decay: float = 0.995) -> None:
        if not (0.0 < prior_mean < 1.0) or not (prior_strength > 0) or not (0.0 < decay <= 1.0):
            raise ValueError("need 0 < prior_mean < 1, prior_strength > 0, 0 < decay <= 1")
        self.prior_mean = prior_mean
        self.prior_strength = prior_strength
        self.decay = decay
        nb = len(self.BUCKET_EDGES)
        self.accepted = np.zeros(nb)
        self.rejected = np.zeros(nb)
        self._alphas: np.ndarray | None = None

    def bucket(self, run: int) -> int:
        return max(bisect_right(self.BUCKET_EDGES, run) - 1, 0)

    def age(self, n_tokens: int = 1) -> None:
        factor = self.decay ** max(n_tokens, 0)
        self.accepted *= factor
        self.rejected *= factor
        self._alphas = None

    def observe(self, run: int, accepted: float) -> None:
        """One drafted (or shadow) position at run `run`: accepted or not (True / False), or the probability it had of
        being accepted."""
        b = self.bucket(run)
        c = min(max(float(accepted), 0.0), 1.0)
        self.accepted[b] += c
        self.rejected[b] += 1.0 - c
        self._alphas = None

    def observe_cycle(self, run: int, n_drafted: int, n_accepted: int, chances: Sequence[float] = ()) -> None:
        """A cycle that drafted n_drafted tokens at run `run` and had the first n_accepted accepted; chances as in
        AcceptanceEstimator.update."""
        c = _examined(n_drafted, n_accepted, chances)
        self.age(n_accepted + 1)
        for i, ci in enumerate(c):
            self.observe(run + i, float(ci))

    def alphas(self) -> np.ndarray:
        """α per bucket (shrunk, then fitted non-decreasing)."""
        if self._alphas is None:
            w = self.prior_strength
            n = self.accepted + self.rejected
            pooled = (self.accepted.sum() + w * self.prior_mean) / (n.sum() + w)
            raw = (self.accepted + w * pooled) / (n + w)
            self._alphas = _isotonic_increasing(raw, n + w)
        return self._alphas

    def rates(self, run: int, k: int) -> np.ndarray:
        """a_1..a_k for a proposal made at run `run`: α(run), α(run + 1), ..."""
        al = self.alphas()
        return np.array([al[self.bucket(run + i)] for i in range(k)])


__all__ = ["AcceptanceEstimator", "MatchLengthEstimator"]
