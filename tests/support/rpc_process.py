"""An `edgespec rpc-server` child process on 127.0.0.1, for tests/llama/test_rpc.py and bench/rpc_bench.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

from support import ROOT


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _limit_data(n: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_DATA, (n, n))


class RpcServer:
    """One `edgespec rpc-server` child on 127.0.0.1 (started, waited for at most 60 s; stop() kills it)."""

    def __init__(self, port: int | None = None, threads: int = 1, data_limit: int | None = None) -> None:
        """data_limit: RLIMIT_DATA of the server process in bytes (a server with too little memory for a model)."""
        self.port = port or free_port()
        self.endpoint = f"127.0.0.1:{self.port}"
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.proc = subprocess.Popen([sys.executable, "-m", "edgespec", "rpc-server", "--port", str(self.port), "--threads", str(threads)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                                     preexec_fn=None if data_limit is None else lambda: _limit_data(data_limit))
        assert self.proc.stderr is not None
        line = ""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.proc.poll() is None:  # the line comes once the server answers a probe
            line = self.proc.stderr.readline()
            if "listening on" in line:
                break
        if "listening on" not in line:
            self.stop()
            raise AssertionError(f"rpc-server on {self.endpoint} did not start: {line!r}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
