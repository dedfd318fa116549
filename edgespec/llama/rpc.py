"""The RPC half of the backend: llama.cpp's RPC servers (ggml-rpc) as devices for a model's layers.

An `rpc-server` on each host (`edgespec rpc-server`, or llama.cpp's own) exposes that host's devices over TCP; this
process registers them (ggml_backend_rpc_add_server) and context.Context places the model's layers over them through
llama_model_params.devices. Imported by context.py, the engine and the CLI only; it takes llama.cpp's bindings from
binding.py.

ggml-rpc ends the process (GGML_ABORT) when it cannot connect or the handshake fails, and a server serves one
client at a time (a second one waits, silently, in its listen queue). So every endpoint is probed first, here in
Python (`probe`: a TCP connect and the protocol's HELLO, bounded by a timeout), unless a model of this process
already holds a connection to it: a server that is down, not an RPC server, of another protocol version, or busy
with another client is one BackendError instead of a signal or a hang.

A server that dies or stalls after the probe (mid-load, mid-decode) cannot be survived inside this process: llama.cpp
aborts on a broken connection and waits forever on a silent one, and its connection to that endpoint stays cached
for the process's life. So from the first RPC model on, the process ends with one line instead (`lost`, exit code
EXIT_RPC_LOST): llama.cpp's abort is caught by ggml's abort callback, and every call that talks to the servers
(decodes, cache snapshots, freeing the model, the load) runs under a watchdog that ends it after EDGESPEC_RPC_TIMEOUT
seconds (default 30; the load gets that plus a second per 5 MB of the file). ggml-rpc talks to a server from a thread
of its own (its dispatcher): llama_decode only queues the graph and the read of the logits, and the wait for the
answer is whichever call synchronizes next; so an RPC model's decode synchronizes inside its watched call
(context.Context.decode_batch), never later in an unwatched llama_get_logits_ith (which hung forever on a stalled
server: issue 44). The ctypes calls release the GIL, so the watchdog runs while a call waits. Before it ends, the `on_lost` hooks run (an
Engine's ends every generation with BackendLostError, so a server's clients get an error, not a dropped
connection) and get LOST_GRACE seconds. `edgespec serve --rpc` runs the server in a child process and reloads it
once the servers answer again (cli/supervise.py).

ggml-rpc connects over IPv4 only (gethostbyname, AF_INET): the probe does the same.

The protocol has no authentication or encryption: servers must only listen on a trusted network.
"""

from __future__ import annotations

import ctypes
import os
import socket
import struct
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn, Sequence

from edgespec.config import split_rpc_endpoint
from edgespec.errors import EXIT_BACKEND_LOST, BackendError, ConfigError
from .binding import C

PROTO_MAJOR, PROTO_MINOR = 7, 0  # ggml-rpc.h's RPC_PROTO_MAJOR_VERSION / MINOR of the llama.cpp this build vendors
_CMD_HELLO = 14  # RPC_CMD_HELLO (fixed across versions)
_CAPS = 24  # RPC_CONN_CAPS_SIZE: transport capabilities in the HELLO (all zero: plain TCP)
PROBE_TIMEOUT = 10.0  # seconds a probe waits for the connection and for the HELLO's answer
DEFAULT_PORT = 50052  # llama.cpp's rpc-server default
_GPU, _IGPU = 1, 2  # enum ggml_backend_dev_type
TIMEOUT_ENV = "EDGESPEC_RPC_TIMEOUT"
DEFAULT_TIMEOUT = 30.0  # seconds a call to the servers may take before the process gives up on them
EXIT_RPC_LOST = EXIT_BACKEND_LOST  # 75, EX_TEMPFAIL: a server was lost; try again once it is back (cli/supervise.py reloads)
EXIT_ABORTED = 1  # llama.cpp aborted for another reason (the CLI's exit code for an error)
LOST_GRACE = 1.0  # seconds the on_lost hooks' clients get to hear of a loss before the process ends
_NO_RPC = ("this llama-cpp-python build has no RPC backend (libggml-rpc): rebuild it with scripts/setup.sh, "
           "which builds with -DGGML_RPC=ON (docs/setup.md)")


