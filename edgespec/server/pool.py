"""Serving several models by name (docs/server.md, "Serving several models"): a model source says which models exist
and how to load each (`ModelSource`: `entries()`, `plan(name)`), and the `ModelPool` holds the engines loaded from
it: a model loads with its draft on the first request that names it (in a worker thread; concurrent requests for it
wait for that one load), stays while it is used, and is unloaded when it has been idle for its keep-alive (Ollama's
`keep_alive`: "5m", "30s", seconds; 0 = right after the request, negative = never), or, least recently used first,
when the models loaded would pass the pool's count (`max_loaded`) or the memory free for them (an estimate from the
files' sizes). An engine with a request in flight is never unloaded.

The server's pinned model (`serve --model`/`--target`, or the default pair) is not in the pool: requests that name
it, or no model, go to it as they always have (core.ServerState). Any object with `entries()` and `plan(name)` is a
source (the catalog of edgespec.models plugs in through a small adapter); `FolderSource` serves GGUF files by their
names (server/by_name.py). `bind` hands a request a `ModelState`: the server's state seen from that model, which every route and
response writer already knows how to use.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Protocol

import anyio

from edgespec.config import ModelSpec
from edgespec import errors
from edgespec.errors import EdgespecError
from .api_errors import APIError
from .core import ServerState, model_stem

if TYPE_CHECKING:  # importing the server loads no llama.cpp
    from edgespec.runtime.engine import Engine

log = logging.getLogger("edgespec.server")

DEFAULT_KEEP_ALIVE = 300.0  # seconds an idle model stays loaded (Ollama's default, 5 minutes)
DEFAULT_MAX_LOADED = 3  # models the pool holds at once (Ollama's OLLAMA_MAX_LOADED_MODELS on a CPU)
MEMORY_FACTOR = 1.2  # a model's memory: its files' size and a share for its caches (an estimate)
NEVER = "2318-08-08T00:00:00Z"  # Ollama's expires_at for a model kept loaded (keep_alive < 0)


# --------------------------------------------------------------------------------------------- the source's terms
@dataclass(frozen=True)
class ModelEntry:
    """One model a source offers: what /v1/models, /api/tags and /api/show say of it."""

    name: str  # the canonical name requests use
    aliases: tuple[str, ...] = ()  # other names that reach it (e.g. "qwen:latest", the file's stem)
    size: int = 0  # bytes on disk (its files)
    family: str = ""  # GGUF general.architecture
    parameter_size: str = ""  # "1.5B"
    quantization: str = ""  # "Q4_K_M"
    modified: float = 0.0  # the file's mtime (epoch seconds)
    digest: str = ""  # an id of its contents where known (Ollama's blob digest)
    context_length: int | None = None
    draft: str | None = None  # the name of its draft, where the source paired one


@dataclass(frozen=True)
class LoadPlan:
    """How to load one model: its canonical name, the target and the draft (None: no draft model)."""

    name: str
    target: ModelSpec
    draft: ModelSpec | None = None


class UnknownModelError(errors.UnknownModelError):
    """A name no model in the source answers to; close_matches: names that look like it, the closest first."""

    def __init__(self, name: str, close_matches: Iterable[str] = ()) -> None:
        matches = list(close_matches)
        hint = f"; did you mean {', '.join(repr(m) for m in matches)}?" if matches else ""
        super().__init__(f"model {name!r} not found{hint}", matches)
        self.name = name


class ModelSource(Protocol):
    def entries(self) -> list[ModelEntry]: ...

    def plan(self, name: str) -> LoadPlan: ...  # UnknownModelError (or any error with close_matches) for an unknown name


def close_matches(name: str, names: Iterable[str], n: int = 3) -> list[str]:
    """The names most like `name` (those containing it first), at most n."""
    names = list(dict.fromkeys(names))
    low = name.lower()
    within = [m for m in names if low and (low in m.lower() or m.lower().split(":")[0] in low)]
    near = difflib.get_close_matches(name, names, n=n, cutoff=0.5)
    return list(dict.fromkeys(within + near))[:n]


def param_size(n: int) -> str:
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


# --------------------------------------------------------------------------------------------- keep_alive
_DURATION = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
FOREVER = 1e9  # seconds (~31 years): a longer keep_alive keeps the model loaded for ever
FAILED_TTL = 30.0  # seconds a failed load is answered from memory (unless its file changes or a model unloads)
_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_keep_alive(value: Any, param: str = "keep_alive") -> float | None:
    """Seconds a model stays loaded after a request (None: for ever), from Ollama's keep_alive: a number of seconds
    or a duration ("5m", "1h30m", "30s", "-1m"); negative = for ever. APIError 400 for anything else."""
    if isinstance(value, bool) or value is None:
        raise APIError(400, f"{param} must be a duration such as \"5m\" or a number of seconds", param=param)
    if isinstance(value, (int, float)):
        try:
            seconds = float(value)
        except OverflowError:  # an integer too large for a float
            seconds = float("inf") if value > 0 else -1.0
    elif isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        text = text.lstrip("+-")
        if re.fullmatch(r"\d+(\.\d*)?", text):
            seconds = sign * float(text)
        elif text and _DURATION.sub("", text) == "":
            seconds = sign * sum(float(n) * _UNITS[u] for n, u in _DURATION.findall(text))
        else:
            raise APIError(400, f"{param}: {value!r} is not a duration (use e.g. \"5m\", \"30s\", \"1h\" or seconds)", param=param)
    else:
        raise APIError(400, f"{param} must be a duration such as \"5m\" or a number of seconds", param=param)
    if seconds != seconds:
        raise APIError(400, f"{param} must be a duration", param=param)
    return None if seconds < 0 or seconds > FOREVER else seconds  # past FOREVER (and inf): as long as the server runs


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat().replace("+00:00", "Z")


# --------------------------------------------------------------------------------------------- the pool
@dataclass(eq=False)
class Held:
    """One model the pool holds: its engine, and when it may go."""

    name: str
    engine: Engine
    need: int  # estimated bytes (MEMORY_FACTOR x its files)
    loaded_at: float  # epoch seconds
    keep_alive: float | None  # seconds idle before it unloads (None: never)
    draft: str | None = None  # its draft's name (the file's stem), None without a draft model
    leases: int = 0  # requests using it now
    idle_since: float = field(default_factory=time.monotonic)  # when the last request ended

    def busy(self) -> bool:
        if self.leases > 0:
            return True
        try:
            slots = self.engine.slot_state()
        except Exception:  # noqa: BLE001 - a closed engine has no work
            return False
        return bool(slots["busy"] or slots["queued"])

    def expires(self) -> float | None:
        """Epoch seconds when it unloads if no request comes (None: never); a model in use counts from now."""
        if self.keep_alive is None:
            return None
        since = time.monotonic() if self.leases > 0 else self.idle_since
        return time.time() + (since + self.keep_alive - time.monotonic())


class Lease:
    """A request's use of a held model; release() when its answer has been written (later calls do nothing). A lease
    dropped without release() is released when it is collected (a request cancelled while its model loaded)."""

    def __init__(self, pool: ModelPool, held: Held) -> None:
        self.held = held
        self._done = weakref.finalize(self, pool.release, held)

    def release(self) -> None:
        self._done()

    @property
    def done(self) -> bool:
        return not self._done.alive


class _Loading:
    def __init__(self) -> None:
        self.event = anyio.Event()
        self.error: APIError | None = None


def load_failed(name: str, e: BaseException) -> APIError:
    why = str(e) if isinstance(e, EdgespecError) else f"{type(e).__name__}: {e}"
    return APIError(400, f"the model {name!r} failed to load: {why}", param="model", code="model_load_failed")


def _stamp(plan: LoadPlan) -> tuple[Any, ...]:
    """The files' identity: a load that failed is not tried again until one of them changes."""
    out: list[Any] = []
    for spec in (plan.target, plan.draft):
        if spec is not None:
            try:
                st = os.stat(spec.path)
                out.append((spec.path, st.st_size, st.st_mtime_ns))
            except OSError:
                out.append((spec.path, None))
    return tuple(out)


