"""A TCP proxy on loopback that adds network delay: every byte arrives `rtt_ms / 2` later in each direction, in
order (this kernel has no netem qdisc to do it). The command line of edgespec/bench/delay_proxy.py (`DelayProxy`,
which rpc_bench.py uses between edgespec and its rpc-servers).

    .venv/bin/python bench/delay_proxy.py --listen 127.0.0.1:60052 --to 127.0.0.1:50052 --rtt-ms 10

Loopback only: it refuses to listen on or forward to any other address.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's edgespec

from edgespec.bench.delay_proxy import DelayProxy  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--listen", default="127.0.0.1:0", help="host:port to listen on (loopback)")
    ap.add_argument("--to", required=True, help="host:port to forward to (loopback)")
    ap.add_argument("--rtt-ms", type=float, required=True, help="round-trip delay added, ms")
    a = ap.parse_args()
    lh, lp = a.listen.rsplit(":", 1)
    th, tp = a.to.rsplit(":", 1)
    try:
        p = DelayProxy((th, int(tp)), a.rtt_ms, (lh, int(lp)))
    except ValueError as e:  # not a loopback address
        raise SystemExit(str(e)) from None
    print(f"delay proxy {p.endpoint} -> {a.to}, +{a.rtt_ms:g} ms round trip (Ctrl-C ends it)", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        p.close()


if __name__ == "__main__":
    main()