def probe(endpoint: str, timeout: float = PROBE_TIMEOUT) -> tuple[int, int, int]:
    """Connect to an RPC server and exchange the HELLO, as llama.cpp would, then disconnect: its protocol version
    (major, minor, patch), or a BackendError saying why llama.cpp could not use it."""
    host, port = split_rpc_endpoint(endpoint)
    try:
        addrs = socket.getaddrinfo(host, port, socket.AF_INET, socket.SOCK_STREAM)  # as ggml-rpc: IPv4 only
    except socket.gaierror as e:
        six = _has_ipv6(host, port)
        raise BackendError(f"RPC server {endpoint}: the host has no IPv4 address ({e.strerror or e})"
                           + ("; it has an IPv6 one, but llama.cpp's RPC backend connects over IPv4 only" if six else "")) from None
    try:
        sock = socket.create_connection((str(addrs[0][4][0]), int(addrs[0][4][1])), timeout=timeout)
    except socket.timeout:
        raise BackendError(f"RPC server {endpoint}: no connection within {timeout:g} s (is the host up and the port open?)") from None
    except OSError as e:
        raise BackendError(f"RPC server {endpoint} is not reachable: {e.strerror or e} "
                           f"(start one there with `edgespec rpc-server --port {port}`)") from None
    with sock:
        try:
            sock.settimeout(timeout)
            sock.sendall(struct.pack("<BQ", _CMD_HELLO, _CAPS) + bytes(_CAPS))
            size = struct.unpack("<Q", _recv(sock, 8))[0]
            if size != 4 + _CAPS:
                raise BackendError(f"{endpoint} is not a llama.cpp RPC server of protocol {PROTO_MAJOR}.x (bad HELLO answer)")
            major, minor, patch = _recv(sock, size)[:3]
        except socket.timeout:
            raise BackendError(f"RPC server {endpoint} accepted the connection but did not answer within {timeout:g} s: a server "
                               "serves one client at a time; is another client (another edgespec or llama.cpp) using it, or is the server "
                               "stopped or stalled?") from None
        except (OSError, EOFError) as e:
            raise BackendError(f"RPC server {endpoint} closed the connection during the handshake ({getattr(e, 'strerror', None) or e}; "
                               f"not a llama.cpp RPC server of protocol {PROTO_MAJOR}.x?)") from None
    if major != PROTO_MAJOR or minor > PROTO_MINOR:
        raise BackendError(f"RPC server {endpoint} speaks protocol {major}.{minor}.{patch}, this build {PROTO_MAJOR}.{PROTO_MINOR}: "
                           "run the same llama.cpp version on both sides")
    return int(major), int(minor), int(patch)


def _has_ipv6(host: str, port: int) -> bool:
    try:
        return bool(socket.getaddrinfo(host, port, socket.AF_INET6, socket.SOCK_STREAM))
    except OSError:
        return False


