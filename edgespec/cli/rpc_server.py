"""`edgespec rpc-server`: serve this machine's devices to other machines' models (llama.cpp's RPC backend)."""

from __future__ import annotations

import ipaddress
import os
import time
from typing import Any

import click

from .common import out


def _default_threads() -> int:
    from edgespec.llama.backend import default_threads

    return max(1, default_threads() // 2)  # llama.cpp's rpc-server default: half the cores


@click.command("rpc-server")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="IPv4 address to listen on (0.0.0.0 = every interface: the protocol has no authentication or encryption).")
@click.option("--port", type=click.IntRange(1, 65535), default=50052, show_default=True, help="Port to listen on.")
@click.option("--threads", "-t", type=click.IntRange(1, 1024), default=None,
              help="CPU threads when serving the CPU (default: half the cores, as llama.cpp's rpc-server).")
def rpc_server(**kw: Any) -> None:
    """Serve this machine's devices (its GPUs, else its CPU) to models on other machines: `--rpc HOST:PORT` there
    puts layers here. One client at a time; it runs until interrupted (Ctrl-C).

    The protocol has no authentication or encryption: listen on loopback (the default) or a trusted network only."""
    host, port = kw.pop("host"), kw.pop("port")
    threads = kw.pop("threads") or _default_threads()
    try:
        addr = ipaddress.IPv4Address(host)
    except ValueError:
        raise click.BadParameter(f"{host!r} is not an IPv4 address (ggml-rpc listens on IPv4 only)", param_hint="--host") from None
    if not addr.is_loopback:
        out(f"warning: listening on {host}: the RPC protocol has no authentication or encryption; anyone who can reach "
            f"{host}:{port} can use this machine's devices and memory. Only run it on a trusted network.", err=True)
    from edgespec.llama import rpc

    rpc.start_server(host, port, threads)
    out(f"rpc-server: listening on {host}:{port} (protocol {rpc.PROTO_MAJOR}.{rpc.PROTO_MINOR}, pid {os.getpid()}); "
        f"use it with --rpc {host if not addr.is_unspecified else 'THIS_HOST'}:{port}", err=True)
    while True:  # the server runs in a daemon thread (in C); the main thread waits for Ctrl-C
        time.sleep(3600)
