"""Prompt-lookup index: match rules, incremental index vs. recompute from scratch, truncation."""

from __future__ import annotations

import random

import numpy as np
import pytest

from edgespec.drafting.ngram import NgramIndex, NgramMatch


def reference_match(
    tokens: list[int], k: int, n_max: int = 4, n_min: int = 1, run_cap: int = 64, candidates: int = 16
) -> tuple[list[int], int, int]:
    """Brute force: the longest suffix (n_max..n_min) with an earlier occurrence; for n < n_max the most recent
    occurrence, for n = n_max the one among the `candidates` most recent whose preceding tokens agree longest
    with the context (ties: most recent); the k tokens after it (continuing periodically past the end of the
    context); and that agreement length (the run, capped at run_cap)."""
    L = len(tokens)
    if k <= 0:
        return [], 0, 0
    for n in range(min(n_max, L - 1), n_min - 1, -1):
        suffix = tokens[L - n :]
        starts = [i + n for i in range(L - n - 1, -1, -1) if tokens[i : i + n] == suffix]  # most recent first
        if not starts:
            continue

        def run_of(s: int) -> int:
            r = 0
            while r < run_cap and s - 1 - r >= 0 and tokens[s - 1 - r] == tokens[L - 1 - r]:
                r += 1
            return r

        if n == n_max:
            runs = [run_of(s) for s in starts[:candidates]]
            s, run = starts[runs.index(max(runs))], max(runs)
        else:
            s, run = starts[0], n
        virtual = list(tokens)
        while len(virtual) < s + k:
            virtual.append(virtual[len(virtual) - (L - s)])
        return virtual[s : s + k], n, run
    return [], 0, 0


def reference(tokens: list[int], k: int, n_max: int = 4, n_min: int = 1) -> tuple[list[int], int]:
    got, n, _ = reference_match(tokens, k, n_max, n_min)
    return got, n


def test_simple_match():
    d = NgramIndex()
    ctx = [1, 2, 3, 4, 9, 1, 2, 3]
    assert d.lookup(ctx, 2).tokens == [4, 9]
    assert d.last_match == NgramMatch([4, 9], 3, 3, 3)


def test_prefers_the_longest_suffix():
    # (1, 2, 3) occurred at the start, followed by 40; (3,) occurred more recently, followed by 50.
    ctx = [1, 2, 3, 40, 9, 3, 50, 8, 1, 2, 3]
    d = NgramIndex()
    assert d.lookup(ctx, 1).tokens == [40]
    assert d.last_match.length == 3
    assert NgramIndex(n_max=1, candidates=1).lookup(ctx, 1).tokens == [50]  # the most recent 1-gram
    assert NgramIndex(n_max=1).lookup(ctx, 1).tokens == [40]  # ... unless an older one agrees for longer


def test_prefers_the_most_recent_among_equal_lengths():
    ctx = [1, 2, 70, 5, 1, 2, 80, 6, 1, 2]
    assert NgramIndex().lookup(ctx, 2).tokens == [80, 6]


def test_no_match():
    d = NgramIndex()
    for ctx in ([], [7], [1, 2, 3], list(range(100))):
        m = d.lookup(ctx, 4)
        assert m.tokens == [] and m.length == 0 and m.start == -1
        assert d.last_match == m
    assert NgramIndex(n_min=2).lookup([5, 6, 7, 6], 3).tokens == []  # only a 1-gram would match
    assert NgramIndex(n_min=1).lookup([5, 6, 7, 6], 3).tokens == [7, 6, 7]


def test_k_truncation_and_periodic_continuation():
    ctx = [1, 2, 3, 4, 5, 6, 1, 2]
    d = NgramIndex()
    assert d.lookup(ctx, 0).tokens == []
    assert d.lookup(ctx, 1).tokens == [3]
    assert d.lookup(ctx, 3).tokens == [3, 4, 5]
    # A continuation that runs into the end keeps copying the repeating pattern.
    assert d.lookup([7, 8, 7, 8], 5).tokens == [7, 8, 7, 8, 7]
    assert d.lookup([5, 5, 5], 4).tokens == [5, 5, 5, 5]