def estimate(plan: LoadPlan) -> int:
    """The memory a plan's engine takes, estimated from its files' sizes."""
    total = 0
    for spec in (plan.target, plan.draft):
        if spec is not None:
            try:
                total += os.path.getsize(spec.path)
            except OSError:
                pass
    return int(total * MEMORY_FACTOR)


class ModelPool:
    """The engines loaded from `source`, by name (see the module's docstring). loader(plan) builds an engine (default:
    Engine.load(plan.target, plan.draft, **engine_kw)); keep_alive: the default seconds an idle model stays (None: for
    ever); max_loaded: models held at once (at least 1); memory_budget: bytes the pool's models may take (None: the
    memory available now plus what the pool already holds); on_event(line): told each load, failure and unload (the
    CLI prints them). Thread-safe; bind/acquire run on the event loop."""

    def __init__(self, source: ModelSource, *, loader: Callable[[LoadPlan], Engine] | None = None,
                 keep_alive: float | None = DEFAULT_KEEP_ALIVE, max_loaded: int = DEFAULT_MAX_LOADED,
                 memory_budget: int | None = None, engine_kw: Mapping[str, Any] | None = None,
                 on_event: Callable[[str], None] | None = None) -> None:
        if max_loaded < 1:
            raise ValueError("max_loaded must be at least 1")
        self.source, self.keep_alive, self.max_loaded, self.memory_budget = source, keep_alive, max_loaded, memory_budget
        self.engine_kw = dict(engine_kw or {})
        self.on_event = on_event
        self.loader = loader or self._engine_load
        self._held: OrderedDict[str, Held] = OrderedDict()  # least recently used first
        self._loading: dict[str, _Loading] = {}
        self._failed: dict[str, tuple[tuple[Any, ...], APIError, float]] = {}  # name -> (file stamp, error, when)
        self._reserved = 0  # loads under way, counted against max_loaded
        self._lock = threading.RLock()  # reentrant: a lease dropped unreleased is released by the collector, on any thread, maybe inside a section of this lock
        self._wake = threading.Event()
        self._reaper: threading.Thread | None = None
        self.closed = False
        self.unloaded: list[str] = []  # names unloaded, in order (for tests and logs)

    def _engine_load(self, plan: LoadPlan) -> Engine:
        from edgespec.runtime.engine import Engine

        return Engine.load(plan.target, plan.draft, **self.engine_kw)

    # -- what is there
    def entries(self) -> list[ModelEntry]:
        return list(self.source.entries())

    def plan(self, name: str) -> LoadPlan:
        """The source's plan for `name`; APIError 404 (model_not_found, with the close matches) for an unknown name."""
        try:
            return self.source.plan(name)
        except Exception as e:
            matches = getattr(e, "close_matches", None)
            if matches is None:
                raise load_failed(name, e) from None
            hint = f"; did you mean {', '.join(repr(m) for m in matches)}?" if matches else ""
            raise APIError(404, f"model {name!r} not found{hint}", param="model", code="model_not_found",
                           extra={"close_matches": list(matches)}) from None

    def loaded(self) -> list[Held]:
        with self._lock:
            return list(self._held.values())

    def get(self, name: str) -> Held | None:
        with self._lock:
            return self._held.get(name)

    # -- taking and giving back
    async def acquire(self, plan: LoadPlan, keep_alive: float | None) -> Lease:
        """A lease on the model `plan` names, loaded first if it is not (one load however many requests wait for it)."""
        while True:
            with self._lock:
                if self.closed:
                    raise APIError(503, "the server is shutting down", code="shutting_down")
                held = self._held.get(plan.name)
                if held is not None and (held.engine.closed or getattr(held.engine, "lost", None)):
                    del self._held[plan.name]
                    held = None
                if held is not None:
                    held.leases += 1
                    held.keep_alive = keep_alive
                    self._held.move_to_end(plan.name)
                    return Lease(self, held)
                loading = self._loading.get(plan.name)
                mine = loading is None
                if loading is None:
                    failed = self._failed.get(plan.name)
                    if failed is not None and failed[0] == _stamp(plan) and time.monotonic() - failed[2] < FAILED_TTL:
                        raise failed[1]
                    loading = self._loading[plan.name] = _Loading()
            if not mine:
                await loading.event.wait()
                if loading.error is not None:
                    raise loading.error
                continue
            try:
                with anyio.CancelScope(shield=True):  # the load ends and is held, whoever has gone: the others wait for it
                    new = await anyio.to_thread.run_sync(self._load, plan, keep_alive)
            except APIError as e:
                loading.error = e
                raise
            finally:
                with self._lock:
                    self._loading.pop(plan.name, None)
                loading.event.set()
            return Lease(self, new)

    def _load(self, plan: LoadPlan, keep_alive: float | None) -> Held:
        """In a worker thread: make room, load, hold (with one lease, the caller's)."""
        need = estimate(plan)
        self._make_room(plan.name, need)
        t0 = time.monotonic()
        try:
            engine = self.loader(plan)
        except BaseException as e:  # noqa: BLE001 - the request's error; the server goes on
            err = load_failed(plan.name, e)
            self._event(err.message)
            with self._lock:
                self._reserved -= 1
                self._failed[plan.name] = (_stamp(plan), err, time.monotonic())
            raise err from None
        held = Held(plan.name, engine, need, time.time(), keep_alive, draft=model_stem(plan.draft.path) if plan.draft else None, leases=1)
        with self._lock:
            self._reserved -= 1
            self._failed.pop(plan.name, None)
            closed = self.closed
            if not closed:
                self._held[plan.name] = held
        if closed:
            engine.close()
            raise APIError(503, "the server is shutting down", code="shutting_down")
        self._event(f"loaded {plan.name}" + (f" + draft {held.draft}" if held.draft else " (no draft model)")
                    + f" in {time.monotonic() - t0:.1f} s")
        self._start_reaper()
        return held

    def _make_room(self, name: str, need: int) -> None:
        """Unload idle models, least recently used first, until one more fits the count and the memory; 503 when the
        count is full of models in use. Reserves the new model's place."""
        while True:
            with self._lock:
                idle = [h for h in self._held.values() if not h.busy()]
                full = len(self._held) + self._reserved >= self.max_loaded
                short = self._short(need)
                if not idle or not (full or short):
                    if full:
                        raise APIError(503, f"the {self.max_loaded} model(s) the server may hold are all in use; retry later",
                                       param="model", code="models_busy", headers={"Retry-After": "1"})
                    self._reserved += 1  # memory short with nothing idle: the load says whether it fits
                    return
                victim = idle[0]
                del self._held[victim.name]
            self._unload(victim, "to make room for " + name)

    def _short(self, need: int) -> bool:
        held = sum(h.need for h in self._held.values())
        budget = self.memory_budget
        if budget is None:
            from edgespec.llama.context import available_memory

            free = available_memory()
            if free is None:
                return False
            budget = free + held
        return held + need > budget

    def release(self, held: Held) -> None:
        with self._lock:
            held.leases -= 1
            if held.leases <= 0:
                held.leases = 0
                held.idle_since = time.monotonic()
        self._wake.set()

    def unload(self, name: str) -> bool:
        """Unload `name` now if it is idle, else as soon as its requests end (keep_alive 0); whether it was held."""
        with self._lock:
            held = self._held.get(name)
            if held is None:
                return False
            held.keep_alive = 0.0
            if held.busy():
                return True
            del self._held[name]
        self._unload(held, "on request")
        return True

    def _unload(self, held: Held, why: str) -> None:
        self.unloaded.append(held.name)
        self._failed.clear()  # memory freed: a model that failed for want of it may load now
        held.engine.close()
        self._event(f"unloaded {held.name} ({why})")

    def _event(self, line: str) -> None:
        log.info("%s", line)
        if self.on_event is not None:
            try:
                self.on_event(line)
            except Exception:  # noqa: BLE001 - a report that fails changes nothing
                log.exception("on_event failed")

    # -- expiry
    def _start_reaper(self) -> None:
        with self._lock:
            if self._reaper is not None or self.closed:
                return
            self._reaper = threading.Thread(target=self._reap_loop, name="edgespec-pool", daemon=True)
        self._reaper.start()

    def _reap_loop(self) -> None:
        while not self.closed:
            wait = self.reap()
            self._wake.wait(wait)
            self._wake.clear()

    def reap(self) -> float:
        """Unload the models whose keep-alive has run out; the seconds until the next one may (at most 5)."""
        now = time.monotonic()
        gone, wait = [], 5.0
        with self._lock:
            for h in list(self._held.values()):
                if h.keep_alive is None or h.leases > 0:
                    continue
                left = h.idle_since + h.keep_alive - now
                if left > 0:
                    wait = min(wait, left)
                elif h.busy():
                    wait = min(wait, 0.05)  # its last generation is still finishing
                else:
                    del self._held[h.name]
                    gone.append(h)
        for h in gone:
            self._unload(h, "idle")
        return max(wait, 0.01)

    def close(self) -> None:
        with self._lock:
            self.closed = True
            held, self._held = list(self._held.values()), OrderedDict()
        self._wake.set()
        for h in held:
            h.engine.close()

    async def bind(self, state: ServerState, name: Any, keep_alive: Any = None) -> ServerState:
        """core.read_bound's: see `bind`."""
        return await bind(self, state, name, keep_alive)


