"""Measured costs: the calibration cache is advisory (any damage is ignored and rewritten), a poisoned curve is
caught at load (quick check) or during generation (level shift -> re-measurement), and the cache stays bounded."""

from __future__ import annotations

import json
import math
import os
import time

import numpy as np
import pytest

from edgespec.drafting import calibration as cal
from edgespec.llama.backend import Model
from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.drafting.costs import SHIFT_RUN, VerifyCurve
from edgespec.runtime.engine import Engine


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGESPEC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "calibration.json"


@pytest.fixture(scope="module")
def models(tiny):
    t = Model(ModelSpec(tiny["target"], n_ctx=256, n_threads=1))
    d = Model(ModelSpec(tiny["draft"], n_ctx=256, n_threads=1))
    yield t, d
    t.close()
    d.close()


def _entry(verify, draft=1e-4, when=None):
    return {"verify": {str(n): s for n, s in verify.items()}, "draft": draft, "when": time.time() if when is None else when}


DAMAGED = {
    "a list": [1, 2, 3],
    "null": None,
    "a string": "calibration",
    "old format": {"somekey": {"verify": {"1": 0.1}, "draft": 0.0}},
    "not json": "{{{",
    "absurdly nested": "[" * 100_000 + "]" * 100_000,
}
BAD_ENTRIES = {
    "zero": {1: 0.0, 2: 0.1},
    "negative": {1: -0.1, 2: 0.1},
    "nan": {1: math.nan, 2: 0.1},
    "inf": {1: math.inf, 2: 0.1},
    "n = 0": {0: 0.1, 1: 0.1},
    "absurd 1e9 s": {1: 1e9, 2: 1e9},
    "strings": {1: "fast", 2: "slow"},
    "implausible shape": {1: 0.1, 8: 0.001},
}


@pytest.mark.parametrize("name", list(DAMAGED))
def test_a_damaged_file_is_ignored_and_rewritten(cache, models, name):
    cache.parent.mkdir(parents=True, exist_ok=True)
    raw = DAMAGED[name]
    cache.write_text(raw if isinstance(raw, str) else json.dumps(raw))
    t, d = models
    c = cal.calibrate(t, d)
    assert c.source in ("measured", "measured-unsteady") and c.verify[1] > 0
    if c.steady:
        data = json.loads(cache.read_text())
        assert data["format"] == cal.FORMAT and cal.entry_key(t, d) in data["entries"]


@pytest.mark.parametrize("name", list(BAD_ENTRIES))
def test_a_bad_entry_is_ignored(cache, models, name):
    t, d = models
    key = cal.entry_key(t, d)
    verify = BAD_ENTRIES[name]
    cache.parent.mkdir(parents=True, exist_ok=True)
    entry = {"verify": {str(n): s for n, s in verify.items()}, "draft": 1e-4, "when": time.time()}
    cache.write_text(json.dumps({"format": cal.FORMAT, "entries": {key: entry}}, allow_nan=True))
    assert cal.load_cached(key) is None
    c = cal.calibrate(t, d)
    assert c.source in ("measured", "measured-unsteady")
    assert all(0 < s < 1.0 for s in c.verify.values())


def test_a_poisoned_curve_fails_its_quick_check_at_load(cache, models):
    """A curve measured while the machine was busy (flat 2.2 s, or 100x too slow) is measured again at load.
    (100x, not 10x: the tiny model's quick check is ~0.13 ms a token, so a loaded test machine that stalls two of
    its three decodes by a millisecond would make a 10x poison agree with it.)"""
    t, d = models
    key = cal.entry_key(t, d)
    good = cal.calibrate(t, d)
    for poison in ({n: 2.2 for n in cal.SIZES}, {n: 100 * good.verify[1] for n in cal.SIZES}):  # flat: plausible whatever noise `good` has
        cal.store(key, cal.Calibration(poison, good.draft, "measured"))
        assert cal.load_cached(key) is not None  # plausible on its own ...
        c = cal.calibrate(t, d)
        assert c.source in ("remeasured", "measured-unsteady")  # ... but not on this machine now
        assert c.verify[1] < 0.1


def test_the_cache_is_bounded_and_forgets_deleted_models(cache, models, tmp_path):
    t, d = models
    cache.parent.mkdir(parents=True, exist_ok=True)
    entries = {}
    for i in range(cal.MAX_ENTRIES + 20):
        gone = tmp_path / f"gone{i}.gguf"
        entries[json.dumps([[str(gone), 1, 1, 1, 0, 1], None, [], "x"])] = _entry({1: 0.1, 2: 0.15})
    real = str(t.spec.path)
    for i in range(cal.MAX_ENTRIES + 20):
        entries[json.dumps([[real, i, 1, 1, 0, 1], None, [], "x"])] = _entry({1: 0.1, 2: 0.15}, when=time.time() - i)
    old = json.dumps([[real, -1, 1, 1, 0, 1], None, [], "x"])
    entries[old] = _entry({1: 0.1}, when=time.time() - 40 * 86400)
    cache.write_text(json.dumps({"format": cal.FORMAT, "entries": entries}))
    cal.store(cal.entry_key(t, d), cal.Calibration({1: 0.1, 2: 0.12}, 0.01, "measured"))
    kept = json.loads(cache.read_text())["entries"]
    assert len(kept) <= cal.MAX_ENTRIES
    assert all(real in k for k in kept)  # entries of deleted files are gone
    assert old not in kept  # and so are expired ones
    assert cal.entry_key(t, d) in kept


