"""Several generations at once (issue 34): slots in the backend, the worker's rounds, batched verify decodes.

On tiny real models (llama.cpp): each generation's output with others running beside it equals its output alone
(greedy and seeded sampling, plain and speculative, with a constraint), both when the verify decodes are batched in
one llama_decode (a flat curve: batching pays) and when they run one by one (a linear curve: it does not); sampled
outputs of three generations interleaved and batched follow the target's exact law (chi-square, N and ALPHA below);
a cancelled generation frees its slot at once; a prompt too long for a slot fails alone; the slot a generation takes
is the one that holds most of its prompt; load-time limits are clear errors. The backend's slot views and
decode_parts: test_slot_views_and_decode_parts; the worker's rounds alone: test_worker_rounds_without_llama.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import edgespec.llama.context as context
from edgespec.llama.backend import DecodePart, Model
from edgespec.drafting.calibration import Calibration
from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.runtime.engine import Engine
from edgespec.errors import ConfigError, ContextFullError
from edgespec.runtime.request import GenerationRequest

from support.model_law import exact_distribution  # the target's law, enumerated through llama.cpp
from support.shared import chi_square

GREEDY = SamplingParams(temperature=0)
SEEDED = SamplingParams(temperature=0.9, top_k=20, seed=4321)
FLAT = Calibration({1: 1e-3, 64: 1.05e-3}, 2e-4, "fixed")  # one decode of many rows costs about one: batching pays
LINEAR = Calibration({1: 1e-3, 64: 64e-3}, 2e-4, "fixed")  # n rows cost n: batching never pays
FIXED = SpecConfig(draft_max=4, adaptive=False)
PROMPTS = ["the cat", "a b c d e f", "hello there", "zz top"]
N_TOKENS = 40
CHI_N = 3_000  # sampled 3-token sequences (three generations at a time)
ALPHA = 1e-3


def make_engine(tiny, drafter: str = "none", parallel: int = 3, calibration: Calibration = FLAT, n_ctx: int = 512) -> Engine:
    spec = dict(n_ctx=n_ctx, n_batch=64, n_threads=1)
    t = Model(ModelSpec(tiny["target"], **spec), prompt_cache_bytes=16 << 20, parallel=parallel)
    d = Model(ModelSpec(tiny["draft"], **spec), prompt_cache_bytes=16 << 20, parallel=parallel) if drafter != "none" else None
    return Engine(t, d, drafter=drafter, spec=FIXED, calibration=calibration)


def alone(tiny, drafter: str, sampling: SamplingParams, prompts=PROMPTS, **kw) -> list[list[int]]:
    with make_engine(tiny, drafter, parallel=1) as eng:
        return [list(eng.generate(p, sampling=sampling, max_tokens=N_TOKENS, **kw).token_ids) for p in prompts]


def together(eng: Engine, sampling: SamplingParams, prompts=PROMPTS, **kw) -> list[list[int]]:
    """All prompts started at once (more than the slots: the rest queue); each one's tokens."""
    gens = [eng.stream(p, sampling=sampling, max_tokens=N_TOKENS, **kw) for p in prompts]
    return [list(g.result(timeout=120).token_ids) for g in gens]


@pytest.mark.parametrize("drafter", ["none", "model", "ngram"])
@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
@pytest.mark.parametrize("calibration", [FLAT, LINEAR], ids=["batched", "one-by-one"])
def test_each_output_with_others_running_equals_its_output_alone(tiny, drafter, sampling, calibration):
    expected = alone(tiny, drafter, sampling)
    with make_engine(tiny, drafter, calibration=calibration) as eng:
        got = together(eng, sampling)
        assert got == expected
        if calibration is FLAT:
            assert eng.slots.batched_decodes > 0  # the generations' verify rows went to llama.cpp together
        else:
            assert eng.slots.batched_decodes == 0


