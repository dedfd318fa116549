"""Exact laws of the acceptance rules, by enumeration (a test helper: pure numpy, no llama.cpp).

The rules draw uniforms (`rng.random()`); here they run with a `ScriptedRng` instead, fed one uniform per draw. Every
rule is a piecewise-constant function of its uniforms, so its law is a finite sum over the cells of a partition of
the uniforms' cube. `run_cell` runs the implementation once per cell (`Branch`: one interval per draw, from the theory
of the rule: accept below min(1, p/q), reject above, the inverse-CDF interval of each token) at the cell's midpoint,
and again at the cell's two extreme corners (every draw just inside the low ends of the intervals, then just inside
the high ends); the caller records the outcome with the cell's measure, and a problem wherever the outcome is not
constant on the cell or the rule drew another number of uniforms than the cell has. The law is then the
implementation's own, up to the probes' resolution (1e-9 of an interval): a rule whose thresholds or intervals differ
from the theory's shows a problem or a wrong law; a correct one gives the target's law to rounding (~1e-15).

The rules that take their randomness as decisions (tree.accept_tree_with with `Draws`) are enumerated by
tree.outcome_distribution; `RngDraws`, which turns those decisions into uniforms, is checked on its own.

`joint(rows, V, K)`: the target's law of the next K tokens. A cycle's emitted tokens e (len(e) <= K) are extended by
the target's own samples (`add_emitted`), so that "the cycle is exact" reads "the law of the first K tokens is the
target's", for every cycle length at once (the first emitted token alone would miss a wrong law of later ones).

`mutant(function, (old, new), ...)`: a copy of a rule with its source text edited (a planted bug), compiled in its
module's namespace; each edit must match exactly once, so a refactor of the rule makes the planted-bug test fail
loudly instead of testing nothing.
"""

from __future__ import annotations

import inspect
import sys
import textwrap
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

TOL = 1e-9  # exact laws must agree with the target's to this (max over cells)
BUG = 1e-3  # a planted bug must move some cell by more than this
Prefix = tuple[int, ...]


# ------------------------------------------------------------------------------------------------ models
class Rows:
    """Next-token rows over V ids that depend on the whole prefix, fixed by (seed, kind, prefix).

    kind: "dirichlet" (Dirichlet(1)), "sparse" (Dirichlet(0.5) with about 40% of the cells exactly 0), "ties" (the two
    largest cells exactly equal and a third within 1e-13 of them), "peaked" (Dirichlet(0.15): cells near 0), "onehot"
    (temperature 0). `mix` (a Rows, weight): the row is (1 - weight) * own + weight * other (a draft close to a target).
    """

    KINDS = ("dirichlet", "sparse", "ties", "peaked", "onehot")

    def __init__(self, V: int, seed: int, kind: str = "dirichlet", mix: tuple["Rows", float] | None = None) -> None:
        if kind not in self.KINDS:
            raise ValueError(kind)
        self.V, self.seed, self.kind, self.mix = V, seed, kind, mix
        self._rows: dict[Prefix, np.ndarray] = {}

    def __call__(self, prefix: Sequence[int]) -> np.ndarray:
        key = tuple(int(t) for t in prefix)
        row = self._rows.get(key)
        if row is None:
            g = np.random.default_rng([self.seed, self.KINDS.index(self.kind), len(key), *key])
            row = self._make(g)
            if self.mix is not None:
                other, w = self.mix
                row = (1.0 - w) * row + w * other(key)
                row /= row.sum()
            row.setflags(write=False)
            self._rows[key] = row
        return row

    def _make(self, g: np.random.Generator) -> np.ndarray:
        V = self.V
        if self.kind == "dirichlet":
            return g.dirichlet(np.ones(V))
        if self.kind == "peaked":
            w = g.dirichlet(np.full(V, 0.15)) + 1e-300
            return w / w.sum()
        if self.kind == "sparse":
            w = g.dirichlet(np.full(V, 0.5))
            zero = g.random(V) < 0.4
            zero[int(g.integers(V))] = False
            w[zero] = 0.0
            return w / w.sum()
        if self.kind == "ties":
            w = g.dirichlet(np.ones(V))
            a, b, c = g.choice(V, size=3, replace=False)
            w[a] = w[b] = max(w[a], w[b])
            w[c] = w[a] * (1.0 - 1e-13)
            return w / w.sum()
        row = np.zeros(V)
        row[int(g.integers(V))] = 1.0
        return row


