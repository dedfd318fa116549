"""Hostile sizes (issue 37, item 4-6): tokenization linear in its input and never holding others up, text limits on
every route, conversation trimming in O(log n) renderings, and a saved conversation that loads into another vocabulary."""

from __future__ import annotations

import random
import threading
import time

import pytest

from edgespec.llama import vocab
from edgespec.llama.backend import Model
from edgespec.llama.vocab import SpecialSplitter
from edgespec.config import ModelSpec
from edgespec.errors import EngineClosedError

from support.tiny import FIM_TOKENS, SPECIAL_TOKENS, write_tiny_model


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
        monkeypatch.setattr(vocab, "TOKENIZE_PIECE_BYTES", size)
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


# --------------------------------------------------------------------------------------------- item 6: conversations
def test_resuming_many_short_messages_renders_log_n_times(tiny, tmp_path, monkeypatch):
    """2,000 short messages that do not fit: the first turn finds what to drop in O(log n) renderings (each
    count in turn: 193 s), and drops what the one-by-one search dropped (the fewest turns that leave half the room)."""
    import json

    from edgespec.runtime.chat import ChatSession
    from edgespec.runtime.chat_file import FILE_FORMAT, FILE_VERSION
    from edgespec.config import SamplingParams
    from edgespec.runtime.engine import Engine

    msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"m{i}"} for i in range(2000)]
    p = tmp_path / "long.json"
    p.write_text(json.dumps({"format": FILE_FORMAT, "version": FILE_VERSION, "system": "", "messages": msgs}))
    with Engine.load(ModelSpec(str(tiny["target"]), n_ctx=512, n_threads=1), calibrate_costs=False, memory=False) as eng:
        s = ChatSession.load(eng, p)
        s.sampling, s.max_tokens = SamplingParams(temperature=0, seed=1), 4
        calls = []
        full = s._full
        monkeypatch.setattr(s, "_full", lambda m, system=True: calls.append(len(m)) or full(m, system))
        t0 = time.perf_counter()
        turn = s.send("last")
        turn.result()
        assert time.perf_counter() - t0 < 30
        assert len(calls) < 20
        room = s.n_ctx - s.reserve
        kept = s.messages[:-1] if s.messages[-1]["role"] == "assistant" else s.messages
        assert len(turn.prompt_tokens) <= room // 2
        # one more turn kept would not leave half the room
        i = len(msgs) - len(kept) + 1  # index of the newest dropped user message (kept starts after it)
        more = msgs[i - 2:] + [{"role": "user", "content": "last"}]
        assert len(full(more)[0]) > room // 2


def test_a_conversation_saved_with_a_bigger_vocabulary_loads_with_a_note(tiny, tmp_path):
    """Ids beyond this vocabulary, saved for another one: the messages load, the cache is rebuilt, a note says so."""
    import json

    from edgespec.runtime.chat import ChatSession
    from edgespec.config import SamplingParams
    from edgespec.runtime.engine import Engine

    with Engine.load(ModelSpec(str(tiny["mismatch_size"]), n_ctx=256, n_threads=1), calibrate_costs=False, memory=False) as big:
        s = ChatSession(big, sampling=SamplingParams(temperature=0, seed=1), max_tokens=4)
        s.send("hello").result()
        s.tokens = s.tokens + [big.target.n_vocab - 1]  # an id only the bigger vocabulary has
        path = s.save(tmp_path / "big.json")
    assert max(json.loads(path.read_text())["cache"]["tokens"]) >= 263
    with Engine.load(ModelSpec(str(tiny["target"]), n_ctx=256, n_threads=1), calibrate_costs=False, memory=False) as small:
        r = ChatSession.load(small, path)
        assert r.tokens == [] and [m["content"] for m in r.messages][:1] == ["hello"]
        assert any("another vocabulary" in n for n in r.notes)
        assert r.send("again").result().stats.n_generated > 0


# --------------------------------------------------------------------------------------------- item 5: text limits
@pytest.fixture(scope="module")
def fim_engine(tmp_path_factory):
    from edgespec.runtime.engine import Engine
    from support.tiny import write_tiny_fim_pair

    files = write_tiny_fim_pair(tmp_path_factory.mktemp("fimpair"))
    with Engine.load(ModelSpec(str(files["target"]), n_ctx=512, n_threads=1), calibrate_costs=False, memory=False) as eng:
        yield eng


def _reference_layout(eng, prefix, suffix, extra, reserve):
    """infill_tokens as it was: every text tokenized whole, the layout cuts."""
    from edgespec.prompts.infill import FILE_NAME, REPO_NAME, fim_layout

    def tok(t):
        return eng.target.tokenize(t, parse_special=False) if t else []

    return fim_layout(eng.fim_tokens(), tok(prefix), tok(suffix), extra=[(tok(f + "\n"), tok(t)) for f, t in extra],
                      repo=tok(REPO_NAME + "\n"), current_file=tok(FILE_NAME + "\n"),
                      bos=eng.target.bos if eng.target.add_bos and eng.target.bos >= 0 else None,
                      budget=max(4, eng.target.n_ctx - reserve))