# --------------------------------------------------------------------------------------------- a request's view
class ModelState(ServerState):
    """The server's state as a request for one pooled model sees it: the same settings, metrics, records, clients and
    stored responses (shared, not copied), the model's engine, and its name as the model id. Made by `bind`; its
    lease on the model is given back when the request's answer has been written (core.generate) or when it goes."""

    def __init__(self, root: ServerState, lease: Lease) -> None:  # noqa: D107 - no dataclass __init__: a view
        self.__dict__.update(root.__dict__)
        self.root, self.lease, self.held = root, lease, lease.held
        self.engine = lease.held.engine
        self.factory = None
        self.load_error = None
        self.loaded_at = int(lease.held.loaded_at)  # the lease goes with this view when nothing released it before

    @property  # type: ignore[override]
    def closing(self) -> bool:
        return self.root.closing

    @closing.setter
    def closing(self, value: bool) -> None:
        self.root.closing = value

    @property
    def model_id(self) -> str:
        return self.held.name


def pinned_names(state: ServerState) -> set[str]:
    """The names that reach the pinned model: its id (alias or file stem), its Ollama name and its file's stem."""
    names = set()
    if state.settings.model_alias:
        names.add(state.settings.model_alias)
    if state.engine is not None:
        stem = model_stem(state.engine.target.spec.path)
        names.update({stem, state.model_id})
    for n in list(names):
        if ":" not in n:
            names.add(n + ":latest")
    return names