def joint(rows: Callable[[Prefix], np.ndarray], V: int, K: int, prefix: Prefix = (), memo: dict | None = None) -> np.ndarray:
    """P(the next K tokens after prefix = s) for s in V^K under the next-token rows `rows` (an array of shape (V,)*K).
    memo: a cache for this `rows` only ({(prefix, K): array})."""
    if K == 0:
        return np.ones(())
    memo = memo if memo is not None else {}
    hit = memo.get((prefix, K))
    if hit is not None:
        return hit
    r = rows(prefix)
    out = np.zeros((V,) * K)
    for t in np.flatnonzero(r[:V] > 0):
        out[t] = r[t] * joint(rows, V, K - 1, prefix + (int(t),), memo)
    memo[(prefix, K)] = out
    return out


class Law:
    """The law of the first K tokens after a cycle (cells V^K) from the empty context, accumulated from (emitted
    tokens, probability); after the cycle's tokens come the target's own samples (rows)."""

    def __init__(self, rows: Callable[[Prefix], np.ndarray], V: int, K: int) -> None:
        self.rows, self.V, self.K = rows, V, K
        self.law = np.zeros((V,) * K)
        self.problems: list[str] = []
        self.accepted = np.zeros(K + 1)  # the law of how many drafted tokens the cycle kept (chain enumerations)
        self._memo: dict = {}

    def add_emitted(self, emitted: Sequence[int], weight: float) -> None:
        e = tuple(int(t) for t in emitted)
        if any(t >= self.V for t in e):
            self.problems.append(f"emitted an id past the target's vocabulary: {e}")
            return
        pr = 1.0
        for i, t in enumerate(e):
            pr *= float(self.rows(e[:i])[t])
        if pr == 0.0 and weight > 0.0:  # found however small the cell: the target cannot produce this sequence
            self.problems.append(f"emitted {e}, which the target gives probability 0")
        if len(e) >= self.K:
            self.law[e[: self.K]] += weight
            return
        self.law[e] += weight * joint(self.rows, self.V, self.K - len(e), e, self._memo)

    def target(self) -> np.ndarray:
        return joint(self.rows, self.V, self.K, (), self._memo)

    def distance(self) -> float:
        """max over cells of |law - target|."""
        return float(np.abs(self.law - self.target()).max())


# ------------------------------------------------------------------------------------------------ uniforms
class ScriptExhausted(Exception):
    pass


class ScriptedRng:
    """Stands in for np.random.Generator: random() returns the scripted uniforms in order."""

    def __init__(self, uniforms: Sequence[float]) -> None:
        self.uniforms = list(uniforms)
        self.n = 0

    def random(self) -> float:
        if self.n >= len(self.uniforms):
            raise ScriptExhausted(f"the rule drew more than the {len(self.uniforms)} uniforms of its branch")
        u = self.uniforms[self.n]
        self.n += 1
        return float(u)


def probes(lo: float, hi: float) -> list[float]:
    """Points of [lo, hi) where a piecewise-constant rule is evaluated: the middle, and both ends (1e-9 of the width
    inside, at least 1e-15: the rules' own rounding of a threshold is ~1e-16)."""
    w = hi - lo
    mid = lo + 0.5 * w
    eps = max(w * 1e-9, 1e-15)
    if 3 * eps >= w:
        return [mid]
    return [mid, lo + eps, hi - eps]


def cdf_cells(row: np.ndarray) -> list[tuple[int, float, float]]:
    """The inverse-CDF partition of [0, 1) for a non-negative row: (token, lo, hi) for each positive entry, token t for
    u in [C_{t-1} / C, C_t / C) (C the total)."""
    r = np.asarray(row, dtype=np.float64)
    c = np.concatenate([[0.0], np.cumsum(r)])
    total = c[-1]
    return [(int(t), float(c[t] / total), float(c[t + 1] / total)) for t in np.flatnonzero(r > 0)]


@dataclass
class Branch:
    """One cell of the uniforms' partition: its probability, an interval per draw, and what the theory says happens."""

    weight: float
    cells: list[tuple[float, float]]
    expect: Hashable = None


