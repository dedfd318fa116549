"""Deterministic mode through the engine on a tiny Q4_1 pair: greedy and seeded sampled output, speculative (a fixed
draft: batched verifies) or plain, alone or beside another slot's generation, is the same token for token; trees are
refused."""

from __future__ import annotations

import pytest

from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.errors import ConfigError
from edgespec.runtime.engine import Engine

from support.tiny import write_tiny_model

SHAPE = {"d_model": 128, "n_head": 4, "n_head_kv": 2, "d_ff": 128}
FIXED = SpecConfig(draft_max=6, adaptive=False)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    d = tmp_path_factory.mktemp("detpair")
    t = write_tiny_model(d / "t.gguf", seed=1, quant="q4_1", name="tiny-q41", **SHAPE)
    dr = write_tiny_model(d / "d.gguf", seed=2, layer_scale=0.4, quant="q4_1", name="tiny-q41-draft", **SHAPE)
    return t, dr


@pytest.fixture(scope="module")
def engine(pair):
    t, d = pair
    with Engine.load(ModelSpec(str(t), n_ctx=256, n_batch=64), ModelSpec(str(d), n_ctx=256, n_batch=64), spec=FIXED,
                     calibrate_costs=False, memory=False, parallel=2, deterministic=True) as eng:
        yield eng


@pytest.mark.parametrize("sampling", [SamplingParams(temperature=0.0), SamplingParams(temperature=0.9, seed=7)],
                         ids=["greedy", "seeded"])
def test_speculative_is_plain_and_beside_is_alone(engine, sampling):
    prompt = "the quick brown fox jumps over the lazy dog"
    plain = engine.generate(prompt, sampling=sampling, max_tokens=60, speculative=False)
    spec = engine.generate(prompt, sampling=sampling, max_tokens=60)
    assert spec.stats.n_drafted > 0
    assert spec.token_ids == plain.token_ids
    long_gen = engine.stream(prompt, sampling=sampling, max_tokens=60)
    other = engine.stream("in the beginning", sampling=SamplingParams(temperature=0.0), max_tokens=40)
    assert long_gen.result().token_ids == plain.token_ids
    assert other.result().token_ids


def test_engine_state(engine):
    assert engine.target.spec.deterministic
    assert engine.target.tree_paths == 0


def test_suffix_drafter_refused(pair):
    t, d = pair
    with pytest.raises(ConfigError, match="chains only"):
        Engine.load(ModelSpec(str(t), n_ctx=256, n_batch=64), drafter="suffix", calibrate_costs=False, memory=False,
                    deterministic=True)
    with pytest.raises(ConfigError, match="True or False"):
        Engine.load(ModelSpec(str(t), n_ctx=256, n_batch=64), calibrate_costs=False, memory=False, deterministic="yes")
