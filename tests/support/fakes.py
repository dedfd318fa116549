"""Numpy fakes of the models the speculation loop talks to, and the exact law of whole generations on them.

* FakeModel: a language model in numpy whose next-token logits are a fixed function of the context,
  W[last token] + len(context) * U[last token] (W, U drawn once from a seeded numpy Generator), with the interface the
  loop (speculate.LanguageModel) and a draft model (speculators.model.DraftModel) use: sync, decode, truncate,
  common_prefix, is_eog. FakeTreeModel adds decode_tree / keep_tree_path (token trees).
* ScriptedDraft: a draft model that predicts its script's token at every position, with confidence 0.99 (the
  policy tests' draft: test_policy_decision, test_rate_guard).
* exact_distribution: the target's law of the first n tokens, enumerated from its rows alone (warp, masks).
* generation_law: the exact law of whatever a whole generation returns, computed by running it once per random
  decision path. The generation gets an `EnumeratingRng` (an np.random.Generator whose random() returns a symbolic
  uniform); every use the loop makes of a uniform (`u * a < b` in the acceptance rules, `sample_at(probs, u)` by
  inverse CDF) becomes a branch point with its exact probability, and the generation is replayed for every branch
  (depth first, as tree.outcome_distribution does for one tree). A uniform used any other way fails the run, so
  the enumeration cannot silently assume something the code does not do.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Hashable, Iterator, Sequence

import numpy as np

import edgespec.decoding.acceptance
import edgespec.decoding.sampling
import edgespec.drafting.model
import edgespec.decoding.tree
from edgespec.config import SamplingParams
from edgespec.decoding.constraint import apply_mask
from edgespec.errors import ContextFullError, StopRequested
from edgespec.llama.prompt_cache import common_prefix
from edgespec.decoding.sampling import warp

V = 8


class FakeModel:
    """A language model in numpy: logits(context) = W[last token] + 0.3 * len(context) * U[last token]."""

    def __init__(self, n_ctx: int = 64, n_vocab: int = V, seed: int = 0, eog: int | None = None, sharp: float = 2.0) -> None:
        rng = np.random.default_rng(seed)
        self.W = rng.standard_normal((n_vocab, n_vocab)) * sharp
        self.U = rng.standard_normal((n_vocab, n_vocab)) * 0.3
        self.n_ctx, self.n_vocab = n_ctx, n_vocab
        self.eog = eog
        self.cached: list[int] = []
        self.n_decoded = 0
        self.decoded_batches: list[list[int]] = []

    @property
    def n_past(self) -> int:
        return len(self.cached)

    def common_prefix(self, tokens: Sequence[int]) -> int:
        return common_prefix(self.cached, tokens)

    def logits(self, context: Sequence[int]) -> np.ndarray:
        last = context[-1]
        return np.asarray(self.W[last] + len(context) * self.U[last], dtype=np.float32)

    def sync(self, tokens: Sequence[int], rows: Sequence[int] = (-1,), *, should_stop: Any = None, progress: Any = None) -> np.ndarray:
        tokens = list(tokens)
        keep = 0
        while keep < min(len(tokens), len(self.cached)) and tokens[keep] == self.cached[keep]:
            keep += 1
        if rows and keep == len(tokens):
            keep -= 1
        self.truncate(keep)
        rest = tokens[keep:]
        out = []
        for i, t in enumerate(rest):
            if should_stop is not None and i > 0 and i % 4 == 0 and should_stop():
                raise StopRequested()
            self.cached.append(t)
            self.n_decoded += 1
            if progress is not None:
                progress(i + 1, len(rest))
        if rows and rest:
            out = [self.logits(self.cached)]
        return np.array(out, dtype=np.float32).reshape(len(out), self.n_vocab)

    def decode(self, tokens: Sequence[int], start_pos: int, rows: Sequence[int] = (-1,)) -> np.ndarray:
        assert start_pos == len(self.cached), "decode out of step with the cache"
        tokens = list(tokens)
        assert all(0 <= t < self.n_vocab for t in tokens), f"a token outside the vocabulary was decoded: {tokens}"
        if start_pos + len(tokens) > self.n_ctx:
            raise ContextFullError("fake context full")
        self.decoded_batches.append(tokens)
        out = []
        for t in tokens:
            self.cached.append(t)
            out.append(self.logits(self.cached))
        self.n_decoded += len(tokens)
        rows = [r % len(tokens) for r in rows]
        return np.stack([out[r] for r in rows]) if rows else np.empty((0, self.n_vocab), np.float32)

    def truncate(self, n: int) -> None:
        del self.cached[n:]

    def is_eog(self, token: int) -> bool:
        return token == self.eog


class FakeTreeModel(FakeModel):
    """FakeModel that also verifies token trees (as backend.Model.decode_tree / keep_tree_path do)."""

    tree_paths = 16

    def decode_tree(self, tokens: Sequence[int], depths: Sequence[int], seq_ids: Sequence[Sequence[int]]) -> np.ndarray:
        start = len(self.cached)
        assert all(0 <= t < self.n_vocab for t in tokens), f"a token outside the vocabulary was decoded: {tokens}"
        assert start + len(tokens) <= self.n_ctx
        rows = []
        for i in range(len(tokens)):
            path = []  # the ancestors of row i: one row per depth whose paths include all of row i's
            for d in range(1, depths[i]):
                j = next(j for j in range(1, i) if depths[j] == d and set(seq_ids[i]) <= set(seq_ids[j]))
                path.append(tokens[j])
            ctx = self.cached + [tokens[0]] + path + ([tokens[i]] if i else [])
            rows.append(self.logits(ctx))
        self.decoded_batches.append(list(tokens))
        self.cached.append(tokens[0])
        self.n_decoded += len(tokens)
        return np.stack(rows)

    def keep_tree_path(self, path: int, tokens: Sequence[int]) -> None:
        self.cached.extend(tokens)


class ScriptedDraft:
    """A draft model (DraftModel protocol) that always predicts `script[position]` with confidence 0.99."""

    n_ctx = 1 << 20
    n_vocab = 100

    def __init__(self, script: Sequence[int]) -> None:
        self.script = list(script)
        self.cached: list[int] = []
        self.synced: list[int] = []  # tokens decoded by each sync (catch-up sizes)

    @property
    def n_past(self) -> int:
        return len(self.cached)

    def common_prefix(self, tokens) -> int:
        return common_prefix(self.cached, tokens)

    def _row(self) -> np.ndarray:
        row = np.full(self.n_vocab, -10.0, dtype=np.float32)
        row[self.script[len(self.cached) % len(self.script)]] = 0.0
        return row[None]

    def sync(self, tokens: Sequence[int], rows: Sequence[int] = (-1,)) -> np.ndarray:
        tokens = list(tokens)
        keep = 0
        while keep < min(len(tokens), len(self.cached)) and tokens[keep] == self.cached[keep]:
            keep += 1
        keep = min(keep, len(tokens) - 1)
        self.synced.append(len(tokens) - keep)
        self.cached = tokens
        return self._row()

    def decode(self, tokens: Sequence[int], start_pos: int, rows: Sequence[int] = (-1,)) -> np.ndarray:
        self.cached += list(tokens)
        return self._row()

    def is_eog(self, token: int) -> bool:
        return False


def exact_distribution(
    target: FakeModel, prompt: list[int], sp: SamplingParams, n: int, constraint: Any = None
) -> dict[tuple[int, ...], float]:
    """P(x1..xn | prompt) from the target's rows alone (plain decoding's warp; with `constraint`, each row masked for
    its own prefix), stopping a sequence early at an end token. Nothing is pruned."""
    out: dict[tuple[int, ...], float] = {}

    def rec(prefix: list[int], mass: float) -> None:
        ctx = prompt + prefix
        row = target.logits(ctx)
        if constraint is not None:
            row = apply_mask(row, constraint.mask())
        p = warp(row, sp, ctx)
        for x in np.flatnonzero(p > 0):
            key = tuple(prefix + [int(x)])
            m = mass * float(p[x])
            if len(key) == n or target.is_eog(int(x)):
                out[key] = out.get(key, 0.0) + m
            else:
                if constraint is not None:
                    assert constraint.advance(int(x))
                rec(list(key), m)
                if constraint is not None:
                    constraint.rollback(1)

    rec([], 1.0)
    return out


# ------------------------------------------------------------------------------------------------ exact laws
class _Undecided(BaseException):  # not an Exception: no `except Exception` on the way may swallow it
    def __init__(self, options: list[tuple[Any, float]]) -> None:
        self.options = options


class _Script:
    """The decisions of one run: replays a prefix of decisions, raises _Undecided at the first one past it."""

    def __init__(self, script: tuple[Any, ...]) -> None:
        self.script, self.i, self.weight = script, 0, 1.0
        self.draws: list[Uniform] = []

    def decide(self, options: list[tuple[Any, float]]) -> Any:
        live = [(v, w) for v, w in options if w > 0.0]
        assert live, "a random decision without any possible outcome"
        if len(live) == 1:
            return live[0][0]
        if self.i == len(self.script):
            raise _Undecided(live)
        choice = self.script[self.i]
        self.i += 1
        weights = dict(live)
        assert choice in weights, "a replayed generation took different decisions: it is not deterministic given its draws"
        self.weight *= weights[choice]
        return choice


class Uniform(float):
    """A symbolic U(0, 1) draw. Its float value (0.5) is never meant to be read: the two uses the loop makes of a
    uniform are intercepted (`u * a < b` here, `sample_at(probs, u)` by the patch in generation_law)."""

    script: _Script
    used: bool

    def __new__(cls, script: _Script) -> "Uniform":
        u = float.__new__(cls, 0.5)
        u.script, u.used = script, False
        script.draws.append(u)
        return u

    def __mul__(self, a: Any) -> "_Scaled":  # type: ignore[override]
        return _Scaled(self, float(a))

    __rmul__ = __mul__  # type: ignore[assignment]

    def take(self) -> None:
        assert not self.used, "one uniform was used for two decisions"
        self.used = True


class _Scaled(float):
    """u * a, waiting for its comparison with a threshold b: u * a < b with probability clip(b / a, 0, 1)."""

    u: Uniform
    a: float

    def __new__(cls, u: Uniform, a: float) -> "_Scaled":
        s = float.__new__(cls, 0.5 * a)
        s.u, s.a = u, a
        return s

    def __lt__(self, b: Any) -> bool:  # type: ignore[override]
        self.u.take()
        assert self.a > 0.0, "u * a < b with a <= 0"
        p = min(1.0, max(0.0, float(b) / self.a))
        return bool(self.u.script.decide([(True, p), (False, 1.0 - p)]))


class EnumeratingRng(np.random.Generator):
    """An np.random.Generator whose random() is a symbolic Uniform of the current script (anything else it would
    draw is refused)."""

    def __init__(self, script: _Script) -> None:
        super().__init__(np.random.PCG64(0))
        self._script = script

    def random(self, *args: Any, **kwargs: Any) -> Any:
        assert not args and not kwargs, "the enumeration supports single uniforms only"
        return Uniform(self._script)

    def __getattribute__(self, name: str) -> Any:
        if name in ("integers", "choice", "normal", "standard_normal", "uniform", "permutation", "shuffle"):
            raise AssertionError(f"rng.{name} is not enumerated")
        return super().__getattribute__(name)


_REAL_SAMPLE_AT = edgespec.decoding.sampling.sample_at
_SAMPLE_AT_USERS = (edgespec.decoding.sampling, edgespec.decoding.tree, edgespec.drafting.model, edgespec.decoding.acceptance)


def _sample_at(probs: np.ndarray, u: float) -> int:
    """sample_at, branching on a symbolic uniform: id i with probability probs[i] / sum(probs). Every branch is checked
    against the real inverse CDF at the middle of that id's interval."""
    if not isinstance(u, Uniform):
        return _REAL_SAMPLE_AT(probs, u)
    u.take()
    p = np.asarray(probs, dtype=np.float64)
    cdf = np.cumsum(p)
    total = float(cdf[-1])
    i = int(u.script.decide([(int(j), float(p[j]) / total) for j in np.flatnonzero(p > 0)]))
    lo = float(cdf[i - 1]) if i else 0.0
    assert _REAL_SAMPLE_AT(probs, (lo + float(cdf[i])) / 2 / total) == i, "sample_at is not the inverse CDF"
    return i


