"""A TCP proxy on loopback that adds network delay: every byte arrives `rtt_ms / 2` later in each direction, in
order (this kernel has no netem qdisc to do it). bench/rpc_bench.py and bench/rpc_servers_compare.py put it between
edgespec and its rpc-servers, tests/llama/test_rpc.py between a model and a server it stops mid-generation;
bench/delay_proxy.py is its command line.

Loopback only: it refuses to listen on or forward to any other address (ValueError).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import threading
import time
from typing import Any


def loopback(host: str) -> str:
    """`host` when it is a loopback address (or "localhost"); ValueError otherwise."""
    if host == "localhost" or ipaddress.ip_address(host).is_loopback:
        return host
    raise ValueError(f"delay_proxy: {host} is not a loopback address")


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, delay: float) -> None:
    """Copy reader -> writer, each chunk written `delay` seconds after it was read, in order."""
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def send() -> None:
        while True:
            due, data = await queue.get()
            if not data:
                break
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
            await writer.drain()

    sender = asyncio.create_task(send())
    try:
        while data := await reader.read(1 << 16):
            queue.put_nowait((time.monotonic() + delay, data))
    except (ConnectionError, OSError):
        pass
    queue.put_nowait((0.0, b""))
    try:
        await sender
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except (ConnectionError, OSError):
            pass


class DelayProxy:
    """listen -> target with `rtt_ms` added to every round trip, served from a daemon thread; `close()` stops it."""

    def __init__(self, target: tuple[str, int], rtt_ms: float, listen: tuple[str, int] = ("127.0.0.1", 0)) -> None:
        self.target = (loopback(target[0]), target[1])
        self.delay = rtt_ms / 2000.0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._server: Any = None
        self._thread = threading.Thread(target=self._run, args=((loopback(listen[0]), listen[1]),), daemon=True, name="delay-proxy")
        self._thread.start()
        if not self._ready.wait(10) or self._server is None:
            raise RuntimeError("delay proxy did not start")
        self.port = int(self._server.sockets[0].getsockname()[1])
        self.endpoint = f"127.0.0.1:{self.port}"

    async def _handle(self, cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            sr, sw = await asyncio.open_connection(*self.target)
        except OSError:
            cw.close()
            return
        for w in (cw, sw):
            sock = w.get_extra_info("socket")
            if sock is not None:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        await asyncio.gather(_pump(cr, sw, self.delay), _pump(sr, cw, self.delay))

    def _run(self, listen: tuple[str, int]) -> None:
        asyncio.set_event_loop(self._loop)

        async def start() -> None:
            self._server = await asyncio.start_server(self._handle, *listen)
            self._ready.set()

        self._loop.run_until_complete(start())
        self._loop.run_forever()

    def close(self) -> None:
        def stop() -> None:
            self._server.close()
            for t in asyncio.all_tasks(self._loop):
                t.cancel()
            self._loop.stop()

        self._loop.call_soon_threadsafe(stop)
        self._thread.join(10)
