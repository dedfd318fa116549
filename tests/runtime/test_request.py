"""The one generation request (edgespec.runtime.request): what it checks when built, the one place "auto" is resolved, the
drafter kinds as a str Enum, the one default sampling, and Engine.start running a request as Engine.stream does."""

from __future__ import annotations

import json

import pytest

from edgespec import DEFAULT_SAMPLING, ConfigError, DrafterKind, GenerationRequest, InfillPrompt, SamplingParams
from edgespec.runtime.request import AUTO, resolve_drafter
from edgespec.drafting import KINDS, MODEL_KINDS, TREE_KINDS

from support.engines import GREEDY, PROMPTS, make_engine


# --------------------------------------------------------------------------------------------- the kinds
def test_drafter_kinds_read_as_their_names():
    assert [k.value for k in DrafterKind] == ["model", "ngram", "suffix", "model+ngram", "model+suffix", "none"]
    assert KINDS == tuple(DrafterKind)
    assert set(MODEL_KINDS) == {"model", "model+ngram", "model+suffix"} and set(TREE_KINDS) == {"suffix", "model+suffix"}
    k = DrafterKind.MODEL_NGRAM
    # what string code (the server, saved sessions, JSON stats) does with a kind keeps working
    assert k == "model+ngram" and f"{k}" == str(k) == "model+ngram" and "ngram" in k
    assert {"model+ngram": 1}[k] == 1 and json.dumps({"drafter": k}) == '{"drafter": "model+ngram"}'
    assert DrafterKind("suffix").uses_tree and not DrafterKind.NGRAM.needs_draft_model and DrafterKind.MODEL_NGRAM.uses_ngram


@pytest.mark.parametrize("choice, draft, lookup, want", [
    (AUTO, True, False, "model+ngram"),
    (AUTO, True, True, "model+ngram"),
    (AUTO, False, False, "none"),  # the library without a draft model: plain decoding
    (AUTO, False, True, "ngram"),  # the CLI given --target and no draft model: the free lookup
    ("ngram", False, False, "ngram"),
    ("suffix", False, False, "suffix"),
    (DrafterKind.MODEL, True, False, "model"),
    ("none", True, False, "none"),
])
def test_auto_is_resolved_in_one_place(choice, draft, lookup, want):
    kind = resolve_drafter(choice, draft_model=draft, lookup_without_draft=lookup)
    assert isinstance(kind, DrafterKind) and kind == want


def test_a_bad_drafter_choice_is_one_line():
    with pytest.raises(ConfigError, match="drafter must be one of model, ngram, suffix, model\\+ngram, model\\+suffix, none, got 'turbo'"):
        resolve_drafter("turbo", draft_model=True)
    with pytest.raises(ConfigError, match="drafter 'model\\+suffix' needs a draft model"):
        resolve_drafter("model+suffix", draft_model=False)
    with pytest.raises(ConfigError, match="drafter must be one of"):
        resolve_drafter(3, draft_model=True)


# --------------------------------------------------------------------------------------------- the request
def test_a_request_is_frozen_and_normalised():
    r = GenerationRequest(messages=[{"role": "user", "content": "hi"}], tokens=None, stop="\n", drafter="ngram", logprobs=3)
    assert r.messages == ({"role": "user", "content": "hi"},) and r.stop == ("\n",) and r.drafter is DrafterKind.NGRAM
    assert r.sampling is DEFAULT_SAMPLING and r.max_tokens == 512 and r.speculative
    assert GenerationRequest(tokens=[1, 2]).tokens == (1, 2)
    assert GenerationRequest(prompt="x", stop=["a", "", "b"]).stop == ("a", "b")
    assert GenerationRequest(prompt="x", sampling=None).sampling is DEFAULT_SAMPLING
    with pytest.raises(AttributeError):
        r.max_tokens = 3  # type: ignore[misc]


