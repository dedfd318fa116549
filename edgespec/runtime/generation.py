"""The engine's worker: the one thread that owns the llama.cpp contexts, its slots, its FIFO queue of jobs (job.py),
and the rounds in which it advances the active generations together. No llama.cpp here: the engine gives the worker
callables to run.

Threads: the worker runs a plain job alone, or up to `parallel` generations together, each bound to a slot and given
a turn per round, the round's decodes run at once (Worker); what callers share with it (the queue, what is running)
is under its lock. A caller holds a generation's handle (handle.Generation), usable from any thread.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Generator

from edgespec.errors import ConfigError, EngineClosedError, QueueFullError

from .job import Job


class _Task:
    """A generation the worker is running: its job, its steps (a generator that yields a decode request, or None at a
    cycle boundary) and its slot."""

    __slots__ = ("job", "steps", "slot", "request", "out_at", "seq")

    def __init__(self, job: Job, steps: Generator[Any, Any, None], slot: int, seq: int) -> None:
        self.job, self.steps, self.slot, self.seq = job, steps, slot, seq
        self.request: Any = None  # the decode it waits for, between a yield and the worker's answer
        self.out_at = 0.0  # when it last yielded (the time until it runs again is not its own: Job.paused)


class Worker:
    """One thread that owns the llama.cpp contexts, `parallel` slots and a queue of jobs.

    A generation job (Job.steps) is bound to a free slot for its life and advanced cycle by cycle together with the
    others: every round gives each active generation one turn (a short one, Job.short, more turns, SHORT_TURNS, while longer ones
    run); the decodes the turns ask for are handed to `execute` together (the engine verifies them in one llama_decode
    where that pays) and each result is sent back to its generation. Queued short jobs are admitted first; when every
    slot is taken, a short job displaces the running long generation with the most tokens to go: `park(slot)` sets its
    cache aside in host memory, and `unpark(slot, saved)` puts it back once the short one has ended. A plain job
    (Job.run: the engine's submit) runs alone, when no generation is active; generations queued behind it wait.
    A cancelled queued job never starts.

    Backpressure: a generation whose reader is behind (Job.held: `Job.backlog` chunks wait unread) is paused at a
    cycle boundary: it keeps its slot but gets no turns until its reader takes a chunk. When it has been held for
    HOLD_GRACE seconds and a queued generation finds no free slot, it is set aside as a displaced one is
    (`park(slot)`) and the queued one takes its slot; it comes back to that slot (`unpark`) once its reader has taken
    half its backlog and the slot is free again (a cancelled one just ends). Everything here runs in the worker
    thread, so the generations share the engine's state without locks; only the queue is shared with callers."""

    SHORT_TURNS = 4  # turns per round of a short generation while a long one runs beside it (a short one is <= 64 tokens)
    HOLD_GRACE = 0.5  # seconds a held generation keeps its slot before a queued one may take it (it is set aside)
    IDLE_WAIT = 0.25  # the longest the worker sleeps while every generation is held (a reader's take wakes it at once)

    def __init__(
        self,
        max_queue: int | None,
        *,
        parallel: int = 1,
        execute: Callable[[list[Any]], list[Any]] | None = None,
        choose_slot: Callable[[Job, list[int]], int] | None = None,
        park: Callable[[int], Any] | None = None,
        unpark: Callable[[int, Any], None] | None = None,
    ) -> None:
        self.max_queue = max_queue
        self.parallel = parallel
        self._execute = execute or (lambda reqs: [_run_request(r) for r in reqs])
        self._choose_slot = choose_slot or (lambda job, free: free[0])
        self._park, self._unpark = park, unpark
        self._queue: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self._active: list[_Task] = []
        self._parked: dict[int, _Task] = {}  # slot -> the long generation a short one displaced there
        self._stalled: list[_Task] = []  # held generations set aside to free their slot (each returns to its own slot)
        self._kicked = False  # something changed that the worker, idle while every generation is held, must look at
        self._seq = 0
        self.current: Job | None = None  # the plain job running (Job.run)
        self.thread = threading.Thread(target=self._loop, name="edgespec-engine", daemon=True)
        self.thread.start()

    # -------------------------------------------------------------------------------- what callers see
    @property
    def pending(self) -> int:
        """Jobs waiting for a slot (generations set aside included: displaced ones, and held ones whose slot was
        given to another)."""
        with self._cond:
            return sum(1 for j in self._queue if not j.cancel_event.is_set()) + len(self._parked) + len(self._stalled)

    @property
    def busy(self) -> int:
        """Slots generating now."""
        with self._cond:
            return len(self._active)

    def running(self) -> list[Job]:
        """The jobs running now (a plain job or the active generations)."""
        with self._cond:
            return [self.current] if self.current is not None else [t.job for t in self._active]

    def submit(self, job: Job) -> None:
        with self._cond:
            if self._closed:
                raise EngineClosedError("the engine is closed; load a new one")
            if threading.current_thread() is self.thread:
                raise ConfigError("a generation cannot be started from inside an engine callback")
            if self.max_queue is not None and self._waiting() >= self.max_queue:
                raise QueueFullError(f"{self.max_queue} generations are already waiting for the engine")
            job.worker_thread = self.thread
            job.kick = self._kick
            job.alone = self._alone
            self._queue.append(job)
            self._kicked = True
            self._cond.notify_all()

    def _waiting(self) -> int:
        """(Holding the lock.) Queued jobs that will wait for a slot: those a free slot takes as soon as the worker
        looks are not waiting (a plain job running holds every slot)."""
        queued = sum(1 for j in self._queue if not j.cancel_event.is_set())
        free = 0 if self.current is not None else self.parallel - len(self._active)
        return max(0, queued - free)

    def _kick(self) -> None:
        """(Any thread.) Wake the worker: a held generation's reader took a chunk, or a job was cancelled."""
        with self._cond:
            self._kicked = True
            self._cond.notify_all()

    # -------------------------------------------------------------------------------- the loop
    def _loop(self) -> None:
        while True:
            if self._quiet():  # between turns with nothing else to look at: the next round at once
                self._round()
                continue
            with self._cond:
                while not self._queue and not self._active and not self._parked and not self._stalled and not self._closed:
                    self._cond.wait()
                if self._closed and not self._queue and not self._active and not self._parked and not self._stalled:
                    return  # closed and drained
                dropped = [j for j in self._queue if j.cancel_event.is_set()]
                for j in dropped:
                    self._queue.remove(j)
                plain = self._take_plain()
            for j in dropped:
                self._safely(j.drop)  # its client left before it started
            if plain is not None:
                self._run_plain(plain)
                continue
            self._resume()
            self._admit()
            if any(not t.job.held() for t in self._active):
                self._round()
            else:
                self._idle()

    def _quiet(self) -> bool:
        """Generations are active, one of them can run, and nothing is queued or set aside to look at: the loop's
        bookkeeping under the lock (cancelled queued jobs, admissions, resumptions) has nothing to do. Read without the
        lock: a submit or a cancel from another thread changes these under it, and the next turn sees the change (a
        turn is one cycle of each generation, as between the loop's rounds anyway)."""
        active = self._active
        return bool(active) and not self._queue and not self._stalled and not self._closed and any(
            not t.job.held() for t in active)

    def _alone(self) -> bool:
        """(The worker's thread, inside a generation's turn.) That generation is the only active one, its reader keeps
        up, and nothing is queued, set aside or closing: a round would give it the next turn at once, so it may run its
        own decodes through `execute` and go on past its cycle boundaries (runner.generation_steps) until this turns
        false. Read without the lock, as _quiet: a submit or a cancel is seen at the generation's next cycle."""
        return len(self._active) == 1 and not self._parked and self._quiet()

    def _idle(self) -> None:
        """Nothing can run (every generation is held, or set aside): sleep until a reader takes a chunk, a job is
        submitted or cancelled (each kicks the worker), or IDLE_WAIT passes (a held one's grace may have run out)."""
        now = time.perf_counter()
        for t in self._active:
            if not t.job.held_since:
                t.job.held_since = now
        with self._cond:
            if not self._kicked and not self._closed:
                self._cond.wait(self.IDLE_WAIT)
            self._kicked = False

    def _resume(self) -> None:
        """Bring back the held generations set aside whose readers have caught up (to their own slot, once it is
        free), and end those whose clients left."""
        with self._cond:
            if not self._stalled:
                return
            stalled = list(self._stalled)
        for t in stalled:
            job = t.job
            if job.cancel_event.is_set():
                with self._cond:
                    self._stalled.remove(t)
                self._close_parked(t)
                continue
            if job.backlog is not None and len(job.items) > job.backlog // 2:
                continue
            with self._cond:
                if t.slot in self._parked or any(a.slot == t.slot for a in self._active):
                    continue
                self._stalled.remove(t)
            try:
                self._unpark(t.slot, job.parked)  # type: ignore[misc]
            except BaseException as e:
                job.parked = None
                self._fail(t, e)
                continue
            job.parked = None
            job.held_since = 0.0
            with self._cond:
                self._active.append(t)

    def _take_plain(self) -> Job | None:
        """(Under the lock.) The plain job at the head of the queue, when no generation is active (it runs alone)."""
        if self._active or self._parked or not self._queue or self._queue[0].steps is not None:
            return None
        if any(j.short for j in self._queue):  # a short generation queued behind it goes first
            return None
        return self._queue.popleft()

    def _run_plain(self, job: Job) -> None:
        with self._cond:
            self.current = job
        try:
            job.run()
        except Exception:  # never lose the worker (and with it every later job) to one job's bookkeeping
            pass
        finally:
            with self._cond:
                self.current = None
                self._cond.notify_all()

    def _admit(self) -> None:
        """Start queued generations in free slots (short ones first; none behind a queued plain job), and let a
        queued short one displace a long generation when every slot is taken."""
        while True:
            with self._cond:
                if self._closed:
                    return
                queued = [j for j in self._queue if not j.cancel_event.is_set()]
                pick = next((j for j in queued if j.short and j.steps is not None), None)
                if pick is None and queued and queued[0].steps is not None:
                    pick = queued[0]
                if pick is None:
                    return
                used = {t.slot for t in self._active}
                free = [s for s in range(self.parallel) if s not in used]
                victim, stalled = None, False
                if not free and self._park is not None:
                    victim = self._held_victim()
                    stalled = victim is not None
                    if victim is None:
                        victim = self._victim(pick)
                if not free and victim is None:
                    return
                self._queue.remove(pick)
            if victim is not None:
                try:
                    saved = self._park(victim.slot)  # type: ignore[misc]
                except BaseException as e:  # the long one cannot be set aside: it fails, and its slot is free
                    self._fail(victim, e)
                else:
                    with self._cond:
                        self._active.remove(victim)
                        if stalled:
                            self._stalled.append(victim)
                        else:
                            self._parked[victim.slot] = victim
                    victim.job.parked = saved
                    victim.out_at = time.perf_counter()
                free = [victim.slot]
            slot = self._choose_slot(pick, free)
            self._start(pick, slot)

    def _held_victim(self) -> _Task | None:
        """(Under the lock.) A generation held for HOLD_GRACE seconds or more (its reader is behind), whose slot a queued
        generation may take: the one held longest (not one running where a displaced one waits: that slot is spoken for)."""
        now = time.perf_counter()
        held = [t for t in self._active if t.slot not in self._parked and t.job.held() and t.job.held_since
                and now - t.job.held_since >= self.HOLD_GRACE]
        return min(held, key=lambda t: t.job.held_since) if held else None

    def _victim(self, job: Job) -> _Task | None:
        """(Under the lock.) The long generation a queued short `job` may displace: the one with the most tokens to go,
        if that is more than the short job generates at most."""
        if not job.short or job.size is None:
            return None
        best = None
        for t in self._active:
            if t.job.short or t.slot in self._parked or t.job.size is None:
                continue
            left = t.job.size - t.job.progress
            if left > job.size and (best is None or left > best.job.size - best.job.progress):  # type: ignore[operator]
                best = t
        return best

    def _start(self, job: Job, slot: int) -> None:
        job.started = True
        job.started_at = time.perf_counter()
        job.slot = slot
        try:
            steps = job.steps(job, slot)  # type: ignore[misc]
        except BaseException as e:
            job.set_error(e, e.__traceback__)
            job.finish()
            self._slot_freed(slot)
            return
        self._seq += 1
        task = _Task(job, steps, slot, self._seq)
        task.out_at = job.started_at
        with self._cond:
            self._active.append(task)

    def _round(self) -> None:
        """One turn for every active generation (short ones first, and again while long ones run)."""
        tasks = sorted(self._active, key=lambda t: (not t.job.short, t.seq))
        waves = [tasks]
        if any(not t.job.short for t in tasks):
            shorts = [t for t in tasks if t.job.short]
            waves += [shorts] * (self.SHORT_TURNS - 1) if shorts else []
        for wave in waves:
            waiting = []
            for t in wave:
                if t not in self._active:
                    continue
                if t.job.held():  # its reader is behind: no turn (it waits at its cycle boundary)
                    if not t.job.held_since:
                        t.job.held_since = time.perf_counter()
                    continue
                t.job.held_since = 0.0
                if self._step(t, None, None):
                    waiting.append(t)
            while waiting:  # their decodes, together; each then runs on to its cycle boundary (or its next decode)
                results = self._run_requests([t.request for t in waiting])
                again = []
                for t, (value, error, seconds) in zip(waiting, results):
                    if self._step(t, value, error, seconds):
                        again.append(t)
                waiting = again

    def _run_requests(self, requests: list[Any]) -> list[tuple[Any, BaseException | None, float]]:
        """(result, error, seconds of the decode each waited in) for each request, from the engine's execute."""
        t0 = time.perf_counter()
        try:
            out = self._execute(requests)
        except BaseException as e:  # all of them share the failure
            dt = time.perf_counter() - t0
            return [(None, e, dt) for _ in requests]
        dt = time.perf_counter() - t0
        return [(None, r, dt) if isinstance(r, BaseException) else (r, None, dt) for r in out]

    def _step(self, task: _Task, value: Any, error: BaseException | None, waited_in: float = 0.0) -> bool:
        """Run a generation from where it stands to its next yield: True when it waits for a decode (task.request)."""
        job = task.job
        now = time.perf_counter()
        job.paused += max(0.0, now - task.out_at - waited_in)  # the time others ran is not this generation's
        try:
            if error is not None:
                item = task.steps.throw(error)
            else:
                item = task.steps.send(value)
        except StopIteration:
            self._end(task)
            return False
        except BaseException as e:
            self._fail(task, e)
            return False
        task.out_at = time.perf_counter()
        task.request = item
        return item is not None

    def _fail(self, task: _Task, error: BaseException) -> None:
        task.job.set_error(error, error.__traceback__)
        self._end(task)

    def _end(self, task: _Task) -> None:
        """A generation ended: its slot goes back to the generation parked there, if any, or becomes free."""
        with self._cond:
            if task in self._active:
                self._active.remove(task)
        task.job.finish()
        self._slot_freed(task.slot)

    def _slot_freed(self, slot: int) -> None:
        with self._cond:
            back = self._parked.pop(slot, None)
            self._cond.notify_all()
        if back is None:
            return
        if back.job.cancel_event.is_set():  # its client left while it was set aside: end it without restoring
            self._close_parked(back)
            return
        try:
            self._unpark(slot, back.job.parked)  # type: ignore[misc]
        except BaseException as e:
            back.job.parked = None
            self._fail(back, e)
            return
        back.job.parked = None
        with self._cond:
            self._active.append(back)

    def _close_parked(self, task: _Task) -> None:
        task.job.parked = None
        try:
            task.steps.close()
        except BaseException as e:
            task.job.set_error(e, e.__traceback__)
        task.job.finish()

    @staticmethod
    def _safely(fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:
            pass

    def fail_all(self, error: BaseException) -> None:
        """From any thread, without the worker (rpc.lost: it may be stuck inside llama.cpp): end every generation queued,
        running or set aside, and the plain job running, with `error`; later submits are refused."""
        got = self._cond.acquire(timeout=1.0)  # the worker holds it only briefly, never across a decode
        try:
            self._closed = True
            jobs = self._jobs()
        finally:
            if got:
                self._cond.release()
        for job in jobs:
            if not job.done.is_set():
                job.set_error(error)
                job.finish()

    def _jobs(self) -> list[Job]:
        """(Under the lock.) Every job queued, running (the generations and the plain job) or set aside."""
        jobs = [*self._queue, *(t.job for t in (*self._active, *self._parked.values(), *self._stalled))]
        return jobs + [self.current] if self.current is not None else jobs

    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            for job in self._jobs():
                job.cancel()
            self._cond.notify_all()
        if threading.current_thread() is not self.thread:
            self.thread.join()


def _run_request(request: Any) -> Any:
    """A decode request run alone (the default execute: request.run(), or its error)."""
    try:
        return request.run()
    except BaseException as e:
        return e


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


__all__ = ["Worker", "shutdown"]