def run_cell(run: Callable[[ScriptedRng], Hashable], cells: Sequence[tuple[float, float]]) -> tuple[Hashable, list[str]]:
    """The outcome of run on one cell (every draw at its interval's middle), and the problems found by running it again
    at the cell's two extreme corners (every draw just above its interval's low end, then just below its high end):
    a threshold or an interval end of the rule that is not the theory's, on either side, changes the outcome there."""
    problems: list[str] = []
    points = [probes(lo, hi) for lo, hi in cells]
    mids = [p[0] for p in points]

    def once(us: list[float]) -> Hashable:
        g = ScriptedRng(us)
        try:
            out = run(g)
        except ScriptExhausted as e:
            problems.append(str(e))
            return ("exhausted",)
        if g.n != len(us):
            problems.append(f"the rule drew {g.n} uniforms where its branch has {len(us)}")
        return out

    base = once(mids)
    for corner in (1, 2):
        us = [p[corner] if len(p) > 1 else p[0] for p in points]
        got = once(us)
        if got != base:
            problems.append(f"not constant on its cell {list(cells)}: {got} at {us}, {base} in the middle")
    return base, problems


# ------------------------------------------------------------------------------------------------ chain rule theory
def prob(row: np.ndarray | None, token: int) -> float:
    if row is None:
        return 1.0
    return float(row[token]) if token < len(row) else 0.0


def chance(p_row: np.ndarray, q_row: np.ndarray | None, d: int) -> float:
    """min(1, p(d) / q(d)) (q None: one-hot at d; q(d) = 0: 0, no evidence)."""
    qd, pd = prob(q_row, d), prob(p_row, d)
    return min(1.0, pd / qd) if qd > 0 else 0.0


def residual_row(p_row: np.ndarray, q_row: np.ndarray | None, d: int) -> np.ndarray:
    """normalise(max(0, p - q)) over p's ids (q padded with zeros or cut), or p itself when that is all zero."""
    q = np.zeros(len(p_row))
    if q_row is None:
        if d < len(p_row):
            q[d] = 1.0
    else:
        n = min(len(p_row), len(q_row))
        q[:n] = q_row[:n]
    r = np.maximum(np.asarray(p_row, dtype=np.float64) - q, 0.0)
    return r if r.sum() > 0 else np.asarray(p_row, dtype=np.float64)


def chain_branches(draft: Sequence[int], q: Sequence[np.ndarray | None], p: Sequence[np.ndarray]) -> list[Branch]:
    """The cells of the chain rule (acceptance.py's docstring): accept d_i for u_i < min(1, p_i/q_i), at the first
    rejection a residual sample, after k acceptances a bonus sample of p_k. expect = (n_accepted, token, bonus)."""
    out: list[Branch] = []
    w, cells = 1.0, []
    k = len(draft)
    for i in range(k):
        a = chance(p[i], q[i], int(draft[i]))
        if a < 1.0:
            for t, lo, hi in cdf_cells(residual_row(p[i], q[i], int(draft[i]))):
                out.append(Branch(w * (1.0 - a) * (hi - lo), cells + [(a, 1.0), (lo, hi)], (i, t, False)))
        if a == 0.0:
            return out
        w *= a
        cells = cells + [(0.0, a)]
    for t, lo, hi in cdf_cells(p[k]):
        out.append(Branch(w * (hi - lo), cells + [(lo, hi)], (k, t, True)))
    return out


def chain_run(rule: Callable[..., Any], *args: Any, **kwargs: Any) -> Callable[[ScriptedRng], tuple[int, int, bool]]:
    """One run of a chain rule on a scripted rng (passed after args), as (n_accepted, token, bonus)."""

    def run(g: ScriptedRng) -> tuple[int, int, bool]:
        v = rule(*args, g, **kwargs)
        return (v.n_accepted, v.token, v.bonus)

    return run


def coupled_cells(rows: Sequence[np.ndarray]) -> list[tuple[float, float]]:
    """The common refinement of the inverse-CDF partitions of several rows of one position (common random numbers)."""
    cuts = {0.0, 1.0}
    for r in rows:
        for _, lo, hi in cdf_cells(r):
            cuts.update((lo, hi))
    c = sorted(cuts)
    return [(a, b) for a, b in zip(c, c[1:]) if b > a]