@pytest.mark.parametrize("kw, message", [
    ({}, "exactly one of prompt, messages or tokens"),
    ({"prompt": "a", "tokens": [1]}, "exactly one of"),
    ({"prompt": 3}, "prompt must be a string"),
    ({"messages": "hi"}, "messages must be a list"),
    ({"messages": []}, "messages must not be empty"),
    ({"tokens": "abc"}, "tokens must be a list of token ids"),
    ({"tokens": []}, "tokens is empty"),
    ({"tokens": [1, -2]}, "a token id must be at least 0"),
    ({"tokens": [1, True]}, "a token id must be an integer"),
    ({"prompt": "a", "tools": [object()]}, "tools are offered with messages"),
    ({"prompt": "a", "sampling": {"temperature": 0}}, "sampling must be a SamplingParams"),
    ({"prompt": "a", "max_tokens": 2.5}, "max_tokens must be an integer"),
    ({"prompt": "a", "max_tokens": -1}, "max_tokens must be at least 0"),
    ({"infill": InfillPrompt("def f("), "max_tokens": -1}, "max_tokens must be at least 0"),
    ({"infill": ("def f(", "")}, "infill must be an InfillPrompt"),
    ({"prompt": "a", "stop": 3}, "stop must be a string or a list"),
    ({"prompt": "a", "logprobs": 21}, "logprobs must be in \\[0, 20\\]"),
    ({"prompt": "a", "speculative": 1}, "speculative must be True or False"),
    ({"prompt": "a", "drafter": "auto"}, "drafter must be one of"),  # "auto" is the engine's choice, not a request's
    ({"prompt": "a", "spec": {"draft_max": 2}}, "spec must be a SpecConfig"),
    ({"prompt": "a", "on_prefill": 3}, "on_prefill must be callable"),
])
def test_a_bad_request_is_refused_when_built(kw, message):
    with pytest.raises(ConfigError, match=message):
        GenerationRequest(**kw)


def test_the_default_sampling_is_llama_cpps():
    assert (DEFAULT_SAMPLING.temperature, DEFAULT_SAMPLING.top_k, DEFAULT_SAMPLING.top_p, DEFAULT_SAMPLING.min_p) == (0.8, 40, 0.95, 0.05)
    assert DEFAULT_SAMPLING.seed is None and not DEFAULT_SAMPLING.uses_history
    from edgespec.cli import main

    gen = main.commands["generate"]
    defaults = {p.name: p.default for p in gen.params}
    assert (defaults["temperature"], defaults["top_k"], defaults["top_p"], defaults["min_p"]) == (0.8, 40, 0.95, 0.05)


# --------------------------------------------------------------------------------------------- the engine runs it
def test_start_runs_a_request_as_stream_does(tiny):
    with make_engine(tiny) as e:
        for p in PROMPTS[:3]:
            want = e.generate(p, sampling=GREEDY, max_tokens=16, stop=["zz"]).token_ids
            req = GenerationRequest(prompt=p, sampling=GREEDY, max_tokens=16, stop=("zz",))
            assert e.start(req).result().token_ids == want
            assert e.start(GenerationRequest(tokens=e.prompt_tokens(p), sampling=GREEDY, max_tokens=16, drafter="ngram")).result().token_ids == want
        seeded = SamplingParams(temperature=1.0, seed=5)
        a = e.start(GenerationRequest(prompt="abc d", sampling=seeded, max_tokens=16)).result()
        b = e.start(GenerationRequest(prompt="abc d", sampling=seeded, max_tokens=16, speculative=False)).result()
        assert a.token_ids == b.token_ids  # one seed, one output, drafted or not
        with pytest.raises(ConfigError, match="start takes a GenerationRequest"):
            e.start({"prompt": "abc"})  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="outside the vocabulary"):
            e.start(GenerationRequest(tokens=[e.target.n_vocab]))
        with pytest.raises(ConfigError, match="suffix drafter"):
            e.start(GenerationRequest(prompt="abc", drafter=DrafterKind.SUFFIX))
        assert e.drafter_kind is DrafterKind.MODEL_NGRAM


def test_the_library_and_the_chat_default_to_the_default_sampling(tiny):
    from edgespec.runtime.chat import ChatSession

    with make_engine(tiny, drafter="none", draft=None) as e:
        assert ChatSession(e).sampling is DEFAULT_SAMPLING
        seeded = SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=3)
        # the same seed with the default's filters spelled out, and with the default itself: the same output
        from dataclasses import replace

        a = e.generate("abc d", sampling=seeded, max_tokens=16).token_ids
        assert e.generate("abc d", sampling=replace(DEFAULT_SAMPLING, seed=3), max_tokens=16).token_ids == a
