"""The /infill request bodies the editor plugins send, copied key for key from their published sources (the values
that come from the editor are parameters; the plugins' default settings are filled in).

- llama.vim, ggml-org/llama.vim @ a1c8e6e40cb45df59b78add5b65d575386832465, autoload/llama.vim:
  `llama#fim` (lines 796-825: the completion request) and `s:ring_update` (lines 552-566: the cache warm-up,
  "no samplers needed here"); its instruct mode (`llama#inst_send`, lines 1491-1499) posts to /v1/chat/completions.
  Defaults (lines 73-76): n_predict 128, stop_strings [], t_max_prompt_ms 500, t_max_predict_ms 1000.
- llama.vscode, ggml-org/llama.vscode @ 3938fb3568b98e3ddfcf2ce3dd52d9570552b579, src/llama-server.ts:
  `defaultRequestParams` (lines 121-127) and `createRequestPayload` (lines 181-215: noPredict = the warm-up of
  `updateExtraContext`, else the completion of `getFIMCompletion`). Defaults (src/configuration.ts): n_predict 128,
  t_max_prompt_ms 500, t_max_predict_ms 2500, max_parallel_completions 3; lora_completion "" (no `lora` key).
"""

from __future__ import annotations

from typing import Any

# what llama.vim reads from the answer of a completion (it shows them in its info line)
VIM_RESPONSE_FIELDS = [
    "content",
    "timings/prompt_n",
    "timings/prompt_ms",
    "timings/prompt_per_token_ms",
    "timings/prompt_per_second",
    "timings/predicted_n",
    "timings/predicted_ms",
    "timings/predicted_per_token_ms",
    "timings/predicted_per_second",
    "truncated",
    "tokens_cached",
]


def vim_fim(prefix: str, suffix: str, middle: str, extra: list[dict[str, str]], indent: int, *, n_predict: int = 128,
            t_max_predict_ms: int = 1000) -> dict[str, Any]:
    return {
        "id_slot": 0,
        "input_prefix": prefix,
        "input_suffix": suffix,
        "input_extra": extra,
        "prompt": middle,
        "n_predict": n_predict,
        "stop": [],
        "n_indent": indent,
        "top_k": 40,
        "top_p": 0.90,
        "samplers": ["top_k", "top_p", "infill"],
        "stream": False,
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": t_max_predict_ms,
        "response_fields": list(VIM_RESPONSE_FIELDS),
    }


def vim_warmup(extra: list[dict[str, str]]) -> dict[str, Any]:
    return {
        "id_slot": 0,
        "input_prefix": "",
        "input_suffix": "",
        "input_extra": extra,
        "prompt": "",
        "n_predict": 0,
        "temperature": 0.0,
        "samplers": [],
        "stream": False,
        "cache_prompt": True,
        "t_max_prompt_ms": 1,
        "t_max_predict_ms": 1,
        "response_fields": [""],
    }


def vim_inst(messages: list[dict[str, str]]) -> dict[str, Any]:
    """llama#inst_send's body (to /v1/chat/completions)."""
    return {"id_slot": 0, "messages": messages, "min_p": 0.1, "temperature": 0.1, "samplers": ["min_p", "temperature"],
            "stream": True, "cache_prompt": True}


def vscode_fim(prefix: str, suffix: str, prompt: str, chunks: list[dict[str, Any]], nindent: int | None, model: str = "",
               *, n_predict: int = 128) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id_slot": 0,
        "input_prefix": prefix,
        "input_suffix": suffix,
        "input_extra": chunks,
        "prompt": prompt,
        "n_predict": n_predict,
        "n_cmpl": 3,
        "top_k": 40,
        "top_p": 0.99,
        "stream": False,
        "samplers": ["top_k", "top_p", "infill"],
        "cache_prompt": True,
    }
    if nindent:
        body["n_indent"] = nindent
    body["t_max_prompt_ms"] = 500
    body["t_max_predict_ms"] = 2500
    if model.strip() != "":
        body["model"] = model
    return body


def vscode_warmup(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id_slot": 0,
        "input_prefix": "",
        "input_suffix": "",
        "input_extra": chunks,
        "prompt": "",
        "n_predict": 0,
        "samplers": [],
        "cache_prompt": True,
        "t_max_prompt_ms": 500,
        "t_max_predict_ms": 1,
    }