def is_pinned(state: ServerState, name: Any) -> bool:
    """Whether a request naming `name` goes to the pinned model: no name, or one of its names (with no pool: any)."""
    if state.pool is None:
        return True
    if not state.pinned:
        return False
    return not isinstance(name, str) or not name or name in pinned_names(state)


def looks_local(name: str) -> bool:
    """Whether an unknown name is written as a local model's (Ollama's `name:tag`, `org/repo/file`, `hf:...`, a .gguf
    file): such a name is a 404 with the close matches even beside a pinned model; any other reaches the pinned one."""
    return ":" in name or "/" in name or name.lower().endswith(".gguf")


async def bind(pool: ModelPool, state: ServerState, name: Any, keep_alive: Any = None) -> ServerState:
    """The state for the model a request names: `state` itself for the pinned model, else a ModelState over the
    pooled model (loaded first if it is not); 404 for an unknown name, 400 with no name and no pinned model."""
    if is_pinned(state, name):
        state.require_engine()
        return state
    if not isinstance(name, str) or not name:
        entries = await anyio.to_thread.run_sync(pool.entries)
        names = ", ".join(repr(e.name) for e in entries[:5])
        raise APIError(400, f"model is required: name one of the models served ({names}{', ...' if len(entries) > 5 else ''})",
                       param="model", code="model_required")
    if state.closing:
        raise APIError(503, "the server is shutting down", code="shutting_down")
    ka = pool.keep_alive if keep_alive is None else parse_keep_alive(keep_alive)
    try:
        plan = await anyio.to_thread.run_sync(pool.plan, name)  # a source may read files
    except APIError as e:
        if e.code == "model_not_found" and state.pinned and not looks_local(name):
            state.require_engine()  # "gpt-4o", "local": what OpenAI clients send reaches the pinned model, as without a pool
            return state
        if e.code == "model_not_found" and state.engine is None and state.factory is not None:
            state.require_engine()  # perhaps the pinned model's name, not known until it has loaded: 503 while it loads
        raise
    if state.engine is not None and os.path.realpath(plan.target.path) == os.path.realpath(state.engine.target.spec.path):
        state.require_engine()  # the pinned model under another of its names
        return state
    return ModelState(state, await pool.acquire(plan, ka))
