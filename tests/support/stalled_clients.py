"""Clients that do not read their streams, against `edgespec serve` in a child process (tests/support/serve_process.py),
for the backpressure soak test (test_server_backpressure.py) and bench/stalled_clients.py.

A stalled client is a raw socket with a small receive buffer (SO_RCVBUF, set before connecting) that sends one
streamed chat request with logprobs and never reads: the server's writes fill the socket's buffers, its writer waits,
and what the generation produces has nowhere to go. Stalled clients come in waves (`at_once` at a time); each holds
its connection `hold` seconds, then closes it without reading. Meanwhile another client (its own bearer token, so the
per-client share tells it apart) sends short requests one after another, and a monitor samples the server's
`edgespec_requests_in_flight` and its RSS.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx


def rss(pid: int) -> int:
    """A process's resident memory in bytes (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def metrics(url: str, client: httpx.Client | None = None) -> dict[str, float]:
    text = (client.get(url + "/metrics") if client is not None else httpx.get(url + "/metrics")).text
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def stalled_request(url: str, body: dict[str, Any], rcvbuf: int = 1024, token: str | None = None) -> socket.socket:
    """Send one POST /v1/chat/completions on a raw socket with a `rcvbuf`-byte receive buffer, and return the socket
    unread (the caller closes it)."""
    u = urlsplit(url)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: the window the server sees
    sock.settimeout(10)
    sock.connect((u.hostname, u.port))
    data = json.dumps(body).encode()
    auth = f"Authorization: Bearer {token}\r\n" if token else ""
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {u.hostname}:{u.port}\r\nContent-Type: application/json\r\n"
            f"{auth}Content-Length: {len(data)}\r\n\r\n")
    sock.sendall(head.encode() + data)
    return sock


def stalled_body(max_tokens: int, top_logprobs: int = 20, prompt: str = "Tell me a story") -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "stream": True,
            "logprobs": True, "top_logprobs": top_logprobs, "temperature": 1.0}


@dataclass
class Soak:
    """What a soak run saw."""

    stalled: int = 0  # stalled clients started
    served: int = 0  # the other client's requests answered 200 (with the right finish)
    other_refused: dict[int, int] = field(default_factory=dict)  # its refusals by status
    other_errors: list[str] = field(default_factory=list)
    in_flight_max: float = 0.0
    rss_before: int = 0
    rss_peak: int = 0
    rss_after: int = 0
    samples: int = 0
    seconds: float = 0.0
    end_metrics: dict[str, float] = field(default_factory=dict)

    def line(self) -> str:
        mb = 2**20
        return (f"{self.stalled} stalled clients in {self.seconds:.1f} s; the other client served {self.served} "
                f"(refused {self.other_refused or 0}); in flight max {self.in_flight_max:.0f}; RSS before "
                f"{self.rss_before / mb:.1f} MiB, peak {self.rss_peak / mb:.1f} MiB, after {self.rss_after / mb:.1f} MiB "
                f"({self.samples} samples)")


def soak(url: str, pid: int, *, clients: int, at_once: int, hold: float, max_tokens: int, rcvbuf: int = 1024,
         settle: float = 60.0, other_every: float = 0.05) -> Soak:
    """Run `clients` stalled clients, `at_once` at a time, each holding its connection `hold` seconds, beside one
    client sending short requests; then wait (at most `settle` seconds) until nothing is in flight, and sample RSS."""
    out = Soak()
    stop = threading.Event()
    http = httpx.Client(timeout=30)
    out.rss_before = out.rss_peak = rss(pid)

    def monitor() -> None:
        with httpx.Client(timeout=10) as c:
            while not stop.is_set():
                m = metrics(url, c)
                out.in_flight_max = max(out.in_flight_max, m["edgespec_requests_in_flight"])
                out.rss_peak = max(out.rss_peak, rss(pid))
                out.samples += 1
                time.sleep(0.05)

    def other() -> None:
        body = {"messages": [{"role": "user", "content": "short"}], "max_tokens": 8, "temperature": 0}
        with httpx.Client(timeout=60, headers={"Authorization": "Bearer other-client"}) as c:
            while not stop.is_set():
                try:
                    r = c.post(url + "/v1/chat/completions", json=body)
                except httpx.HTTPError as e:
                    out.other_errors.append(repr(e))
                    continue
                if r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length":
                    out.served += 1
                else:
                    out.other_refused[r.status_code] = out.other_refused.get(r.status_code, 0) + 1
                time.sleep(other_every)

    threads = [threading.Thread(target=monitor, daemon=True), threading.Thread(target=other, daemon=True)]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    try:
        started = 0
        while started < clients:
            wave = [stalled_request(url, stalled_body(max_tokens), rcvbuf) for _ in range(min(at_once, clients - started))]
            started += len(wave)
            out.stalled = started
            time.sleep(hold)
            for s in wave:
                s.close()
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline:
            m = metrics(url, http)
            if m["edgespec_requests_in_flight"] == 0 and m["edgespec_queue_length"] == 0 and m["edgespec_requests_running"] == 0:
                break
            time.sleep(0.1)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
        out.seconds = time.monotonic() - t0
    time.sleep(0.5)
    out.end_metrics = metrics(url, http)
    http.close()
    out.rss_after = rss(pid)
    return out