def test_infill_tokenizes_only_what_the_context_can_keep(fim_engine):
    """Long prefixes, suffixes and many extra chunks give the ids of tokenizing everything and cutting after, and a
    27 MB suffix costs what a short one does."""
    eng = fim_engine
    rng = random.Random(3)
    lines = ["x = 1\n", "def f(a, b):\n", "    return a + b\n", "# the end\n", "\n"]
    prefix = "".join(rng.choice(lines) for _ in range(20_000))
    suffix = "".join(rng.choice(lines) for _ in range(20_000))
    extra = [(f"f{i}.py", "".join(rng.choice(lines) for _ in range(rng.randint(0, 30)))) for i in range(900)]
    for pre, suf, ext, reserve in ((prefix, suffix, extra, 64), (prefix[:300], suffix[:200], extra[-3:], 64),
                                   ("", suffix, [], 400), (prefix, "", extra[:2], 0), ("ab " * 100_000, "cd " * 100_000, [], 64)):
        assert eng.infill_tokens(pre, suf, extra=ext, reserve=reserve) == _reference_layout(eng, pre, suf, ext, reserve)
    t0 = time.perf_counter()
    toks = eng.infill_tokens("def f():\n", "x = 1\n" * 4_500_000, reserve=64)
    assert time.perf_counter() - t0 < 10 and len(toks) == eng.target.n_ctx - 64


def test_too_many_extra_chunks_are_refused(fim_engine):
    from edgespec.errors import ConfigError
    from edgespec.prompts.infill import MAX_EXTRA_CHUNKS

    with pytest.raises(ConfigError, match=f"at most {MAX_EXTRA_CHUNKS}"):
        fim_engine.infill_tokens("a", "b", extra=["x"] * (MAX_EXTRA_CHUNKS + 1))
    assert fim_engine.infill_tokens("a", "b", extra=["x"] * MAX_EXTRA_CHUNKS)


def test_tokenize_route_bounds_its_content(fim_engine):
    from starlette.testclient import TestClient

    from edgespec.server import create_app
    from edgespec.server.routes_llamacpp import TOKENIZE_MAX_BYTES, TOKENIZE_PIECES_MAX_BYTES

    with TestClient(create_app(fim_engine), base_url="http://127.0.0.1") as c:
        r = c.post("/tokenize", json={"content": "<|im_end|>" * 200_000})
        assert r.status_code == 200 and len(r.json()["tokens"]) == 200_000
        r = c.post("/tokenize", json={"content": "a" * (TOKENIZE_MAX_BYTES + 1)})
        assert r.status_code == 400 and r.json()["error"]["param"] == "content"
        r = c.post("/tokenize", json={"content": "é" * (TOKENIZE_PIECES_MAX_BYTES // 2 + 1), "with_pieces": True})
        assert r.status_code == 400 and "with_pieces" in r.json()["error"]["message"]
        r = c.post("/infill", json={"input_prefix": "a", "input_suffix": "b", "input_extra": [{"text": "x"}] * 2000})
        assert r.status_code == 400 and "at most" in r.json()["error"]["message"]


@pytest.mark.slow
def test_close_leaves_the_release_to_a_long_call_in_progress(tmp_path, monkeypatch):
    """One llama.cpp call on a long plain text: close() returns after CLOSE_WAIT, no call starts after it, and the
    model is freed when the call ends."""
    monkeypatch.setattr(Model, "CLOSE_WAIT", 0.1)
    m = Model(ModelSpec(str(write_tiny_model(tmp_path / "t.gguf")), n_ctx=64, n_batch=16, n_threads=1))
    got: list[int] = []
    th = threading.Thread(target=lambda: got.extend(m.tokenize("hello world " * 1_000_000)))
    th.start()
    time.sleep(0.3)
    t0 = time.perf_counter()
    m.close()
    assert time.perf_counter() - t0 < 2 and m.closed and m._ctx is not None  # still in use: not freed yet
    with pytest.raises(EngineClosedError):
        m.tokenize("hi")
    th.join(60)
    assert len(got) > 1_000_000 and m._ctx is None and m._model is None


# --------------------------------------------------------------------------------------------- seeded output and caches
def test_seeded_output_is_the_same_cold_warm_and_plain_where_logits_do_not_depend_on_batching(tiny):
    """docs/api.md "Seeded output and caches": the uniforms are per position, so drafts, the controller's state and
    what the cache held change a seeded token only through the logits; on the tiny F32 models the logits of a prompt
    decoded whole, in pieces, or after a reused prefix are bit-identical, and so is the output."""
    import numpy as np

    from edgespec.config import SamplingParams
    from edgespec.runtime.engine import Engine

    with Model(ModelSpec(str(tiny["target"]), n_ctx=128, n_batch=64, n_threads=1)) as m:
        toks = m.tokenize("the cat sat on the mat and then it")
        whole = m.sync(toks, rows=(-1,))
        m.reset()
        m.sync(toks[:5], rows=())
        pieces = m.sync(toks, rows=(-1,))
        assert np.array_equal(whole, pieces)

    prompt = "the cat sat on the mat and then"
    with Engine.load(ModelSpec(str(tiny["target"]), n_ctx=512, n_threads=1), ModelSpec(str(tiny["draft"]), n_ctx=512, n_threads=1),
                     calibrate_costs=False, memory=False) as eng:
        def run(p: str, seed: int, speculative: bool = True):
            return eng.stream(p, sampling=SamplingParams(temperature=1.0, seed=seed), max_tokens=32, speculative=speculative).result()

        for seed in range(8):
            cold = run(prompt, seed)
            run(prompt + " a long detour of other text" * 3, seed + 100)  # the cache now holds another conversation
            warm = run(prompt, seed)
            assert warm.stats.n_cached > 0  # its prefix was reused, not recomputed
            assert warm.token_ids == cold.token_ids == run(prompt, seed, speculative=False).token_ids
