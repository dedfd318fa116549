"""The sampled replay (issue 23, item 4): research/record_traces.py --sampled (edgespec/bench/traces.py) records a
trajectory per prompt and both models' top distributions along it; research/predict_speedup.py --sampled
(edgespec/bench/recorded.py, replay.py, speedup.py) replays sampling at T > 0 from them.

* The rows the replay rebuilds reproduce the recorded exact acceptance rate sum(min(p, q)) after the sampler's
  filters (synthetic recordings; a tiny llama.cpp pair recorded by the real recorder; the committed file).
* The replay is wired at the right depths: a draft whose rows equal the target's at every depth is always accepted, one
  shifted by a position (disjoint supports) never is.
* The expected-rate oracle equals the greedy oracle where every acceptance probability is 0 or 1, and no policy's
  replay beats it by more than sampling noise on a long synthetic recording.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from edgespec.bench import curves, oracle, recorded, speedup
from edgespec.bench import traces as rt
from edgespec.config import SamplingParams, SpecConfig
from edgespec.decoding.sampling import warp

from support import ROOT

RESEARCH = ROOT / "research"  # the recordings and curves (data, read as files) and predict_speedup.py, run as a command
DEFAULT_SAMPLED = RESEARCH / "data" / "traces_t1.json.gz"

FLAT = {1: 0.010, 2: 0.0102, 4: 0.0105, 8: 0.011, 16: 0.012}
SETTINGS = {"temperature": 1.0, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
PARAMS = SamplingParams(**SETTINGS)  # type: ignore[arg-type]


def entry(probs: dict[int, float]) -> list[list[int]]:
    """A recorded position: [[ids], [log probabilities x LOGP_SCALE]], most likely first."""
    top = sorted(probs, key=lambda t: -probs[t])
    return [top, [int(round(math.log(probs[t]) * rt.LOGP_SCALE)) for t in top]]


def full_row(probs: dict[int, float], width: int) -> np.ndarray:
    row = np.full(width, -1e4, dtype=np.float32)
    for t, p in probs.items():
        row[t] = math.log(p)
    return row


def sampled_data(target: list[dict[int, float]], draft: list[dict[int, float]], prompt: list[int], trace: list[int]) -> dict:
    """A one-prompt format-3 recording with these per-position distributions (alpha computed from the full rows)."""
    width = 1 + max([*prompt, *trace] + [t for d in target + draft for t in d])
    hist = list(prompt)
    alpha = []
    for i, (p, q) in enumerate(zip(target, draft)):
        pw, qw = warp(full_row(p, width), PARAMS, hist), warp(full_row(q, width), PARAMS, hist)
        alpha.append(int(round(float(np.minimum(pw, qw).sum()) * rt.CONF_SCALE)))
        hist.append(trace[i])
    return {"format": 3, "draft_len": 16, "max_tokens": len(trace), "n_vocab": width, "eog_ids": [0], "sampling": SETTINGS,
            "top": 40, "prompts": [{"suite": "s", "index": 0, "name": "s-1", "prompt": prompt, "trace": trace,
                                    "stop": "length", "target": [entry(p) for p in target], "draft": [entry(q) for q in draft],
                                    "alpha": alpha}]}


def random_dists(rng: np.random.Generator, n: int, vocab: int = 30, k: int = 6) -> list[dict[int, float]]:
    out = []
    for _ in range(n):
        ids = rng.choice(np.arange(1, vocab), size=k, replace=False)
        w = rng.dirichlet(np.full(k, 0.5)) * 0.999
        out.append({int(t): float(x) for t, x in zip(ids, w) if x > 1e-6})
    return out


def test_rebuilt_rows_reproduce_the_recorded_acceptance_rate():
    rng = np.random.default_rng(2026)
    n = 80
    p, q = random_dists(rng, n), random_dists(rng, n)
    trace = [max(d, key=d.get) for d in p]
    data = sampled_data(p, q, [5, 6, 7], trace)
    sp = recorded.SampledPrompt(data["prompts"][0], recorded.SampledVocab(data))
    params = recorded.sampled_params(data)
    errs = [abs(recorded.row_alpha(sp, i, params) - a / rt.CONF_SCALE) for i, a in enumerate(data["prompts"][0]["alpha"])]
    assert max(errs) < 2e-3, max(errs)
    assert params.seed is None and params.temperature == 1.0 and params.top_k == 40


def test_a_draft_equal_to_the_target_is_always_accepted_and_a_shifted_one_never():
    """Position i's distribution has its own support (ids 10i+1..10i+3), so a row read at the wrong depth is disjoint
    from the right one: with q = p at every depth every drafted token is accepted; with q read one position ahead none."""
    n = 60
    p = [{10 * i + 1: 0.6, 10 * i + 2: 0.3, 10 * i + 3: 0.099} for i in range(n)]
    trace = [10 * i + 1 for i in range(n)]
    same = sampled_data(p, p, [2, 3, 4], trace)
    ahead = sampled_data(p, p[1:] + p[-1:], [2, 3, 4], trace)
    curve = curves.Curve(verify=dict(FLAT), draft=0.001)
    spec = SpecConfig(draft_max=4, adaptive=False)
    for data, accepted in ((same, True), (ahead, False)):
        res = speedup.predict(data, curve, spec, kinds=("model",))
        m = res["overall"]["model"]
        assert m["drafted"] > 20
        assert m["acceptance"] == (1.0 if accepted else 0.0), m
    # the equal draft on a flat curve: about k + 1 tokens per cycle
    assert speedup.predict(same, curve, spec, kinds=("model",))["overall"]["model"]["speedup"] > 3.0


def test_the_replay_is_deterministic_and_reaches_the_tokens():
    rng = np.random.default_rng(7)
    n = 50
    p = random_dists(rng, n)
    q = [{t: 0.5 * x + 0.5 / len(d) for t, x in d.items()} for d in p]  # a draft that half agrees
    data = sampled_data(p, q, [3, 4, 5], [max(d, key=d.get) for d in p])
    curve = curves.Curve(verify=dict(FLAT), draft=0.002)
    a = speedup.predict(data, curve, SpecConfig())
    b = speedup.predict(data, curve, SpecConfig())
    assert a["overall"] == b["overall"]
    o = a["overall"]
    assert o["tokens"] == n and o["alpha"] == pytest.approx(np.mean(data["prompts"][0]["alpha"]) / rt.CONF_SCALE, abs=1e-4)
    assert 0 < o["model"]["acceptance"] < 1


def test_expected_oracle_equals_the_greedy_oracle_where_acceptance_is_certain():
    """With every acceptance probability 0 or 1 the draws are known: the expected oracle is oracle_seconds with the
    accepted run lengths (model: consecutive ones from t, capped at k_max; the lookup: its proposal's leading ones)."""
    rng = np.random.default_rng(11)
    for verify, draft in ((FLAT, 0.002), ({1: 1.0, 2: 1.2, 4: 1.5, 8: 3.0}, 0.3)):
        cost = curves.Curve(verify=dict(verify), draft=draft)
        for _ in range(5):
            n, k_max = 40, 6
            alpha = [float(x) for x in rng.random(n) < 0.7]
            lookup = [[float(x) for x in rng.random(int(rng.integers(0, 5))) < 0.6] for _ in range(n)]
            model_r = []
            for t in range(n):
                r = 0
                while r < k_max and t + r < n and alpha[t + r] == 1.0:
                    r += 1
                model_r.append(r)
            ngram_r = [next((i for i, a in enumerate(acc) if a == 0.0), len(acc)) for acc in lookup]
            for m, g in ((True, False), (False, True), (True, True)):
                want = oracle.oracle_seconds(n, cost, model_r if m else None, ngram_r if g else None)
                got = oracle.expected_oracle_seconds(n, cost, alpha if m else None, lookup if g else None, k_max)
                assert got == pytest.approx(want, rel=1e-12), (m, g)


def test_no_policy_beats_the_expected_oracle_on_a_long_recording():
    """320 positions, the model drafter on a flat curve: its replay (one draw of the sampling) stays below the
    expected-rate oracle's speedup plus 5% (the draws' noise; the oracle knows each position's rate, not the draw)."""
    rng = np.random.default_rng(3)
    n = 320
    p = random_dists(rng, n)
    q = [{t: 0.7 * x + 0.3 / len(d) for t, x in d.items()} for d in p]
    data = sampled_data(p, q, [3, 4, 5], [max(d, key=d.get) for d in p])
    res = speedup.predict(data, curves.Curve(verify=dict(FLAT), draft=0.001), SpecConfig(), kinds=("model", "model+ngram"))
    o = res["overall"]
    for k in ("model", "model+ngram"):
        assert 1.0 < o[k]["speedup"] <= 1.05 * o["oracle"][k], (k, o)


def test_the_recorder_on_tiny_models(tiny):
    """record_sampled through llama.cpp (a tiny pair): the top rows' probabilities are the softmax of the model's
    logits, and the replay's rebuilt rows give the recorded acceptance rates."""
    from edgespec.llama.backend import Model
    from edgespec.config import ModelSpec
    from edgespec.runtime.speculate import speculate

    prompt = [ord(c) for c in "abc d ab abd abc"]
    with Model(ModelSpec(tiny["target"], n_ctx=512, n_threads=1)) as target, \
            Model(ModelSpec(tiny["draft"], n_ctx=512, n_threads=1)) as draft:
        params = SamplingParams(**SETTINGS, seed=5)  # type: ignore[arg-type]
        trace = [t for st in speculate(target, prompt, params, np.random.default_rng(5), max_tokens=40) for t in st.tokens]
        rows = rt.record_sampled(SimpleNamespace(target=target, draft=draft), prompt, trace, params, 40)
        target.reset()
        logits = target.sync(prompt + trace[:3])[0].astype(np.float64)
    ids, probs = rt.sampled_rows(rows["target"][3])
    soft = np.exp(logits - logits.max()) / np.exp(logits - logits.max()).sum()
    assert ids[0] == int(np.argmax(logits)) and probs[0] == pytest.approx(float(soft[ids[0]]), rel=2e-3)
    data = {"format": 3, "eog_ids": sorted(target.eog_ids), "sampling": SETTINGS,
            "prompts": [{"suite": "tiny", "prompt": prompt, "trace": trace, **rows}]}
    sp = recorded.SampledPrompt(data["prompts"][0], recorded.SampledVocab(data))
    errs = [abs(recorded.row_alpha(sp, i, recorded.sampled_params(data)) - a / rt.CONF_SCALE) for i, a in enumerate(rows["alpha"])]
    assert len(errs) == len(trace) and max(errs) < 2e-3, max(errs)


@pytest.mark.slow
def test_committed_sampled_recording():
    path = DEFAULT_SAMPLED
    if not path.exists():
        pytest.skip("no sampled recording yet")
    assert path.stat().st_size < 4 * 2**20
    data = rt.load_traces(path)
    assert data["format"] == 3 and data["sampling"]["temperature"] == 1.0 and data["top"] >= data["sampling"]["top_k"]
    vocab = recorded.SampledVocab(data)
    params = recorded.sampled_params(data)
    errs = []
    for rec in data["prompts"]:
        assert len(rec["target"]) == len(rec["draft"]) == len(rec["alpha"]) == len(rec["trace"])
        sp = recorded.SampledPrompt(rec, vocab)
        errs += [abs(recorded.row_alpha(sp, i, params) - a / rt.CONF_SCALE) for i, a in enumerate(rec["alpha"])]
    # every position: the rebuilt rows' acceptance rate is the recorded one, except where a top-p or min-p threshold
    # falls within the rounding of a recorded probability (3 of the 3,789 positions recorded on 2026-12-02)
    e = np.asarray(errs)
    assert e.mean() < 1e-4 and np.mean(e > 1e-3) < 0.005 and e.max() < 0.1, (e.mean(), np.sum(e > 1e-3), e.max())


def test_sampled_flag_refuses_a_greedy_recording():
    """research/predict_speedup.py, the command line, run as one (this checkout's edgespec)."""
    r = subprocess.run([sys.executable, str(RESEARCH / "predict_speedup.py"), "--sampled", "--traces", str(RESEARCH / "data" / "traces.json.gz"),
                        "--curve", str(RESEARCH / "data" / "curve_gpu_flat.json")], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2
    assert "not a sampled recording" in r.stderr


def test_profiles_of_a_sampled_recording_say_what_their_oracle_is():
    rng = np.random.default_rng(5)
    p = random_dists(rng, 40)
    data = sampled_data(p, p, [3, 4, 5], [max(d, key=d.get) for d in p])
    rows = speedup.profile_rows(data, [("flat", curves.Curve(verify=dict(FLAT), draft=0.003))], [0.3], SpecConfig())
    assert [r["suite"] for r in rows] == ["s", "overall"] and rows[-1]["alpha"] == pytest.approx(1.0, abs=1e-3)
    assert rows[-1]["default"] > 1.0 and "oracle_default_tree" not in rows[-1]
    text = speedup.format_profiles(rows)
    assert "best expected rate" in text and "(a sampled replay)" in text