def test_generations_progress_together(tiny):
    """The second generation's first tokens come while the first is still running (it does not wait for its end)."""
    with make_engine(tiny, parallel=2) as eng:
        first = eng.stream(PROMPTS[0], sampling=GREEDY, max_tokens=400)
        second = eng.stream(PROMPTS[1], sampling=GREEDY, max_tokens=400)
        next(iter(second))
        assert not first.done and len(first.token_ids) < 400
        assert eng.slot_state()["busy"] == 2
        first.result(timeout=120), second.result(timeout=120)
        assert eng.slot_state() == {"parallel": 2, "busy": 0, "queued": 0}


def test_structured_output_keeps_its_guarantee_beside_others(tiny):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"schema": schema}}
    with make_engine(tiny, parallel=1) as eng:
        ref = eng.generate(PROMPTS[0], sampling=GREEDY, max_tokens=N_TOKENS, constraint=fmt).token_ids
    with make_engine(tiny, "model") as eng:
        plain = [eng.stream(p, sampling=GREEDY, max_tokens=N_TOKENS) for p in PROMPTS[1:3]]
        structured = eng.stream(PROMPTS[0], sampling=GREEDY, max_tokens=N_TOKENS, constraint=fmt)
        assert structured.result(timeout=120).token_ids == ref
        for g in plain:
            g.result(timeout=120)


def test_three_sampled_generations_interleaved_follow_the_target_law(tiny):
    """CHI_N 3-token sequences at temperature 1 (unseeded: the engine's entropy, fixed here), sampled three at a time
    with a draft model, batched verify decodes; chi-square against the target's law of the 3 tokens, enumerated
    through llama.cpp from the target alone (p > ALPHA)."""
    sp = SamplingParams(temperature=1.0)
    prompt = PROMPTS[0]
    with make_engine(tiny, "model") as eng:
        eng._entropy = np.random.SeedSequence(2026)
        ctx = eng.prompt_tokens(prompt)
        ref = Model(ModelSpec(tiny["target"], n_ctx=512, n_batch=64, n_threads=1))
        try:
            exact = exact_distribution(ref, ctx, sp, 3)
        finally:
            ref.close()
        seqs: list[tuple[int, ...]] = []
        drafted = 0
        while len(seqs) < CHI_N:
            gens = [eng.stream(prompt, sampling=sp, max_tokens=3) for _ in range(3)]
            for g in gens:
                r = g.result(timeout=60)
                seqs.append(tuple(r.token_ids))
                drafted += r.stats.n_drafted
        assert eng.slots.batched_decodes > 0 and drafted > 0
    p = chi_square(seqs[:CHI_N], exact)
    assert p > ALPHA, f"chi-square p = {p:.2e} (N={CHI_N})"


def test_a_cancelled_generation_frees_its_slot_at_once(tiny):
    with make_engine(tiny, parallel=2) as eng:
        a = eng.stream(PROMPTS[0], sampling=GREEDY, max_tokens=450)
        b = eng.stream(PROMPTS[1], sampling=GREEDY, max_tokens=450)
        c = eng.start(GenerationRequest(prompt=PROMPTS[2], sampling=GREEDY, max_tokens=5, short=False))  # waits for a slot
        next(iter(a))
        assert not c.started
        a.cancel()
        assert len(c.result(timeout=60).token_ids) == 5
        assert not b.done  # c ran in a's slot while b went on
        assert a.result(timeout=60).finish_reason == "cancelled"
        assert len(b.result(timeout=120).token_ids) == 450


def test_a_prompt_too_long_for_a_slot_fails_alone(tiny):
    """Refused when it is started (PromptTooLongError, a ContextFullError), before it is queued: the generation
    running beside it goes on."""
    with make_engine(tiny, parallel=2, n_ctx=64) as eng:
        ok = eng.stream(PROMPTS[0], sampling=GREEDY, max_tokens=20)
        with pytest.raises(ContextFullError, match="80 tokens but the context holds 64"):
            eng.stream(tokens=[65] * 80, sampling=GREEDY, max_tokens=4)
        assert len(ok.result(timeout=60).token_ids) == 20


