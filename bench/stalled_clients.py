"""Clients that never read their streams, against `edgespec serve` on loopback (the backpressure soak, at scale):

    .venv/bin/python bench/stalled_clients.py                    # 200 stalled clients, 10 at a time, the tiny pair
    .venv/bin/python bench/stalled_clients.py --code /tmp/old    # another checkout's edgespec (a baseline)

Each stalled client is a raw socket with a 1 KiB receive buffer that sends a streamed chat request (logprobs with
top_logprobs 20) and never reads; it holds its connection --hold seconds, then closes it. Meanwhile another client
(its own bearer token) sends short requests one after another. Prints the server's RSS before, at its peak and after
the clients closed, the most requests in flight (/metrics), and how many of the other client's requests were served
(tests/support/stalled_clients.py; tests/server/test_server_backpressure.py is the bounded version).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # edgespec from this checkout; the tests' support package (tiny models, the server process)

from support.serve_process import ServeProcess  # noqa: E402
from support.stalled_clients import soak  # noqa: E402
from support.tiny import write_tiny_set  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=200)
    ap.add_argument("--at-once", type=int, default=10)
    ap.add_argument("--hold", type=float, default=6.0, help="seconds each stalled client keeps its connection")
    ap.add_argument("--max-tokens", type=int, default=8000, help="per stalled request (top-20 logprobs: ~1.5 KB a token)")
    ap.add_argument("--parallel", type=int, default=2)
    ap.add_argument("--max-queue", type=int, default=6)
    ap.add_argument("--stall-timeout", type=float, default=2.0)
    ap.add_argument("--code", default=None, help="the checkout whose edgespec serves (default: this one)")
    args = ap.parse_args()
    files = write_tiny_set(Path(tempfile.mkdtemp(prefix="edgespec-bench-")))
    extra = ["--stall-timeout", str(args.stall_timeout)] if args.code is None else []
    server = ServeProcess([
        "--target", str(files["target"]), "--draft", str(files["draft"]), "--threads", "1", "--ctx", "8192",
        "--parallel", str(args.parallel), "--max-queue", str(args.max_queue), "--log-level", "error", *extra,
    ], code=args.code)
    try:
        # warm-up: one round of the same mix, so that caches and pools reach their size
        soak(server.url, server.proc.pid, clients=args.at_once, at_once=args.at_once, hold=args.hold, max_tokens=args.max_tokens)
        r = soak(server.url, server.proc.pid, clients=args.clients, at_once=args.at_once, hold=args.hold, max_tokens=args.max_tokens)
        print(r.line())
        keys = ("edgespec_requests_stalled_total", 'edgespec_requests_rejected_total{reason="queue_full"}',
                'edgespec_requests_rejected_total{reason="client_queue_full"}', "edgespec_requests_in_flight")
        print({k: r.end_metrics.get(k) for k in keys})
        if r.other_errors:
            print("the other client's errors:", r.other_errors[:5])
    finally:
        server.stop()


if __name__ == "__main__":
    main()
