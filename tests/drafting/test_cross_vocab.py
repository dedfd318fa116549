"""CrossVocabDraft (drafting/cross_vocab.py) on a fake draft model: what the draft is fed for the target's tokens (its
image, the draft token of the same bytes, its own tokenization of the text, byte tokens for part of a character),
the prompt tokenized as text once, the translation kept in step with a context that grows and is rolled back, and
rows over the target's ids with -inf outside the shared tokens."""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pytest

from edgespec.decoding.vocab_map import TokenTable, build_map
from edgespec.drafting.cross_vocab import CrossVocabDraft

# target: a b c ab " a" <|im_end|> \xe2 (part of a character) "é"
T = TokenTable([b"a", b"b", b"c", b"ab", b" a", None, b"\xe2", "é".encode()], [False] * 8, {"<|im_end|>": 5})
# draft: <bos> c b a " " <|im_end|> \xe2 (a byte token) \xc3 \xa9
D = TokenTable([None, b"c", b"b", b"a", b" ", None, b"\xe2", b"\xc3", b"\xa9"], [False] * 6 + [True] * 3, {"<bos>": 0, "<|im_end|>": 5})
PIECES = {0: b"a", 1: b"b", 2: b"c", 3: b"ab", 4: b" a", 5: b"<|im_end|>", 6: b"\xe2", 7: "é".encode()}


def tokenize(data: bytes, add_special: bool, parse_special: bool) -> list[int]:
    """The draft's tokenizer: one token per character it knows (a, b, c, space), its BOS with add_special."""
    out = [0] if add_special else []
    ids = {ord("c"): 1, ord("b"): 2, ord("a"): 3, ord(" "): 4}
    text = data.decode("utf-8", "replace")
    for ch in text:
        if ch in ("<", "|"):
            continue
        out += [ids[ord(ch)]] if ord(ch) in ids else [7, 8] if ch == "é" else []
    return out


class FakeDraft:
    """A draft with a cache that follows by common prefix; rows are arange(n_vocab) + the last token fed."""

    n_ctx = 64
    n_vocab = len(D)

    def __init__(self) -> None:
        self.cached: list[int] = []
        self.decoded = 0

    @property
    def n_past(self) -> int:
        return len(self.cached)

    def common_prefix(self, tokens: Sequence[int]) -> int:
        n = 0
        while n < min(len(tokens), len(self.cached)) and tokens[n] == self.cached[n]:
            n += 1
        return n

    def _row(self) -> np.ndarray:
        return np.arange(self.n_vocab, dtype=np.float32) + (self.cached[-1] if self.cached else 0)

    def sync(self, tokens: Sequence[int], rows: Sequence[int] = (-1,)) -> np.ndarray:
        n = min(self.common_prefix(tokens), len(tokens) - 1)
        self.decoded += len(tokens) - n
        self.cached = list(tokens)
        return np.stack([self._row()])

    def decode(self, tokens: Sequence[int], start_pos: int, rows: Sequence[int] = (-1,)) -> np.ndarray:
        assert start_pos == len(self.cached)
        self.cached += list(tokens)
        self.decoded += len(tokens)
        return np.stack([self._row()])

    def is_eog(self, token: int) -> bool:
        return token == 5


def wrapper(retokenize: bool = True) -> tuple[CrossVocabDraft, FakeDraft]:
    fake = FakeDraft()
    return CrossVocabDraft(fake, build_map(T, D), target_piece=PIECES.__getitem__, tokenize=tokenize, retokenize_prompt=retokenize), fake


def test_what_the_draft_reads_for_each_target_token() -> None:
    w, _ = wrapper()
    assert [w.feed(t) for t in range(8)] == [(3,), (2,), (1,), (3, 2), (4, 3), (5,), (6,), (7, 8)]


