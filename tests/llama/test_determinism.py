"""Deterministic mode (ModelSpec.deterministic, llama/determinism.py) through the real llama.cpp on tiny Q4_1 models:
a position's logits are bit-identical decoded alone, in batches of 2, 9 and 17, beside another slot's rows and at
another thread count; a model the mode cannot make batch-invariant is refused at load, never loaded."""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.config import ModelSpec
from edgespec.errors import ConfigError
from edgespec.llama.backend import DecodePart, Model

from support.tiny import write_tiny_model

SHAPE = {"d_model": 128, "n_head": 4, "n_head_kv": 2, "d_ff": 128}  # head_dim 32: a q8_0 cache's block


@pytest.fixture(scope="module")
def q41(tmp_path_factory):
    d = tmp_path_factory.mktemp("det")
    return {
        "target": write_tiny_model(d / "t.gguf", seed=1, quant="q4_1", name="tiny-q41", **SHAPE),
        "draft": write_tiny_model(d / "d.gguf", seed=2, layer_scale=0.4, quant="q4_1", name="tiny-q41-draft", **SHAPE),
    }


def _spec(path, n_ctx=256, **kw):
    return ModelSpec(str(path), n_ctx=n_ctx, n_batch=64, deterministic=True, **kw)


def _tokens(n, seed):
    return [int(t) for t in np.random.default_rng(seed).integers(0, 256, n)]


@pytest.mark.parametrize("n_prompt", [40, 600], ids=["short", "cache past 512 cells"])
def test_alone_equals_batched_bitwise(q41, n_prompt):
    prompt, cont = _tokens(n_prompt, 0), _tokens(17, 1)
    with Model(_spec(q41["target"], n_ctx=1024, n_threads=2), parallel=2) as m:
        m.sync(prompt, rows=())
        alone = m.decode(cont[:1], len(prompt), rows=(0,))[0].copy()
        for n in (2, 9, 17):
            m.truncate(len(prompt))
            got = m.decode(cont[:n], len(prompt), rows=(0, n - 1))
            assert np.array_equal(got[0], alone), n
        # beside another slot's 12 tokens, in one llama_decode
        m.truncate(len(prompt))
        other = m.slot(1)
        other.sync(_tokens(30, 2), rows=())
        rows = m.decode_parts([DecodePart(m, cont[:1], rows=(0,)), DecodePart(other, _tokens(12, 3), rows=(-1,))])
        assert np.array_equal(rows[0][0], alone)
    with Model(_spec(q41["target"], n_ctx=1024, n_threads=1)) as m1:  # another thread count, another load
        m1.sync(prompt, rows=())
        assert np.array_equal(m1.decode(cont[:1], len(prompt), rows=(0,))[0], alone)


def test_prefill_chunks_do_not_matter(q41):
    """The same cache filled in one batch or token by token gives the same next logits."""
    prompt = _tokens(33, 4)
    with Model(_spec(q41["target"])) as m:
        whole = m.sync(prompt)[0].copy()
        m.reset()
        m.sync(prompt[:1], rows=())
        for i, t in enumerate(prompt[1:], start=1):
            last = m.decode([t], i)
        assert np.array_equal(last[0], whole)


def test_trees_refused(q41):
    with pytest.raises(ConfigError, match="chains only"):
        Model(_spec(q41["target"]), tree_paths=2)


def test_small_heads_refused(tiny):
    with pytest.raises(ConfigError, match="multiple of 32"):
        Model(_spec(tiny["target"]))  # head size 8


def test_f32_model_refused_or_invariant(tmp_path):
    """F32 weights take llama.cpp's llamafile sgemm in batches of 2 or more where the build has it (a compile-time
    choice): the load-time check refuses such a model; where it loads, its logits are batch-invariant."""
    try:
        m = Model(_spec(write_tiny_model(tmp_path / "f32.gguf", seed=1, **SHAPE)))
    except ConfigError as e:
        assert "decoded alone and in a batch" in str(e)
        return
    with m:
        prompt, cont = _tokens(20, 5), _tokens(9, 6)
        m.sync(prompt, rows=())
        alone = m.decode(cont[:1], len(prompt), rows=(0,))[0].copy()
        m.truncate(len(prompt))
        assert np.array_equal(m.decode(cont, len(prompt), rows=(0,))[0], alone)
