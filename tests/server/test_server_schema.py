"""Request bodies (server/bodies.py's pydantic models and route models, server/schema.py's translation): the exact
one-line errors a client reads, the same whichever route parses the body, and what a valid body becomes. No model is
loaded."""

from __future__ import annotations

import pytest

from edgespec.server import schema
from edgespec.server.api_errors import APIError
from edgespec.server.bodies import COMMON_KEYS, validate_body
from edgespec.server.core import ResponseStore
from edgespec.server.routes_llamacpp import InfillBody, TokenizeBody
from edgespec.server.routes_ollama import parse_ollama_generate
from edgespec.server.routes_responses import parse_responses

MSG = [{"role": "user", "content": "x"}]
ERRORS = [  # (extra body fields, param, message) as the server answered them before the pydantic models
    ({"temperature": 5}, "temperature", "temperature must be in [0, 2], got 5"),
    ({"temperature": "hot"}, "temperature", 'temperature must be a number, got string "hot"'),
    ({"temperature": True}, "temperature", "temperature must be a number, got boolean true"),
    ({"temperature": 10**400}, "temperature", "temperature must be in [0, 2], got an integer of 401 digits"),
    ({"temperature": float("inf")}, "temperature", "temperature must be a number, got number Infinity"),
    ({"max_tokens": 2.5}, "max_tokens", "max_tokens must be an integer, got number 2.5"),
    ({"max_tokens": True}, "max_tokens", "max_tokens must be an integer, got boolean true"),
    ({"max_tokens": 0}, "max_tokens", "max_tokens must be in [1, 1048576], got 0"),
    ({"max_tokens": 0.0}, "max_tokens", "max_tokens must be in [1, 1048576], got 0"),
    ({"seed": -5.0}, "seed", "seed must be in [-1, 18446744073709551615], got -5"),
    ({"seed": 2**64}, "seed", "seed must be in [-1, 18446744073709551615], got 18446744073709551616"),
    ({"stop": ["a"] * 33}, "stop", "stop has 33 strings; at most 32"),
    ({"stop": [1, 2]}, "stop", "stop must be a string or an array of strings"),
    ({"stream": "yes"}, "stream", "stream must be true or false, got string"),
    ({"top_k": "many"}, "top_k", 'top_k must be an integer, got string "many"'),
    ({"min_p": 1}, "min_p", "min_p must be in [0, 1), got 1"),
    ({"repeat_penalty": 1e-9}, "repeat_penalty", "repeat_penalty must be in [1e-06, 1e+06], got 1e-09"),
    ({"speculative.n_max": 99}, "speculative.n_max", "speculative.n_max must be in [0, 64], got 99"),
    ({"model": 5}, "model", "model must be a string, got number"),
    ({"stream_options": 5}, "stream_options", "stream_options is only allowed when stream is true"),
    ({"stream": True, "stream_options": 5}, "stream_options", "stream_options must be an object"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage",
     "stream_options.include_usage must be true or false, got string"),
    ({"max_tokens": 3, "max_completion_tokens": 4}, "max_tokens", "max_tokens (3) and max_completion_tokens (4) disagree; send one of them"),
]


@pytest.mark.parametrize("extra,param,message", ERRORS, ids=[p for _, p, _ in ERRORS])
def test_chat_and_completion_errors_are_one_exact_line(extra, param, message):
    for parse, body in ((schema.parse_chat, {"messages": MSG}), (schema.parse_completion, {"prompt": "hi"})):
        with pytest.raises(APIError) as e:
            parse({**body, **extra})
        err = e.value
        assert (err.status, err.param, err.message, err.code) == (400, param, message, "invalid_value")
        assert err.body()["error"]["type"] == "invalid_request_error"


def test_chat_only_fields():
    with pytest.raises(APIError, match=r"^top_logprobs needs logprobs: true$"):
        schema.parse_chat({"messages": MSG, "top_logprobs": 3})
    with pytest.raises(APIError, match=r"^top_logprobs must be in \[0, 20\], got 21$"):
        schema.parse_chat({"messages": MSG, "logprobs": True, "top_logprobs": 21})
    with pytest.raises(APIError, match=r"^logprobs must be in \[0, 5\], got 6$"):
        schema.parse_completion({"prompt": "hi", "logprobs": 6})


def test_a_valid_body_becomes_the_request():
    req = schema.parse_chat({"messages": MSG, "temperature": 0.5, "max_tokens": 5.0, "stop": ["a", ""], "seed": -1, "top_k": -1,
                             "stream": True, "stream_options": {"include_usage": True}, "speculative.n_max": 0, "zz": None,
                             "top_p": None})
    assert req.sampling.temperature == 0.5 and req.sampling.top_p == 1.0 and req.sampling.top_k == 0 and req.sampling.seed is None
    assert req.max_tokens == 5 and req.stop == ("a",) and req.include_usage and not req.speculative and req.draft_max == 0
    assert req.ignored == ("zz",)  # unknown keys are kept and reported, never silent
    greedy = schema.parse_completion({"prompt": [1, 2], "top_p": 0, "temperature": 1.5, "n_predict": -1})
    assert greedy.sampling.temperature == 0.0 and greedy.prompt_tokens == [1, 2] and greedy.max_tokens is None
    assert COMMON_KEYS >= {"speculative.n_max", "max_completion_tokens", "samplers", "grammar"}