# ------------------------------------------------------------------------------------------------ drafts
def sampled_drafts(qM: Callable[[Prefix], np.ndarray], k: int, context: Prefix = ()) -> list[tuple[list[int], list[np.ndarray], float]]:
    """Every chain draft d ~ q (d_i from q(context + d[:i])) with its q rows and probability."""
    out = []

    def grow(d: list[int], rows: list[np.ndarray], w: float) -> None:
        if len(d) == k:
            out.append((d, rows, w))
            return
        row = qM(context + tuple(d))
        for t in np.flatnonzero(row > 0):
            grow(d + [int(t)], rows + [row], w * float(row[t]))

    grow([], [], 1.0)
    return out


def sibling_draws(qrow: np.ndarray, b: int, replacement: bool) -> list[tuple[list[tuple[int, np.ndarray]], float]]:
    """Every way to draw b siblings from qrow (i.i.d., or without replacement as tree.sample_children draws them:
    sibling j's row is q without siblings 1..j-1, renormalised), with its probability: [(token, row drawn from)], prob."""
    out: list[tuple[list[tuple[int, np.ndarray]], float]] = []

    def grow(drawn: list[tuple[int, np.ndarray]], row: np.ndarray, w: float) -> None:
        if len(drawn) == b or not row.any():
            out.append((drawn, w))
            return
        for t in np.flatnonzero(row > 0):
            nxt = row
            if not replacement:
                nxt = row.copy()
                nxt[t] = 0.0
                nxt = nxt / nxt.sum() if nxt.sum() > 0 else nxt
            grow(drawn + [(int(t), row)], nxt, w * float(row[t]))

    q = np.asarray(qrow, dtype=np.float64)
    grow([], q / q.sum(), 1.0)
    return out


# ------------------------------------------------------------------------------------------------ planted bugs
def mutant(fn: Callable[..., Any], *edits: tuple[str, str], helpers: Sequence[tuple[Callable[..., Any], Sequence[tuple[str, str]]]] = ()) -> Callable[..., Any]:
    """A copy of `fn` with each (old, new) edit applied to its source (each `old` must occur exactly once), compiled in
    a copy of its module's namespace. `helpers`: other functions of that module to edit in the same namespace (the
    mutant calls the edited helpers)."""
    module = sys.modules[fn.__module__]
    namespace = dict(vars(module))
    for f, f_edits in list(helpers) + [(fn, edits)]:
        src = textwrap.dedent(inspect.getsource(f))
        for old, new in f_edits:
            n = src.count(old)
            if n != 1:
                raise AssertionError(f"planted bug: {old!r} occurs {n} times in {f.__qualname__} (the rule changed: update the mutant)")
            src = src.replace(old, new)
        exec(compile(src, f"<mutant of {f.__qualname__}>", "exec"), namespace)  # noqa: S102 - a test's own source edit
    return namespace[fn.__name__]


def chain_law(
    pM: Callable[[Prefix], np.ndarray],
    V: int,
    k: int,
    *,
    qM: Callable[[Prefix], np.ndarray] | None = None,
    drafts: Sequence[tuple[list[int], list[np.ndarray | None], float]] | None = None,
    rule: Callable[..., Any] | None = None,
    K: int | None = None,
) -> tuple[Law, list[str], float]:
    """The exact law of one cycle of the chain rule followed by the target's own samples (first K = k + 1 tokens),
    over `drafts` (default: every d ~ qM), with its problems and the total weight of cells whose outcome differs from
    the theory's (0 for the reference rule). rule: default accept_sampled."""
    if rule is None:
        from edgespec.decoding.acceptance import accept_sampled as rule
    law = Law(pM, V, K if K is not None else k + 1)
    problems: list[str] = []
    off_theory = 0.0
    if drafts is None:
        assert qM is not None
        drafts = [(d, list(rows), w) for d, rows, w in sampled_drafts(qM, k)]
    for d, qrows, w in drafts:
        p = np.stack([pM(tuple(d[:i])) for i in range(len(d) + 1)])
        for br in chain_branches(d, qrows, p):
            if br.weight == 0.0:
                continue
            out, probs = run_cell(chain_run(rule, d, qrows, p), br.cells)
            problems += probs
            if out != br.expect:
                off_theory += w * br.weight
            if isinstance(out, tuple) and len(out) == 3:
                law.add_emitted(list(d[: out[0]]) + [out[1]], w * br.weight)
                law.accepted[out[0]] += w * br.weight
    return law, problems + law.problems, off_theory
