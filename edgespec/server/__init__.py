"""`edgespec serve`: a local OpenAI-compatible HTTP server over one Engine (see docs/server.md).

app.py (the Starlette app: endpoints, disconnect = cancel, middleware), schema.py (request checking, OpenAI-shaped
errors), sse.py (event framing), metrics.py (Prometheus counters). Importing this package does not load llama.cpp.
"""

from __future__ import annotations

from .app import RequestRecord, ServerState, Settings, create_app

__all__ = ["create_app", "Settings", "ServerState", "RequestRecord"]