def _recv(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        part = sock.recv(n - len(buf))
        if not part:
            raise EOFError("connection closed")
        buf += part
    return buf


# ------------------------------------------------------------------------------------------- lost servers
_ABORT_CB = ctypes.CFUNCTYPE(None, ctypes.c_char_p)


def timeout() -> float:
    """EDGESPEC_RPC_TIMEOUT (seconds, > 0) or DEFAULT_TIMEOUT; a ConfigError for any other value."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT
    try:
        t = float(raw)
    except ValueError:
        t = 0.0
    if not 0 < t <= 86400:
        raise ConfigError(f"{TIMEOUT_ENV} must be a number of seconds in (0, 86400], got {raw[:40]!r}")
    return t


_lost_hooks: list[Callable[[str], None]] = []
_lost_once = threading.Lock()


def on_lost(hook: Callable[[str], None]) -> Callable[[], None]:
    """Call hook(message), from whichever thread notices, when a server is lost, just before the process ends (it
    must not block: the process ends LOST_GRACE seconds later whatever it does). Returns what unregisters it."""
    with _LOCK:
        _lost_hooks.append(hook)

    def remove() -> None:
        with _LOCK:
            if hook in _lost_hooks:
                _lost_hooks.remove(hook)

    return remove


def lost(message: str, code: int = EXIT_RPC_LOST) -> NoReturn:
    """End the process with one line on stderr (an RPC server is gone and llama.cpp cannot go on without it),
    after the on_lost hooks and LOST_GRACE seconds for what they started; a second caller waits for the first."""
    if not _lost_once.acquire(blocking=False):
        while True:
            time.sleep(3600)
    try:
        os.write(2, f"Error: {message}\n".encode("utf-8", "replace"))
        hooks = list(_lost_hooks)
        for hook in hooks:
            try:
                hook(message)
            except BaseException:  # noqa: BLE001 - the process ends anyway
                pass
        if hooks:
            time.sleep(LOST_GRACE)
    finally:
        os._exit(code)


def _servers_text() -> str:
    got = _LOCK.acquire(timeout=1.0)  # the abort may come from inside `acquire`, which holds it
    try:
        eps = sorted(ep for ep, n in list(_users.items()) if n)
    finally:
        if got:
            _LOCK.release()
    return ", ".join(eps) or "an RPC server"


def _on_abort(msg: bytes | None) -> None:
    """ggml's abort callback (from any thread, llama.cpp's own included): one line and exit, instead of SIGABRT."""
    text = (msg or b"").decode("utf-8", "replace").strip()
    where, _, what = text.partition(": ")
    remote = "rpc" in where.lower() or "RPC" in what
    if remote and WATCHDOG.doing(LOADING):
        # during the load: most often a server that cannot allocate a buffer for the weights it is sent (it closes the
        # connection); reloading would meet the same wall, so this is a failed load (exit 1), not a lost server (75)
        lost(f"RPC server {_servers_text()} closed the connection while the model was loading onto it ({what or text}): does "
             "it have the memory for its share of the layers? (its own log says; `edgespec info --rpc` shows its free memory; "
             "--tensor-split and --n-gpu-layers N move layers)", EXIT_ABORTED)
    if remote:
        lost(f"the connection to RPC server {_servers_text()} broke ({what or text}); the model on it cannot go on: "
             "restart edgespec once the server is back (`edgespec serve --rpc` reloads by itself; docs/rpc.md)")
    lost(f"llama.cpp stopped: {what or text}", EXIT_ABORTED)


_abort_handler: Any = None


def _install_abort_handler() -> None:
    global _abort_handler
    if _abort_handler is None:
        _abort_handler = _ABORT_CB(_on_abort)  # kept referenced for the process's life
        _libs()["ggml-base"].ggml_set_abort_callback(_abort_handler)


class Watchdog:
    """Ends the process (`lost`) when a call to the RPC servers outlasts its timeout: one daemon thread, started
    with the first watched call, that looks four times a second."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._calls: dict[int, tuple[float, float, tuple[str, ...], str]] = {}
        self._next = 0
        self._thread: threading.Thread | None = None

    @contextmanager
    def watch(self, endpoints: Sequence[str], what: str, seconds: float) -> Iterator[None]:
        with self._lock:
            key = self._next
            self._next += 1
            self._calls[key] = (time.monotonic() + seconds, seconds, tuple(endpoints), what)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="rpc-watchdog", daemon=True)
                self._thread.start()
        try:
            yield
        finally:
            with self._lock:
                self._calls.pop(key, None)

    def doing(self, what: str) -> bool:
        """Whether a watched call whose description starts with `what` is under way."""
        with self._lock:
            return any(c[3].startswith(what) for c in self._calls.values())

    def _run(self) -> None:
        while True:
            time.sleep(0.25)
            now = time.monotonic()
            with self._lock:
                late = [c for c in self._calls.values() if c[0] <= now]
            if late:
                _, limit, eps, what = late[0]
                lost(f"RPC server {', '.join(eps)} did not answer within {_seconds(limit)} s ({what}): it stopped, stalled or "
                     f"the network did; restart edgespec once it answers (`edgespec serve --rpc` reloads by itself; {TIMEOUT_ENV} "
                     "sets the limit; docs/rpc.md)")


