"""Run statistics: one record per generation; totals are sums of records; one summary line for either."""

from __future__ import annotations

import pytest

from edgespec.stats import GenerationStats, Totals, summary_line


def _record(cycles: list[tuple[int, int, int, str]], *, wall: float, prefill: float, stop: str = "length") -> GenerationStats:
    s = GenerationStats(n_prompt=10, n_cached=4, n_prefill=6)
    s.timings.prefill = prefill
    for drafted, accepted, emitted, source in cycles:
        s.record_cycle(drafted, accepted, emitted, source, t_draft=0.01 * drafted, t_target=0.1)
    s.finish(wall)
    s.stop_reason = stop
    return s


def test_a_record_counts_cycles_positions_and_sources() -> None:
    s = _record([(3, 2, 3, "model"), (0, 0, 1, "plain"), (2, 2, 3, "ngram")], wall=1.0, prefill=0.2)
    assert (s.n_generated, s.n_cycles, s.n_spec_cycles, s.n_drafted, s.n_accepted) == (7, 3, 2, 5, 4)
    assert s.drafted_by_pos == [2, 2, 1] and s.accepted_by_pos == [2, 2]
    assert s.source_counts == {"model": 1, "plain": 1, "ngram": 1} and s.accepted_by_source == {"model": 2, "ngram": 2}
    assert s.mu == pytest.approx(2.0) and s.acceptance == pytest.approx(0.8)
    assert s.decode_seconds == pytest.approx(0.8) and s.tokens_per_second == pytest.approx(7 / 0.8)
    assert s.timings.overhead == pytest.approx(1.0 - 0.2 - 0.05 - 0.3)
    d = s.as_dict()
    assert d["acceptance_by_pos"] == [1.0, 1.0, 0.0] and d["seconds"]["decode"] == pytest.approx(0.8)


def test_decode_time_is_wall_time_after_prefill() -> None:
    s = _record([(0, 0, 1, "plain")], wall=1.0, prefill=0.1)
    s.finish(1.0)
    assert s.decode_seconds == pytest.approx(0.9) and s.timings.overhead == pytest.approx(1.0 - 0.1 - 0.1)
    assert "calibration" not in s.as_dict()["seconds"]  # nothing is measured inside a request any more


def test_totals_are_sums_of_records() -> None:
    a = _record([(4, 4, 5, "ngram")], wall=1.0, prefill=0.5)
    b = _record([(2, 0, 1, "model"), (0, 0, 1, "plain")], wall=2.0, prefill=0.0, stop="cancelled")
    t = Totals()
    t.add(a)
    t.add(b)
    assert (t.runs, t.interrupted, t.n_generated, t.n_drafted, t.n_accepted, t.n_spec_cycles) == (2, 1, 7, 6, 4, 2)
    assert t.drafted_by_pos == [2, 2, 1, 1] and t.accepted_by_pos == [1, 1, 1, 1]
    assert t.decode_seconds == pytest.approx(0.5 + 2.0) and t.tokens_per_second == pytest.approx(7 / 2.5)
    assert t.timings.prefill == pytest.approx(0.5) and t.wall == pytest.approx(3.0)
    assert t.mu == pytest.approx(2.0) and t.acceptance == pytest.approx(4 / 6)


def test_summary_line() -> None:
    s = _record([(3, 2, 3, "model")], wall=1.0, prefill=0.2, stop="eos")
    line = summary_line(s)
    assert line.startswith("3 tokens · 3.8 tok/s · μ 2.00 · accepted 67%") and "prompt 10 tok (6 decoded in 0.20s, 4 cached)" in line
    assert line.endswith("stop: eos")
    plain = summary_line(_record([(0, 0, 1, "plain")], wall=1.0, prefill=0.0))
    assert "μ" not in plain and "accepted" not in plain
    t = Totals()
    t.add(_record([(0, 0, 1, "plain")], wall=1.0, prefill=0.0, stop="cancelled"))
    assert summary_line(t).startswith("1 run · 1 tokens") and summary_line(t).endswith("1 interrupted")
