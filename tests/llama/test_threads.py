"""The thread choice (edgespec.llama.threads) as a pure decision on fake timings, and the backend's use of it."""

from __future__ import annotations

import pytest

from edgespec.llama.threads import LARGE_FROM, ThreadTuner, candidate_counts, work


class FakeMachine:
    """Seconds per decode of n tokens with t threads, for a machine whose load the test switches."""

    def __init__(self) -> None:
        self.busy = False

    def seconds(self, t: int, n: int) -> float:
        one = {(1, False): 0.050, (2, False): 0.033, (1, True): 0.052, (2, True): 0.100}[(t, self.busy)]
        return one * work(n)


def drive(tuner: ThreadTuner, machine: FakeMachine, start: float, seconds: float, n: int = 1) -> tuple[float, list[int]]:
    """Decode back to back for `seconds` of fake time; returns (end time, the count used by each decode)."""
    now, used = start, []
    while now < start + seconds:
        t = tuner.choose(n, now)
        dt = machine.seconds(t, n)
        tuner.observe(t, n, dt, now)
        used.append(t)
        now += dt
    return now, used


def test_candidates():
    assert candidate_counts(1) == (1,)
    assert candidate_counts(2) == (2, 1)
    assert candidate_counts(4) == (4, 3, 2, 1)
    assert candidate_counts(8) == (8, 7, 4)
    with pytest.raises(ValueError):
        ThreadTuner([2, 2])
    with pytest.raises(ValueError):
        ThreadTuner([0])


def test_quiet_machine_keeps_all_cores_and_probes_rarely():
    tuner, m = ThreadTuner([2, 1]), FakeMachine()
    _, used = drive(tuner, m, 0.0, 30.0)
    assert tuner.current == 2
    assert used.count(1) / len(used) < 0.02  # probes of the slower count: under 2% of the decodes


def test_on_all_cores_the_timer_probes_rarely_and_a_load_is_still_seen_at_once():
    """While the count in use is all the cores, the probe interval doubles up to max_probe_after_all (32 s), not
    max_probe_after (4 s): 120 s of a quiet machine's decodes, the probes counted both ways (exactly, on fake
    timings); then a busy core is still found within a few decodes (the slowdown makes the other count stale)."""
    m = FakeMachine()
    capped = ThreadTuner([2, 1], max_probe_after_all=4.0)
    drive(capped, m, 0.0, 120.0)
    tuner = ThreadTuner([2, 1])
    now, _ = drive(tuner, m, 0.0, 120.0)
    assert tuner.current == 2 and capped.current == 2
    assert tuner.probes <= 8 < 25 <= capped.probes  # 1, 2, 4, 8, 16, 32, 32 ... s against 1, 2, 4, 4, 4 ... s
    m.busy = True
    _, used = drive(tuner, m, now, 3.0)
    assert used.index(1) <= 4 and tuner.current == 1


def test_a_busy_core_moves_to_one_thread_within_a_few_decodes_and_back_when_it_is_free():
    tuner, m = ThreadTuner([2, 1]), FakeMachine()
    now, _ = drive(tuner, m, 0.0, 5.0)
    assert tuner.current == 2
    m.busy = True
    now, used = drive(tuner, m, now, 5.0)
    first_one = used.index(1)
    assert first_one <= 4  # the slowdown of the count in use makes the other count stale at once
    assert tuner.current == 1
    assert used[first_one:].count(2) / len(used[first_one:]) < 0.05  # then it stays, probing now and then
    m.busy = False
    now, used = drive(tuner, m, now, 6.0)
    assert tuner.current == 2  # a probe within the probe interval (at most max_probe_after) finds all cores free
    assert used.index(2) < len(used) // 2


def test_switching_load_tracks_the_better_count_most_of_the_time():
    tuner, m = ThreadTuner([2, 1]), FakeMachine()
    now, good, total = 0.0, 0, 0
    for phase in range(12):  # 3 s on, 3 s off
        m.busy = phase % 2 == 1
        end = now + 3.0
        while now < end:
            t = tuner.choose(1, now)
            dt = m.seconds(t, 1)
            tuner.observe(t, 1, dt, now)
            best = 1 if m.busy else 2
            good += t == best
            total += 1
            now += dt
    assert good / total > 0.85


