"""`edgespec serve` as a child process, for the tests (test_serve_process.py, test_server_load.py) and the benchmarks
that talk to a real server process (bench/bench_server.py --mode process, bench/tool_roundtrip.py)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import httpx


class ServeProcess:
    """`python -m edgespec serve ARGS --port 0` in a child process (also the load test's server): started when its
    "listening on" line names the URL and /health answers 200, each within `timeout` seconds (RuntimeError with the
    server's stderr otherwise); stop() terminates it, then kills it."""

    def __init__(self, args: list[str], timeout: float = 60.0, code: str | None = None) -> None:
        cmd = [sys.executable, "-m", "edgespec", "serve", *args, "--port", "0"]
        # code: the checkout whose edgespec runs (its folder is the child's working directory and PYTHONPATH)
        env = {**os.environ, "PYTHONPATH": code} if code else None
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=code, env=env)
        self.lines: list[str] = []
        self.url = ""
        found = threading.Event()

        def drain() -> None:
            assert self.proc.stderr is not None
            for line in self.proc.stderr:
                self.lines.append(line)
                m = re.search(r"listening on (http://\S+?) ", line)
                if m and not found.is_set():
                    self.url = m.group(1)
                    found.set()

        threading.Thread(target=drain, daemon=True).start()
        if not found.wait(timeout):
            self.stop()
            raise RuntimeError("the server did not start:\n" + "".join(self.lines))
        deadline = time.monotonic() + timeout
        while True:
            try:
                if httpx.get(self.url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.stop()
                raise RuntimeError("the server did not get ready:\n" + "".join(self.lines))
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