def test_a_conversation_goes_back_to_the_slot_that_holds_it(tiny):
    """Two conversations alternating over two slots: each turn decodes only its new tokens (no snapshots: the
    prompt cache is off, so only the slot's own cache can serve the prefix)."""
    spec = dict(n_ctx=512, n_batch=64, n_threads=1)
    t = Model(ModelSpec(tiny["target"], **spec), parallel=2)
    with Engine(t, None, drafter="none", calibration=FLAT) as eng:
        hist = {"x": "the cat sat", "y": "a b c d e f g"}
        for turn in range(3):
            for name in ("x", "y"):
                r = eng.generate(hist[name], sampling=GREEDY, max_tokens=6)
                if turn:
                    assert r.stats.n_cached >= r.stats.n_prompt - 8, (name, turn, r.stats.n_cached, r.stats.n_prompt)
                hist[name] += r.text + " more"


def test_engine_load_parallel_and_its_limits(tiny, monkeypatch):
    with Engine.load(tiny["target"], tiny["draft"], parallel=3, calibrate_costs=False, memory=False) as eng:
        assert eng.parallel == eng.draft.parallel == 3
        assert eng.slot_state() == {"parallel": 3, "busy": 0, "queued": 0}
    with Engine.load(tiny["target"], calibrate_costs=False, memory=False) as eng:
        assert 1 <= eng.parallel <= 4
    with pytest.raises(ConfigError, match="parallel"):
        Engine.load(tiny["target"], parallel=0, calibrate_costs=False)
    # a suffix drafter's tree paths: 9 sequences per slot; 64 slots would need 576 (llama.cpp allows 256)
    with pytest.raises(ConfigError, match="sequences"):
        Engine.load(tiny["target"], drafter="suffix", parallel=64, calibrate_costs=False, memory=False)
    # a cache larger than the machine's free memory: refused before llama.cpp allocates
    monkeypatch.setattr(context, "available_memory", lambda: 4096)
    with pytest.raises(ConfigError, match="KV cache"):
        Engine.load(tiny["target"], parallel=2, calibrate_costs=False, memory=False)


@pytest.fixture
def slot_model(tiny):
    m = Model(ModelSpec(tiny["target"], n_ctx=256, n_batch=64, n_threads=1), parallel=3, tree_paths=4)
    ref = Model(ModelSpec(tiny["target"], n_ctx=256, n_batch=64, n_threads=1), tree_paths=4)
    yield m, ref
    m.close()
    ref.close()


def test_slot_views_and_decode_parts(slot_model):
    m, ref = slot_model
    a, b, c = m.slot(0), m.slot(1), m.slot(2)
    assert a is m and m.slot(1) is b
    p1, p2, p3 = [1, 5, 9, 33, 70], [2, 8, 100, 7], [40, 41, 42, 43, 44, 45]
    for view, p in ((a, p1), (b, p2)):
        ref.reset()
        assert np.array_equal(view.sync(p, rows=range(len(p))), ref.sync(p, rows=range(len(p))))
    assert a.cached == p1 and b.cached == p2
    c.sync(p3)
    c.truncate(len(p3) - 1)
    ref.reset(); ref.sync(p1); r1 = ref.decode([11, 12], len(p1), rows=(0, 1))  # noqa: E702
    ref.reset(); ref.sync(p2); r2 = ref.decode([13], len(p2), rows=(0,))  # noqa: E702
    ref.reset(); ref.sync(p3); ref.truncate(len(p3) - 1)  # noqa: E702
    tree = dict(depths=[0, 1, 1, 2], seq_ids=[[0, 1], [0], [1], [1]])
    r3 = ref.decode_tree([45, 10, 11, 12], **tree)
    out = m.decode_parts([DecodePart(a, [11, 12], rows=(0, 1)), DecodePart(b, [13], rows=(0,)),
                          DecodePart(c, [45, 10, 11, 12], **tree)])
    for got, want in zip(out, (r1, r2, r3)):
        assert np.abs(got - want).max() < 1e-4
    assert a.cached == p1 + [11, 12] and b.cached == p2 + [13] and c.cached == p3
    c.keep_tree_path(1, [11, 12])
    ref.keep_tree_path(1, [11, 12])
    assert np.abs(c.decode([3], c.n_past) - ref.decode([3], ref.n_past)).max() < 1e-4
    data, toks = a.save_state(), list(a.cached)
    b.reset()
    assert b.load_state(toks, data) and b.cached == toks
    assert np.abs(b.decode([4], b.n_past) - a.decode([4], a.n_past)).max() < 1e-4
    b.reset()
    assert a.cached == toks + [4] and b.cached == []  # resetting a slot leaves the others
    with pytest.raises(Exception, match="one part per slot"):
        m.decode_parts([DecodePart(a, [1]), DecodePart(a, [2])])
    with pytest.raises(Exception, match="slot 3"):
        m.slot(3)