def _seconds(x: float) -> str:
    return f"{x:.1f}".rstrip("0").rstrip(".")  # 2 (the timeout alone), 2.2 (a decode's allowance added), 145.3


WATCHDOG = Watchdog()
LOADING = "loading the model onto it"  # what context.Context's load is watched as


def transfer_seconds(nbytes: int, timeout_s: float) -> float:
    """The watchdog's limit for a call that moves `nbytes` to or from the servers: `timeout_s` plus a second per 5 MB."""
    return timeout_s + nbytes / 5e6


def load_seconds(path: str | os.PathLike[str], timeout_s: float) -> float:
    """The watchdog's limit for loading a model onto the servers: `timeout_s` plus a second per 5 MB uploaded."""
    try:
        size = os.path.getsize(path)
    except OSError:
        size = 0
    return transfer_seconds(size, timeout_s)


# ------------------------------------------------------------------------------------------- the libraries
_LIBS: dict[str, Any] = {}
_LOCK = threading.Lock()
_users: dict[str, int] = {}  # endpoint -> live models holding its devices (their connection is open: no probe)
_regs: dict[str, int] = {}  # endpoint -> its ggml_backend_reg_t (llama.cpp keeps them for the process's life)
_versions: dict[str, tuple[int, int, int]] = {}  # endpoint -> the protocol its last probe reported


def _open(name: str) -> Any:
    """The copy of lib`name` that llama.cpp's libraries loaded (the wheel may hold several files of one library,
    libggml-rpc.so and libggml-rpc.so.0: opened by another path, it would be a second copy with its own servers);
    None when it is not loaded (for libggml-rpc: this build has no RPC backend)."""
    noload = getattr(os, "RTLD_NOLOAD", 0)
    d = Path(C.__file__).parent / "lib"
    names = [f"lib{name}.so.0", f"lib{name}.0.dylib"] + [str(d / f) for f in (f"lib{name}.so", f"lib{name}.dylib")]
    for n in names if noload else ():
        try:
            return ctypes.CDLL(n, mode=noload)
        except OSError:
            continue
    if noload:
        return None
    for f in (f"{name}.dll", f"lib{name}.dll"):  # Windows: a DLL already loaded is found by its name
        if (d / f).exists():
            return ctypes.CDLL(str(d / f))
    return None


