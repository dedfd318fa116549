"""The handle a caller holds for a generation (`Generation`: iterate, `async for`, cancel, close, result) and what it
returns at the end (`Result`). Everything a caller touches on a handle is guarded by its job's lock and `done` event
(job.py), so handles may be used from any thread, and from an asyncio loop: iteration there waits without blocking
the loop. No llama.cpp here.
"""

from __future__ import annotations

import asyncio
import math
import numbers
import threading
import weakref
from dataclasses import dataclass
from typing import Any

from edgespec.errors import ConfigError
from edgespec.stats import GenerationStats

from .job import Chunk, Job


@dataclass
class Result:
    text: str
    token_ids: list[int]
    stats: GenerationStats
    finish_reason: str  # "eos", "stop", "length", "context", "cancelled"

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason, "stats": self.stats.as_dict()}


def check_timeout(timeout: Any) -> float | None:
    """A wait's timeout: None (no limit) or a finite number of seconds in [0, threading.TIMEOUT_MAX]; anything else
    (a string, NaN, infinity, 1e300, a negative number) is a ConfigError, as every other bad argument."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise ConfigError(f"timeout must be a number of seconds or None, got {type(timeout).__name__}")
    try:
        t = float(timeout)
    except OverflowError:  # an int past float range
        t = math.inf
    if not (0.0 <= t <= threading.TIMEOUT_MAX):  # NaN fails this too
        shown = repr(timeout) if len(repr(timeout)) <= 40 else repr(timeout)[:37] + "..."
        raise ConfigError(f"timeout must be None or in [0, {threading.TIMEOUT_MAX:g}] seconds, got {shown}")
    return t


class Generation:
    """A queued or running generation. Iterate it for Chunks (sync or `async for`); `.text`, `.token_ids` and
    `.stats` describe what was generated so far, `result()` waits for the end. `cancel()` works from any thread;
    `close()` cancels and waits until the engine has let go of it. Dropping the handle cancels it."""

    def __init__(self, job: Job, ids: list[int], stats: GenerationStats, texts: list[str]) -> None:
        self._job = job
        self._ids = ids
        self._texts = texts
        self.stats = stats
        self._finalizer = weakref.finalize(self, job.cancel)

    @property
    def prompt_tokens(self) -> list[int]:
        """The token ids the generation starts from (its prompt as the target decodes it)."""
        return list(self._job.prompt)

    @property
    def max_tokens(self) -> int:
        """The most tokens it generates (the request's max_tokens, or what the context left)."""
        return self._job.size or 0

    # -- control
    def cancel(self) -> None:
        """Stop generating (within one cycle, or one prefill chunk); a queued generation never starts."""
        self._job.cancel()

    def close(self) -> None:
        """Cancel and wait until the generation has ended (its tokens and stats are final then). From inside an
        engine callback it only cancels: the engine cannot wait for itself."""
        self._job.cancel()
        if threading.current_thread() is not self._job.worker_thread:
            self.wait()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the generation has ended; False if `timeout` passed first."""
        timeout = check_timeout(timeout)
        self._not_on_worker(timeout)
        return self._job.done.wait(timeout)

    def _not_on_worker(self, timeout: float | None) -> None:
        """Waiting without a timeout for a generation on the engine's own thread (in a callback) would wait forever."""
        if timeout is None and threading.current_thread() is self._job.worker_thread and not self._job.done.is_set():
            raise ConfigError("an engine callback cannot wait for a generation (the engine would wait for itself)")

    @property
    def done(self) -> bool:
        return self._job.done.is_set()

    def result(self, timeout: float | None = None) -> Result:
        """Wait for the end and return text, token ids, stats and finish reason (raises what the generation
        raised)."""
        timeout = check_timeout(timeout)
        self._not_on_worker(timeout)
        try:
            ended = self._job.done.wait(timeout)
        except BaseException:  # Ctrl-C while waiting: stop the work too
            if not self._job.done.is_set():
                self._job.cancel()
            raise
        if not ended:  # it goes on: the caller may wait again, or cancel
            raise TimeoutError("the generation did not finish in time")
        self._job.raise_error()
        return Result(self.text, list(self._ids), self.stats, self.finish_reason)

    # -- what was generated
    @property
    def text(self) -> str:
        with self._job.lock:
            return "".join(self._texts)

    @property
    def token_ids(self) -> list[int]:
        with self._job.lock:
            return list(self._ids)

    @property
    def finish_reason(self) -> str:
        """"eos", "stop", "length", "context", "cancelled", "error" (it raised), or "" while it runs."""
        done = self._job.done.is_set()  # first: a job that ends between the two reads has its stop_reason set
        if not self.stats.stop_reason and done:
            return "error" if self._job.error is not None else "cancelled"  # "cancelled": it never started
        return self.stats.stop_reason

    @property
    def started(self) -> bool:
        """True once the engine began working on it (a generation cancelled while queued never starts)."""
        return self._job.started

    def limit_backlog(self, chunks: int | None) -> None:
        """Backpressure: pause the generation (at a cycle boundary) while `chunks` chunks or more wait unread; a
        paused one may be set aside to free its slot for a queued one (generation.Worker). None: no limit (the
        default: a caller that only waits for result() never reads the chunks)."""
        if chunks is not None and chunks < 1:
            raise ConfigError(f"the backlog must be at least 1 chunk, got {chunks}")
        self._job.backlog = chunks
        self._job.kick_worker()

    def _taken(self, had: int) -> None:
        """A reader took chunks from `had` waiting: wake the worker if that may end a pause."""
        b = self._job.backlog
        if b is not None and had >= b // 2:
            self._job.kick_worker()

    def ready(self) -> list[Chunk]:
        """The chunks available now, without waiting (for callers that batch what they forward)."""
        with self._job.lock:
            out = list(self._job.items)
            self._job.items.clear()
        self._taken(len(out))
        return out

    # -- iteration
    def __iter__(self) -> "Generation":
        return self

    def __next__(self) -> Chunk:
        job = self._job
        if not job.items:  # about to block (only the worker pushes, so on the worker nothing arrives meanwhile)
            self._not_on_worker(None)
        try:
            with job.lock:
                while not job.items and not job.done.is_set():
                    job.lock.wait()
                if job.items:
                    had = len(job.items)
                    chunk = job.items.popleft()
                else:
                    chunk = None
            if chunk is not None:
                self._taken(had)
                return chunk
        except BaseException:  # Ctrl-C while waiting: stop the work too
            job.cancel()
            raise
        job.raise_error()
        raise StopIteration

    def __aiter__(self) -> "Generation":
        return self

    async def __anext__(self) -> Chunk:
        job = self._job
        loop = asyncio.get_running_loop()
        event = asyncio.Event()

        def wake() -> None:  # on a loop closed with this iteration still parked in it, this raises: Job._wake drops it
            loop.call_soon_threadsafe(event.set)

        job.wakers.append(wake)
        try:
            while True:
                event.clear()
                with job.lock:
                    had = len(job.items)
                    chunk = job.items.popleft() if had else None
                    ended = job.done.is_set()
                if chunk is not None:
                    self._taken(had)
                    return chunk
                if ended:
                    job.raise_error()
                    raise StopAsyncIteration
                await event.wait()
        except asyncio.CancelledError:
            job.cancel()
            raise
        finally:
            job.wakers.remove(wake)


__all__ = ["Generation", "Result", "check_timeout"]
