"""OpenAI's chat completions and completions routes (`/v1/chat/completions`, `/v1/completions`) and the model list
(`/v1/models`, `/v1/models/{id}`): schema.parse_chat / schema.parse_completion read the body, core.generate runs it,
responses.GenerationResponse writes it in OpenAI's shapes."""

from __future__ import annotations

from typing import Any

import anyio

from starlette.requests import Request
from starlette.responses import Response

from . import by_name, schema
from .core import JSON, ServerState, error_response, generate, model_stem, server_state
from .responses import GenerationResponse
from .api_errors import APIError


async def chat_completions(request: Request) -> Any:
    return await generate(request, schema.parse_chat, "chat", GenerationResponse)


async def completions(request: Request) -> Any:
    return await generate(request, schema.parse_completion, "completion", GenerationResponse)


async def models(request: Request) -> Response:
    """GET /v1/models: the pinned model's card, then those of the models served by name (by_name.openai_cards)."""
    state = server_state(request)
    if state.pool is None:
        return JSON({"object": "list", "data": [model_card(state)]})
    pinned = [model_card(state)] if state.pinned else []
    ids = {c["id"] for c in pinned}
    cards = await anyio.to_thread.run_sync(by_name.openai_cards, state)  # a source may read files
    return JSON({"object": "list", "data": pinned + [c for c in cards if c["id"] not in ids]})


async def model(request: Request) -> Response:
    """GET /v1/models/{id}: the card of the model served, or OpenAI's 404 for any other id."""
    want = request.path_params["model_id"]
    if not want:  # /v1/models/ is the list
        return await models(request)
    state = server_state(request)
    if state.pool is not None:
        cards = ([model_card(state)] if state.pinned else []) + await anyio.to_thread.run_sync(by_name.openai_cards, state)
        for c in cards:
            if want == c["id"] or want in c["meta"].get("aliases", ()):
                return JSON(c)
        near = by_name.close_matches(want, [c["id"] for c in cards])
        hint = f"; did you mean {', '.join(repr(m) for m in near)}?" if near else ""
        return error_response(APIError(404, f"the model {want!r} does not exist{hint}", param="model", code="model_not_found",
                                       extra={"close_matches": near}))
    card = model_card(state)
    if want != card["id"]:
        return error_response(APIError(404, f"the model {want!r} does not exist (this server serves {card['id']!r})",
                                       param="model", code="model_not_found"))
    return JSON(card)


def model_card(state: ServerState) -> dict[str, Any]:
    eng = state.require_engine()
    t, d = eng.target, eng.draft
    meta: dict[str, Any] = {
        "name": t.name,
        "path": t.spec.path,
        "n_ctx": t.n_ctx,
        "n_ctx_train": t.info.context_length,
        "n_vocab": t.n_vocab,
        "n_params": t.info.n_params,
        "size": t.info.file_size,
        "quantization": t.info.quantization,
        "drafter": eng.drafter_kind,
        "draft_max": eng.spec.draft_max,
        "adaptive": eng.spec.adaptive,
        "draft": None
        if d is None
        else {"id": model_stem(d.spec.path), "name": d.name, "n_params": d.info.n_params, "size": d.info.file_size, "quantization": d.info.quantization},
    }
    return {"id": state.model_id, "object": "model", "created": state.loaded_at, "owned_by": "edgespec", "meta": meta}


__all__ = ["chat_completions", "completions", "models", "model", "model_card"]