def test_worker_rounds_without_llama():
    """The worker alone, with fake generations: every round gives each active one a turn, a short one two while a long
    one runs; their requests reach execute together."""
    from edgespec.runtime.generation import Worker
    from edgespec.runtime.job import Job

    batches: list[list[str]] = []
    log: list[str] = []
    lock = threading.Lock()

    def execute(reqs):
        with lock:
            batches.append(list(reqs))
        return [r + "!" for r in reqs]

    def steps(name, n):
        def make(job, slot):
            for i in range(n):
                got = yield f"{name}{i}"
                assert got == f"{name}{i}!"
                log.append(name)
                yield None
        return make

    w = Worker(None, parallel=2, execute=execute)
    try:
        long_job = Job(steps=steps("L", 6), size=100)
        short_job = Job(steps=steps("S", 4), size=4, short=True)
        with w._cond:  # the worker sees both at once
            w.submit(long_job)
            w.submit(short_job)
        assert long_job.done.wait(10) and short_job.done.wait(10)
    finally:
        w.shutdown()
    assert batches[0] == ["S0", "L0"] and batches[1] == ["S1"]  # both first turns in one execute; then the short one's second
    assert log[:3] == ["S", "L", "S"]  # more turns for the short one in each round
    assert log.count("S") == 4 and log.count("L") == 6


def test_a_lone_generation_runs_on_until_another_needs_the_worker():
    """Job.alone (Worker._alone): true while a generation is the only one the worker could run (it then runs its own
    decodes, runner.generation_steps); false as soon as another job is queued, or its reader falls behind (held)."""
    from edgespec.runtime.generation import Worker
    from edgespec.runtime.job import Job

    seen: list[bool] = []
    second_in, go_on = threading.Event(), threading.Event()

    def long_steps(job, slot):
        seen.append(job.alone())
        second_in.wait(10)  # the test queues another job meanwhile
        seen.append(job.alone())
        go_on.wait(10)
        yield None
        seen.append(job.alone())  # (the other one may be running beside it now, or have ended)
        job.backlog = 1
        job.items.append(object())  # its reader is behind
        seen.append(job.alone())
        job.items.clear()

    def short_steps(job, slot):
        yield None

    w = Worker(None, parallel=2, execute=lambda reqs: [None] * len(reqs))
    try:
        a = Job(steps=long_steps, size=10)
        w.submit(a)
        while not seen:
            threading.Event().wait(0.01)
        b = Job(steps=short_steps, size=1)
        w.submit(b)
        second_in.set()
        go_on.set()
        assert b.done.wait(10) and a.done.wait(10)
    finally:
        w.shutdown()
    assert seen[0] is True and seen[1] is False and seen[3] is False
    assert Job(steps=short_steps).alone() is False  # never submitted: no worker, never alone