def test_route_fields_keep_their_apis_wording():
    cases = [
        (InfillBody, {"input_extra": [{"text": 1}]}, "input_extra[0]", "input_extra[0] must be an object with string text and filename"),
        (InfillBody, {"input_extra": 5}, "input_extra", 'input_extra must be an array of {"filename", "text"} objects'),
        (InfillBody, {"n_indent": -1}, "n_indent", "n_indent must be an integer >= 0 (the least indentation of the lines after the first)"),
        (InfillBody, {"t_max_predict_ms": "x"}, "t_max_predict_ms", "t_max_predict_ms must be a number of milliseconds >= 0"),
        (TokenizeBody, {"content": "x", "with_pieces": 1}, "with_pieces", "with_pieces must be true or false"),
    ]
    for model, body, param, message in cases:
        with pytest.raises(APIError) as e:
            validate_body(model, body)
        assert (e.value.param, e.value.message) == (param, message)
    with pytest.raises(APIError, match=r"^top_logprobs must be between 0 and 20$"):
        parse_ollama_generate({"prompt": "hi", "logprobs": True, "top_logprobs": 21}, 4096)
    with pytest.raises(APIError, match=r"^metadata has 17 pairs; at most 16$"):
        parse_responses({"input": "hi", "metadata": {f"k{i}": "v" for i in range(17)}}, ResponseStore())
    with pytest.raises(APIError, match=r"^max_output_tokens must be in \[1, 1048576\], got 0$") as e:
        parse_responses({"input": "hi", "max_output_tokens": 0}, ResponseStore())
    assert e.value.param == "max_output_tokens"


@pytest.mark.parametrize("raw, param, message", [
    (b'{"temperature": 1e309}', "temperature", "temperature must be a finite number, got 1e309 (outside the range of a double)"),
    (b'{"options": {"seed": -1e309}}', "options.seed", "options.seed must be a finite number, got -1e309 (outside the range of a double)"),
    (b'{"messages": [{"x": NaN}]}', "messages[0].x", "messages[0].x must be a finite number, got NaN"),
    (b'{"zz": -Infinity}', "zz", "zz must be a finite number, got -Infinity"),  # a key not read: still a 400
    (b'{"seed": ' + b"9" * 5000 + b"}", "seed", "seed must be a finite number, got an integer of 5000 digits"),
])
def test_numbers_a_double_cannot_hold_are_a_400_naming_their_path(raw, param, message):
    """Python's json reads 1e309 as inf (and an integer of thousands of digits not at all): named where it is."""
    with pytest.raises(APIError) as e:
        schema.parse_json(raw)
    assert (e.value.status, e.value.param, e.value.message) == (400, param, message)
    assert schema.parse_json(b'{"t": 1e308, "n": -1e-400}') == {"t": 1e308, "n": -0.0}  # finite (an underflow is 0)


def test_numbers_out_of_range_on_the_completions_routes():
    req = schema.parse_completion({"prompt": "hi", "top_logprobs": 3})  # chat's field: checked, then reported ignored
    assert req.ignored == ("top_logprobs",) and req.logprobs is None
    for extra, message in (({"top_logprobs": -1}, "top_logprobs must be in [0, 20], got -1"),
                           ({"seed": -1e308}, "seed must be in [-1, 18446744073709551615], got -1e+308"),
                           ({"max_tokens": 1e300}, "max_tokens must be in [1, 1048576], got 1e+300"),
                           ({"typical_p": True}, "typical_p is not supported")):
        with pytest.raises(APIError) as e:
            schema.parse_completion({"prompt": "hi", **extra})
        assert (e.value.param, e.value.message) == (next(iter(extra)), message)
    assert schema.parse_chat({"messages": MSG, "logprobs": True, "top_logprobs": 2}).ignored == ()


def test_responses_numbers_and_parallel_tool_calls():
    tools = [{"type": "function", "name": "f", "parameters": {"type": "object"}}]
    req, _ = parse_responses({"input": "hi", "tools": tools, "parallel_tool_calls": False, "max_tool_calls": 2}, ResponseStore())
    assert req.tool_choice == "auto" and req.ignored == ("max_tool_calls",)  # built-in tools' limit: checked, not read
    for extra, param, message in (({"parallel_tool_calls": "no"}, "parallel_tool_calls", "parallel_tool_calls must be true or false, got string"),
                                  ({"max_tool_calls": 0}, "max_tool_calls", "max_tool_calls must be in [1, 1048576], got 0"),
                                  ({"top_logprobs": -1}, "top_logprobs", "top_logprobs must be in [0, 20], got -1"),
                                  ({"top_logprobs": 2}, "top_logprobs", "top_logprobs is not supported")):
        with pytest.raises(APIError) as e:
            parse_responses({"input": "hi", "tools": tools, **extra}, ResponseStore())
        assert (e.value.param, e.value.message) == (param, message)
