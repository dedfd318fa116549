"""Short generations first, with one slot (parallel=1): a queued short generation (an infill, at most SHORT_TOKENS
tokens, or GenerationRequest(short=True)) displaces the running generation at its next cycle boundary when that one
has more tokens to go (generation.Worker: both models' caches of the slot are set aside in host memory and restored
after). On tiny real models (llama.cpp): the long generation's output is what it is alone (greedy, seeded sampling,
speculative with a draft model), the short one's too; the order is deterministic (the long request's prefill
callback holds the worker until the short one is queued); the long one's timings leave the wait out. Several slots:
tests/runtime/test_slots.py."""

from __future__ import annotations

import threading
import time

import pytest

import edgespec.llama.backend as backend
from edgespec.drafting.calibration import Calibration
from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.runtime.engine import SHORT_TOKENS, Engine
from edgespec.runtime.request import GenerationRequest

GREEDY = SamplingParams(temperature=0)
SEEDED = SamplingParams(temperature=0.9, top_k=20, seed=4321)
FLAT = Calibration({1: 1e-3, 16: 1.05e-3}, 2e-4, "fixed")  # drafting pays: the draft model drafts
FIXED = SpecConfig(draft_max=4, adaptive=False)
LONG, SHORT = 200, 12
LONG_PROMPT, SHORT_PROMPT = "the cat", "a b c d e f"


def make_engine(tiny, drafter: str = "none") -> Engine:
    t = backend.Model(ModelSpec(tiny["target"], n_ctx=512, n_batch=64, n_threads=1), prompt_cache_bytes=32 << 20)
    d = backend.Model(ModelSpec(tiny["draft"], n_ctx=512, n_batch=64, n_threads=1), prompt_cache_bytes=32 << 20) if drafter != "none" else None
    return Engine(t, d, drafter=drafter, spec=FIXED, calibration=FLAT)


class Held:
    """A long request whose prefill callback holds the engine's worker until `release()`: whatever is queued
    before the release is in the queue when the long generation's first cycle boundary comes."""

    def __init__(self, eng: Engine, sampling: SamplingParams, max_tokens: int = LONG, **kw) -> None:
        self.go = threading.Event()
        prefilled = threading.Event()

        def hold(done: int, total: int) -> None:
            prefilled.set()
            self.go.wait(30)

        self.gen = eng.start(GenerationRequest(prompt=LONG_PROMPT, sampling=sampling, max_tokens=max_tokens,
                                               on_prefill=hold, **kw))
        assert prefilled.wait(30)  # the long one holds the slot before anything else is queued

    def release(self) -> None:
        self.go.set()


def _alone(tiny, drafter: str, sampling: SamplingParams) -> tuple[list[int], list[int]]:
    with make_engine(tiny, drafter) as eng:
        long = eng.generate(LONG_PROMPT, sampling=sampling, max_tokens=LONG)
        short = eng.generate(SHORT_PROMPT, sampling=sampling, max_tokens=SHORT)
        assert len(long.token_ids) == LONG  # the tiny model never ends a text by itself: all LONG tokens
        return list(long.token_ids), list(short.token_ids)


@pytest.mark.parametrize("drafter,sampling", [("none", GREEDY), ("none", SEEDED), ("model", GREEDY), ("model", SEEDED)],
                         ids=["plain-greedy", "plain-seeded", "model-greedy", "model-seeded"])
def test_a_short_request_runs_inside_a_long_one_and_neither_output_changes(tiny, drafter, sampling):
    long_alone, short_alone = _alone(tiny, drafter, sampling)
    with make_engine(tiny, drafter) as eng:
        held = Held(eng, sampling)
        seen_at: list[int] = []  # how far the long one was when the short one started
        short = eng.start(GenerationRequest(prompt=SHORT_PROMPT, sampling=sampling, max_tokens=SHORT,
                                            on_prefill=lambda d, t: seen_at.append(len(held.gen.token_ids))))
        held.release()
        assert list(short.result(timeout=60).token_ids) == short_alone
        long = held.gen.result(timeout=60)
        assert list(long.token_ids) == long_alone
        assert seen_at and 0 < seen_at[0] < LONG  # inside the long one: after its first cycle, before its end
        if drafter == "model":
            assert long.stats.n_drafted > 0 and short.result().stats.n_drafted > 0


