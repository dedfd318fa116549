"""Drafting across vocabularies (decoding/vocab_map.py), proven by enumeration like the other rules
(tests/decoding/test_exact_laws.py, tests/support/exact.py).

Two small vocabularies that overlap partly, with tokens that split differently ("ab" is one target token and two draft
tokens; the draft's "zz" is no target token) and a control token shared by text. The draft's rows live on its own
ids; the proposal is what the speculator does: a draft token drawn from the draft's row conditioned on the shared
tokens, carried as the target id of the same bytes, with the q row `restrict_probs` reports. The emitted law (chains
k <= 3 and the first level of a tree with siblings drawn without replacement) must equal the target's to 1e-9 at
every row kind; planted bugs in the module's own source (no renormalisation, one id paired wrong in one direction,
the unrestricted draft row) must move it by more than 1e-3.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np
import pytest

from edgespec.decoding import vocab_map
from edgespec.config import SamplingParams
from edgespec.decoding.sampling import warp
from edgespec.decoding.tree import ROOT, TokenTree, accept_tree_with, outcome_distribution
from edgespec.decoding.vocab_map import (
    CONTROL,
    NORMAL,
    TokenTable,
    VocabMap,
    build_map,
    pair_mode,
    restrict_logits,
    restrict_probs,
)

from support.exact import BUG, TOL, Law, Rows, chain_law, mutant

# target ids:  a  b  c  ab  abc  " a"  <|im_end|>  bc
T_TOKENS = ["a", "b", "c", "ab", "abc", "Ġa", "<|im_end|>", "bc"]
T_TYPES = [NORMAL] * 6 + [CONTROL, NORMAL]
# draft ids:   c  bc  a  zz  <|im_end|>  b  abc
D_TOKENS = ["c", "bc", "a", "zz", "<|im_end|>", "b", "abc"]
D_TYPES = [NORMAL] * 4 + [CONTROL, NORMAL, NORMAL]
VT, VD = len(T_TOKENS), len(D_TOKENS)


def tables() -> tuple[TokenTable, TokenTable]:
    return TokenTable.from_gguf(T_TOKENS, T_TYPES, "gpt2", "default"), TokenTable.from_gguf(D_TOKENS, D_TYPES, "gpt2", "other")


def the_map() -> VocabMap:
    return build_map(*tables())


def test_the_map_pairs_tokens_of_the_same_bytes_one_to_one() -> None:
    m = the_map()
    assert m.t2d.tolist() == [2, 5, 0, -1, 6, -1, 4, 1]
    assert all(m.d2t[m.t2d[t]] == t for t in range(VT) if m.t2d[t] >= 0)
    assert m.d2t[3] == -1  # "zz"
    assert m.coverage == pytest.approx(5 / 7) and m.draft_coverage == pytest.approx(5 / 6)  # control tokens not counted
    t, d = tables()
    assert t.pieces[5] == b" a" and t.pieces[6] is None  # GPT-2's byte map; a control token has no bytes
    assert pair_mode(t, d, m, same=False) == "intersection"
    assert pair_mode(t, d, m, same=True) == "same"


def test_modes_mapped_and_none() -> None:
    t, _ = tables()
    # the same ordinary tokens at other ids, other control tokens: "mapped"
    perm = TokenTable.from_gguf(T_TOKENS[::-1] + ["<s>"], T_TYPES[::-1] + [CONTROL], "gpt2", "default")
    m = build_map(t, perm)
    assert pair_mode(t, perm, m, same=False) == "mapped"
    assert all(T_TOKENS[i] == (T_TOKENS[::-1] + ["<s>"])[m.t2d[i]] for i in range(VT))
    # another script: nothing ordinary shared
    other = TokenTable.from_gguf(["я", "ю", "<|im_end|>"], [NORMAL, NORMAL, CONTROL], "gpt2", "default")
    m = build_map(t, other)
    assert m.coverage == 0.0 and pair_mode(t, other, m, same=False) == "none"


def test_sentencepiece_and_byte_tokens() -> None:
    """SentencePiece's U+2581 is a space; a byte-fallback token stands for its byte, after the ordinary token of the
    same bytes."""
    spm = TokenTable.from_gguf(["<0x61>", "\u2581a", "a", "<bos>"], [6, NORMAL, NORMAL, CONTROL], "llama")
    assert spm.pieces == [b"a", b" a", b"a", None]
    t, _ = tables()
    m = build_map(t, spm)
    assert m.t2d[0] == 2 and m.t2d[5] == 1 and m.draft_index[b"a"] == 2


def test_restricted_logits_are_the_restricted_distribution_at_every_setting() -> None:
    """warp(restrict_logits(l)) == restrict_probs(warp over the draft's ids) (temperature), and greedy picks the most
    likely shared token."""
    m = the_map()
    rng = np.random.default_rng(5)
    for _ in range(20):
        logits = rng.normal(size=VD) * 2
        for temp in (0.5, 1.0, 1.7):
            s = SamplingParams(temperature=temp, top_k=0, top_p=1.0, min_p=0.0)
            got = warp(restrict_logits(logits, m), s, ())
            want = restrict_probs(warp(logits, s, ()), m)
            assert np.abs(got - want).max() < 1e-12
        assert int(np.argmax(restrict_logits(logits, m))) == m.d2t[m.shared_d[np.argmax(logits[m.shared_d])]]


# ------------------------------------------------------------------------------------------------ the law
def proposals(qD: Rows, m: VocabMap, k: int, restrict: Callable[..., np.ndarray]) -> list[tuple[list[int], list[Any], float]]:
    """Every chain the speculator can draft with its probability: d_i a draft token drawn from the draft's row (at
    the target prefix so far) conditioned on the shared tokens, carried as its target id; q_i what `restrict`
    reports. A row with no mass on the shared tokens ends the draft."""
    out: list[tuple[list[int], list[Any], float]] = []

    def grow(d: list[int], rows: list[Any], w: float) -> None:
        row = qD(tuple(d))
        shared = [int(x) for x in np.flatnonzero(row > 0) if m.d2t[x] >= 0]
        z = float(sum(row[x] for x in shared))
        if len(d) == k or z == 0.0:
            out.append((d, rows, w))
            return
        reported = restrict(row, m)
        for x in shared:
            grow(d + [int(m.d2t[x])], rows + [reported], w * float(row[x]) / z)

    grow([], [], 1.0)
    return out


def chain_distance(
    restrict: Callable[..., np.ndarray], k: int, pkind: str, qkind: str, seed: int, m: VocabMap | None = None
) -> tuple[float, list[str]]:
    pM, qD = Rows(VT, seed, pkind), Rows(VD, seed + 1, qkind)
    law, problems, _ = chain_law(pM, VT, k, drafts=proposals(qD, m or the_map(), k, restrict))
    return law.distance(), problems


@pytest.mark.parametrize("k, pkind, qkind, seed", [
    (1, "dirichlet", "dirichlet", 300), (2, "sparse", "dirichlet", 301), (2, "dirichlet", "sparse", 302),
    (3, "ties", "peaked", 303), (2, "peaked", "ties", 304),
])
def test_chain_across_vocabularies_is_exact(k: int, pkind: str, qkind: str, seed: int) -> None:
    pM, qD = Rows(VT, seed, pkind), Rows(VD, seed + 1, qkind)
    drafts = proposals(qD, the_map(), k, restrict_probs)
    assert sum(w for _, _, w in drafts) == pytest.approx(1.0, abs=1e-12)
    law, problems, off_theory = chain_law(pM, VT, k, drafts=drafts)  # the exact law of one cycle, every cell of its uniforms
    assert off_theory == 0.0
    assert not problems, problems[:5]
    assert law.distance() < TOL, law.distance()


def tree_first_level(qD: Rows, m: VocabMap, b: int, restrict: Callable[..., np.ndarray]) -> list[tuple[TokenTree, float]]:
    """A root with b siblings as the speculator draws them: the first from the restricted row, each next from it
    with the siblings before removed and renormalised (model._alternatives, tree.sample_children), each carrying the
    row it was drawn from (the q the tree rule reads)."""
    row = qD(())
    first = restrict(row, m)
    out: list[tuple[TokenTree, float]] = []
    true = np.zeros(VT)  # the law the draft really draws from, worked out in the draft's ids
    shared = [x for x in range(VD) if m.d2t[x] >= 0]
    z = sum(row[x] for x in shared)
    for x in shared:
        true[m.d2t[x]] = row[x] / z

    def grow(tree_rows: list[tuple[int, np.ndarray]], rep: np.ndarray, law: np.ndarray, w: float) -> None:
        if len(tree_rows) == b or not law.any():
            tree = TokenTree()
            for t, r in tree_rows:
                tree.add(ROOT, t, r)
            out.append((tree, w))
            return
        for t in np.flatnonzero(law > 0):
            rep2, law2 = rep.copy(), law.copy()
            rep2[t] = law2[t] = 0.0
            rep2 = rep2 / rep2.sum() if rep2.sum() > 0 else rep2
            law2 = law2 / law2.sum() if law2.sum() > 0 else law2
            grow(tree_rows + [(int(t), rep)], rep2, law2, w * float(law[t]))

    grow([], np.asarray(first, dtype=np.float64), true, 1.0)
    return out


def tree_distance(
    restrict: Callable[..., np.ndarray], pkind: str, qkind: str, seed: int, m: VocabMap | None = None
) -> tuple[float, list[str]]:
    pM, qD = Rows(VT, seed, pkind), Rows(VD, seed + 1, qkind)
    law = Law(pM, VT, 2)
    for tree, w in tree_first_level(qD, m or the_map(), 2, restrict):
        rows: list[Any] = [pM(())] + [pM((tree.token(i),)) for i in range(len(tree))]
        for (path, token), pr in outcome_distribution(tree, rows, accept_tree_with).items():
            law.add_emitted([tree.token(i) for i in path] + [token], w * pr)
    return law.distance(), law.problems


@pytest.mark.parametrize("pkind, qkind, seed", [("dirichlet", "dirichlet", 320), ("sparse", "peaked", 321), ("ties", "sparse", 322)])
def test_tree_siblings_across_vocabularies_are_exact(pkind: str, qkind: str, seed: int) -> None:
    dist, problems = tree_distance(restrict_probs, pkind, qkind, seed)
    assert dist < TOL and not problems


# ------------------------------------------------------------------------------------------------ planted bugs
def _no_renormalisation() -> Callable[..., np.ndarray]:
    return mutant(restrict_probs, ("return out / total if total > 0.0 else out", "return out"))


def _unrestricted() -> Callable[..., np.ndarray]:
    """The draft's whole row reported as if its ids were the target's."""
    return mutant(restrict_probs, ("out[vmap.shared_t] = q[vmap.shared_d]", "out[: min(q.size, out.size)] = q[: out.size]"))


def _one_id_wrong() -> Callable[..., VocabMap]:
    """build_map pairs one target token with the wrong draft id in t2d only (d2t, what the draft's draw is carried
    by, stays right)."""
    return mutant(build_map, ("shared_d = t2d[shared_t]", "t2d[0] = 3\n    shared_d = t2d[shared_t]"))


MUTANTS = {
    "not renormalised": lambda: (_no_renormalisation(), build_map),
    "unrestricted q": lambda: (_unrestricted(), build_map),
    "one id mapped wrong": lambda: (restrict_probs, _one_id_wrong()),
}


@pytest.mark.parametrize("name", list(MUTANTS))
def test_planted_bugs_fail_the_law(name: str) -> None:
    assert chain_distance(restrict_probs, 2, "dirichlet", "dirichlet", 310)[0] < TOL
    restrict, build = MUTANTS[name]()
    m = build(*tables())
    dist, problems = chain_distance(restrict, 2, "dirichlet", "dirichlet", 310, m)
    try:
        tdist, tproblems = tree_distance(restrict, "dirichlet", "dirichlet", 320, m)
    except ValueError as e:  # the tree refuses a q row that is not a distribution: caught as loudly
        tdist, tproblems = float("inf"), [str(e)]
    assert dist > BUG or problems
    assert tdist > BUG or tproblems


def test_vocab_map_module_has_the_documented_names() -> None:
    assert set(vocab_map.__all__) >= {"restrict_logits", "restrict_probs", "build_map", "pair_mode"}