def test_small_contexts_calibrate(cache, tiny):
    """--ctx 16 with a draft: sizes that do not fit are skipped (was: KeyError)."""
    with Model(ModelSpec(tiny["target"], n_ctx=16, n_threads=1)) as t, Model(ModelSpec(tiny["draft"], n_ctx=16, n_threads=1)) as d:
        c = cal.calibrate(t, d)
        assert 1 in c.verify and max(c.verify) <= 15 and c.draft > 0


def test_an_unwritable_cache_is_not_an_error(models, tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("EDGESPEC_CACHE_DIR", str(blocker / "sub"))  # a path under a file: cannot be created
    t, d = models
    assert cal.calibrate(t, d).verify[1] > 0


# --------------------------------------------------------------------------------------------- during generation
def test_a_level_shift_rescales_the_whole_curve_after_a_few_observations():
    c = VerifyCurve({1: 2.2, 8: 2.3})  # flat and 27x too slow
    for _ in range(SHIFT_RUN):
        assert c.shifts == 0
        c.update(1, 0.08)
    assert c.shifts == 1 and c.points[1] < 0.2  # the size's point follows the machine at once
    assert c.points[8] < 0.2  # and so does every size not decoded lately (the whole curve moved)
    hiccup = VerifyCurve({1: 0.08, 8: 0.5})
    for s in (0.08, 0.5, 0.08, 0.09, 0.5, 0.08):  # isolated slow decodes are not a level shift
        hiccup.update(1, s)
    assert hiccup.shifts == 0 and hiccup.points[8] == 0.5


def test_a_machine_that_gets_busy_moves_the_curve_up_within_a_few_cycles():
    c = VerifyCurve({1: 0.03, 2: 0.05, 4: 0.08, 8: 0.15})
    for _ in range(SHIFT_RUN):
        c.update(3, 0.20)  # a size between the measured ones, 3x what the curve says
    assert c.shifts == 1
    assert all(2.5 < c.points[n] / v < 3.5 for n, v in {1: 0.03, 2: 0.05, 4: 0.08, 8: 0.15}.items())


@pytest.mark.parametrize("poison", ["flat-slow", "thousand-times"])
def test_a_poisoned_engine_recovers_without_measuring_inside_the_request(tiny, cache, poison, monkeypatch):
    """The engine starts from a poisoned curve (bypassing the load check). Within SHIFT_RUN observations of one batch
    size the curve follows the live decodes; nothing is measured inside the request (no calibration function runs,
    and no decode happens outside the generation's own cycles)."""
    t = Model(ModelSpec(tiny["target"], n_ctx=512, n_threads=1))
    d = Model(ModelSpec(tiny["draft"], n_ctx=512, n_threads=1))
    true = cal.measure_decode_costs(t)[0]
    # poisons far beyond what a busy machine does to tiny models (timings of sub-millisecond decodes swing 10x)
    bad = {n: 2.2 for n in cal.SIZES} if poison == "flat-slow" else {n: 1000 * s for n, s in true.items()}
    calls = []
    for name in ("measure_decode_costs", "quick_check", "calibrate"):
        monkeypatch.setattr(cal, name, lambda *a, _n=name, **kw: calls.append(_n))
    spec = SpecConfig(draft_max=4)
    eng = Engine(t, d, spec=spec, calibration=cal.Calibration(bad, 1e-4, "cache"))
    try:
        prompt = eng.prompt_tokens("abc d")
        before = t.n_decoded
        r = eng.generate(tokens=prompt, sampling=SamplingParams(temperature=0), max_tokens=60)
        assert calls == []
        assert "calibration" not in r.stats.as_dict()["seconds"]
        # every target decode was the prompt or a cycle's verify
        assert t.n_decoded - before == r.stats.n_prefill + r.stats.n_cycles + r.stats.n_drafted - 1
        assert eng.curve.shifts >= 1
        assert all(v < bad[n] / 10 for n, v in eng.curve.points.items() if n in bad)  # the poison is gone
    finally:
        eng.close()


def test_stats_and_json_show_the_costs_planned_with(tiny, cache):
    with Engine.load(ModelSpec(tiny["target"], n_ctx=256, n_threads=1), ModelSpec(tiny["draft"], n_ctx=256, n_threads=1)) as eng:
        r = eng.generate("abc", sampling=SamplingParams(temperature=0), max_tokens=4)
        costs = r.stats.as_dict()["costs"]
        assert costs["source"] in ("measured", "measured-unsteady", "cache") and 1 in costs["verify"] and "draft" in costs
        assert os.path.exists(cal.cache_path()) or costs["source"] == "measured-unsteady"


def test_the_verify_curve_interpolates_as_np_interp_bit_for_bit():
    """VerifyCurve keeps its points in plain lists (bisect, np.interp's arithmetic): between measured sizes its value
    equals np.interp over the running maximum of the points, bit for bit, on 500 random curves of 2-7 points (sizes
    1-39, asked at every n strictly between the smallest and the largest)."""
    rng = np.random.default_rng(1)
    for _ in range(500):
        ns = sorted(set(rng.integers(1, 40, size=int(rng.integers(2, 8))).tolist()))
        if len(ns) < 2:
            continue
        pts = {n: float(rng.uniform(0.001, 1.0)) for n in ns}
        c = VerifyCurve(pts)
        xs = np.array(ns, dtype=float)
        ys = np.maximum.accumulate(np.array([pts[n] for n in ns]))
        for n in range(ns[0] + 1, ns[-1]):  # the ends and beyond are the curve's own extrapolation
            assert c(n) == float(np.interp(n, xs, ys))
