"""The target's layers on llama.cpp RPC servers (edgespec/llama/rpc.py): two `edgespec rpc-server` processes on loopback
serve a tiny target, whose output must equal the local run token for token (greedy, seeded sampling, speculative
with a local draft); endpoints that cannot be used are one clear error, never the abort llama.cpp would raise.

Needs a llama-cpp-python built with -DGGML_RPC=ON (scripts/setup.sh does): where the build has no RPC library the
tests that use one are skipped, saying so, unless EDGESPEC_REQUIRE_RPC=1 (CI) makes that a failure."""

from __future__ import annotations

import os
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

import edgespec.llama.backend as backend
from edgespec.llama.context import RPC_SLOW_FACTOR, Context, rpc_decode_allowance
from edgespec.llama import rpc
from edgespec.drafting.calibration import Calibration
from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.runtime.engine import Engine
from edgespec.errors import BackendError, ConfigError

from support.rpc_process import RpcServer, free_port
from support.shared import ROOT, run_child

GREEDY = SamplingParams(temperature=0)
FLAT = Calibration({1: 1e-3, 16: 1.05e-3}, 2e-4, "fixed")  # drafting always looks cheap: the draft model is used
FIXED = SpecConfig(draft_max=4, adaptive=False)
PROMPTS = ["abc d", "the cat", "a b c d e f", "hello"]
NO_RPC = "this llama-cpp-python build has no RPC backend (libggml-rpc); rebuild with scripts/setup.sh (-DGGML_RPC=ON)"

if not rpc.available() and os.environ.get("EDGESPEC_REQUIRE_RPC") == "1":
    raise RuntimeError(f"EDGESPEC_REQUIRE_RPC=1 but {NO_RPC}")
needs_rpc = pytest.mark.skipif(not rpc.available(), reason=NO_RPC)


def _cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "edgespec", *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def servers():
    started: list[RpcServer] = []
    try:
        started = [RpcServer(), RpcServer()]
        yield [s.endpoint for s in started]
    finally:
        for s in started:
            s.stop()


def _engine(tiny, rpc_servers=(), *, draft: bool = False, drafter: str = "none") -> Engine:
    t = backend.Model(ModelSpec(tiny["target"], n_ctx=512, n_batch=64, n_threads=1, rpc=tuple(rpc_servers)))
    try:
        d = backend.Model(ModelSpec(tiny["draft"], n_ctx=512, n_batch=64, n_threads=1)) if draft else None
    except BaseException:
        t.close()
        raise
    return Engine(t, d, drafter=drafter, spec=FIXED, calibration=FLAT)


def _outputs(eng: Engine, sampling: SamplingParams, drafted: list[int] | None = None) -> dict[str, list[int]]:
    out = {}
    with eng:
        for p in PROMPTS:
            r = eng.generate(p, sampling=sampling, max_tokens=32)
            out[p] = list(r.token_ids)
            if drafted is not None:
                drafted.append(r.stats.n_drafted)
    return out


@pytest.fixture(scope="module")
def local_greedy(tiny):
    return _outputs(_engine(tiny), GREEDY)


# --------------------------------------------------------------------------------------------- settings (no server)
@pytest.mark.parametrize("bad", ["x", "h:0", "h:65536", "::1:50052", "h:p", "a b:1", "h:1,h:1", ["h:1", 5], 5])
def test_bad_endpoints_are_one_config_error(bad):
    with pytest.raises(ConfigError) as e:
        ModelSpec("m.gguf", rpc=bad)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("six", ["[::1]:50052", "::1:50052", "fe80::1:50052"])
def test_ipv6_endpoints_say_llama_cpp_connects_over_ipv4_only(six):
    with pytest.raises(ConfigError, match="IPv4 only"):
        ModelSpec("m.gguf", rpc=six)


