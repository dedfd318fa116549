"""Exact speculative sampling: decide how many drafted tokens the target keeps, and what comes next.

Pure numpy. Notation follows Leviathan et al. 2023 ("Fast Inference from Transformers via Speculative
Decoding") and Chen et al. 2023: p = the target's distributions, q = the draft's.

A cycle drafts d_0..d_{k-1}, d_i ~ q_i, and the target scores the prefix once, giving p_0..p_k (p_i is the
target distribution after the prompt + d_0..d_{i-1}). For i = 0, 1, ...:

    accept d_i with probability min(1, p_i(d_i) / q_i(d_i))          (one u ~ U[0,1): accept iff u*q < p)
    at the first rejection emit x ~ normalize(max(0, p_i - q_i)) and stop;
    if all k are accepted emit the bonus x ~ p_k.

Every emitted token is then distributed exactly as the target alone would have produced it:
P(emit t at i) = min(p_i(t), q_i(t)) + (1 - sum_t' min(p_i(t'), q_i(t'))) * residual_i(t) = p_i(t).
The acceptance probability at a position is sum_t min(p_i(t), q_i(t)) (`expected_acceptance`).

Conventions and corner cases:
- q_i = None is a deterministic proposal (n-gram lookup, greedy draft): q_i is one-hot at d_i, so d_i is
  accepted with probability p_i(d_i) and the residual is p_i with d_i removed.
- q_i(d_i) == 0: the draft claims it sampled a token it gave zero probability. That cannot happen when d_i ~ q_i
  (an event of q-probability 0), so the only safe reading is "no evidence": it is rejected and the next token
  comes from the residual normalize(max(0, p_i - q_i)).
- p_i(d_i) == 0 (d_i outside the target's top-k / top-p / min-p support, or an id past p's vocabulary):
  always rejected.
- A residual that is all zeros (p_i <= q_i everywhere, i.e. p_i == q_i on the support: rejection has
  probability 0 in exact arithmetic, but rounding or the q(d) == 0 rule can still get there) falls back to
  sampling p_i itself.
- Draft and target vocabularies may differ in size (by up to ~128 padding ids): the shorter row is treated as
  padded with zeros; only the first len(p_i) ids can ever be emitted.
- k = 0: the result is a sample of p_0, reported as a bonus (all zero drafts were accepted).
- Random draws: one rng.random() per examined draft position, then one for the emitted token (via `sample`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .sampling import Probs, sample, sample_at



@dataclass(frozen=True)
class Verdict:
    """The outcome of verifying one draft.

    n_accepted: how many drafted tokens are kept (a prefix d_0..d_{n-1}).
    token: the next token after them: the residual sample at the first rejection (bonus=False), or the
        bonus sample from p_k when all k drafts were accepted (bonus=True).
    chances: for each draft position the rule examined (d_0..d_n, or all k when every one was kept), the probability
        it had of being accepted there (`expected_acceptance`): the expectation of the accepted/rejected indicator
        given the rows, from which an acceptance estimate learns with less noise than from the draw itself
        (Rao-Blackwell). Filled in by speculate.verify (see there when); empty otherwise.
    """

    n_accepted: int
    token: int
    bonus: bool
    chances: tuple[float, ...] = ()


def _prob(row: np.ndarray | Probs, token: int) -> float:
    """row[token], or 0 for an id past the end of the row (a padded vocabulary)."""
    if isinstance(row, Probs):
        return row.prob(token)
    return float(row[token]) if token < row.shape[0] else 0.0


def residual(p_row: np.ndarray | Probs, q_row: np.ndarray | Probs | None, draft_token: int) -> np.ndarray | Probs:
    """max(0, p - q) over p's vocabulary (unnormalised), with q padded by zeros or truncated to len(p);
    q_row None means q is one-hot at draft_token. A Probs p gives a Probs (on p's support: nowhere else can
    p - q be positive)."""
    if isinstance(p_row, Probs):
        return p_row.minus(q_row, draft_token)
    r = np.array(p_row, dtype=np.float64)
    if q_row is None:
        if draft_token < r.shape[0]:
            r[draft_token] = 0.0  # max(0, p(d) - 1) = 0
        return r
    q = np.asarray(q_row, dtype=np.float64)
    n = min(r.shape[0], q.shape[0])
    r[:n] -= q[:n]
    np.maximum(r, 0.0, out=r)
    return r


def _positive(r: np.ndarray | Probs) -> bool:
    return r.total > 0.0 if isinstance(r, Probs) else bool(r.any())


def accept_sampled(
    draft_tokens: Sequence[int],
    q: Sequence[np.ndarray | Probs | None],
    p: Sequence[np.ndarray | Probs] | np.ndarray,
    rng: np.random.Generator,
) -> Verdict:
    """Verify k drafted tokens by exact speculative sampling (see the module docstring).

    draft_tokens: d_0..d_{k-1}.
    q: k entries, q[i] the probability row d_i was sampled from, or None for a deterministic proposal.
    p: k+1 target probability rows (from `warp`), p[i] scored after d_0..d_{i-1}.
    """
    k = len(draft_tokens)
    if len(q) != k:
        raise ValueError(f"q must have one row per drafted token: {len(q)} rows for {k} tokens")
    if len(p) != k + 1:
        raise ValueError(f"p must have k+1 = {k + 1} rows, got {len(p)}")
    for i in range(k):
        d_i = int(draft_tokens[i])
        if d_i < 0:
            raise ValueError(f"draft token {d_i} is negative")
        p_i = _row(p[i])
        q_raw = q[i]
        q_i = None if q_raw is None else _row(q_raw)
        u = rng.random()
        p_d = _prob(p_i, d_i)
        q_d = 1.0 if q_i is None else _prob(q_i, d_i)
        if q_d > 0.0 and u * q_d < p_d:  # u < p/q: accepted with probability min(1, p/q)
            continue
        r = residual(p_i, q_i, d_i)
        if not _positive(r):  # p <= q everywhere: rejection had probability 0; sample the target instead
            r = p_i
        return Verdict(n_accepted=i, token=sample(r, rng), bonus=False)
    return Verdict(n_accepted=k, token=sample(_row(p[k]), rng), bonus=True)


def _row(r: np.ndarray | Probs) -> np.ndarray | Probs:
    return r if isinstance(r, Probs) else np.asarray(r)


def accept_greedy(draft_tokens: Sequence[int], target_tokens: Sequence[int]) -> Verdict:
    """Verification at temperature 0: target_tokens[i] = argmax p_i for the k+1 target rows. Keep the longest
    prefix where d_i == target_tokens[i]; the next token is target_tokens[n] (a bonus when n == k)."""
    k = len(draft_tokens)
    if len(target_tokens) != k + 1:
        raise ValueError(f"target_tokens must have k+1 = {k + 1} entries, got {len(target_tokens)}")
    n = 0
    while n < k and int(draft_tokens[n]) == int(target_tokens[n]):
        n += 1
    return Verdict(n_accepted=n, token=int(target_tokens[n]), bonus=n == k)


def accept_coupled(draft_tokens: Sequence[int], p: Sequence[np.ndarray | Probs] | np.ndarray, uniforms: Sequence[float]) -> Verdict:
    """Verification with common random numbers (seeded generations). uniforms[i] is the uniform fixed for the
    position of draft token i (the draft sampled its candidate there with the same number). The target's token at
    position i is x_i = sample_at(p_i, uniforms[i]); the longest prefix with d_i == x_i is kept and the next token is
    x_n (a bonus when n == k).

    Exact pathwise: every emitted token is x_i, the inverse-CDF sample of p_i at a uniform that nothing before
    position i depends on, so the output is the plain seeded output token for token. For a deterministic draft the
    acceptance probability is p_i(d_i), as with accept_sampled; for a sampled draft it is the overlap of the two
    inverse CDFs at a common u, at most sum min(p, q).
    """
    k = len(draft_tokens)
    if len(p) != k + 1 or len(uniforms) < k + 1:
        raise ValueError(f"need k+1 = {k + 1} target rows and uniforms, got {len(p)} and {len(uniforms)}")
    for i in range(k + 1):
        x = sample_at(_row(p[i]), float(uniforms[i]))
        if i == k or int(draft_tokens[i]) != x:
            return Verdict(n_accepted=i, token=x, bonus=i == k)
    raise AssertionError("unreachable")  # pragma: no cover


def expected_acceptance(p_row: np.ndarray | Probs, q_row: np.ndarray | Probs | None, draft_token: int | None = None) -> float:
    """The probability that one drafted token is accepted: sum_t min(p(t), q(t)) (rows padded with zeros to a
    common length); for a deterministic proposal (q_row None) it is p(draft_token)."""
    if q_row is None:
        if draft_token is None:
            raise ValueError("a deterministic proposal (q_row None) needs its draft_token")
        return _prob(_row(p_row), int(draft_token))
    if isinstance(p_row, Probs):
        return p_row.overlap(q_row)
    if isinstance(q_row, Probs):
        return q_row.overlap(p_row)
    p_row = np.asarray(p_row, dtype=np.float64)
    q_row = np.asarray(q_row, dtype=np.float64)
    n = min(p_row.shape[0], q_row.shape[0])
    return float(np.minimum(p_row[:n], q_row[:n]).sum())


__all__ = ["Verdict", "accept_greedy", "accept_sampled", "accept_coupled", "expected_acceptance", "residual"]