def test_lookup_accepts_any_int_sequence_and_returns_ints():
    d = NgramIndex()
    assert d.lookup([1, 2, 3, 1, 2], 3).tokens == [3, 1, 2]
    assert d.lookup(np.array([1, 2, 3, 1, 2]), 3).tokens == [3, 1, 2]
    assert d.lookup((1, 2, 3, 1, 2), 3).tokens == [3, 1, 2]
    assert all(type(t) is int for t in d.lookup(np.array([1, 2, 3, 1, 2]), 3).tokens)


@pytest.mark.parametrize("vocab,n_max,n_min", [(3, 4, 1), (8, 4, 1), (20, 3, 2), (50, 6, 1)])
def test_incremental_equals_reference_on_random_streams(vocab, n_max, n_min):
    rng = random.Random(vocab * 100 + n_max)
    for _ in range(5):
        stream = [rng.randrange(vocab) for _ in range(400)]
        inc = NgramIndex(n_max, n_min)
        ctx: list[int] = []
        while len(ctx) < len(stream):
            step = rng.randint(1, 6)
            new = stream[len(ctx) : len(ctx) + step]
            inc.extend(new)
            ctx.extend(new)
            k = rng.randint(0, 10)
            want, n, run = reference_match(ctx, k, n_max, n_min)
            got = inc.lookup(ctx, k)
            assert (got.tokens, got.length, got.run if got.tokens else 0) == (want, n, run)
            fresh = NgramIndex(n_max, n_min)
            fresh.reset(ctx)
            assert fresh.lookup(ctx, k) == got


def test_run_measures_how_far_the_source_agrees_with_the_context():
    # The text being copied: a block of the prompt, reproduced token for token.
    source = [10, 11, 12, 13, 14, 15, 16, 17, 18, 19]
    ctx = [1, 2] + source + [3] + source[:7]
    m = NgramIndex(n_max=4).lookup(ctx, 3)
    assert m.tokens == [17, 18, 19] and m.length == 4 and m.run == 7
    assert NgramIndex(n_max=4, run_cap=5).lookup(ctx, 3).run == 5
    # A shorter suffix match has run == its length (a longer one would have matched at n + 1).
    assert NgramIndex(n_max=4).lookup([5, 6, 7, 1, 6, 7], 1) == NgramMatch([1], 2, 3, 2)


def test_prefers_the_occurrence_that_agrees_longest():
    # (7, 8, 9, 4) occurs twice; the older occurrence is preceded by the same 2 tokens as the context's suffix,
    # so it is the likelier source even though the other is more recent.
    ctx = [1, 2, 7, 8, 9, 4, 50, 0, 5, 7, 8, 9, 4, 60, 0, 1, 2, 7, 8, 9, 4]
    m = NgramIndex(n_max=4).lookup(ctx, 1)
    assert m.tokens == [50] and m.run == 6
    assert NgramIndex(n_max=4, candidates=1).lookup(ctx, 1).tokens == [60]  # only the most recent is examined


def test_lookup_syncs_itself_and_resets_after_truncation():
    rng = random.Random(3)
    stream = [rng.randrange(6) for _ in range(300)]
    d = NgramIndex()
    for L in range(2, 300, 7):  # growing contexts: extends incrementally
        assert d.lookup(stream[:L], 4).tokens == reference(stream[:L], 4)[0]
    assert len(d) == 296
    for L in (150, 40, 200, 5):  # truncated (rollback) or regrown: resets when not a continuation
        assert d.lookup(stream[:L], 4).tokens == reference(stream[:L], 4)[0]
        assert d.tokens == stream[:L]
    edited = stream[:100] + [9, 9, 1, 2]  # same length order, different content
    assert d.lookup(edited, 4).tokens == reference(edited, 4)[0]
    d.reset(stream[:50])
    assert d.tokens == stream[:50]
    assert d.lookup(stream[:60], 3).tokens == reference(stream[:60], 3)[0]
    d.reset()
    assert len(d) == 0


def test_validates_arguments():
    with pytest.raises(ValueError):
        NgramIndex(n_max=2, n_min=3)
    with pytest.raises(ValueError):
        NgramIndex(n_min=0)
    with pytest.raises(ValueError):
        NgramIndex(n_max=4, run_cap=3)
    with pytest.raises(ValueError):
        NgramIndex(candidates=0)