def test_one_slow_decode_is_not_a_load_change():
    tuner, m = ThreadTuner([2, 1]), FakeMachine()
    now, _ = drive(tuner, m, 0.0, 2.0)
    probes = tuner.probes
    tuner.observe(tuner.choose(1, now), 1, 0.2, now)  # one hiccup of 6x
    now, used = drive(tuner, m, now + 0.2, 0.3)
    assert tuner.current == 2 and tuner.probes - probes <= 1


def test_prompt_chunks_use_the_current_count_and_teach_nothing():
    tuner, m = ThreadTuner([2, 1]), FakeMachine()
    drive(tuner, m, 0.0, 1.0)
    before = dict(tuner.describe())
    for i in range(10):
        assert tuner.choose(LARGE_FROM, 1.0 + i) == tuner.current  # never probed, however stale the other count is
        tuner.observe(tuner.current, 512, 50.0, 1.0 + i)  # absurd timings: ignored by the estimates
    assert tuner.current == before["current"] and tuner.probes == before["probes"]


def test_a_single_candidate_is_fixed():
    tuner = ThreadTuner([3])
    for i in range(20):
        assert tuner.choose(1, float(i)) == 3
        tuner.observe(3, 1, 0.01 * (i + 1), float(i))
    assert tuner.describe()["switches"] == 0


# --------------------------------------------------------------------------------------------- the backend
def test_a_user_given_thread_count_is_never_changed(tiny):
    from edgespec.llama.backend import Model
    from edgespec.config import ModelSpec

    with Model(ModelSpec(tiny["target"], n_ctx=256, n_threads=2)) as m:
        assert m.tuner is None and m.threads_info() == {"mode": "fixed", "current": 2}
        m.sync(list(range(1, 20)))
        for _ in range(30):
            m.decode([5], m.n_past)
        assert m.threads_now == 2 and m.context.threads_applied == 2


def test_auto_threads_choose_among_candidates_and_pin_during_measurements(tiny, monkeypatch):
    import edgespec.llama.backend as B
    import edgespec.llama.context as context
    from edgespec.config import ModelSpec

    monkeypatch.setattr(context, "default_threads", lambda: 2)
    set_calls: list[int] = []
    real = context.C.llama_set_n_threads
    monkeypatch.setattr(context.C, "llama_set_n_threads", lambda ctx, a, b: (set_calls.append(a), real(ctx, a, b))[1])
    with B.Model(ModelSpec(tiny["target"], n_ctx=256)) as m:
        assert m.tuner is not None and m.tuner.candidates == (2, 1)
        m.sync(list(range(1, 10)))
        with m.pinned_threads():
            for _ in range(5):
                m.decode([5], m.n_past)
        assert set_calls == [] and m.tuner.probes == 0  # pinned: the count in use, nothing learnt
        for _ in range(5):
            m.decode([5], m.n_past)
        assert m.tuner.probes >= 1 and set_calls and set(set_calls) <= {1, 2}
        assert sum(m.threads_info()["decodes"].values()) == 6  # the prompt and the five unpinned decodes


def test_generation_stats_report_the_threads(tiny):
    from edgespec import Engine, ModelSpec, SamplingParams

    with Engine.load(ModelSpec(tiny["target"], n_ctx=256, n_threads=1), ModelSpec(tiny["draft"], n_ctx=256), calibrate_costs=False) as eng:
        r = eng.generate("abc", sampling=SamplingParams(temperature=0), max_tokens=8)
        th = r.stats.as_dict()["threads"]
        assert th["target"] == {"mode": "fixed", "current": 1}
        assert th["draft"]["current"] >= 1


def test_warm_threads_compares_the_counts_before_costs_are_measured(tiny, monkeypatch):
    import edgespec.llama.backend as B
    import edgespec.llama.context as context
    from edgespec.config import ModelSpec

    monkeypatch.setattr(context, "default_threads", lambda: 2)
    with B.Model(ModelSpec(tiny["target"], n_ctx=256)) as m:
        m.warm_threads()
        info = m.threads_info()
        assert info["probes"] >= 1 and all(n > 0 for n in info["decodes"].values())  # both counts were timed
        assert m.n_past == 0
    with B.Model(ModelSpec(tiny["target"], n_ctx=256, n_threads=2)) as fixed:
        fixed.warm_threads()  # nothing to compare: no decode at all
        assert fixed.n_decoded == 0