def _libs() -> dict[str, Any]:
    """libggml-rpc, libggml and libggml-base (already loaded by llama.cpp: the same handles), with the signatures
    used here; a BackendError when this build has no RPC backend."""
    if _LIBS:
        return _LIBS
    try:
        libs = {k: _open(k) for k in ("ggml-rpc", "ggml", "ggml-base")}
        if any(v is None for v in libs.values()):
            raise BackendError(_NO_RPC)
        rpc, ggml, base = libs["ggml-rpc"], libs["ggml"], libs["ggml-base"]
        vp, sz = ctypes.c_void_p, ctypes.c_size_t
        for lib, fn, args, res in (
            (rpc, "ggml_backend_rpc_add_server", [ctypes.c_char_p], vp),
            (rpc, "ggml_backend_rpc_start_server", [ctypes.c_char_p, ctypes.c_char_p, sz, sz, ctypes.POINTER(vp)], None),
            (ggml, "ggml_backend_dev_count", [], sz),
            (ggml, "ggml_backend_dev_get", [sz], vp),
            (base, "ggml_backend_dev_type", [vp], ctypes.c_int),
            (base, "ggml_backend_dev_name", [vp], ctypes.c_char_p),
            (base, "ggml_backend_dev_description", [vp], ctypes.c_char_p),
            (base, "ggml_backend_dev_memory", [vp, ctypes.POINTER(sz), ctypes.POINTER(sz)], None),
            (base, "ggml_backend_dev_backend_reg", [vp], vp),
            (base, "ggml_backend_reg_name", [vp], ctypes.c_char_p),
            (base, "ggml_backend_reg_dev_count", [vp], sz),
            (base, "ggml_backend_reg_dev_get", [vp, sz], vp),
            (base, "ggml_set_abort_callback", [_ABORT_CB], _ABORT_CB),
        ):
            f = getattr(lib, fn)
            f.argtypes, f.restype = args, res
    except (OSError, AttributeError) as e:
        raise BackendError(f"{_NO_RPC} ({e})") from None
    _LIBS.update(libs)
    return _LIBS


def available() -> bool:
    """Whether this llama.cpp build has the RPC backend."""
    try:
        _libs()
    except BackendError:
        return False
    return True


def local_devices() -> list[int]:
    """This machine's GPUs (integrated ones only where there is no discrete one), as llama.cpp's default list."""
    libs = _libs()
    ggml, base = libs["ggml"], libs["ggml-base"]
    gpus: list[int] = []
    igpus: list[int] = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        kind = base.ggml_backend_dev_type(dev)
        if base.ggml_backend_reg_name(base.ggml_backend_dev_backend_reg(dev)) == b"RPC":
            continue
        if kind == _GPU:
            gpus.append(dev)
        elif kind == _IGPU and not igpus:
            igpus.append(dev)
    return gpus or igpus


def local_gpu() -> bool:
    """Whether this machine has a GPU llama.cpp can offload to (llama_supports_gpu_offload also says yes for a
    build with the RPC backend alone)."""
    if not available():
        return bool(C.llama_supports_gpu_offload())
    return bool(local_devices())


def acquire(endpoints: Sequence[str], timeout_s: float = PROBE_TIMEOUT) -> list[int]:
    """Register the servers (each one probed first unless a live model of this process uses it) and return their
    devices in order; `release` when the model that uses them is freed. BackendError when one cannot be used."""
    libs = _libs()
    rpc, base = libs["ggml-rpc"], libs["ggml-base"]
    _install_abort_handler()
    devs: list[int] = []
    with _LOCK:
        for ep in endpoints:
            if not _users.get(ep):
                _versions[ep] = probe(ep, timeout_s)  # llama.cpp would abort the process on a server it cannot reach
            reg = _regs.get(ep)
            if reg is None:
                reg = rpc.ggml_backend_rpc_add_server(ep.encode())
                if not reg:
                    raise BackendError(f"RPC server {ep} reports no devices")
                _regs[ep] = reg
            devs += [base.ggml_backend_reg_dev_get(reg, i) for i in range(base.ggml_backend_reg_dev_count(reg))]
        for ep in endpoints:
            _users[ep] = _users.get(ep, 0) + 1
    return devs


def release(endpoints: Sequence[str]) -> None:
    with _LOCK:
        for ep in endpoints:
            _users[ep] = max(0, _users.get(ep, 0) - 1)


def model_devices(endpoints: Sequence[str], timeout_s: float = PROBE_TIMEOUT) -> tuple[Any, list[int]]:
    """For llama_model_params.devices: the servers' devices, then this machine's GPUs, as a NULL-terminated array
    (keep it alive until the model is loaded), and the list. The caller releases the endpoints."""
    devs = acquire(endpoints, timeout_s)
    try:
        devs += local_devices()
    except BaseException:
        release(endpoints)
        raise
    arr = (ctypes.c_void_p * (len(devs) + 1))(*devs, None)
    return arr, devs


