"""Backpressure and fairness (issue 44): clients that do not read their streams, and one client flooding the queue.

The engine: a generation whose reader is behind (Generation.limit_backlog) pauses at a cycle boundary, gives its
slot to a queued generation after a grace and comes back to it when its reader catches up, its output unchanged; a
cancelled one set aside ends at once. The server (`edgespec serve` in a child process, on loopback): a stream its
client does not read (a raw socket with a 1 KiB receive buffer) is cancelled after --stall-timeout and its connection
reset; requests in flight, their responses still being written included, count against slots + queue (503 beyond);
one client (its bearer token, else its address) holds at most slots + ceil(--client-share x --max-queue) of them (429
beyond) while another client is served. The soak (slow): 40 stalled clients, 10 at a time, beside a client sending
short requests: in flight never above slots + queue, every one of the other client's requests served, and the
server's RSS bounded while they stall and flat after they close (bounds below).
"""

from __future__ import annotations

import socket
import time
from types import SimpleNamespace

import httpx
import pytest

from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.runtime.engine import Engine
from edgespec.server.core import ServerState, Settings
from edgespec.server.api_errors import APIError

from support.serve_process import ServeProcess
from support.stalled_clients import metrics, soak, stalled_body, stalled_request

GREEDY = SamplingParams(temperature=0)
LONG_CTX = 8192  # a stream of 8000 tokens with top-20 logprobs is ~12 MB: more than the kernel's socket buffers hold
SOAK_CLIENTS, SOAK_AT_ONCE = 40, 10
RSS_PEAK_MIB = 40  # the most the server's RSS may grow over its warmed-up size while the stalled clients hold on
RSS_AFTER_MIB = 10  # and what it may keep once they have closed


def make_engine(tiny, parallel: int = 1) -> Engine:
    return Engine.load(ModelSpec(str(tiny["target"]), n_ctx=1024, n_threads=1), None, parallel=parallel,
                       spec=SpecConfig(draft_max=4, adaptive=False), calibrate_costs=False)


def wait_for(cond, timeout: float = 60.0, every: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every)


# --------------------------------------------------------------------------------------------- the engine
def test_a_generation_whose_reader_is_behind_pauses_and_its_output_is_unchanged(tiny):
    with make_engine(tiny) as eng:
        want = eng.generate("the cat", sampling=GREEDY, max_tokens=200).token_ids
        g = eng.stream("the cat", sampling=GREEDY, max_tokens=200)
        g.limit_backlog(2)
        wait_for(lambda: len(g._job.items) >= 2)
        time.sleep(0.3)  # it would have finished long since: it waits for its reader instead
        assert not g.done and len(g._job.items) <= 4  # (one cycle may push two chunks and the detokenizer's tail)
        assert [t for c in g for t in c.tokens] == want and g.finish_reason == "length"


def test_a_held_generation_gives_its_slot_to_a_queued_one_and_gets_it_back(tiny):
    with make_engine(tiny) as eng:
        want_a = eng.generate("the cat", sampling=GREEDY, max_tokens=200).token_ids
        want_b = eng.generate("zz top", sampling=GREEDY, max_tokens=100).token_ids
        a = eng.stream("the cat", sampling=GREEDY, max_tokens=200)
        a.limit_backlog(2)
        wait_for(lambda: len(a._job.items) >= 2)
        b = eng.stream("zz top", sampling=GREEDY, max_tokens=100)  # long (not short): it waits for a slot
        assert b.result(timeout=60).token_ids == want_b  # A's slot was given to it while A's reader was away
        assert not a.done and eng.pending == 1  # A, set aside
        assert [t for c in a for t in c.tokens] == want_a  # back in its slot, its output unchanged


def test_a_cancelled_generation_set_aside_ends_at_once(tiny):
    with make_engine(tiny) as eng:
        a = eng.stream("the cat", sampling=GREEDY, max_tokens=200)
        a.limit_backlog(1)
        wait_for(lambda: len(a._job.items) >= 1)
        b = eng.stream("zz top", sampling=GREEDY, max_tokens=900)
        b.limit_backlog(1)  # B holds A's slot (its reader away too) once it has it
        wait_for(lambda: b.started and len(b._job.items) >= 1)
        a.cancel()
        assert a.wait(10) and a.finish_reason == "cancelled"
        assert not b.done
        b.cancel()
        assert b.wait(10)
        assert eng.pending == 0 and eng.slot_state()["busy"] == 0


def test_limit_backlog_checks_its_argument(tiny):
    with make_engine(tiny) as eng:
        g = eng.stream("x", sampling=GREEDY, max_tokens=2)
        with pytest.raises(Exception, match="at least 1"):
            g.limit_backlog(0)
        g.result(timeout=30)


# --------------------------------------------------------------------------------------------- admission
def _state(parallel: int, max_queue: int | None, share: float) -> ServerState:
    eng = SimpleNamespace(parallel=parallel, max_queue=max_queue)
    return ServerState(settings=Settings(client_share=share), engine=eng)


def test_admission_counts_slots_plus_queue_and_a_clients_share():
    st = _state(2, 6, 0.5)  # 8 in flight; one client at most 2 + 3
    a = [st.admit("a") for _ in range(5)]
    with pytest.raises(APIError) as ei:
        st.admit("a")
    assert ei.value.status == 429 and ei.value.code == "client_queue_full" and "Retry-After" in ei.value.headers
    b = [st.admit("b") for _ in range(3)]
    with pytest.raises(APIError) as ei:
        st.admit("c")
    assert ei.value.status == 503 and ei.value.code == "queue_full"
    a[0].release()
    a[0].release()  # once only
    assert st.metrics.in_flight == 7 and st.clients["a"] == 4
    st.admit("c")
    for x in a[1:] + b:
        x.release()
    assert st.clients == {"c": 1} and st.metrics.rejected == {"client_queue_full": 1, "queue_full": 1}
    one = _state(1, 4, 1.0)  # share 1: one client may take every place
    assert len([one.admit("a") for _ in range(5)]) == 5
    unbounded = _state(1, None, 0.5)  # an engine without a queue limit: no limit here either
    assert len([unbounded.admit("a") for _ in range(50)]) == 50


