"""The backend through the real llama.cpp, on tiny generated GGUF models (F32: batched and single-token
decoding agree to float rounding, tolerance 1e-3 on logits of magnitude ~10)."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.errors import BackendError, ContextFullError
from edgespec.llama.backend import Model
from edgespec.config import ModelSpec
from edgespec.errors import IncompatiblePairError
from edgespec.llama.gguf_check import ModelFileError, check_pair, inspect_gguf
from edgespec.llama.vocab_pair import require_pairable

from support.tiny import CHATML_TEMPLATE

TOL = 1e-3


@pytest.fixture(scope="module")
def target(tiny):
    with Model(ModelSpec(tiny["target"], n_ctx=256, n_batch=64)) as m:
        yield m


def _tokens(n: int, seed: int = 0) -> list[int]:
    return [int(t) for t in np.random.default_rng(seed).integers(0, 256, n)]


def test_facts(target):
    assert target.n_vocab == 256 + 4 + 3
    assert target.eos == 256 + 4 + 2
    assert target.is_eog(target.eos)
    assert not target.add_bos
    assert target.chat_template == CHATML_TEMPLATE


def test_tokenize_roundtrip(target):
    text = "the quick brown fox, 12 + 30 = 42; héllo"
    toks = target.tokenize(text)
    assert target.detokenize(toks) == text
    assert target.tokenize("<|im_start|>user", parse_special=True)[0] == 256 + 4 + 1
    assert target.token_bytes(target.eos) == b""  # control tokens do not render as text
    assert target.token_bytes(target.eos, special=True) == b"<|im_end|>"


def test_batched_rows_equal_single_token_decoding(target):
    toks = _tokens(40, seed=1)
    target.reset()
    batched = target.decode(toks, 0, range(len(toks)))
    target.reset()
    single = np.stack([target.decode([t], i, (0,))[0] for i, t in enumerate(toks)])
    assert batched.shape == (40, target.n_vocab)
    assert np.max(np.abs(batched - single)) < TOL


def test_rows_subset_and_order(target):
    toks = _tokens(20, seed=2)
    target.reset()
    full = target.decode(toks, 0, range(20))
    target.reset()
    sub = target.decode(toks, 0, (-1, 3, 7))
    assert np.max(np.abs(sub - full[[19, 3, 7]])) < TOL
    target.reset()
    assert target.decode(toks, 0, ()).shape == (0, target.n_vocab)
    assert target.n_past == 20


def test_views_of_the_logits_buffer_equal_the_copies(target):
    """decode(view=True) and decode_next give llama.cpp's own buffer (no copy) with exactly the copies' values; rows
    asked out of order, or a decode over several batches, still come back as copies; the next decode overwrites a
    view (what its callers must know)."""
    toks = _tokens(12, seed=4)
    target.reset()
    copy = target.decode(toks, 0, (3, 7, 11))
    nxt = target.decode([5], 12, (0,))
    target.reset()
    view = target.decode(toks, 0, (3, 7, 11), view=True)
    assert not view.flags.owndata and np.array_equal(view, copy)
    row = target.decode_next(5)
    assert not row.flags.owndata and np.array_equal(row, nxt[0])
    target.reset()
    unordered = target.decode(toks, 0, (7, 3), view=True)
    assert unordered.flags.owndata and np.array_equal(unordered, copy[[1, 0]])
    target.reset()
    first = target.decode(toks[:6], 0, (5,), view=True)
    kept = first.copy()
    target.decode(toks[6:], 6, (5,))
    assert not np.array_equal(first, kept)  # overwritten by the next decode
    # the arrays over the buffer are kept per (address, rows); a decode with more outputs than the buffer held
    # (llama.cpp reallocates it) must not leave an array over freed memory: views stay equal to the copies
    many = _tokens(60, seed=5)

    def run(as_view: bool) -> list[np.ndarray]:
        target.reset()
        return [target.decode(many[:4], 0, (3,), view=as_view).copy(),
                target.decode(many[4:60], 4, tuple(range(56)), view=as_view).copy(),
                target.decode_next(5).copy() if as_view else target.decode([5], 60, (0,))[0],
                target.decode(many[:2], 61, (0, 1), view=as_view).copy()]

    copies = run(False)
    for _ in range(2):
        assert all(np.array_equal(a, b) for a, b in zip(run(True), copies))


def test_prefill_larger_than_batch_is_chunked(target):
    toks = _tokens(150, seed=3)  # n_batch is 64
    target.reset()
    rows = target.decode(toks, 0, (0, 70, 149))
    target.reset()
    ref = [target.decode(toks[: i + 1], 0, (-1,))[0] for i in (0,)]
    assert np.max(np.abs(rows[0] - ref[0])) < TOL
    target.reset()
    ref149 = target.decode(toks, 0, (-1,))[0]
    assert np.max(np.abs(rows[2] - ref149)) < TOL


def test_truncate_then_redecode_reproduces_logits(target):
    toks = _tokens(30, seed=4)
    target.reset()
    first = target.decode(toks, 0, range(30))
    target.truncate(12)
    assert target.n_past == 12 and target.cached == toks[:12]
    again = target.decode(toks[12:], 12, range(18))
    assert np.max(np.abs(again - first[12:])) < TOL
    # a different continuation after truncation, then back: no trace of the discarded tokens
    target.truncate(12)
    target.decode(_tokens(10, seed=5), 12, ())
    target.truncate(12)
    back = target.decode(toks[12:], 12, (-1,))
    assert np.max(np.abs(back[0] - first[-1])) < TOL


def test_sync_reuses_common_prefix(target):
    a = _tokens(25, seed=6)
    b = a[:20] + _tokens(5, seed=7)
    target.reset()
    target.sync(a)
    before = target.n_decoded
    target.sync(b)
    assert target.n_decoded - before == 5
    assert target.cached == b


def test_position_and_range_errors(target):
    target.reset()
    target.decode([1, 2, 3], 0, ())
    with pytest.raises(BackendError, match="position"):
        target.decode([4], 5, (0,))
    with pytest.raises(BackendError, match="truncate"):
        target.truncate(10)
    with pytest.raises(BackendError, match="out of range"):
        target.decode([99999], 3, (0,))
    assert target.n_past == 3


def test_context_full_is_an_error_not_a_crash(tiny):
    with Model(ModelSpec(tiny["target"], n_ctx=32, n_batch=32)) as m:
        with pytest.raises(ContextFullError):
            m.decode(_tokens(40), 0, (-1,))
        assert m.n_past == 0
        m.decode(_tokens(32), 0, (-1,))  # exactly full is fine


@pytest.mark.parametrize(
    "key, pattern",
    [
        ("truncated", "truncated"),
        ("text", "not a GGUF file"),
        ("f64", "F64.*cannot compute"),
    ],
)
def test_bad_files_are_refused_before_llama_cpp(tiny, key, pattern):
    with pytest.raises(ModelFileError, match=pattern):
        inspect_gguf(tiny[key])
    with pytest.raises(ModelFileError, match=pattern):
        Model(ModelSpec(tiny[key]))


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="no such file"):
        inspect_gguf(tmp_path / "nope.gguf")
    with pytest.raises(ModelFileError, match="directory"):
        inspect_gguf(tmp_path)


def test_unknown_architecture(tmp_path):
    from support.tiny import write_tiny_model

    p = write_tiny_model(tmp_path / "weird.gguf", architecture="notanarch")
    with pytest.raises(ModelFileError, match="architecture 'notanarch'"):
        inspect_gguf(p)


def test_pair_compatibility(tiny):
    t = inspect_gguf(tiny["target"])
    assert check_pair(t, inspect_gguf(tiny["draft"])).ok
    assert check_pair(t, inspect_gguf(tiny["bad_draft"])).ok  # same tokenizer, different weights
    text = check_pair(t, inspect_gguf(tiny["mismatch_text"]))
    assert not text.ok and "different text, first id 100" in text.verdict()
    size = check_pair(t, inspect_gguf(tiny["mismatch_size"]))
    assert not size.ok and "vocabulary sizes differ by 300" in size.verdict()
    with pytest.raises(IncompatiblePairError, match="cannot be used with target"):  # the engine's rule (vocab_pair.py)
        require_pairable(t, inspect_gguf(tiny["other_script"]))  # shares no ordinary token


def test_info_summary(tiny):
    s = inspect_gguf(tiny["target"]).summary()
    assert s["architecture"] == "llama" and s["vocab_size"] == 263 and s["chat_template"]
    assert s["quantization"] == "ALL_F32"


# --------------------------------------------------------------------------------------------- trees and snapshots
def test_tree_rows_equal_chain_decoding_and_the_kept_path_continues(tiny):
    """One decode of a token tree gives, for every node, the logits a chain decode of its path gives; keeping a
    path leaves the cache as if that path alone had been decoded."""
    from edgespec.decoding.tree import TokenTree

    ctx = [97, 98, 99, 32, 100]
    tree = TokenTree()
    a, b = tree.add(-1, 97), tree.add(-1, 98)
    tree.add(a, 99), tree.add(a, 100), tree.add(b, 101)
    tb = tree.batch(ctx[-1], len(ctx) - 1)
    depths = [p - (len(ctx) - 1) for p in tb.positions]
    with Model(ModelSpec(tiny["target"], n_ctx=256, n_threads=1), tree_paths=4) as m, Model(ModelSpec(tiny["target"], n_ctx=256, n_threads=1)) as ref:
        m.sync(ctx[:-1], rows=())
        rows = m.decode_tree(tb.tokens, depths, tb.seq_ids)
        for path in tb.paths:
            ref.reset()
            chain = ref.decode(ctx + [tree.token(i) for i in path], 0, range(len(ctx) - 1, len(ctx) + len(path)))
            for k, row in enumerate([0] + [tb.node_row[i] for i in path]):
                assert np.max(np.abs(rows[row] - chain[k])) < 1e-3
        s = tb.seq_ids[tb.node_row[3]][0]  # the path through node 3 (a, 100)
        m.keep_tree_path(s, [97, 100])
        assert m.cached == ctx + [97, 100]
        nxt = m.decode([5], m.n_past)[0]
        ref.reset()
        assert np.max(np.abs(nxt - ref.decode(ctx + [97, 100, 5], 0)[0])) < 1e-2
        # an interrupted tree (no keep) is cleaned up by the next decode: the cache is the main sequence again
        m.truncate(len(ctx) - 1)
        m.decode_tree(tb.tokens, depths, tb.seq_ids)
        m.truncate(len(ctx) - 1)
        again = m.decode([ctx[-1]], len(ctx) - 1)[0]
        ref.reset()
        assert np.max(np.abs(again - ref.decode(ctx, 0)[0])) < 1e-2
        with pytest.raises(BackendError, match="tree_paths"):
            ref.decode_tree(tb.tokens, depths, tb.seq_ids)


def test_snapshot_restore_equals_a_fresh_prefill(tiny):
    ctx = [int(t) for t in np.random.default_rng(0).integers(97, 105, 60)]
    with Model(ModelSpec(tiny["target"], n_ctx=256, n_threads=1), prompt_cache_bytes=8 << 20) as m:
        m.sync(ctx, rows=())
        other = [int(t) for t in np.random.default_rng(1).integers(97, 105, 50)]
        m.sync(other, rows=())  # throws ctx away: a snapshot is kept first
        assert m.prompt_cache is not None and len(m.prompt_cache) == 1
        before = m.n_decoded
        row = m.sync(ctx + [100])[0]  # the snapshot shares all of ctx: restored, only one token decoded
        assert m.n_decoded - before == 1 and m.prompt_cache.restores == 1
        with Model(ModelSpec(tiny["target"], n_ctx=256, n_threads=1)) as fresh:
            assert np.max(np.abs(row - fresh.decode(ctx + [100], 0)[0])) < 1e-2


@pytest.mark.parametrize("n_new", [1, 2])
def test_a_decode_interrupted_before_its_bookkeeping_leaves_nothing_behind(target, monkeypatch, n_new):
    """A decode that raises between llama_decode and its bookkeeping (a Ctrl-C there) leaves cells past `cached`
    in llama.cpp; the next decode drops them first (the slot's `_beyond` mark), so its logits equal a clean cache's.
    One token with a view (Slot._decode_one, the plain step) and two tokens (the general path); a decode that ran to
    its end leaves no mark (it costs no llama.cpp call)."""
    toks = _tokens(10, seed=7)
    target.reset()
    target.decode(toks[:6], 0)
    clean = target.decode(toks[6:9], 6, (0, 1, 2))
    target.reset()
    target.decode(toks[:6], 0)
    slot = target.slot(0)
    assert not slot._beyond
    calls = []

    def interrupted(*a, **k):
        calls.append(1)
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(type(slot.context), "logits_view", interrupted)
        with pytest.raises(KeyboardInterrupt):
            target.decode(toks[6:6 + n_new], 6, (n_new - 1,), view=True)
    assert calls and target.n_past == 6 and slot._beyond  # llama.cpp holds n_new cells more than `cached`
    again = target.decode(toks[6:9], 6, (0, 1, 2))
    assert np.allclose(again, clean, atol=TOL) and not slot._beyond