def describe(endpoints: Sequence[str], timeout_s: float = PROBE_TIMEOUT) -> list[dict[str, Any]]:
    """What `edgespec info --rpc` shows: per server its protocol and devices (name, free and total memory)."""
    libs = _libs()
    base = libs["ggml-base"]
    out = []
    for ep in endpoints:
        devices = []
        devs = acquire([ep], timeout_s)
        try:
            for dev in devs:
                free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
                with WATCHDOG.watch([ep], "asked for its free memory", timeout_s):
                    base.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
                devices.append({"name": (base.ggml_backend_dev_name(dev) or b"").decode(), "free": free.value, "total": total.value})
        finally:
            release([ep])
        version = _versions.get(ep)
        out.append({"endpoint": ep, "protocol": ".".join(map(str, version)) if version else None, "devices": devices})
    return out


def start_server(host: str, port: int, threads: int) -> threading.Thread:
    """Start an RPC server on host:port with this machine's devices (its GPUs, else its CPU with `threads`
    threads), as llama.cpp's rpc-server does, in a daemon thread (it serves until the process ends); returned
    once it answers a probe. BackendError if it cannot listen there."""
    libs = _libs()
    ggml, base, rpc = libs["ggml"], libs["ggml-base"], libs["ggml-rpc"]
    devs = [d for i in range(ggml.ggml_backend_dev_count())
            if base.ggml_backend_dev_type(d := ggml.ggml_backend_dev_get(i)) in (_GPU, _IGPU)
            and base.ggml_backend_reg_name(base.ggml_backend_dev_backend_reg(d)) != b"RPC"]
    if not devs:
        devs = [d for i in range(ggml.ggml_backend_dev_count()) if base.ggml_backend_dev_type(d := ggml.ggml_backend_dev_get(i)) == 0][:1]
    if not devs:
        raise BackendError("no device to serve (llama.cpp found no CPU backend)")
    try:  # a port taken by another server (one that answers probes, even) is refused here, not mistaken for ours
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as e:
        raise BackendError(f"the RPC server cannot listen on {host}:{port}: {e.strerror or e}") from None
    arr = (ctypes.c_void_p * len(devs))(*devs)
    endpoint = f"{host}:{port}".encode()
    t = threading.Thread(target=rpc.ggml_backend_rpc_start_server, args=(endpoint, None, threads, len(devs), arr),
                         name="rpc-server", daemon=True)
    t.start()
    here = f"{'127.0.0.1' if host == '0.0.0.0' else host}:{port}"
    deadline = time.monotonic() + 30
    while True:
        if not t.is_alive():
            raise BackendError(f"the RPC server could not listen on {host}:{port} (is the port taken?)")
        try:
            probe(here, 2.0)
            return t
        except BackendError:
            if time.monotonic() > deadline:
                raise BackendError(f"the RPC server on {host}:{port} did not answer within 30 s") from None
            time.sleep(0.05)


def device_names(devs: Sequence[int]) -> list[str]:
    base = _libs()["ggml-base"]
    return [(base.ggml_backend_dev_name(d) or b"?").decode() + " " + (base.ggml_backend_dev_description(d) or b"").decode() for d in devs]


__all__ = ["probe", "available", "timeout", "lost", "on_lost", "LOST_GRACE", "EXIT_ABORTED", "LOADING",
           "WATCHDOG", "Watchdog", "load_seconds", "transfer_seconds", "TIMEOUT_ENV", "DEFAULT_TIMEOUT",
           "EXIT_RPC_LOST", "local_gpu", "local_devices", "acquire", "release", "model_devices", "describe", "start_server", "PROBE_TIMEOUT",
           "DEFAULT_PORT", "PROTO_MAJOR", "PROTO_MINOR"]