# --------------------------------------------------------------------------------------------- the server
def serve(tiny, *extra: str) -> ServeProcess:
    return ServeProcess(["--target", str(tiny["target"]), "--draft", str(tiny["draft"]), "--threads", "1", "--ctx",
                         str(LONG_CTX), "--log-level", "error", *extra])


def short(url: str, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.post(url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
                      headers=headers, timeout=60)


def test_a_stream_its_client_does_not_read_is_cancelled_and_reset_after_the_stall_timeout(tiny):
    s = serve(tiny, "--parallel", "1", "--max-queue", "2", "--stall-timeout", "1")
    try:
        sock = stalled_request(s.url, stalled_body(8000))
        try:
            wait_for(lambda: metrics(s.url)["edgespec_requests_stalled_total"] == 1, every=0.1)
            wait_for(lambda: metrics(s.url)["edgespec_requests_in_flight"] == 0, every=0.1)
            sock.settimeout(10)
            with pytest.raises(ConnectionResetError):  # reset: the server dropped what it still held for it
                while sock.recv(1 << 16):
                    pass
        finally:
            sock.close()
        m = metrics(s.url)
        assert m['edgespec_requests_cancelled_total{stage="running"}'] == 1
        assert m['edgespec_tokens_total{kind="generated"}'] < 8000  # cancelled, not run to its end
        assert short(s.url).status_code == 200
    finally:
        s.stop()


def test_unread_responses_count_in_flight_and_one_client_gets_its_share(tiny):
    # 1 slot + 4 queued = 5 in flight; one client at most 1 + ceil(0.5 * 4) = 3
    s = serve(tiny, "--parallel", "1", "--max-queue", "4", "--stall-timeout", "60")
    socks: list[socket.socket] = []
    try:
        socks += [stalled_request(s.url, stalled_body(8000), token="flood") for _ in range(3)]
        wait_for(lambda: metrics(s.url)["edgespec_requests_in_flight"] == 3, every=0.1)
        r = short(s.url, "flood")
        assert r.status_code == 429 and r.headers["retry-after"] == "1"
        assert r.json()["error"]["code"] == "client_queue_full" and r.json()["error"]["type"] == "rate_limit_error"
        assert short(s.url, "other").status_code == 200  # another client's short request is served meanwhile
        socks += [stalled_request(s.url, stalled_body(8000)) for _ in range(2)]  # (no token: the peer address)
        wait_for(lambda: metrics(s.url)["edgespec_requests_in_flight"] == 5, every=0.1)
        r = short(s.url, "third")
        assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full"  # slots + queue, all in flight
        for x in socks:
            x.close()
        socks = []
        wait_for(lambda: metrics(s.url)["edgespec_requests_in_flight"] == 0, every=0.1)  # closing gives the places back
        assert short(s.url, "flood").status_code == 200
    finally:
        for x in socks:
            x.close()
        s.stop()


def test_client_share_from_the_environment(tiny, monkeypatch):
    monkeypatch.setenv("EDGESPEC_CLIENT_SHARE", "1")
    s = serve(tiny, "--parallel", "1", "--max-queue", "2", "--stall-timeout", "60")
    socks: list[socket.socket] = []
    try:
        socks = [stalled_request(s.url, stalled_body(8000)) for _ in range(3)]  # share 1: one client takes every place
        wait_for(lambda: metrics(s.url)["edgespec_requests_in_flight"] == 3, every=0.1)
        assert short(s.url).status_code == 503
    finally:
        for x in socks:
            x.close()
        s.stop()


# --------------------------------------------------------------------------------------------- the soak
@pytest.mark.slow
def test_soak_stalled_clients_beside_a_served_one(tiny):
    """SOAK_CLIENTS stalled clients (one client: the same address), SOAK_AT_ONCE at a time, over 2 slots + 6 queued,
    stall timeout 1 s: in flight never above 8; every request of another client served; RSS within RSS_PEAK_MIB of its
    warmed-up size meanwhile and within RSS_AFTER_MIB after (bench/stalled_clients.py runs 200)."""
    s = serve(tiny, "--parallel", "2", "--max-queue", "6", "--stall-timeout", "1")
    try:
        soak(s.url, s.proc.pid, clients=SOAK_AT_ONCE, at_once=SOAK_AT_ONCE, hold=6, max_tokens=8000)  # warm-up
        r = soak(s.url, s.proc.pid, clients=SOAK_CLIENTS, at_once=SOAK_AT_ONCE, hold=6, max_tokens=8000)
        print("\nsoak:", r.line())
        assert r.in_flight_max <= 2 + 6
        assert r.served > 0 and not r.other_refused and not r.other_errors, (r.other_refused, r.other_errors[:3])
        assert r.end_metrics["edgespec_requests_stalled_total"] > 0  # the scenario did stall the server's writes
        assert r.rss_peak - r.rss_before <= RSS_PEAK_MIB * 2**20, r.line()
        assert r.rss_after - r.rss_before <= RSS_AFTER_MIB * 2**20, r.line()
        assert r.end_metrics["edgespec_requests_in_flight"] == 0
        assert s.proc.poll() is None
    finally:
        s.stop()