def test_a_host_with_only_an_ipv6_address_is_one_error(monkeypatch):
    """The probe resolves as ggml-rpc does (gethostbyname: IPv4 only), so a name with only an IPv6 address is one
    error at load instead of llama.cpp's abort."""
    real = socket.getaddrinfo

    def six_only(host, port, family=0, *a, **kw):
        if host == "six-only.test":
            if family == socket.AF_INET:
                raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
            return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", ("::1", port, 0, 0))]
        return real(host, port, family, *a, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", six_only)
    with pytest.raises(BackendError, match="no IPv4 address.*IPv4 only"):
        rpc.probe("six-only.test:50052", timeout=2)


def test_endpoints_are_normalised():
    assert ModelSpec("m.gguf", rpc=" a:1, 10.0.0.2:50052 ").rpc == ("a:1", "10.0.0.2:50052")
    assert ModelSpec("m.gguf", rpc=["a:1"]).rpc == ("a:1",) and ModelSpec("m.gguf").rpc == ()


def test_a_build_without_rpc_says_how_to_rebuild(tiny, monkeypatch):
    """Where llama.cpp's libraries do not include libggml-rpc (the default build of llama-cpp-python), --rpc is one
    line that names scripts/setup.sh, before anything loads."""
    monkeypatch.setattr(rpc, "_LIBS", {})
    monkeypatch.setattr(rpc, "_open", lambda name: None if name == "ggml-rpc" else object())
    with pytest.raises(BackendError, match="no RPC backend.*scripts/setup.sh"):
        backend.Model(ModelSpec(tiny["target"], n_ctx=64, rpc=("127.0.0.1:1",)))


# --------------------------------------------------------------------------------------------- exactness over RPC
@needs_rpc
def test_the_layers_are_on_the_servers(tiny, servers):
    devs = rpc.acquire(servers)
    try:
        assert len(devs) == 2
        assert [n.split()[1] for n in rpc.device_names(devs)] == servers  # a device's description is its server
    finally:
        rpc.release(servers)
    r = _cli("info", "--json", "--rpc", ",".join(servers))
    assert r.returncode == 0, r.stderr
    import json

    info = json.loads(r.stdout)["rpc"]
    assert [s["endpoint"] for s in info] == servers
    assert all(s["protocol"].startswith(f"{rpc.PROTO_MAJOR}.") and s["devices"][0]["total"] > 0 for s in info)


def _buffers(tiny, servers: list[str], split: str) -> dict[str, float]:
    """MiB of the tiny target's weights per device, as llama.cpp's load log says, loaded with --tensor-split `split`."""
    code = ("from edgespec.llama import backend; from edgespec.config import ModelSpec; "
            f"backend.Model(ModelSpec({str(tiny['target'])!r}, n_ctx=64, n_threads=1, rpc={servers!r}, tensor_split={split!r}), parallel=1).close()")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "EDGESPEC_VERBOSE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    import re

    return {m[0]: float(m[1]) for m in re.findall(r"RPC\d+\[([\d.:]+)\] model buffer size =\s+([\d.]+) MiB", r.stderr)}


@needs_rpc
def test_tensor_split_places_the_layers_in_those_shares(tiny, servers, local_greedy):
    """--tensor-split 1,0 puts every offloaded layer on the first server, 0,1 on the second (llama.cpp's load log
    names each device's weights), and the output does not change with the placement."""
    a, b = servers
    assert set(_buffers(tiny, servers, "1,0")) == {a} and set(_buffers(tiny, servers, "0,1")) == {b}
    assert set(_buffers(tiny, servers, "")) == {a, b}  # llama.cpp's default: by free memory
    for split in ((1, 0), (0, 1), (1, 3)):
        t = backend.Model(ModelSpec(tiny["target"], n_ctx=512, n_batch=64, n_threads=1, rpc=tuple(servers), tensor_split=split))
        assert _outputs(Engine(t, None, drafter="none", spec=FIXED, calibration=FLAT), GREEDY) == local_greedy
    with pytest.raises(ConfigError, match="3 shares but the model has 2 device"):
        backend.Model(ModelSpec(tiny["target"], n_ctx=64, rpc=tuple(servers), tensor_split=(1, 1, 1)))
    with pytest.raises(ConfigError, match="no --rpc"):  # a CPU-only machine without servers has nothing to split over
        backend.Model(ModelSpec(tiny["target"], n_ctx=64, tensor_split=(1,)))
    r = _cli("generate", "-m", str(tiny["target"]), "--no-draft", "--rpc", ",".join(servers), "--tensor-split", "1,x", "hi")
    assert r.returncode == 1 and "tensor_split must be numbers" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("bad", ["0,0", "-1,1", "nan", ",".join(["1"] * 17), [True]])
def test_bad_tensor_splits_are_one_config_error(bad):
    with pytest.raises(ConfigError, match="tensor_split"):
        ModelSpec("x.gguf", tensor_split=bad)
    assert ModelSpec("x.gguf", tensor_split="3, 1").tensor_split == (3.0, 1.0) and ModelSpec("x.gguf", tensor_split=None).tensor_split == ()


@needs_rpc
def test_greedy_over_rpc_equals_the_local_run(tiny, servers, local_greedy):
    assert _outputs(_engine(tiny, servers), GREEDY) == local_greedy
    # and again in the same process (the connections of the first model are closed and opened anew)
    assert _outputs(_engine(tiny, servers[:1]), GREEDY) == local_greedy


@needs_rpc
def test_speculative_with_a_local_draft_equals_plain(tiny, servers, local_greedy):
    drafted: list[int] = []
    assert _outputs(_engine(tiny, servers, draft=True, drafter="model"), GREEDY, drafted) == local_greedy
    assert sum(drafted) > 0  # the draft model really drafted, and the target over RPC verified


@needs_rpc
def test_target_and_draft_on_one_server_share_it(tiny, servers, local_greedy):
    """A server serves one client: the draft's layers on the target's server go over the same connection."""
    t = backend.Model(ModelSpec(tiny["target"], n_ctx=512, n_batch=64, n_threads=1, rpc=servers[:1]))
    d = backend.Model(ModelSpec(tiny["draft"], n_ctx=512, n_batch=64, n_threads=1, rpc=servers[:1]))
    drafted: list[int] = []
    assert _outputs(Engine(t, d, drafter="model", spec=FIXED, calibration=FLAT), GREEDY, drafted) == local_greedy
    assert sum(drafted) > 0


@needs_rpc
def test_seeded_sampling_over_rpc_equals_the_local_run(tiny, servers):
    s = SamplingParams(temperature=0.9, top_k=20, seed=1234)
    assert _outputs(_engine(tiny, servers, draft=True, drafter="model"), s) == _outputs(_engine(tiny, draft=True, drafter="model"), s)


@needs_rpc
def test_the_cli_runs_the_target_over_rpc(tiny, servers):
    args = ["generate", "-m", str(tiny["target"]), "--no-draft", "--temperature", "0", "--max-tokens", "16", "--threads", "1", "hello the"]
    local = _cli(*args)
    remote = _cli(*args, "--rpc", ",".join(servers))
    assert local.returncode == 0 and remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout and remote.stdout.strip()


# --------------------------------------------------------------------------------------------- endpoints that cannot serve
@needs_rpc
def test_an_unreachable_server_is_one_error_not_an_abort(tiny):
    """llama.cpp aborts the process (SIGABRT) on a server it cannot connect to: the probe says so first."""
    port = free_port()  # nothing listens there
    r = run_child(f"""
        from edgespec.llama import backend
        from edgespec.config import ModelSpec
        from edgespec.errors import BackendError
        try:
            backend.Model(ModelSpec({str(tiny["target"])!r}, n_ctx=64, rpc=["127.0.0.1:{port}"]))
        except BackendError as e:
            print("ERR", e)
        """, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith("ERR RPC server 127.0.0.1:") and "not reachable" in r.stdout
    cli = _cli("generate", "-m", str(tiny["target"]), "--no-draft", "--max-tokens", "4", "--rpc", f"127.0.0.1:{port}", "hi")
    assert cli.returncode == 1 and cli.stderr.count("\n") == 1 and "not reachable" in cli.stderr and "Traceback" not in cli.stderr


@needs_rpc
def test_a_server_busy_with_another_client_is_one_error(servers):
    """A server serves one client at a time: while another holds it, the handshake is not answered (llama.cpp would
    wait forever); the probe gives up after its timeout."""
    host, port = servers[1].split(":")
    with socket.create_connection((host, int(port)), timeout=10) as other:
        other.sendall(struct.pack("<BQ", 14, 24) + bytes(24))  # another client's HELLO: it now holds the server
        assert len(other.recv(64)) > 0
        t0 = time.monotonic()
        with pytest.raises(BackendError, match="did not answer within 1 s.*another client"):
            rpc.probe(servers[1], timeout=1.0)
        assert time.monotonic() - t0 < 10
    rpc.probe(servers[1])  # free again once the other client leaves


@needs_rpc
def test_something_else_on_the_port_is_one_error(tiny):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        ep = "127.0.0.1:%d" % s.getsockname()[1]
        with pytest.raises(BackendError, match="did not answer"):  # accepted by the kernel, never answered
            rpc.probe(ep, timeout=0.5)


@needs_rpc
def test_rpc_server_refuses_a_taken_port_and_warns_off_loopback(servers):
    port = servers[0].split(":")[1]
    r = _cli("rpc-server", "--port", port, timeout=60)
    assert r.returncode == 1 and "cannot listen on 127.0.0.1:" + port in r.stderr and "Traceback" not in r.stderr
    r = _cli("rpc-server", "--host", "192.0.2.1", "--port", port, timeout=60)  # TEST-NET-1: never this machine's
    assert r.returncode == 1 and "no authentication or encryption" in r.stderr and "cannot listen" in r.stderr
    r = _cli("rpc-server", "--host", "localhost", timeout=60)
    assert r.returncode == 2 and "IPv4" in r.stderr


# --------------------------------------------------------------------------------------------- servers lost after the load
_LOADED_CHILD = """
import sys
import time
from edgespec import BackendLostError
from edgespec.llama import backend
from edgespec.drafting.calibration import Calibration
from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.runtime.engine import Engine
t = backend.Model(ModelSpec({target!r}, n_ctx=512, n_batch=64, n_threads=1, rpc=[{endpoint!r}]))
eng = Engine(t, None, drafter="none", spec=SpecConfig(draft_max=4, adaptive=False), calibration=Calibration({{1: 1e-3, 16: 1.05e-3}}, 2e-4, "fixed"))
print("loaded", flush=True)
sys.stdin.readline()
try:
    r = eng.generate("hello the", sampling=SamplingParams(temperature=0), max_tokens=64)
    print("finished", len(r.token_ids), flush=True)
except BackendLostError as e:  # the caller hears of it; the process ends a moment later (rpc.LOST_GRACE)
    print("raised BackendLostError", flush=True)
    time.sleep(60)
"""


def _loaded_child(tiny, endpoint: str, rpc_timeout: str) -> subprocess.Popen:
    """A process that loads the tiny target onto `endpoint`, says "loaded", and generates once a line arrives."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), rpc.TIMEOUT_ENV: rpc_timeout}
    child = subprocess.Popen([sys.executable, "-c", _LOADED_CHILD.format(target=str(tiny["target"]), endpoint=endpoint)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None
    line = child.stdout.readline()
    if line.strip() != "loaded":
        child.kill()
        raise AssertionError(f"the child did not load: {line!r} {child.communicate(timeout=30)[1][-2000:]}")
    return child


def _lost(child: subprocess.Popen, limit: float) -> tuple[str, float]:
    """Let the child generate; it must end by itself within `limit` seconds: exit code 75, not a signal, one line, and
    the generation raised BackendLostError in the caller first."""
    t0 = time.monotonic()
    out, err = child.communicate("go\n", timeout=limit + 60)
    took = time.monotonic() - t0
    assert child.returncode == rpc.EXIT_RPC_LOST == 75, (child.returncode, err[-2000:])
    assert "finished" not in out and "raised BackendLostError" in out and "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), err[-2000:]
    return lines[0], took


@needs_rpc
@pytest.mark.slow  # child processes and a server killed or stopped: make test runs it, make test-fast does not
def test_a_server_that_dies_after_the_load_ends_the_process_with_one_line(tiny):
    """llama.cpp aborts (SIGABRT, a core dump) when a server's connection breaks mid-generation: ggml's abort callback
    turns that into BackendLostError in the caller, then one line and exit code 75."""
    server = RpcServer()
    try:
        child = _loaded_child(tiny, server.endpoint, "30")
        server.stop()  # killed: its connection is closed under the loaded model
        line, took = _lost(child, 30)
        assert f"RPC server {server.endpoint}" in line and "broke" in line and "restart edgespec" in line
    finally:
        server.stop()


@needs_rpc
@pytest.mark.slow  # child processes and a server killed or stopped: make test runs it, make test-fast does not
def test_a_server_that_stalls_ends_the_process_within_the_timeout(tiny):
    """A server that stops answering (SIGSTOP: its socket stays open, nothing comes back) would hold llama.cpp's
    decode forever: the watchdog ends the process after EDGESPEC_RPC_TIMEOUT (2 s here)."""
    server = RpcServer()
    try:
        child = _loaded_child(tiny, server.endpoint, "2")
        os.kill(server.proc.pid, signal.SIGSTOP)
        line, took = _lost(child, 2)
        assert f"RPC server {server.endpoint} did not answer within 2 s (a decode)" in line and rpc.TIMEOUT_ENV in line
        assert took < 2 + 10  # the limit plus the watchdog's quarter-second look and the process's start of generation
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()


# --------------------------------------------------------------------------------------------- servers that stall mid-work
# llama_decode only queues an RPC model's work (ggml-rpc sends it from its own thread); the wait for the answer is
# the synchronize inside the watched decode (context.Context.decode_batch), so a stall anywhere in a generation ends
# it within EDGESPEC_RPC_TIMEOUT + rpc.LOST_GRACE. STALL_SLACK: the watchdog's quarter-second look, the process's end.
STALL_TIMEOUT = 2.0
STALL_SLACK = 3.0


def _delay_proxy(server: RpcServer, rtt_ms: float):
    """edgespec.bench.delay_proxy in front of `server`: every round trip `rtt_ms` longer, so that the tiny model's
    generation lasts long enough to be stopped in the middle (alone it makes 1,600 tokens/s)."""
    from edgespec.bench.delay_proxy import DelayProxy

    return DelayProxy(("127.0.0.1", server.port), rtt_ms)


def _said_stalled(line: str, endpoint: str) -> float:
    """The limit the watchdog's line for a decode names: the timeout (2 s) plus the decode's allowance (RPC_SLOW_FACTOR
    x its tokens x the median seconds per token of the recent decodes; a few tenths of a second here); 0 for another line."""
    import re

    m = re.search(rf"RPC server {re.escape(endpoint)} did not answer within (\d+(?:\.\d)?) s \(a decode\)", line)
    return float(m.group(1)) if m and rpc.TIMEOUT_ENV in line else 0.0


def test_an_rpc_decode_is_given_the_timeout_plus_its_allowance():
    """A decode of n tokens may take EDGESPEC_RPC_TIMEOUT plus RPC_SLOW_FACTOR x n x the median seconds per token
    of the recent decodes (none yet: the timeout alone); a snapshot the timeout plus a second per 5 MB."""
    from types import SimpleNamespace

    assert rpc_decode_allowance(2.0, [], 512) == 2.0
    recent = [0.001, 5.0, 0.002]  # one decode slowed by a busy moment: the median is 0.002
    assert rpc_decode_allowance(2.0, recent, 1) == pytest.approx(2.0 + RPC_SLOW_FACTOR * 0.002)
    assert rpc_decode_allowance(2.0, recent, 512) == pytest.approx(2.0 + RPC_SLOW_FACTOR * 1.024)
    m = SimpleNamespace(rpc=("h:1",), rpc_timeout=2.0, rpc_token_seconds=recent)
    assert Context.rpc_decode_seconds(m, 1) == pytest.approx(2.0 + RPC_SLOW_FACTOR * 0.002)  # the model's own
    m.rpc = ()
    assert Context.rpc_decode_seconds(m, 1) is None  # a local model's decode is not watched
    assert rpc.transfer_seconds(50_000_000, 2.0) == pytest.approx(12.0)


def _stopped(server: RpcServer) -> float:
    os.kill(server.proc.pid, signal.SIGSTOP)
    return time.monotonic()


def _resume_and_stop(server: RpcServer) -> None:
    if server.proc.poll() is None:
        os.kill(server.proc.pid, signal.SIGCONT)
    server.stop()


_PREFILL_CHILD = """
import sys
import time
from edgespec import BackendLostError
from edgespec.llama import backend
from edgespec.drafting.calibration import Calibration
from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.runtime.engine import Engine
t = backend.Model(ModelSpec({target!r}, n_ctx=512, n_batch=16, n_threads=1, rpc=[{endpoint!r}]))
eng = Engine(t, None, drafter="none", spec=SpecConfig(draft_max=4, adaptive=False), calibration=Calibration({{1: 1e-3, 16: 1.05e-3}}, 2e-4, "fixed"))
print("loaded", flush=True)
seen = []

def on_prefill(done, total):  # from the engine's thread after each chunk: after the first, the test stops the server
    if not seen:
        seen.append(done)
        print("prefill", done, total, flush=True)
        sys.stdin.readline()

try:
    r = eng.generate("hello the cat " * 40, sampling=SamplingParams(temperature=0), max_tokens=16, on_prefill=on_prefill)
    print("finished", len(r.token_ids), flush=True)
except BackendLostError as e:
    print("raised BackendLostError", flush=True)
    time.sleep(60)
"""


@needs_rpc
@pytest.mark.slow  # child processes and a server stopped: make test runs it, make test-fast does not
def test_a_server_that_stalls_during_the_prefill_ends_the_process_within_the_timeout(tiny):
    """SIGSTOP between two chunks of a prompt's prefill: the next chunk's decode waits for the server; the caller gets
    BackendLostError and the process ends with one line and exit 75 within the timeout and the grace."""
    server = RpcServer()
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT), rpc.TIMEOUT_ENV: str(STALL_TIMEOUT)}
        child = subprocess.Popen([sys.executable, "-c", _PREFILL_CHILD.format(target=str(tiny["target"]), endpoint=server.endpoint)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        try:
            assert child.stdout is not None and child.stdin is not None
            assert child.stdout.readline().strip() == "loaded"
            word, done, total = child.stdout.readline().split()
            assert word == "prefill" and 0 < int(done) < int(total), (word, done, total)
            t0 = _stopped(server)
            out, err = child.communicate("go\n", timeout=STALL_TIMEOUT + 60)
            took = time.monotonic() - t0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait(30)
        assert child.returncode == rpc.EXIT_RPC_LOST, (child.returncode, err[-2000:])
        assert "raised BackendLostError" in out and "finished" not in out and "Traceback" not in err
        lines = [ln for ln in err.splitlines() if ln.strip()]
        limit = _said_stalled(lines[0], server.endpoint)
        assert len(lines) == 1 and STALL_TIMEOUT <= limit < STALL_TIMEOUT + 2, err[-2000:]
        assert STALL_TIMEOUT <= took < limit + rpc.LOST_GRACE + STALL_SLACK, took
    finally:
        _resume_and_stop(server)


@needs_rpc
@pytest.mark.slow  # a generate process and a server stopped under it: make test runs it, make test-fast does not
def test_a_server_that_stalls_mid_generation_ends_generate_with_one_line_and_exit_75(tiny):
    """The issue's case: `edgespec generate --rpc` streaming its output when the server stops (SIGSTOP): the output
    stops, one line on stderr and exit 75 within the timeout and the grace, not a hang."""
    import threading

    server = RpcServer()
    proxy = _delay_proxy(server, 40)
    gen = None
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT), rpc.TIMEOUT_ENV: str(STALL_TIMEOUT)}
        gen = subprocess.Popen([sys.executable, "-m", "edgespec", "generate", "-m", str(tiny["target"]), "--no-draft", "--temperature", "0",
                                "--ctx", "512", "--threads", "1", "--max-tokens", "400", "--rpc", proxy.endpoint, "hello the"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        got: list[bytes] = []
        assert gen.stdout is not None

        def read() -> None:
            while chunk := gen.stdout.read1(4096):  # type: ignore[union-attr]
                got.append(chunk)

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        deadline = time.monotonic() + 120
        while sum(map(len, got)) < 10:  # it is generating (40 ms a token through the proxy: 400 tokens take 16 s or more)
            assert time.monotonic() < deadline and gen.poll() is None, "generate did not start"
            time.sleep(0.05)
        t0 = _stopped(server)
        at_stop = sum(map(len, got))
        gen.wait(timeout=STALL_TIMEOUT + 60)
        took = time.monotonic() - t0
        reader.join(10)
        assert gen.stderr is not None
        err = gen.stderr.read().decode()
    finally:
        if gen is not None and gen.poll() is None:
            gen.kill()
            gen.wait(30)
        proxy.close()
        _resume_and_stop(server)
    assert gen.returncode == rpc.EXIT_RPC_LOST, (gen.returncode, err[-2000:])
    lines = [ln for ln in err.splitlines() if ln.strip()]
    limit = _said_stalled(lines[0], proxy.endpoint)
    assert len(lines) == 1 and STALL_TIMEOUT <= limit < STALL_TIMEOUT + 2, err[-2000:]
    assert at_stop < 300 and sum(map(len, got)) < 400  # stopped in the middle
    assert STALL_TIMEOUT <= took < limit + rpc.LOST_GRACE + STALL_SLACK, took


def _stream(url: str, body: dict, out: list) -> None:
    """One streamed completion: (status, everything it sent, when it ended); a transport error as its text."""
    import httpx

    try:
        with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
            text = "".join(r.iter_text())
            out.append((r.status_code, text, time.monotonic()))
    except httpx.HTTPError as e:
        out.append((0, f"{type(e).__name__}: {e}", time.monotonic()))


@needs_rpc
@pytest.mark.slow  # server processes, a server stopped twice: make test runs it, make test-fast does not
def test_serve_ends_every_stream_with_backend_lost_when_a_server_stalls_and_reloads_after_sigcont(tiny, monkeypatch):
    """`serve --rpc` with 6 streams in flight (2 slots, 4 queued) when the server stops (SIGSTOP): every stream ends
    with 503 `backend_lost` (a started stream as its last event) within the timeout and the grace, /health says 503
    meanwhile; SIGCONT brings it back. Stopped again while the supervisor reloads (before or during the child's
    probe and load): the supervisor stays, says 503 `backend_lost` again, and serves once the server continues."""
    import threading

    import httpx

    from support.serve_process import ServeProcess

    monkeypatch.setenv(rpc.TIMEOUT_ENV, str(STALL_TIMEOUT))
    server = RpcServer()
    proxy = _delay_proxy(server, 20)
    body = {"prompt": "hello the", "max_tokens": 300, "temperature": 0}
    s = None
    try:
        s = ServeProcess(["--target", str(tiny["target"]), "--no-draft", "--ctx", "512", "--threads", "1", "--parallel", "2",
                          "--log-level", "warning", "--rpc", proxy.endpoint], timeout=120)
        before = httpx.post(s.url + "/v1/completions", json={**body, "max_tokens": 8}, timeout=60)
        assert before.status_code == 200, before.text
        ended: list = []
        threads = [threading.Thread(target=_stream, args=(s.url, body, ended), daemon=True) for _ in range(6)]
        for t in threads:
            t.start()
        time.sleep(1.0)  # the first two generate (20 ms a token through the proxy), four wait
        assert not ended, ended
        t0 = _stopped(server)
        for t in threads:
            t.join(STALL_TIMEOUT + 60)
        assert len(ended) == 6
        for status, text, when in ended:
            assert status in (200, 503) and "backend_lost" in text, (status, text[-500:])
            assert when - t0 < STALL_TIMEOUT + rpc.LOST_GRACE + STALL_SLACK, when - t0
        took = max(when for _, _, when in ended) - t0
        assert STALL_TIMEOUT <= took, took
        h = httpx.get(s.url + "/health", timeout=10)  # from the child in its grace, or the supervisor after it
        assert h.status_code == 503 and h.json()["error"]["code"] == "backend_lost", h.text
        deadline = time.monotonic() + 30
        while "load again once" not in httpx.get(s.url + "/health", timeout=10).text:  # the supervisor answers
            assert time.monotonic() < deadline and s.proc.poll() is None, "".join(s.lines)[-3000:]
            time.sleep(0.2)
        assert httpx.post(s.url + "/v1/completions", json=body, timeout=60).status_code == 503

        os.kill(server.proc.pid, signal.SIGCONT)  # back: the supervisor probes it and reloads
        deadline = time.monotonic() + 60
        while "answer again: loading" not in "".join(s.lines):
            assert time.monotonic() < deadline and s.proc.poll() is None, "".join(s.lines)[-3000:]
            time.sleep(0.02)
        _stopped(server)  # stalls again while the new child starts, probes and loads
        deadline = time.monotonic() + 60
        while "".join(s.lines).count("the models are unloaded") < 2:  # the child gave up: exit 75, or 1 with the server silent
            assert time.monotonic() < deadline and s.proc.poll() is None, "".join(s.lines)[-3000:]
            time.sleep(0.2)
        h = httpx.get(s.url + "/health", timeout=10)
        assert h.status_code == 503 and h.json()["error"]["code"] == "backend_lost", h.text
        os.kill(server.proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 120
        while httpx.get(s.url + "/health", timeout=10).status_code != 200:
            assert time.monotonic() < deadline and s.proc.poll() is None, "".join(s.lines)[-3000:]
            time.sleep(0.2)
        after = httpx.post(s.url + "/v1/completions", json={**body, "max_tokens": 8}, timeout=60)
        assert after.status_code == 200 and after.json()["choices"][0]["text"] == before.json()["choices"][0]["text"]
        s.proc.terminate()
        assert s.proc.wait(30) == 0
        log = "".join(s.lines)
        assert "Traceback" not in log and log.count("edgespec: ready") >= 2, log[-3000:]
    finally:
        if s is not None:
            s.stop()
        proxy.close()
        _resume_and_stop(server)


def test_a_bad_rpc_timeout_is_one_config_error(tiny, monkeypatch):
    for bad in ("abc", "0", "-5", "1e9"):
        monkeypatch.setenv(rpc.TIMEOUT_ENV, bad)
        with pytest.raises(ConfigError, match=rpc.TIMEOUT_ENV):
            backend.Model(ModelSpec(tiny["target"], n_ctx=64, rpc=("127.0.0.1:1",)))
    monkeypatch.setenv(rpc.TIMEOUT_ENV, "2.5")
    assert rpc.timeout() == 2.5 and rpc.load_seconds(tiny["target"], 2.5) > 2.5


def test_rpc_probe_needs_no_library():
    """The probe is plain Python sockets: it says why a port is unusable even where this build has no RPC."""
    with pytest.raises(BackendError, match="not reachable"):
        rpc.probe(f"127.0.0.1:{free_port()}", timeout=2)


@needs_rpc
@pytest.mark.real
@pytest.mark.slow
def test_the_real_target_over_rpc_equals_the_local_run(real_pair, servers, monkeypatch):
    """The real 1.5B target split over both servers, the 0.5B draft local: greedy speculative output equals plain
    local decoding with the same CPU kernels. (A server computes with ggml's plain CPU kernels; a local load repacks
    Q4_K weights for AVX2/AVX512 kernels that round differently, so the comparison turns repacking off: measured,
    the default local run leaves this output at token 10, the no-repack run matches it token for token.)"""
    target, draft = real_pair
    prompt = "def fibonacci(n):"

    def run(rpc_servers: tuple[str, ...], with_draft: bool) -> tuple[list[int], int]:
        t = backend.Model(ModelSpec(target, n_ctx=512, n_threads=2, rpc=rpc_servers))
        d = backend.Model(ModelSpec(draft, n_ctx=512, n_threads=2)) if with_draft else None
        with Engine(t, d, drafter="model" if with_draft else "none", spec=FIXED, calibration=FLAT) as eng:
            r = eng.generate(prompt, sampling=GREEDY, max_tokens=24)
            return list(r.token_ids), r.stats.n_drafted

    remote, drafted = run(tuple(servers), True)
    assert drafted > 0
    monkeypatch.setenv("EDGESPEC_NO_REPACK", "1")
    assert remote == run((), False)[0]


@needs_rpc
@pytest.mark.slow  # server processes, a server killed and started again: make test runs it, make test-fast does not
def test_serve_answers_503_while_a_server_is_lost_and_reloads_once_it_is_back(tiny):
    """`edgespec serve --rpc` serves from a child process: when the RPC server dies, the request that meets it gets
    503 `backend_lost` (not a dropped connection), /health says so while the server is gone, and once a server
    answers on that port again the models load again and the output is what it was."""
    import httpx

    from support.serve_process import ServeProcess

    server = RpcServer()
    port = server.port
    body = {"prompt": "hello the", "max_tokens": 16, "temperature": 0}
    s = None
    try:
        s = ServeProcess(["--target", str(tiny["target"]), "--no-draft", "--ctx", "256", "--threads", "1", "--log-level", "warning",
                          "--rpc", server.endpoint], timeout=120)
        before = httpx.post(s.url + "/v1/completions", json=body, timeout=60)
        assert before.status_code == 200, before.text
        server.stop()  # killed: the next decode finds its connection broken
        lost = httpx.post(s.url + "/v1/completions", json=body, timeout=60)
        assert lost.status_code == 503 and lost.json()["error"]["code"] == "backend_lost", lost.text
        assert lost.headers.get("retry-after")
        deadline = time.monotonic() + 30
        while True:  # the child ends within rpc.LOST_GRACE; the supervisor then answers on the same port
            h = httpx.get(s.url + "/health", timeout=10)
            if h.status_code == 503 and "load again once" in h.json()["error"]["message"]:
                break
            assert time.monotonic() < deadline, h.text
            time.sleep(0.2)
        assert h.json()["error"]["code"] == "backend_lost"
        assert httpx.post(s.url + "/v1/completions", json=body, timeout=60).status_code == 503
        assert s.proc.poll() is None
        server = RpcServer(port=port)  # back on the same port
        deadline = time.monotonic() + 120
        while httpx.get(s.url + "/health", timeout=10).status_code != 200:
            assert time.monotonic() < deadline and s.proc.poll() is None, "".join(s.lines)[-3000:]
            time.sleep(0.2)
        after = httpx.post(s.url + "/v1/completions", json=body, timeout=60)
        assert after.status_code == 200 and after.json()["choices"][0]["text"] == before.json()["choices"][0]["text"]
        s.proc.terminate()  # SIGTERM to the supervisor reaches the server process: both end, exit 0
        assert s.proc.wait(30) == 0
        log = "".join(s.lines)
        assert "Traceback" not in log and log.count("edgespec: ready") == 2 and "answer again: loading" in log, log[-3000:]
    finally:
        if s is not None:
            s.stop()
        server.stop()


@needs_rpc
@pytest.mark.slow  # a chat process and a server killed under it: make test runs it, make test-fast does not
@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_chat_that_loses_its_server_saves_the_conversation(tiny, tmp_path, how):
    """`edgespec chat --rpc`: the server dies (or stops answering: SIGSTOP) between two messages; the chat saves the
    conversation (the second message included) before the process ends with the one line and exit 75, and a chat
    without the server resumes it."""
    server = RpcServer()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "EDGESPEC_DATA_DIR": str(tmp_path), rpc.TIMEOUT_ENV: str(STALL_TIMEOUT)}
    args = [sys.executable, "-m", "edgespec", "chat", "-m", str(tiny["target"]), "--no-draft", "--temperature", "0", "--max-tokens", "8",
            "--threads", "1", "--ctx", "512"]
    chat = subprocess.Popen([*args, "--rpc", server.endpoint], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert chat.stdin is not None and chat.stdout is not None
        chat.stdin.write("hello the\n")
        chat.stdin.flush()
        first = chat.stdout.readline()  # the first answer has come
        time.sleep(0.5)  # and ended (8 tokens of the tiny model: milliseconds)
        if how == "killed":
            server.stop()
        else:
            _stopped(server)
        out, err = chat.communicate("the cat\n", timeout=60)
    finally:
        if chat.poll() is None:
            chat.kill()
        _resume_and_stop(server)
    assert chat.returncode == rpc.EXIT_RPC_LOST, err[-2000:]
    lines = [ln for ln in err.splitlines() if ln.strip()]
    if how == "killed":
        assert len(lines) == 1 and lines[0].startswith("Error: the connection to RPC server"), err[-2000:]
    else:
        assert len(lines) == 1 and lines[0].startswith("Error: ") and _said_stalled(lines[0], server.endpoint) >= STALL_TIMEOUT, err[-2000:]
    saved = list((tmp_path / "chats").glob("lost-*.json"))
    assert len(saved) == 1 and f"--resume {saved[0]}" in out, (first, out)
    import json

    msgs = json.loads(saved[0].read_text())["messages"]
    assert [m["content"] for m in msgs if m["role"] == "user"] == ["hello the", "the cat"]
    r = subprocess.run([*args, "--resume", str(saved[0])], input="", capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]


def test_a_connection_closed_during_the_load_is_a_failed_load_not_a_lost_server(monkeypatch):
    """A server closes the connection while the weights are sent to it when it cannot allocate their buffer: that is
    exit 1 with a memory hint (serve --rpc must not reload into the same wall), a loss after the load exit 75."""
    calls = []

    def lost(message: str, code: int = rpc.EXIT_RPC_LOST) -> None:  # the real one ends the process
        calls.append((message, code))
        raise SystemExit(code)

    monkeypatch.setattr(rpc, "lost", lost)
    with rpc.WATCHDOG.watch(["127.0.0.1:1"], rpc.LOADING, 60), pytest.raises(SystemExit):
        rpc._on_abort(b"ggml-rpc.cpp:123: Remote RPC server crashed or returned malformed response")
    with pytest.raises(SystemExit):
        rpc._on_abort(b"ggml-rpc.cpp:123: Remote RPC server crashed or returned malformed response")
    (during, code1), (after, code2) = calls
    assert code1 == rpc.EXIT_ABORTED == 1 and "memory for its share" in during
    assert code2 == rpc.EXIT_RPC_LOST == 75 and "broke" in after


@needs_rpc
@pytest.mark.real
@pytest.mark.slow
def test_a_server_without_the_memory_for_the_model_is_one_error(real_pair):
    """An rpc-server limited to 400 MB of data (RLIMIT_DATA) cannot hold the real 1.5B target: one line naming the
    server and what to check, exit 1 (not 75: `serve --rpc` would reload into the same wall), no traceback."""
    server = RpcServer(data_limit=400 * 2**20)
    try:
        r = _cli("generate", "-m", str(real_pair[0]), "--no-draft", "--rpc", server.endpoint, "--max-tokens", "4", "def f(", timeout=300)
    finally:
        server.stop()
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == 1 and len(lines) == 1 and server.endpoint in lines[0] and "memory for its share" in lines[0], r.stderr[-2000:]
