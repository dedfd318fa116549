"""edgespec.drafting.suffix_index: multi-candidate proposals from everything seen, against a brute-force reference; eviction,
divergent contexts, persistence (damaged files are ignored with one warning), and work per lookup that does not
grow with the number of indexed tokens (counted, not timed). Fixed seeds throughout."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pytest

from edgespec.drafting import suffix_index as si
from edgespec.drafting.suffix_index import FORMAT_VERSION, MAGIC, SuffixIndex, default_path
from edgespec.drafting.suffix_ladder import LADDER
from edgespec.decoding.tree import ROOT
from edgespec.drafting.tree_shape import best_tree, positional_acceptance
from edgespec.drafting.costs import CostModel


# ------------------------------------------------------------------------------------------------ reference
def reference_trie(docs: list[list[int]], ctx: list[int], depth: int, run_cap: int = 64, run_weight: float = 0.5):
    """Brute force: the longest n in LADDER whose suffix occurs (in a document, or earlier in the context with a
    token after it), every occurrence's run and continuation, and the weight of every continuation prefix.
    Returns (n, best run, {path tuple: weight})."""
    L = len(ctx)
    for n in reversed(LADDER):
        if n > L:
            continue
        suffix = ctx[L - n :]
        occ = [(d, s, len(d)) for d in docs for s in range(n, len(d)) if d[s - n : s] == suffix]
        occ += [(ctx, s, None) for s in range(n, L) if ctx[s - n : s] == suffix]
        if occ:
            break
    else:
        return 0, 0, {}
    cap = min(run_cap, L)
    runs, conts = [], []
    for src, s, end in occ:
        r = 0
        while r < cap and s - 1 - r >= 0 and src[s - 1 - r] == ctx[L - 1 - r]:
            r += 1
        runs.append(r)
        if end is None:  # the context: periodic past its end
            conts.append([ctx[s + j % (L - s)] for j in range(depth)])
        else:
            conts.append(src[s : min(s + depth, end)])
    best = max(runs)
    weights: dict[tuple[int, ...], float] = {}
    for r, c in zip(runs, conts):
        for k in range(1, len(c) + 1):
            weights[tuple(c[:k])] = weights.get(tuple(c[:k]), 0.0) + run_weight ** (best - r)
    return n, best, weights


def proposal_paths(p: si.SuffixProposal) -> dict[tuple[int, ...], float]:
    """{path tokens: score} of every proposal node."""
    out: dict[tuple[int, ...], float] = {}
    for i in range(len(p)):
        path, node = [], i
        while node != ROOT:
            path.append(p.tokens[node])
            node = p.parents[node]
        out[tuple(reversed(path))] = p.scores[i]
    return out


def assert_matches_reference(index: SuffixIndex, docs: list[list[int]], ctx: list[int], depth: int = 4) -> None:
    n, best, weights = reference_trie(docs, ctx, depth)
    p = index.propose(ctx, max_depth=depth, max_width=1000, max_nodes=None)
    assert (p.length, p.run) == (n, best)
    got = proposal_paths(p)
    assert set(got) == set(weights)
    for path, score in got.items():
        siblings = sum(w for q, w in weights.items() if len(q) == len(path) and q[:-1] == path[:-1])
        assert score == pytest.approx(weights[path] / siblings, abs=1e-12), path


def held_docs(index: SuffixIndex) -> list[list[int]]:
    return [index.document_tokens(i) for i, _, _ in index.documents()]


# ------------------------------------------------------------------------------------------------ proposals
def test_frequencies_become_scores() -> None:
    idx = SuffixIndex()
    # "a b c" followed by x three times and by y once, each after a different token (equal runs of 3)
    a, b, c, x, y = 10, 11, 12, 20, 21
    doc = [1, a, b, c, x, 30, 2, a, b, c, x, 31, 3, a, b, c, y, 32, 4, a, b, c, x, 33]
    idx.add_document(doc, source="file:demo")
    p = idx.propose([7, 8, a, b, c], max_depth=2, max_width=4)
    assert (p.length, p.run, p.n_occurrences) == (3, 3, 4)
    root = {p.tokens[i]: p.scores[i] for i in range(len(p)) if p.parents[i] == ROOT}
    assert root == {x: pytest.approx(0.75), y: pytest.approx(0.25)}
    assert p.tokens[0] == x  # best first
    best = p.candidates[0]
    assert best.tokens[0] == x and best.score == pytest.approx(0.75 / 3)  # x then one of three tokens
    assert [p.tree().token(c) for c in p.tree().children()] == [x, y]


def test_longer_runs_weigh_more_and_recency_breaks_ties() -> None:
    idx = SuffixIndex(run_weight=0.5)
    idx.add_document([5, 6, 1, 2, 3, 40, 9, 9])  # run 5 for the context below (5 6 1 2 3)
    idx.add_document([7, 6, 1, 2, 3, 41, 9, 9])  # run 4
    idx.add_document([8, 6, 1, 2, 3, 42, 9, 9])  # run 4, newer
    p = idx.propose([5, 6, 1, 2, 3], max_depth=1, max_width=4)
    assert (p.length, p.run) == (4, 5)
    root = {p.tokens[i]: p.scores[i] for i in range(len(p))}
    assert root == {40: pytest.approx(0.5), 41: pytest.approx(0.25), 42: pytest.approx(0.25)}
    assert list(p.tokens) == [40, 42, 41]  # 42 ties 41 and is more recent


def test_context_itself_and_periodic_continuation() -> None:
    idx = SuffixIndex()
    p = idx.propose([1, 2, 3, 1, 2, 3, 1, 2], max_depth=5, max_width=2)
    assert p.candidates[0].tokens == (3, 1, 2, 3, 1)  # the pattern keeps repeating past the context's end
    assert p.length == 4 and p.run == 5  # LADDER level 4 found it; the source agrees on 5 tokens
    assert SuffixIndex().propose([1, 2, 3], 4, 2) == si.SuffixProposal()  # nothing seen before


def test_pruning_width_depth_nodes_and_min_score() -> None:
    idx = SuffixIndex()
    rng = np.random.default_rng(1)
    for i in range(12):  # 12 different continuations of "5 6 7" with equal runs
        idx.add_document([100 + i, 5, 6, 7] + rng.integers(20, 24, size=6).tolist())
    p = idx.propose([9, 5, 6, 7], max_depth=3, max_width=2)
    kids: dict[int, int] = {}
    for par in p.parents:
        kids[par] = kids.get(par, 0) + 1
    assert max(kids.values()) <= 2
    assert max(len(c.tokens) for c in p.candidates) <= 3
    assert all(a >= b - 1e-15 for a, b in zip(p.path_scores, p.path_scores[1:]))  # best first
    small = idx.propose([9, 5, 6, 7], max_depth=3, max_width=2, max_nodes=3)
    assert small.tokens == p.tokens[:3] and small.parents == p.parents[:3]
    sure = idx.propose([9, 5, 6, 7], max_depth=3, max_width=2, min_score=0.2)
    assert all(s >= 0.2 for s in sure.path_scores) and len(sure) < len(p)


def test_tree_and_fill_with_a_tree_shape() -> None:
    idx = SuffixIndex()
    idx.add_document([1, 5, 6, 7, 8, 2, 5, 6, 7, 8, 3, 5, 6, 9, 4])
    p = idx.propose([0, 5, 6], max_depth=3, max_width=3)
    tree = p.tree()
    assert [tree.token(c) for c in tree.children()] == [7, 9]
    assert all(q is None for q in (tree.q(i) for i in range(len(tree))))  # deterministic candidates
    shape = best_tree(positional_acceptance([0.6, 0.3], 3), CostModel({1: 0.02, 64: 0.021}), 5)
    filled = p.fill(shape.rank_paths)
    assert [filled.token(c) for c in filled.children()] == [7, 9]
    assert filled.path_tokens(filled.leaves()[0]) == [7, 8, 3]  # ties with 2; 3 is more recent
    assert len(filled) <= shape.n_nodes
    assert p.fill([(1,), (1, 0), (5,)]).tokens == [9, 4]  # the rank-5 root child does not exist


class SmallTail(SuffixIndex):
    TAIL = 8  # the context's buffer is merged into the sorted arrays every 8 tokens


@pytest.mark.parametrize("seed", range(12))
def test_matches_brute_force_reference(seed: int) -> None:
    """Small vocabularies (many repeats): documents, a growing context, a departing context, evictions."""
    rng = np.random.default_rng(seed)
    V = int(rng.integers(3, 7))
    idx = (SmallTail if seed % 2 else SuffixIndex)(max_tokens=300, max_occurrences=100_000)
    for _ in range(int(rng.integers(1, 6))):
        idx.add_document(rng.integers(0, V, size=int(rng.integers(2, 120))).tolist(), source="doc")
    ctx = rng.integers(0, V, size=int(rng.integers(1, 30))).tolist()
    for step in range(25):
        idx.sync(ctx)  # first: a departing context adds a document
        assert_matches_reference(idx, held_docs(idx), ctx)
        ctx = ctx + rng.integers(0, V, size=int(rng.integers(1, 4))).tolist()
        if step == 12:  # a new request that shares only a prefix: the old tail becomes a document
            ctx = ctx[: int(rng.integers(0, len(ctx)))] + rng.integers(0, V, size=5).tolist()
    assert len(idx) <= 300 + len(ctx)


@pytest.mark.parametrize("cls", [SuffixIndex, SmallTail])
def test_long_context_matches_brute_force_reference(cls: type[SuffixIndex]) -> None:
    """A context growing past the buffer size many times, by single tokens and by long appends."""
    rng = np.random.default_rng(40)
    idx = cls(max_occurrences=100_000)
    doc = rng.integers(0, 8, size=200).tolist()
    idx.add_document(doc)
    ctx: list[int] = []
    for step in range(60):
        ctx = ctx + rng.integers(0, 8, size=int(rng.choice([1, 2, 40, 300]))).tolist()
        if step % 3 == 0:
            assert_matches_reference(idx, [doc], ctx)
        else:
            idx.sync(ctx)
    assert len(ctx) > 1000


def test_occurrence_cap_keeps_the_most_recent_and_the_ladder_finds_longer_matches() -> None:
    idx = SuffixIndex(max_occurrences=2)
    idx.add_document([5, 6, 9, 1, 2, 50, 0])  # run 5 with the context below, at LADDER level 4
    for i in range(6):
        idx.add_document([30 + i, 6, 9, 1, 2, 60 + i, 0])  # run 4, newer
    p = idx.propose([5, 6, 9, 1, 2], max_depth=1, max_width=8)
    assert p.n_occurrences == 2 and list(p.tokens) == [65, 64]  # the 2 most recent occurrences of the 4-gram
    idx.add_document([7, 7, 5, 6, 9, 1, 2, 51, 0])  # agrees with the next context on 6 tokens
    for i in range(6):
        idx.add_document([40 + i, 6, 9, 1, 2, 70 + i, 0])
    p = idx.propose([7, 5, 6, 9, 1, 2], max_depth=1, max_width=8)
    assert (p.length, p.run, list(p.tokens)) == (6, 6, [51])  # level 6 finds it behind 6 newer 4-gram matches


# ------------------------------------------------------------------------------------------------ contexts, documents
def test_sync_extends_and_a_departing_context_is_kept_as_a_document() -> None:
    idx = SuffixIndex()
    first = list(range(100, 140))
    idx.sync(first)
    idx.sync(first + [1, 2])
    assert idx.context == first + [1, 2] and idx.n_documents == 0
    second = first[:30] + [7, 7, 7]
    idx.sync(second)  # departs after 30 tokens: the old tail, from 16 tokens before, is finished
    assert idx.context == second
    (doc_id, length, source), = idx.documents()
    assert idx.document_tokens(doc_id) == (first + [1, 2])[14:] and source == "context"
    # the old answer is proposed again where the prompt repeats
    p = idx.propose(second + [135, 136], max_depth=3, max_width=2)
    assert p.candidates[0].tokens == (137, 138, 139)
    idx.finish_context()
    assert idx.context == [] and idx.n_documents == 2 and len(idx) == length + len(second) + 2


def test_eviction_keeps_the_newest_documents_within_budget() -> None:
    rng = np.random.default_rng(5)
    idx = SuffixIndex(max_tokens=1000)
    docs = []
    for i in range(30):
        d = rng.integers(0, 50, size=int(rng.integers(50, 200))).tolist()
        docs.append(d)
        idx.add_document(d, source=f"d{i}")
        assert idx.n_finished_tokens <= 1000
    kept = idx.documents()
    assert [s for _, _, s in kept] == [f"d{i}" for i in range(30 - len(kept), 30)]
    fresh = SuffixIndex(max_tokens=1000)
    for i in range(30 - len(kept), 30):
        fresh.add_document(docs[i])
    for _ in range(30):
        ctx = rng.integers(0, 50, size=8).tolist()
        a = idx.propose(ctx, 4, 3)
        fresh.sync([])
        idx.sync([])
        assert a == fresh.propose(ctx, 4, 3)
    big = rng.integers(0, 50, size=1500).tolist()
    idx.add_document(big)
    assert idx.documents()[-1][1] == 1000 and idx.n_documents == 1  # only its last 1000 tokens fit


def test_bad_input() -> None:
    idx = SuffixIndex()
    with pytest.raises(ValueError):
        idx.extend([1, -2])
    with pytest.raises(ValueError):
        idx.add_document([1, 2**31])
    assert idx.add_document([5]) is None and idx.n_documents == 0
    with pytest.raises(ValueError):
        idx.propose([1], max_depth=0)
    with pytest.raises(ValueError):
        SuffixIndex(max_tokens=0)
    with pytest.raises(KeyError):
        idx.document_tokens(3)


# ------------------------------------------------------------------------------------------------ persistence
def sample_index(vocab: str = "qwen2.5") -> SuffixIndex:
    rng = np.random.default_rng(7)
    idx = SuffixIndex(vocab=vocab)
    for i in range(5):
        idx.add_document(rng.integers(0, 40, size=300).tolist(), source=f"file:{i}.py")
    idx.sync(rng.integers(0, 40, size=50).tolist())
    return idx


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    idx = sample_index()
    path = tmp_path / "sub" / "index.idx"
    idx.save(path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["index.idx"]  # no temporary file left behind
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        back = SuffixIndex.load(path, vocab="qwen2.5")
    assert back.documents()[:5] == idx.documents()
    assert back.documents()[5][1:] == (50, "context")  # the open context was saved as a document
    rng = np.random.default_rng(8)
    idx.finish_context()
    for _ in range(40):
        ctx = rng.integers(0, 40, size=10).tolist()
        idx.sync([])
        back.sync([])
        assert back.propose(ctx, 4, 3) == idx.propose(ctx, 4, 3)
    small = SuffixIndex.load(path, vocab="qwen2.5", max_tokens=700)  # the newest documents that fit
    assert [s for _, _, s in small.documents()] == ["file:3.py", "file:4.py", "context"]


def corruptions(good: bytes) -> dict[str, bytes]:
    body = good[:-32]
    fixed = len(MAGIC) + 8
    version, header_len = si.struct.unpack("<II", body[len(MAGIC) : fixed])
    header, tokens = body[fixed : fixed + header_len], body[fixed + header_len :]

    def sealed(head: bytes, toks: bytes = tokens, v: int = version) -> bytes:  # a valid checksum over bad contents
        b = MAGIC + si.struct.pack("<II", v, len(head)) + head + toks
        return b + si.hashlib.sha256(b).digest()

    assert sealed(header) == good
    return {
        "empty": b"",
        "foreign": b"PK\x03\x04 this is a zip file, not an index" * 3,
        "truncated": good[: len(good) // 2],
        "flipped byte": good[:200] + bytes([good[200] ^ 0xFF]) + good[201:],
        "newer version": sealed(header, v=FORMAT_VERSION + 1),
        "bad json": sealed(b"{" * header_len),
        "deep json": sealed(b"[" * 100_000),
        "not a dict": sealed(b"[1, 2, 3]"),
        "huge number": sealed(header.replace(b'"documents":[[0,300', b'"documents":[[1e999,300')),
        "short tokens": sealed(header, tokens[:-4]),
        "negative token": sealed(header, tokens[:-4] + (-5).to_bytes(4, "little", signed=True)),
        "header lies": sealed(header.replace(b'"documents":[[0,300', b'"documents":[[0,1')),
    }


def test_damaged_or_foreign_files_are_ignored_with_one_warning(tmp_path: Path) -> None:
    path = tmp_path / "good.idx"
    sample_index().save(path)
    good = path.read_bytes()
    for name, data in corruptions(good).items():
        bad = tmp_path / f"{name}.idx"
        bad.write_bytes(data)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            idx = SuffixIndex.load(bad, vocab="qwen2.5")
        assert len(caught) == 1, (name, [str(w.message) for w in caught])
        message = str(caught[0].message)
        assert "\n" not in message and str(bad) in message, name
        assert len(idx) == 0 and idx.propose([1, 2, 3], 3, 2) == si.SuffixProposal(), name
    with pytest.warns(RuntimeWarning, match="vocabulary"):
        assert len(SuffixIndex.load(path, vocab="llama3")) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(SuffixIndex.load(tmp_path / "missing.idx")) == 0  # no file yet: no warning
        assert len(SuffixIndex.load(path, vocab="qwen2.5")) > 0


def test_unreadable_path_is_ignored(tmp_path: Path) -> None:
    with pytest.warns(RuntimeWarning, match="cannot read"):
        assert len(SuffixIndex.load(tmp_path)) == 0  # a directory


def test_default_path_is_in_the_cache_and_names_the_vocabulary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EDGESPEC_CACHE_DIR", str(tmp_path))
    a, b = default_path("qwen2.5"), default_path("llama3")
    assert a.parent == tmp_path / "suffix" and a != b and a.suffix == ".idx"


# ------------------------------------------------------------------------------------------------ work per lookup
def text_like(rng: np.random.Generator, n: int) -> list[int]:
    """Zipf-distributed tokens with copied passages: repeats at every n-gram length."""
    out = rng.zipf(1.3, size=n).clip(max=30_000).tolist()
    for _ in range(n // 200):
        a, b = sorted(rng.integers(0, n - 64, size=2).tolist())
        out[b : b + 48] = out[a : a + 48]
    return out[:n]


def work_per_lookup(n_tokens: int, n_lookups: int = 150) -> tuple[dict[str, int], int]:
    rng = np.random.default_rng(11)
    idx = SuffixIndex(max_tokens=1 << 20)
    for start in range(0, n_tokens, 5000):
        idx.add_document(text_like(rng, min(5000, n_tokens - start)))
    ctx = text_like(rng, 400)
    idx.sync(ctx)
    worst: dict[str, int] = {}
    max_writes = 0
    for _ in range(n_lookups):
        before = dict(idx.work)
        ctx = ctx + list(idx.propose(ctx, 8, 4).tokens[:3]) + [int(rng.integers(1, 50))]
        after = dict(idx.work)
        for k in ("levels", "occurrences", "continuation_tokens", "trie_nodes"):
            worst[k] = max(worst.get(k, 0), after.get(k, 0) - before.get(k, 0))
        max_writes = max(max_writes, after.get("hash_writes", 0) - before.get("hash_writes", 0))
    return worst, max_writes


def test_lookup_work_does_not_grow_with_the_index() -> None:
    """Per lookup: a binary search over LADDER (at most 4 probes for 8 levels), at most 2 x max_occurrences
    occurrences at the level found, continuations of max_depth tokens for them, a trie of at most
    max_occurrences x max_depth nodes; per appended token len(LADDER) hash writes (plus a merge into sorted arrays
    every TAIL tokens). The bounds hold at 10k and at 100k indexed tokens alike (time: see
    bench/bench_suffix_index.py)."""
    C = SuffixIndex().max_occurrences
    for n in (10_000, 100_000):
        worst, writes = work_per_lookup(n)
        assert worst["levels"] <= 4
        assert worst["occurrences"] <= 2 * C
        assert worst["continuation_tokens"] <= 2 * C * 8
        assert worst["trie_nodes"] <= C * 8
        assert writes <= 4 * len(LADDER)  # up to 4 tokens appended per cycle
        assert worst["occurrences"] > 0 and worst["trie_nodes"] > 0


def test_memory_is_about_100_bytes_per_finished_token() -> None:
    rng = np.random.default_rng(12)
    idx = SuffixIndex()
    idx.add_document(text_like(rng, 50_000))
    per_token = idx.memory_bytes() / idx.n_finished_tokens
    assert 60 < per_token < 140
    assert math.isclose(idx.n_finished_tokens, 50_000)
