"""Deterministic mode on the real Qwen2.5-Coder pair (docs/determinism.md): greedy speculative output (a fixed 8-token
draft: verify batches of up to 9 rows) is token for token plain decoding's, and a long answer's tokens are the same
alone and with other slots' requests decoded beside it. Exact equality: no near-tie allowance."""

from __future__ import annotations

import threading

import pytest

from edgespec.config import ModelSpec, SamplingParams, SpecConfig

pytestmark = [pytest.mark.real, pytest.mark.slow]

TOKENS = 100
PROMPTS = [
    "Write a Python function that merges two sorted lists, with a docstring.",
    "Explain in plain English how a hash table handles collisions.",
    "Extract every name and amount as JSON: 'Alice paid Bob $120; Carol paid Dave $75.50.'",
]
GREEDY = SamplingParams(temperature=0.0)
FIXED = SpecConfig(draft_max=8, adaptive=False)


@pytest.fixture(scope="module")
def engine(real_pair):
    from edgespec.runtime.engine import Engine

    target, draft = real_pair
    with Engine.load(ModelSpec(str(target), n_ctx=1024), ModelSpec(str(draft), n_ctx=1024), spec=FIXED, calibrate_costs=False,
                     memory=False, parallel=2, deterministic=True) as eng:
        yield eng


@pytest.mark.parametrize("prompt", PROMPTS)
def test_speculative_greedy_is_plain(engine, prompt):
    msgs = [{"role": "user", "content": prompt}]
    plain = engine.generate(messages=msgs, sampling=GREEDY, max_tokens=TOKENS, speculative=False)
    spec = engine.generate(messages=msgs, sampling=GREEDY, max_tokens=TOKENS)
    assert spec.stats.n_drafted > 0
    assert spec.token_ids == plain.token_ids


def test_beside_another_slot(engine):
    msgs = [{"role": "user", "content": "Write a tutorial on Python decorators with three examples."}]
    alone = engine.generate(messages=msgs, sampling=GREEDY, max_tokens=TOKENS)
    gen = engine.stream(messages=msgs, sampling=GREEDY, max_tokens=TOKENS)
    shorts = []

    def feed():
        for q in ("Say hello in French.", "What is 17 * 23?", "Name three sorting algorithms."):
            shorts.append(engine.generate(messages=[{"role": "user", "content": q}], sampling=GREEDY, max_tokens=12))

    th = threading.Thread(target=feed)
    th.start()
    beside = gen.result()
    th.join()
    assert len(shorts) == 3
    assert beside.token_ids == alone.token_ids
