"""One prompt path (runtime/prompt.py): the engine, the server and the API build a request's tokens the same way,
with one infill reserve rule and one check that the prompt leaves room to generate."""

from __future__ import annotations

import pytest

from edgespec.config import ModelSpec, SamplingParams
from edgespec.errors import ContextFullError, PromptTooLongError
from edgespec.runtime.request import GenerationRequest, InfillPrompt

N_CTX = 512


@pytest.fixture(scope="module")
def fim_engine(tmp_path_factory):
    from edgespec.runtime.engine import Engine
    from support.tiny import write_tiny_fim_pair

    files = write_tiny_fim_pair(tmp_path_factory.mktemp("fimpair"))
    with Engine.load(ModelSpec(str(files["target"]), n_ctx=N_CTX, n_threads=1), calibrate_costs=False, memory=False) as eng:
        yield eng


def _long_infill() -> InfillPrompt:
    # far longer than the context on both sides: the layout clips, and how much it keeps depends on the reserve
    return InfillPrompt("".join(f"line {i} = {i * 7}\n" for i in range(400)), "".join(f"tail {i}\n" for i in range(400)))


def test_the_infill_reserve_is_one_rule(fim_engine):
    """An infill leaves max_tokens free for the middle (at most half the context), a quarter of it when max_tokens
    is None (the server's requests without n_predict): the same tokens as infill_tokens with that reserve."""
    prompts, fi = fim_engine.prompts, _long_infill()

    def laid_out(reserve: int) -> list[int]:
        return fim_engine.infill_tokens(fi.prefix, fi.suffix, reserve=reserve)

    assert prompts.request_tokens(GenerationRequest(infill=fi, max_tokens=None)) == laid_out(N_CTX // 4)
    assert prompts.request_tokens(GenerationRequest(infill=fi, max_tokens=40)) == laid_out(40)
    assert prompts.request_tokens(GenerationRequest(infill=fi, max_tokens=10_000)) == laid_out(N_CTX // 2)
    assert len(laid_out(N_CTX // 4)) > len(laid_out(N_CTX // 2))  # the rule matters for this prompt


def test_start_reports_the_prompt_and_the_budget_it_used(fim_engine):
    fi = _long_infill()
    gen = fim_engine.start(GenerationRequest(infill=fi, max_tokens=None, sampling=SamplingParams(temperature=0)))
    try:
        assert gen.prompt_tokens == fim_engine.infill_tokens(fi.prefix, fi.suffix, reserve=N_CTX // 4)
        assert gen.max_tokens == N_CTX - len(gen.prompt_tokens)  # None: until the context is full
    finally:
        gen.close()
    gen = fim_engine.start(GenerationRequest(prompt="x = 1", max_tokens=3, sampling=SamplingParams(temperature=0)))
    assert gen.max_tokens == 3 and gen.prompt_tokens == fim_engine.prompt_tokens("x = 1")
    assert len(gen.result().token_ids) <= 3


def test_an_infill_warm_up_generates_nothing(fim_engine):
    r = fim_engine.start(GenerationRequest(infill=InfillPrompt("def f(", ")"), max_tokens=0)).result()
    assert r.token_ids == [] and r.text == ""


def test_a_prompt_with_no_room_to_generate_is_refused_before_it_is_queued(fim_engine):
    full = [5] * N_CTX
    with pytest.raises(PromptTooLongError) as e:
        fim_engine.start(GenerationRequest(tokens=full, max_tokens=1))
    assert (e.value.n_prompt, e.value.n_ctx) == (N_CTX, N_CTX) and isinstance(e.value, ContextFullError)
    with pytest.raises(PromptTooLongError):
        fim_engine.start(GenerationRequest(tokens=full[:-1] + [5, 5], max_tokens=0))
    with pytest.raises(PromptTooLongError):
        fim_engine.start(GenerationRequest(tokens=full, max_tokens=None))
    # max_tokens 0 only evaluates the prompt: a full context is enough
    fim_engine.start(GenerationRequest(tokens=full, max_tokens=0)).result()
    assert fim_engine.pending == 0
