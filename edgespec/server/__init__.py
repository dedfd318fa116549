"""`edgespec serve`: a local OpenAI-compatible HTTP server over one Engine (see docs/server.md, "How the server is built").

core.py (the state, body reading, JSON sending, the one generate path and the only Engine.start call), schema.py (a
chat or completion body into the CompletionRequest), bodies.py (request bodies as pydantic models), api_errors.py
(OpenAI-shaped errors), refused.py (refused features, ignored keys), responses.py (the generation writer every route
subclasses, statistics, the one tool-call reader), routes_openai.py, routes_llamacpp.py, routes_ollama.py and
routes_responses.py (each a translation of its API onto the core), app.py (the Starlette app: routes, middleware,
/health, /metrics), page.py (the chat page at /, its files in static/), guards.py (Host check, API key), metrics.py
(Prometheus counters), samplers.py (llama-server's sampler chains), sse.py (event framing), pool.py (serving several
models by name: the model source's terms, the ModelPool of engines loaded on first use and unloaded when idle, a
request's view of its model) and by_name.py (the model sources, the listings of the pool's models). Importing this
package does not load llama.cpp.
"""

from __future__ import annotations

from .app import create_app
from .core import RequestRecord, ServerState, Settings

__all__ = ["create_app", "Settings", "ServerState", "RequestRecord"]
