"""Generations as jobs: the worker thread that owns the llama.cpp contexts, its FIFO queue, and the handle a caller
holds (`Generation`: iterate, `async for`, cancel, close, result). No llama.cpp here: the engine gives the worker
callables to run.

Threads: the worker runs one job at a time; everything a caller touches on a handle is guarded by the job's lock
and its `done` event, so handles may be used from any thread (and from an asyncio loop: iteration there waits
without blocking the loop).
"""

from __future__ import annotations

import asyncio
import collections
import math
import numbers
import threading
import time
import weakref
from dataclasses import dataclass
from typing import Any, Callable

from .errors import ConfigError, EngineClosedError, QueueFullError
from .stats import GenerationStats


@dataclass
class Chunk:
    """A piece of streamed text. `from_draft` is True when every token behind it was a draft token the target
    accepted (for --show-draft colouring)."""

    text: str
    tokens: list[int]
    from_draft: bool
    logprobs: list[Any] | None = None  # speculate.TokenLogprob per token, when the generation asked for them


@dataclass
class Result:
    text: str
    token_ids: list[int]
    stats: GenerationStats
    finish_reason: str  # "eos", "stop", "length", "context", "cancelled"

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason, "stats": self.stats.as_dict()}


# --------------------------------------------------------------------------------------------- jobs
class Job:
    """Something the worker runs with the contexts to itself. Holds no reference to a Generation handle."""

    def __init__(self, run: Callable[["Job"], Any], on_dropped: Callable[[], None] | None = None, *,
                 size: int | None = None, short: bool = False) -> None:
        """``on_dropped`` is called (on the worker) instead of ``run`` when the job is cancelled before it starts.
        size: the most tokens a generation job may generate (None: not a generation); short: it may run inside a
        generation with more than `size` tokens still to go (Worker.take_shorter)."""
        self._run = run
        self._on_dropped = on_dropped
        self.size = size
        self.short = short
        self.paused = 0.0  # seconds this job spent suspended while a shorter one ran (its clock leaves them out)
        self.cancel_event = threading.Event()
        self.done = threading.Event()
        self.started = False
        self.error: BaseException | None = None
        self._error_tb: Any = None  # the traceback as captured (re-raising the same object would keep extending it)
        self.worker_thread: threading.Thread | None = None  # the thread that will run it (set when submitted)
        self.value: Any = None
        self.logprob_carry: list[Any] = []  # logprobs of tokens whose text has not come out yet (engine._emit)
        self.enqueued = time.perf_counter()
        self.started_at = 0.0
        self.lock = threading.Condition()
        self.items: collections.deque[Chunk] = collections.deque()
        self.wakers: list[Callable[[], None]] = []

    def cancel(self) -> None:
        self.cancel_event.set()
        self._wake()

    def clock(self) -> float:
        """perf_counter without the time this job was suspended: the generation's timings and rates are its own."""
        return time.perf_counter() - self.paused

    def push(self, chunk: Chunk) -> None:
        with self.lock:
            self.items.append(chunk)
            self.lock.notify_all()
        self._wake()

    def run(self) -> None:
        self.started = True
        self.started_at = time.perf_counter()
        try:
            self.value = self._run(self)
        except BaseException as e:  # the caller gets it; the worker lives on
            self.error, self._error_tb = e, e.__traceback__
        finally:
            self.finish()

    def drop(self) -> None:
        """End a job cancelled before it started, without running it."""
        try:
            if self._on_dropped is not None:
                self._on_dropped()
        finally:
            self.finish()

    def raise_error(self) -> None:
        """Raise what the job raised (with its own traceback, however often it is asked), if anything."""
        if self.error is not None:
            raise self.error.with_traceback(self._error_tb)

    def finish(self) -> None:
        with self.lock:
            self.done.set()
            self.lock.notify_all()
        self._wake()

    def _wake(self) -> None:
        for w in list(self.wakers):
            try:
                w()
            except Exception:  # a waiter's event loop that is gone (RuntimeError): nobody is left to wake there
                pass