def test_the_long_generation_timings_leave_the_wait_out(tiny):
    with make_engine(tiny) as eng:
        held = Held(eng, GREEDY)
        short = eng.start(GenerationRequest(prompt=SHORT_PROMPT, sampling=GREEDY, max_tokens=SHORT,
                                            on_prefill=lambda d, t: time.sleep(1.0)))  # the short one takes > 1 s
        t0 = time.perf_counter()
        held.release()
        short.result(timeout=60)
        long = held.gen.result(timeout=60)
        elapsed = time.perf_counter() - t0
        assert long.stats.wall <= elapsed - 0.9  # its own time, without the second it spent suspended
        assert long.stats.tokens_per_second > 0


def test_only_short_requests_with_fewer_tokens_to_go_run_first(tiny):
    with make_engine(tiny) as eng:
        # not short: more than SHORT_TOKENS tokens; short=False; short but not fewer than the long one has left
        cases = [dict(max_tokens=SHORT_TOKENS + 1), dict(max_tokens=SHORT, short=False), dict(max_tokens=60, short=True)]
        for kw in cases:
            held = Held(eng, GREEDY, max_tokens=40 if kw.get("short") else LONG)
            seen: list[int] = []

            def note(d: int, t: int, seen: list[int] = seen, held: Held = held) -> None:
                seen.append(len(held.gen.token_ids))

            other = eng.start(GenerationRequest(prompt=SHORT_PROMPT, sampling=GREEDY, on_prefill=note, **kw))
            held.release()
            other.result(timeout=60)
            assert seen[0] == len(held.gen.result(timeout=60).token_ids), kw  # it ran after the long one, in queue order
        # and an explicit short=True with many tokens runs inside a longer one
        held = Held(eng, GREEDY)
        seen = []
        other = eng.start(GenerationRequest(prompt=SHORT_PROMPT, sampling=GREEDY, max_tokens=100, short=True,
                                            on_prefill=lambda d, t: seen.append(len(held.gen.token_ids))))
        held.release()
        other.result(timeout=60)
        assert seen[0] < LONG == len(held.gen.result(timeout=60).token_ids)


def test_one_level_deep_and_in_queue_order(tiny):
    """Two short requests queued behind a long one: the first displaces it, the second waits for the first to end
    (a short generation is not displaced) and then displaces the long one again."""
    with make_engine(tiny) as eng:
        held = Held(eng, GREEDY)
        order: list[tuple[str, int]] = []
        a = eng.start(GenerationRequest(prompt=SHORT_PROMPT, sampling=GREEDY, max_tokens=SHORT,
                                        on_prefill=lambda d, t: order.append(("a", len(held.gen.token_ids)))))
        b = eng.start(GenerationRequest(prompt="hello", sampling=GREEDY, max_tokens=SHORT,
                                        on_prefill=lambda d, t: order.append(("b", len(held.gen.token_ids)))))
        held.release()
        a.result(timeout=60)
        b.result(timeout=60)
        assert len(held.gen.result(timeout=60).token_ids) == LONG
        assert [n for n, _ in order] == ["a", "b"]
        assert 0 < order[0][1] <= order[1][1] < LONG  # b ran inside the long one too, after a


def test_cancelling_the_long_one_while_a_short_one_runs(tiny):
    with make_engine(tiny) as eng:
        held = Held(eng, GREEDY)
        short = eng.start(GenerationRequest(prompt=SHORT_PROMPT, sampling=GREEDY, max_tokens=SHORT,
                                            on_prefill=lambda d, t: held.gen.cancel()))
        held.release()
        assert len(short.result(timeout=60).token_ids) == SHORT
        long = held.gen.result(timeout=60)
        assert long.finish_reason == "cancelled" and len(long.token_ids) < LONG
        assert len(eng.generate(SHORT_PROMPT, sampling=GREEDY, max_tokens=SHORT).token_ids) == SHORT  # and the engine goes on