@contextlib.contextmanager
def _patched_sample_at() -> Iterator[None]:
    saved = [(m, m.sample_at) for m in _SAMPLE_AT_USERS]  # type: ignore[attr-defined]
    try:
        for m, _ in saved:
            m.sample_at = _sample_at  # type: ignore[attr-defined]
        yield
    finally:
        for m, f in saved:
            m.sample_at = f  # type: ignore[attr-defined]


def generation_law(run: Callable[[np.random.Generator], Hashable], max_leaves: int = 200_000) -> dict[Hashable, float]:
    """The exact law of run(rng): {value: probability}, by replaying run once per path of random decisions. `run`
    must build everything it uses afresh (models' caches, speculators, policies): each replay starts from scratch,
    and with the same decisions must take the same path."""
    out: dict[Hashable, float] = {}
    todo: list[tuple[Any, ...]] = [()]
    leaves = 0
    with _patched_sample_at():
        while todo:
            script = _Script(todo.pop())
            try:
                value = run(EnumeratingRng(script))
            except _Undecided as branch:
                todo.extend(script.script + (choice,) for choice, _ in branch.options)
                continue
            assert all(u.used for u in script.draws), "a uniform was drawn and used in a way the enumeration does not see"
            leaves += 1
            assert leaves <= max_leaves, "the enumeration is too large for a unit test"
            out[value] = out.get(value, 0.0) + script.weight
    return out


def marginal(law: dict[Any, float], key: Callable[[Any], Hashable]) -> dict[Hashable, float]:
    out: dict[Hashable, float] = {}
    for v, w in law.items():
        k = key(v)
        out[k] = out.get(k, 0.0) + w
    return out


def max_gap(a: dict[Any, float], b: dict[Any, float]) -> float:
    """max |a(x) - b(x)| over the union of both supports."""
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))