def test_the_prompt_is_read_as_text_then_token_by_token_and_rolled_back() -> None:
    w, fake = wrapper()
    prompt = [3, 4, 2]  # "ab a" "c"
    assert w.translate(prompt) == [0, 3, 2, 4, 3, 1]  # the draft's own tokenization, its BOS first
    assert w.translate(prompt + [0, 7]) == [0, 3, 2, 4, 3, 1, 3, 7, 8]
    assert w.translate(prompt + [0]) == [0, 3, 2, 4, 3, 1, 3]  # a rejection: rolled back by common prefix
    assert w.translate(prompt + [0, 3, 5]) == [0, 3, 2, 4, 3, 1, 3, 3, 2, 5]
    assert w.translate([2, 2]) == [0, 1, 1]  # another prompt: read as text again
    mapped, _ = wrapper(retokenize=False)
    assert mapped.translate(prompt) == [3, 2, 4, 3, 1]  # "mapped": token by token from the start
    assert fake.decoded == 0  # translating decodes nothing


def test_rows_are_the_target_vocabulary_with_only_shared_tokens() -> None:
    w, fake = wrapper()
    row = w.sync([3, 4, 2])[0]
    vmap = w.vmap
    assert row.shape == (8,) and w.n_vocab == 8
    assert np.isneginf(row[[3, 4, 7]]).all()  # "ab", " a", "é": no draft image
    assert row[0] == fake._row()[3] and row[5] == fake._row()[5]  # "a" is draft id 3; <|im_end|> by its text
    nxt = w.decode_next(0)  # a drafted "a" is fed as draft id 3
    assert fake.cached[-1] == 3 and np.array_equal(nxt[vmap.shared_t], fake._row()[vmap.shared_d])
    assert w.is_eog(5) and not w.is_eog(0)
    with pytest.raises(ValueError, match="no draft image"):
        w.decode_next(3)
    # the window: what the translation adds over the target's count is taken off the draft's
    assert w.n_ctx == fake.n_ctx - (6 - 3)
    assert w.common_prefix([3, 4, 2]) == 3 and w.common_prefix([3, 4, 2, 1]) == 3


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_a_model_speculator_over_it_proposes_shared_tokens_with_their_restricted_q(temperature: float) -> None:
    """ModelSpeculator unchanged over the wrapper: every drafted id has a draft image, and a sampled draft's q is the
    draft's row restricted to the shared tokens and renormalised (0 elsewhere, sum 1)."""
    from edgespec.config import SamplingParams, SpecConfig
    from edgespec.decoding.sampling import warp
    from edgespec.decoding.vocab_map import restrict_probs
    from edgespec.drafting.model import ModelSpeculator
    from edgespec.drafting.model_policy import Controller

    from support.cost_curves import costs

    w, _ = wrapper()
    params = SamplingParams(temperature=temperature, top_k=0, top_p=1.0, min_p=0.0)
    spec = ModelSpeculator(w, params, Controller(SpecConfig(draft_max=3, adaptive=False), costs({1: 1.0, 4: 1.0}, 0.1)))
    rng = np.random.default_rng(3)
    for _ in range(20):
        prop = spec.propose([3, 4, 2], 3, rng)
        assert prop.tokens and all(w.vmap.t2d[t] >= 0 for t in prop.tokens)
        for q in prop.q:
            if temperature == 0.0:
                assert q is None
                continue
            dense = np.asarray(q)
            # the fake's rows are arange(n) plus a constant: the same distribution at every position
            want = restrict_probs(warp(np.arange(len(D), dtype=np.float32), params, ()), w.vmap)
            assert np.abs(dense - want).max() < 1e-6 and dense[[3, 4, 7]].sum() == 0.0


def test_a_prompt_that_ends_inside_a_character_is_read_as_whole_characters() -> None:
    seen: list[bytes] = []

    def recording(data: bytes, add_special: bool, parse_special: bool) -> list[int]:
        seen.append(data)
        return tokenize(data, add_special, parse_special)

    w = CrossVocabDraft(FakeDraft(), build_map(T, D), target_piece=PIECES.__getitem__, tokenize=recording, retokenize_prompt=True)
    w.translate([0, 6])  # "a" then the first byte of a three-byte character
    assert seen == ["a\ufffd".encode()]
    assert w.translate([0, 6, 2])[-1] == 1  # later tokens one by one
