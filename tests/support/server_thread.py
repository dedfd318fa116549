"""uvicorn serving an app in a thread, on a free port on 127.0.0.1 (`ServerThread`, with an openai client and raw
posts), and what the server tests read and send: `sse_events`, `chat` messages, `wait_for` a condition
(test_server, test_server_clients, test_server_editors, test_structured_server, test_hostile_input, test_infill)."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any, Callable, Iterator

import httpx
import openai
import uvicorn


class ServerThread:
    """uvicorn serving `app` on 127.0.0.1, on a port the OS picked, in a background thread."""

    def __init__(self, app: Any) -> None:
        self.app = app
        # IPPROTO_TCP: asyncio sets TCP_NODELAY on accepted sockets only when the listening socket names it
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)
        self.thread.start()
        wait_for(lambda: self.server.started, what="the server to start")

    @property
    def state(self) -> Any:
        return self.app.state.edgespec

    def client(self, **kw: Any) -> openai.OpenAI:
        kw.setdefault("api_key", "none")
        kw.setdefault("max_retries", 0)
        return openai.OpenAI(base_url=self.url + "/v1", **kw)

    def aclient(self, **kw: Any) -> openai.AsyncOpenAI:
        kw.setdefault("api_key", "none")
        kw.setdefault("max_retries", 0)
        return openai.AsyncOpenAI(base_url=self.url + "/v1", **kw)

    def post(self, path: str, body: Any, **kw: Any) -> httpx.Response:
        return httpx.post(self.url + path, json=body, timeout=30, **kw)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(15)
        self.sock.close()


def wait_for(cond: Callable[[], Any], timeout: float = 20.0, what: str = "a condition") -> Any:
    """Poll until cond() is true (waiting for the server's state, not timing anything)."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def sse_events(lines: Iterator[str]) -> Iterator[Any]:
    """JSON objects of a stream's `data:` lines; '[DONE]' as the string."""
    for line in lines:
        if line.startswith("data: "):
            data = line[6:]
            yield data if data == "[DONE]" else json.loads(data)


def chat(content: str, system: str | None = None) -> list[dict[str, str]]:
    """A chat's messages: `system` (if any), then one user message."""
    return ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": content}]
