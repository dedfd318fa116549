"""`edgespec serve --rpc`: the server runs in a child process that this one restarts once a lost RPC server is back.

llama.cpp cannot survive a lost RPC server inside the process that talks to it (edgespec/llama/rpc.py): that process ends
with exit code rpc.EXIT_RPC_LOST after telling its clients (503 `backend_lost`). So `serve` with `--rpc` keeps the
listening socket here, serves from a child process (serve.child_main: its settings pickled on its stdin, the socket
inherited) and, when the child ends with that code, answers every request on the same socket
itself (503 `backend_lost`, `/health` included) while it probes the servers every PROBE_EVERY seconds; once they
all answer, a new child loads the models and serves; a child whose load failed (exit 1) while a server does not
answer a probe is a lost server too (it stalled or died before or while the child probed it). Any other end of the
child (Ctrl-C, SIGTERM, a load that fails while the servers answer) ends this process with the child's exit code.
Connections that arrive while the child starts wait in the socket's queue: the port never refuses them.
"""

from __future__ import annotations

import asyncio
import json
import pickle
import signal
import socket
import subprocess
import sys
import time
from typing import Any, Sequence

import click

PROBE_EVERY = 2.0  # seconds between probes of the lost servers
MIN_RESTART = 2.0  # seconds at least between two starts of the child (a server that answers probes but keeps failing)


def supervise(params: dict[str, Any], sock: socket.socket, endpoints: Sequence[str], child: Sequence[str]) -> int:
    """Serve `params` from child processes (command line `child`, which reads {"params", "fd"} pickled on its stdin)
    on `sock` until one ends for another reason than a lost RPC server; that one's exit code (130 after Ctrl-C here,
    0 after SIGTERM)."""
    from edgespec.errors import EXIT_BACKEND_LOST

    stop: list[int] = []
    proc: subprocess.Popen[bytes] | None = None

    def forward(sig: int, frame: Any) -> None:  # the child has its own session: a terminal's Ctrl-C reaches only us
        stop.append(sig)
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)  # the child's first Ctrl-C/SIGTERM ends its generations and stops; a second forces it

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            started = time.monotonic()
            proc = _spawn(child, params, sock)
            code = proc.wait()
            if stop and code in (0, -signal.SIGTERM, -signal.SIGINT):  # it stopped as asked (uvicorn raises the signal again)
                return 130 if signal.SIGINT in stop else 0
            if code < 0:  # killed by a signal that was not ours to forward (the OOM killer, kill -9)
                click.echo(f"edgespec: the server process was killed by signal {-code}", err=True)
                return 1
            if stop or (code != EXIT_BACKEND_LOST and not (code == 1 and not _all_answer(endpoints)[0])):
                return code  # (a load that failed because a server stopped answering, before or while the child probed it: lost)
            click.echo(f"edgespec: the models are unloaded; every request gets 503 until {', '.join(endpoints)} answer(s) again, "
                       "then they load again", err=True)
            time.sleep(max(0.0, MIN_RESTART - (time.monotonic() - started)))
            if stop or not _answer_while_lost(sock, endpoints, stop):
                return 130 if signal.SIGINT in stop else 0
            click.echo("edgespec: the RPC servers answer again: loading the models", err=True)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()


def _spawn(cmd: Sequence[str], params: dict[str, Any], sock: socket.socket) -> subprocess.Popen[bytes]:
    fd = sock.fileno()
    preexec = _die_with_parent if sys.platform.startswith("linux") else None
    child = subprocess.Popen(list(cmd), stdin=subprocess.PIPE, pass_fds=(fd,), start_new_session=True, preexec_fn=preexec)
    assert child.stdin is not None
    try:
        child.stdin.write(pickle.dumps({"params": params, "fd": fd}))  # the API key goes here, not on a command line
        child.stdin.close()
    except BrokenPipeError:
        pass  # it ended before reading: its exit code says why
    return child


def _die_with_parent() -> None:
    """(In the child, Linux.) SIGTERM when this supervisor dies, so that a `kill -9` of it leaves no server behind."""
    import ctypes

    try:
        ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _all_answer(endpoints: Sequence[str]) -> tuple[bool, str]:
    """Whether every endpoint answers a probe now (at most PROBE_EVERY seconds each), and why not."""
    from edgespec.llama import rpc  # llama.cpp's libraries load here, in the supervisor, only once a server was lost
    from edgespec.errors import BackendError

    for ep in endpoints:
        try:
            rpc.probe(ep, timeout=PROBE_EVERY)
        except BackendError as e:
            return False, str(e)
    return True, ""


def _answer_while_lost(sock: socket.socket, endpoints: Sequence[str], stop: list[int]) -> bool:
    """Answer 503 `backend_lost` to every request on `sock` until every endpoint answers a probe (True) or a signal
    stops this process (False)."""
    import uvicorn

    from edgespec.server.api_errors import APIError

    why = ["not probed yet"]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        e = APIError(503, f"an RPC server the model runs on was lost ({why[0]}); the models load again once "
                     f"{', '.join(endpoints)} answer(s)", code="backend_lost")
        body = json.dumps(e.body()).encode()
        await send({"type": "http.response.start", "status": 503, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"retry-after", b"10")]})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    server = uvicorn.Server(uvicorn.Config(app, lifespan="off", log_level="warning", access_log=False))
    back: list[bool] = []

    def all_answer() -> bool:
        ok, why[0] = _all_answer(endpoints)
        return ok

    async def watch() -> None:
        while not server.should_exit:
            if await asyncio.to_thread(all_answer):
                back.append(True)
                server.should_exit = True
                return
            await asyncio.sleep(PROBE_EVERY)

    async def main() -> None:
        task = asyncio.create_task(watch())
        try:
            await server.serve(sockets=[sock.dup()])  # uvicorn closes what it is given: a duplicate, not the socket
        finally:
            task.cancel()

    asyncio.run(main())
    return bool(back) and not stop
