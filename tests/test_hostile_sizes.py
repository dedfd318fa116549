"""Hostile sizes (issue 37, item 4-6): tokenization linear in its input and never holding others up, text limits on
every route, conversation trimming in O(log n) renderings, and a saved conversation that loads into another vocabulary."""

from __future__ import annotations

import random
import threading
import time

import pytest

from edgespec import backend
from edgespec.backend import Model, SpecialSplitter
from edgespec.config import ModelSpec
from edgespec.errors import EngineClosedError
from edgespec.tiny import FIM_TOKENS, SPECIAL_TOKENS, write_tiny_model


@pytest.fixture(scope="module")
def fim_model(tmp_path_factory):
    path = write_tiny_model(tmp_path_factory.mktemp("fim") / "t.gguf", fim=True)
    with Model(ModelSpec(str(path), n_ctx=256, n_batch=64, n_threads=1)) as m:
        yield m


# --------------------------------------------------------------------------------------------- item 4: tokenization
def test_pieces_tokenize_as_the_whole(fim_model, monkeypatch):
    """Cut into pieces of 1-16 bytes wherever a cut is safe, random texts of special tokens, their fragments,
    spaces and plain text get exactly the ids of one llama.cpp call on the whole, with every flag."""
    m = fim_model
    rng = random.Random(7)
    atoms = SPECIAL_TOKENS + FIM_TOKENS + ["<|", "|>", "<|im", " ", "\n", "  ", "the", "hi there", "é", "日本", "<|im_start|", "|im_end|>", "\t"]
    cut = 0
    for _ in range(600):
        text = "".join(rng.choice(atoms) for _ in range(rng.randint(0, 50)))
        size = rng.choice([1, 2, 5, 16])
        monkeypatch.setattr(backend, "TOKENIZE_PIECE_BYTES", size)
        cut += bool(m.special_splitter(True).cuts(text.encode(), size))
        for add in (False, True):
            for special in (False, True):
                assert m.tokenize(text, add_special=add, parse_special=special) == m._tokenize_bytes(text.encode(), add, special), (text, add, special)
    assert cut > 300  # most texts were cut somewhere


def test_splitter_refuses_unsafe_cuts():
    sp = SpecialSplitter({b"<a>": False, b"a><b": False, b"<c>": True})
    assert sp.safe(b"x<a>y", 1)
    assert not sp.safe(b"<a><b>", 3)  # "a><b" straddles the cut
    assert not sp.safe(b"x<a><b", 1)  # "a><b" overlaps the token at the cut without starting there
    assert not sp.safe(b"x <c>", 2)  # <c> strips the space before it: across the cut
    assert sp.safe(b"x <a>", 2)  # <a> does not strip
    assert not sp.safe(b"x<d>", 1)  # no token starts there
    assert sp.cuts(b"<a>" * 10, 4) == [6, 12, 18, 24]


def test_many_special_tokens_tokenize_in_linear_time(fim_model):
    end = fim_model.tokenize("<|im_end|>")
    assert len(end) == 1
    t0 = time.perf_counter()
    ids = fim_model.tokenize("<|im_end|>" * 200_000)
    assert time.perf_counter() - t0 < 15  # one llama.cpp call: 76 s (quadratic); pieces: ~0.3 s
    assert ids == end * 200_000


def test_vocabulary_calls_run_together_and_close_waits_for_one_piece(tmp_path):
    """A long tokenization does not hold up another thread's, and close() ends it after the piece in progress."""
    path = write_tiny_model(tmp_path / "t.gguf")
    m = Model(ModelSpec(str(path), n_ctx=64, n_batch=16, n_threads=1))
    started, errors = threading.Event(), []
    text = "<|im_end|>x" * 3_000_000  # ~30 s of pieces

    def long() -> None:
        started.set()
        try:
            m.tokenize(text)
        except EngineClosedError as e:
            errors.append(e)

    th = threading.Thread(target=long)
    th.start()
    started.wait()
    time.sleep(0.2)
    t0 = time.perf_counter()
    assert m.tokenize("hi") == [104, 105]
    assert time.perf_counter() - t0 < 5
    m.close()
    th.join(10)
    assert not th.is_alive() and len(errors) == 1
    assert time.perf_counter() - t0 < 10