class Worker:
    """One thread, one FIFO queue of jobs. A cancelled queued job never starts. A short generation job (Job.short)
    does not wait behind a long one: the running generation offers the worker each cycle boundary
    (take_shorter), and a queued short job with fewer tokens to generate than it has left runs there, inside it
    (one level deep: a job running inside another is not interrupted; the first such job in queue order)."""

    def __init__(self, max_queue: int | None) -> None:
        self.max_queue = max_queue
        self._queue: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self.current: Job | None = None
        self.nested: Job | None = None  # a short job running inside `current` (take_shorter)
        self.thread = threading.Thread(target=self._loop, name="edgespec-engine", daemon=True)
        self.thread.start()

    @property
    def pending(self) -> int:
        with self._cond:
            return sum(1 for j in self._queue if not j.cancel_event.is_set())

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._closed:
                raise EngineClosedError("the engine is closed; load a new one")
            if threading.current_thread() is self.thread:
                raise ConfigError("a generation cannot be started from inside an engine callback")
            if self.max_queue is not None and sum(1 for j in self._queue if not j.cancel_event.is_set()) >= self.max_queue:
                raise QueueFullError(f"{self.max_queue} generations are already waiting for the engine")
            job.worker_thread = self.thread
            self._queue.append(job)
            self._cond.notify_all()

    def take_shorter(self, remaining: int) -> Job | None:
        """For the running generation at a cycle boundary, with up to `remaining` tokens still to go: the first
        queued short job that generates fewer, taken off the queue (run it with run_nested), or None."""
        with self._cond:
            if self.nested is not None or self._closed or threading.current_thread() is not self.thread:
                return None
            for job in self._queue:
                if job.short and job.size is not None and job.size < remaining and not job.cancel_event.is_set():
                    self._queue.remove(job)
                    self.nested = job
                    return job
        return None

    def put_back(self, job: Job) -> None:
        """A job taken by take_shorter that will not run inside the current one after all: first in the queue."""
        with self._cond:
            self.nested = None
            self._queue.appendleft(job)
            self._cond.notify_all()

    def run_nested(self, job: Job) -> None:
        """Run a job taken by take_shorter, here in the worker thread, inside the current one."""
        try:
            job.run()
        except Exception:  # as in _loop: one job's bookkeeping never ends the one it ran inside
            pass
        finally:
            with self._cond:
                self.nested = None
                self._cond.notify_all()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if not self._queue:
                    return  # closed and drained
                job = self._queue.popleft()
                self.current = job
            try:
                if job.cancel_event.is_set():
                    job.drop()  # its client left before it started
                else:
                    job.run()
            except Exception:  # never lose the worker (and with it every later job) to one job's bookkeeping
                pass
            finally:
                with self._cond:
                    self.current = None
                    self._cond.notify_all()

    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            for job in self._queue:
                job.cancel()
            for running in (self.current, self.nested):
                if running is not None:
                    running.cancel()
            self._cond.notify_all()
        if threading.current_thread() is not self.thread:
            self.thread.join()


def shutdown(worker: "Worker", models: list[Any], memory: Any = None, memory_path: str | None = None) -> None:
    """Stop the worker, save the suffix memory (where asked), then free the models (never while a job runs)."""
    worker.shutdown()
    if memory is not None and memory_path is not None:
        try:
            memory.save(memory_path)  # creates the folder
        except OSError:
            pass  # the memory is a cache: losing it costs speed, never correctness
    for m in models:
        m.close()


# --------------------------------------------------------------------------------------------- the handle
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

    def ready(self) -> list[Chunk]:
        """The chunks available now, without waiting (for callers that batch what they forward)."""
        with self._job.lock:
            out = list(self._job.items)
            self._job.items.clear()
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
                    return job.items.popleft()
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
                    if job.items:
                        return job.items.popleft()
                    ended = job.done.is_set()
                if ended:
                    job.raise_error()
                    raise StopAsyncIteration
                await event.wait()
        except asyncio.CancelledError:
            job.cancel()
            raise
        finally:
            job.wakers.remove(wake)


__all__ = ["Chunk", "Result", "Job", "Worker", "Generation", "shutdown"]
