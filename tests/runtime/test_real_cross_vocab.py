"""The default target with Gemma 3 270M as its draft (another vocabulary: docs/vocabularies.md), when that file is
in the model cache (`edgespec models pull qwen2.5-coder-1.5b+gemma3-270m --role draft`): the pair's mode from the
headers, and greedy speculative output checked at every position against plain decoding along its own tokens, as
tests/runtime/test_real_pair.py does for the default pair (each token the target's argmax, or within NEAR_TIE of it:
batched and single-token kernels part at near-ties)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from edgespec.config import ModelSpec, SamplingParams, SpecConfig

pytestmark = [pytest.mark.real, pytest.mark.slow]

NEAR_TIE = 0.6  # as tests/runtime/test_real_pair.py
GEMMA = "gemma-3-270m-q4_k_m.gguf"
PROMPTS = [
    "Write a Python function that reverses a linked list.",
    "Write a SQL query that returns the top 5 customers by total order value.",
    "Describe the water cycle in three sentences.",
    "What is 17 * 23? Show the steps.",
]


@pytest.fixture(scope="module")
def gemma(real_pair: tuple[Path, Path]) -> tuple[Path, Path]:
    path = Path(real_pair[0]).parent / GEMMA
    if not path.is_file():
        if os.environ.get("EDGESPEC_REQUIRE_REAL") == "1":  # CI pulls it (.ci/run)
            pytest.fail(f"{GEMMA} is not in the model cache (edgespec models pull qwen2.5-coder-1.5b+gemma3-270m --role draft)")
        pytest.skip(f"{GEMMA} is not in the model cache (edgespec models pull qwen2.5-coder-1.5b+gemma3-270m --role draft)")
    return Path(real_pair[0]), path


def test_the_pair_is_an_intersection(gemma: tuple[Path, Path]) -> None:
    from edgespec.llama.gguf_check import inspect_gguf
    from edgespec.llama.vocab_pair import pair_vocab

    pair = pair_vocab(inspect_gguf(gemma[0]), inspect_gguf(gemma[1]))
    assert pair.mode == "intersection" and pair.vmap is not None
    assert 0.5 < pair.coverage < 0.8 and pair.vmap.n_shared > 90_000


def test_greedy_identity_with_gemma_as_draft(gemma: tuple[Path, Path]) -> None:
    from edgespec.runtime.engine import Engine

    greedy = SamplingParams(temperature=0)
    spec = SpecConfig(draft_max=3, adaptive=False)
    with Engine.load(ModelSpec(gemma[0], n_ctx=1024), ModelSpec(gemma[1], n_ctx=1024), drafter="model", spec=spec,
                     calibrate_costs=False, memory=False) as eng:
        accepted = 0
        for prompt in PROMPTS:
            msgs = [{"role": "user", "content": prompt}]
            run = eng.generate(messages=msgs, sampling=greedy, max_tokens=40)
            assert run.stats.n_drafted > 0
            accepted += run.stats.n_accepted
            ids = eng.prompt_tokens(messages=msgs)

            def walk(e: Engine, p: list[int] = ids, toks: list[int] = run.token_ids) -> list[tuple[int, float]]:
                model = e.target
                model.reset()
                logits = model.sync(p)[0]
                off = []
                for i, t in enumerate(toks):
                    top = int(np.argmax(logits))
                    if t != top:
                        off.append((i, float(logits[top] - logits[t])))
                    if i + 1 < len(toks):
                        logits = model.decode([t], model.n_past)[0]
                return off

            for pos, gap in eng.run_on_worker(walk).result():
                assert gap < NEAR_TIE, f"{prompt!r}: token {pos} is {gap:.3f} below plain decoding's argmax (not a near-tie)"
        assert accepted > 0