def test_drafts_are_planned_for_the_batch_as_a_whole():
    """CostModel.others (rows other generations put in the same decode): on a flat, GPU-like curve a generation pays
    a share of one row plus everything its drafts add to the shared decode, so it drafts shorter beside others; on a
    linear curve that is what it pays alone, and nothing changes."""
    from edgespec.drafting.costs import CostModel, best_k

    a = [0.8] * 12
    flat = CostModel({1: 1.0, 64: 1.3}, c_draft=0.02)
    alone_k = best_k(a, flat, 12)
    flat.others = 24  # three other generations' rows beside it
    assert best_k(a, flat, 12) < alone_k
    assert flat.verify(8) == pytest.approx(flat.curve(25) / 25 + flat.curve(32) - flat.curve(25))
    linear = CostModel({1: 1.0, 64: 64.0}, c_draft=0.2)
    k = best_k(a, linear, 12)
    linear.others = 24
    assert best_k(a, linear, 12) == k and linear.verify(5) == pytest.approx(linear.curve(5))


def test_asyncio_tasks_stream_together(tiny):
    """Two asyncio tasks iterating `astream` handles: both get chunks before either ends (they share no thread)."""
    import asyncio

    async def main(eng: Engine) -> list[list[int]]:
        events: list[tuple[str, int]] = []

        async def read(name: str, prompt: str) -> list[int]:
            ids: list[int] = []
            async for chunk in eng.astream(prompt, sampling=GREEDY, max_tokens=200):
                ids += chunk.tokens
                events.append((name, len(ids)))
            return ids

        out = await asyncio.gather(read("a", PROMPTS[0]), read("b", PROMPTS[1]))
        first_end = min(events.index(next(e for e in reversed(events) if e[0] == n)) for n in "ab")
        assert {n for n, _ in events[:first_end]} == {"a", "b"}  # both had chunks before the first one ended
        return out

    expected = alone(tiny, "none", GREEDY, PROMPTS[:2])
    with make_engine(tiny, parallel=2) as eng:
        got = asyncio.run(main(eng))
    assert [g[:N_TOKENS] for g in got] == expected


def test_the_queue_counts_only_generations_that_wait_for_a_slot():
    """max_queue bounds the generations waiting for a slot: ones that arrive together before the worker looks, as many
    as there are free slots, do not wait (the server admits slots + queue; the engine refused the last one of three
    sent at once to 1 slot + a queue of 2 when the worker had not yet taken the first)."""
    from edgespec.errors import QueueFullError
    from edgespec.runtime.generation import Worker
    from edgespec.runtime.job import Job

    def steps(job, slot):
        yield None

    w = Worker(2, parallel=1, execute=lambda reqs: [None] * len(reqs))
    try:
        jobs = [Job(steps=steps, size=1) for _ in range(3)]
        with w._cond:  # all at once: the worker takes none of them before the last is in
            for j in jobs:
                w.submit(j)
            with pytest.raises(QueueFullError):
                w.submit(Job(steps=steps, size=1))
        assert all(j.done.wait(10) for j in jobs)
    finally:
        w.shutdown()


def test_automatic_slots_stop_at_a_quarter_of_the_free_memory_and_asked_slots_do_not(tiny, monkeypatch):
    """parallel=-n (Engine.load's parallel=None): at most the slots a quarter of the free memory holds, whatever the
    thread setting (here fixed); a slot count the user asked for is kept where the whole memory holds it."""
    spec = ModelSpec(tiny["target"], n_ctx=256, n_batch=64, n_threads=1)
    with Model(spec) as one:
        per_slot = one.kv_bytes_per_token() * 256
    monkeypatch.setattr(context, "available_memory", lambda: 8 * per_slot)  # a quarter: 2 slots
    with Model(spec, parallel=-4) as auto:
        assert auto.parallel == 2
    with Model(spec, parallel=3) as asked:
        assert asked.parallel == 3
