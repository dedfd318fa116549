"""A job: what a caller and the engine's worker (generation.Worker) share. A `Job` is something the worker runs (a
plain callable, or a generation advanced cycle by cycle in a slot); it carries the job's cancel and done events, its
error, and the `Chunk`s a generation pushes for its reader, all guarded by the job's lock, so that the handle
(handle.Generation) may be used from any thread. No llama.cpp here.
"""

from __future__ import annotations

import collections
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Sequence


@dataclass
class Chunk:
    """A piece of streamed text. `from_draft` is True when every token behind it was a draft token the target
    accepted (for --show-draft colouring). `source`: where its tokens came from, the drafter's source name
    (steps.Step.source: "model", "ngram", "suffix") for accepted drafts, "target" for the target's own token.
    `pieces`: the text each token added, in order (their concatenation is `text`; a token that ends inside a
    character adds "" and the next one the whole character)."""

    text: str
    tokens: list[int]
    from_draft: bool
    logprobs: list[Any] | None = None  # speculate.TokenLogprob per token, when the generation asked for them
    source: str = "target"
    pieces: list[str] | None = None


def _never() -> bool:
    return False


class Job:
    """Something the worker runs with the contexts to itself. Holds no reference to a Generation handle."""

    def __init__(self, run: Callable[["Job"], Any] | None = None, on_dropped: Callable[[], None] | None = None, *,
                 steps: Callable[["Job", int], Generator[Any, Any, None]] | None = None,
                 size: int | None = None, short: bool = False) -> None:
        """A plain job runs ``run(job)`` alone; a generation job gives ``steps(job, slot)``, the generator the worker
        advances cycle by cycle in a slot (Worker). ``on_dropped`` is called (on the worker) instead when the job is
        cancelled before it starts. size: the most tokens a generation may generate; short: it is admitted first and
        may displace a longer one (Worker)."""
        if (run is None) == (steps is None):
            raise ValueError("a job has either run or steps")
        self._run = run
        self.steps = steps
        self._on_dropped = on_dropped
        self.size = size
        self.short = short
        self.prompt: Any = ()  # a generation's prompt tokens (the worker's slot choice: the longest cached prefix)
        self.progress = 0  # tokens generated so far (the engine counts them; the worker compares what is left)
        self.slot = -1  # the slot a generation runs in
        self.parked: Any = None  # a displaced generation's cache, set aside (Worker.park)
        self.paused = 0.0  # seconds it stood aside while other generations ran (its clock leaves them out)
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
        # the most chunks that may wait unread before the worker pauses the generation (None: no limit; see held())
        self.backlog: int | None = None
        self.held_since = 0.0  # when the worker first skipped it for its backlog (0: it is not held)
        self.kick: Callable[[], None] | None = None  # wakes the worker (set by Worker.submit)
        # True while it is the only generation the worker could run and nothing waits for the worker (set by
        # Worker.submit): it may run its own decodes and go past its cycle boundaries without handing back (runner.py)
        self.alone: Callable[[], bool] = _never

    def cancel(self) -> None:
        self.cancel_event.set()
        self._wake()
        self.kick_worker()

    def held(self) -> bool:
        """True while its reader is behind: `backlog` chunks or more wait unread (a cancelled job is never held: it
        must run on to its end)."""
        return self.backlog is not None and len(self.items) >= self.backlog and not self.cancel_event.is_set()

    def kick_worker(self) -> None:
        """Wake the worker (Worker.submit set `kick`): its reader took chunks, or it was cancelled."""
        if self.kick is not None:
            try:
                self.kick()
            except Exception:
                pass

    def clock(self) -> float:
        """perf_counter without the time this job was suspended: the generation's timings and rates are its own."""
        return time.perf_counter() - self.paused

    def push(
        self, chunk: Chunk | None, *, ids: list[int] | None = None, used: Sequence[int] = (), texts: list[str] | None = None
    ) -> None:
        """Hand the reader `chunk` (None: tokens without text yet), under the same lock adding its tokens `used` to the
        generation's `ids` (and its progress) and its text to `texts`."""
        with self.lock:
            if ids is not None:
                ids.extend(used)
                self.progress = len(ids)
            if chunk is None:
                return
            if texts is not None:
                texts.append(chunk.text)
            self.items.append(chunk)
            self.lock.notify_all()
        self._wake()

    def run(self) -> None:
        self.started = True
        self.started_at = time.perf_counter()
        try:
            assert self._run is not None
            self.value = self._run(self)
        except BaseException as e:  # the caller gets it; the worker lives on
            self.set_error(e, e.__traceback__)
        finally:
            self.finish()

    def drop(self) -> None:
        """End a job cancelled before it started, without running it."""
        try:
            if self._on_dropped is not None:
                self._on_dropped()
        finally:
            self.finish()

    def set_error(self, error: BaseException, traceback: Any = None) -> None:
        """Record what ended the job, with its traceback as captured (None: none to show)."""
        self.error, self._error_tb = error, traceback

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


__all__ = ["Chunk", "Job"]
