"""The GPU-evidence tools (issue 14): trace recording, the speedup predictor, the synthetic-model generator and the
device script's plumbing (edgespec/bench/: traces, curves, recorded, replay, oracle, speedup, synth; research/ holds
their command lines and data). All on tiny models or synthetic data: no GPU, no real pair.

* traces.record_segments stores one greedy continuation per position as shifted segments: checked against a
  brute-force continuation at every position, with a fake draft and with a real tiny draft through llama.cpp.
* The predictor's replay is the engine's own loop and speculators over fake models: with a fixed draft length its
  cycles, drafted and accepted counts equal a real run's on tiny models (model and n-gram drafters), and its
  speedups never beat the oracle bound.
* synth: a spec read from a tiny GGUF gives a loadable quantized model of the same shapes.
* gpu_check.sh runs end to end in its quick mode (slow).
"""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from edgespec.bench import curves, oracle, recorded, replay, speedup
from edgespec.bench import traces as rt
from edgespec.config import SamplingParams, SpecConfig
from edgespec.drafting.costs import CostModel, VerifyCurve
from edgespec.drafting.model import top_probability

from support import ROOT
from support.replay_data import CPU, FLAT, RuleDraft, brute_continuation, make_trace, record_tiny, synthetic_data

RESEARCH = ROOT / "research"  # the recorded traces, curves and the pair's spec (data, read as files)
DEFAULT_TRACES = RESEARCH / "data" / "traces.json.gz"
DEFAULT_PROFILES = RESEARCH / "data" / "curves"
DEFAULT_SPEC = RESEARCH / "data" / "qwen2.5-coder-pair.spec.json.xz"


# --------------------------------------------------------------------------------------------- fakes


# --------------------------------------------------------------------------------------------- recording
@pytest.mark.parametrize("agree_every,eog", [(3, None), (1000, None), (2, 7)])
def test_segments_equal_brute_force_continuations(agree_every, eog):
    draft = RuleDraft(eog)
    prompt = [3, 4, 5, 6]
    trace = make_trace(RuleDraft(), prompt, 40, agree_every)
    L = 6
    segs = rt.record_segments(draft, prompt, trace, L)
    assert [s[0] for s in segs] == sorted(s[0] for s in segs) and segs[0][0] == 0
    for t in range(len(trace)):
        toks, conf = rt.continuation(segs, t, L)
        want_t, want_c = brute_continuation(RuleDraft(eog), prompt + trace[:t], L)
        assert toks == want_t, t
        assert conf == pytest.approx(want_c, abs=1e-9)
    # the shift trick: a perfect agreement needs one segment, not one per position
    if agree_every == 1000 and eog is None:
        assert len(segs) == 1


def test_logits_row_has_the_recorded_argmax_and_confidence():
    for tok, conf in [(0, 0.3), (5, 0.01), (151000, 0.999), (3, 1.0), (7, 0.5)]:
        row = recorded.logits_row(tok, conf)
        assert int(np.argmax(row)) == tok
        assert top_probability(row) == pytest.approx(conf, abs=1e-4)


def test_logits_row_ranks_the_recorded_alternatives_next():
    for tok, conf, alts in [(4, 0.5, [(9, 0.3), (2, 0.1)]), (151000, 0.9, [(17, 0.05), (150999, 0.01)]), (0, 0.34, [(1, 0.33), (2, 0.33)])]:
        row = recorded.logits_row(tok, conf, alts)
        p = np.exp(row - row.max(), dtype=np.float64)
        p /= p.sum()
        order = np.argsort(-row, kind="stable")
        assert [int(x) for x in order[:3]] == [tok] + [t for t, _ in alts]
        assert p[tok] == pytest.approx(conf, abs=2e-3)
        for t, q in alts:
            assert p[t] == pytest.approx(q, abs=2e-3)


def test_alternatives_are_the_drafts_next_best_tokens(tiny):
    """Format 2: every drafted position carries the draft's next-best tokens after the drafted one, with their
    probabilities, as a real draft ranks them there; add_alternatives gives a format-1 recording the same."""
    from edgespec.llama.backend import Model
    from edgespec.config import ModelSpec
    from edgespec.decoding.sampling import greedy

    prompt = [ord(c) for c in "abc d ab"]
    with Model(ModelSpec(tiny["draft"], n_ctx=512, n_threads=1)) as draft:
        trace = [int(x) for x in rt.record_segments(draft, prompt, [ord("c")] * 20, 4)[0][1]] + [ord("z")] * 10
        segs = rt.record_segments(draft, prompt, trace, 4)
        assert all(len(seg) == 4 for seg in segs)
        for t in (0, 5, 17, 29):
            toks, conf, alts = rt.continuation_with_alternatives(segs, t, 4)
            assert alts is not None and len(alts) == len(toks)
            ctx = prompt + trace[:t]
            for j, d in enumerate(toks):
                row = draft.sync(ctx + toks[:j])[0].astype(np.float64)
                assert greedy(row.astype(np.float32), SamplingParams(temperature=0), ctx) == d
                p = np.exp(row - row.max())
                p /= p.sum()
                want = [int(x) for x in np.argsort(-row, kind="stable") if int(x) != d][:2]
                assert [x for x, _ in alts[j]] == want
                assert [q for _, q in alts[j]] == pytest.approx([p[x] for x in want], abs=1e-4)
        old = [seg[:3] for seg in segs]  # a format-1 recording of the same
        assert rt.continuation_with_alternatives(old, 3, 4)[2] is None
        assert rt.add_alternatives(draft, prompt, trace, old) == segs


# --------------------------------------------------------------------------------------------- predictor


@pytest.mark.parametrize("verify", [FLAT, CPU])
@pytest.mark.parametrize("agree_every", [2, 5, 1000])
def test_predicted_speedups_never_beat_the_oracle(verify, agree_every):
    data = synthetic_data(agree_every)
    cost = curves.Curve(verify=dict(verify), draft=0.3 * verify[1])
    res = speedup.predict(data, cost, SpecConfig())
    for s in list(res["suites"].values()) + [res["overall"]]:
        for k in replay.KINDS:
            assert s[k]["speedup"] <= s["oracle"][k] * (1 + 1e-9) + 1e-9, (k, s)
        assert s["oracle"]["model+ngram"] >= max(s["oracle"]["model"], s["oracle"]["ngram"]) - 1e-9
    if verify is FLAT and agree_every == 1000:  # a perfect draft on a flat curve pays a lot
        assert res["overall"]["model"]["speedup"] > 2.0
    if verify is CPU:  # the hardware gate: the engine does not run the draft model on such a curve
        assert not res["draft_model_pays"]
        assert res["overall"]["model"]["speedup"] == pytest.approx(1.0)


def test_depth_scale_makes_deep_decodes_dearer():
    table = {"verify": {"16": {"1": 1.0, "8": 1.0}, "116": {"1": 2.0, "8": 1.5}}, "draft": {"16": 1.0, "116": 3.0}}
    cost = curves.Curve(verify=dict(CPU), draft=0.01, depth_scale=table)
    assert cost.verify_factor(1, 16) == 1.0 and cost.verify_factor(1, 66) == pytest.approx(1.5)
    assert cost.verify_factor(8, 116) == pytest.approx(1.5) and cost.verify_factor(4, 1000) == pytest.approx(2.0 - 0.5 * 3 / 7)
    assert cost.draft_factor(0) == 1.0 and cost.draft_factor(1000) == 3.0
    data = synthetic_data(3)
    flat = speedup.predict(data, curves.Curve(verify=dict(CPU), draft=0.01), SpecConfig())
    deep = speedup.predict(data, cost, SpecConfig())
    assert deep["overall"]["plain_seconds"] > 1.2 * flat["overall"]["plain_seconds"]


def test_oracle_dynamic_programming_by_hand():
    cost = curves.Curve(verify={1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0}, draft=0.0)
    # proposals of the model accept 3 tokens everywhere: 8 tokens in two cycles of 4
    assert oracle.oracle_seconds(8, cost, [3] * 8, None) == pytest.approx(2.0)
    # nothing accepted: plain decoding
    assert oracle.oracle_seconds(5, cost, [0] * 5, [0] * 5) == pytest.approx(5.0)
    # a costly draft that does not pay is never used
    costly = curves.Curve(verify={1: 1.0, 2: 1.0}, draft=5.0)
    assert oracle.oracle_seconds(4, costly, [1] * 4, None) == pytest.approx(4.0)


def test_fitted_run_table_is_the_best_table_and_below_the_oracle():
    """fitted_run_table against brute force over every table (2 buckets used, k <= 3), on a made-up proposal
    sequence whose copies are long at long runs and short at short ones."""
    import itertools

    from edgespec.drafting.estimators import MatchLengthEstimator

    cost = curves.Curve(verify={1: 1.0, 2: 1.5, 3: 1.9, 4: 2.2}, draft=0.0)
    # (run, proposed, accepted): run 2 proposals are mostly wrong, run 8 ones mostly right
    pattern = [(-1, 0, 0), (2, 3, 0), (2, 3, 1), (8, 3, 3), (8, 3, 3), (8, 3, 2), (2, 3, 0)]
    props = (pattern * 9)[:60]
    traces = [(10, props)]
    sec, table = oracle.fitted_run_table(traces, cost, k_max=3)
    edges = MatchLengthEstimator.BUCKET_EDGES
    b2, b8 = MatchLengthEstimator().bucket(2), MatchLengthEstimator().bucket(8)

    def seconds(k2: int, k8: int) -> float:
        t, total = 0, 0.0
        while t < len(props):
            run, n_tok, acc = props[t]
            k = 0 if run < 0 else min(k2 if run == 2 else k8, n_tok, len(props) - t - 1)
            total += cost.verify[k + 1]
            t += min(k, acc) + 1
        return total

    brute = min(seconds(k2, k8) for k2, k8 in itertools.product(range(4), repeat=2))
    assert sec == pytest.approx(brute)
    assert table[edges[b8]] > table[edges[b2]]
    assert sec <= len(props) * cost.verify[1]  # never worse than plain (the all-zero table)
    bound = oracle.oracle_seconds(len(props), cost, None, [acc for _, _, acc in props])
    assert bound <= sec + 1e-9


@pytest.mark.parametrize("deep", [False, True])
@pytest.mark.parametrize("verify", [FLAT, CPU])
def test_rule_seconds_equal_the_replay_of_fixed_drafts_and_the_fitted_rule_is_bounded(verify, deep):
    """rule_seconds charges what the replay charges (decodes dearer with the context depth too): with a fixed draft
    length (no decisions) the engine's model and ngram drafters are the rules (K = 8, no stop, no lookup) and (lookup
    always, up to 8); the fitted rule is at least as fast as either, as plain decoding, and never faster than the
    oracle."""
    data = synthetic_data(3, prompts=2)
    table = {"verify": {"8": {"1": 1.0, "8": 1.0}, "80": {"1": 1.6, "8": 1.3}}, "draft": {"8": 1.0, "80": 2.0}} if deep else None
    cost = curves.Curve(verify=dict(verify), draft=0.3 * verify[1], overhead=0.01 * verify[1], depth_scale=table)
    fixed = SpecConfig(draft_max=8, adaptive=False, ngram_n_min=1)
    def replayed(kind: str | None) -> float:  # the replay's decode seconds over the prompts, unrounded
        state = replay.new_state(cost)
        return sum(replay.run_one(rec, data, kind, cost, state, fixed)[0].decode_seconds for rec in data["prompts"])

    prompts = []
    for rec in data["prompts"]:
        first = replay.run_one(rec, data, None, cost, replay.new_state(cost), fixed)[1]
        prompts.append((len(rec["prompt"]), first, oracle.model_proposals(rec, data, 8), oracle.ngram_proposals(rec, fixed, 8)))
    model = oracle.rule_seconds(prompts, cost, K=8, theta=0.0, R=1 << 30, Kn=8)
    ngram = oracle.rule_seconds(prompts, cost, K=0, theta=0.0, R=0, Kn=8)
    assert model == pytest.approx(replayed("model"), rel=1e-9)
    assert ngram == pytest.approx(replayed("ngram"), rel=1e-9)
    best, rule = oracle.fitted_rule(prompts, cost)
    plain = oracle.rule_seconds(prompts, cost, K=0, theta=0.0, R=1 << 30, Kn=1)
    assert plain == pytest.approx(replayed(None), rel=1e-9)
    assert best <= min(model, ngram, plain) + 1e-12
    n = [len(rec["trace"]) for rec in data["prompts"]]
    bound = sum(oracle.oracle_seconds(k, cost, [r for _, r, _ in p[2]], [a for _, _, a in p[3]], p[1], p[0])
                 for k, p in zip(n, prompts))
    assert bound <= best + 1e-9
    fit = speedup.predict(data, cost, SpecConfig(), fit_rules=True)
    for s in fit["suites"].values():
        assert s["fitted_rule"]["speedup"] <= s["oracle"]["model+ngram"] * (1 + 1e-9)


def test_python_time_charges_the_replays_own_work():
    """--python-time: the virtual clock also advances by the wall time spent outside the fakes' modelled calls, so a
    replay on a curve whose model calls cost nothing still takes time, and never less than without it."""
    clock = curves.Clock(real=True)
    a = clock.perf_counter()
    sum(range(100_000))
    assert clock.perf_counter() > a and curves.Clock().perf_counter() == 0.0
    data = synthetic_data(3, prompts=1)
    free = {1: 1e-12, 64: 1e-12}
    rec = data["prompts"][0]
    for kind in (None, "model+ngram"):
        modelled = curves.Curve(verify=dict(free), draft=1e-12)
        timed = curves.Curve(verify=dict(free), draft=1e-12, python_time=True)
        s0, _ = replay.run_one(rec, data, kind, modelled, replay.new_state(modelled), SpecConfig())
        s1, _ = replay.run_one(rec, data, kind, timed, replay.new_state(timed), SpecConfig())
        assert s0.decode_seconds < 1e-6 < s1.decode_seconds, kind
    assert curves.load_curve(RESEARCH / "data" / "curve_gpu_flat.json").describe()["python_time"] is False


def test_curve_files(tmp_path):
    plain = tmp_path / "c.json"
    plain.write_text(json.dumps({"verify": {"1": 0.01, "4": 0.02}, "draft": 0.004, "overhead": 0.001}))
    c = curves.load_curve(plain)
    assert c.verify == {1: 0.01, 4: 0.02} and c.draft == 0.004 and c.overhead == 0.001
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"costs": {"calibration": {"source": "cache", "verify": {"1": 0.05, "2": 0.08}, "draft": 0.02}}}))
    assert curves.load_curve(bench).verify == {1: 0.05, 2: 0.08}
    cache = tmp_path / "calibration.json"
    cache.write_text(json.dumps({"format": 2, "entries": {
        "a": {"verify": {"1": 0.1}, "draft": 0.0, "when": 1, "used": 1},
        "b": {"verify": {"1": 0.2}, "draft": 0.0, "when": 1, "used": 5}}}))
    assert curves.load_curve(cache).verify == {1: 0.2}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"verify": {"0": 1.0}}))
    with pytest.raises(ValueError):
        curves.load_curve(bad)
    flat = curves.load_curve(RESEARCH / "data" / "curve_gpu_flat.json")
    assert flat.verify[64] == pytest.approx(1.1 * flat.verify[1], rel=1e-3)


def test_replay_reproduces_a_real_run_on_tiny_models(tiny):
    """Fixed draft length (no timing-dependent decision): the replay's cycle counts equal the real loop's."""
    from edgespec.llama.backend import Model
    from edgespec.config import ModelSpec
    from edgespec.runtime.speculate import speculate
    from edgespec.drafting import make_speculator
    from edgespec.stats import GenerationStats

    prompt = [ord(c) for c in "abc d ab"]
    n = 48
    sampling = SamplingParams(temperature=0)
    with Model(ModelSpec(tiny["target"], n_ctx=512, n_threads=1)) as target, \
            Model(ModelSpec(tiny["draft"], n_ctx=512, n_threads=1)) as draft:
        plain, data = record_tiny(target, draft, prompt, n)
        for kind in ("model", "ngram", "model+ngram"):
            spec = SpecConfig(draft_max=4, adaptive=False, ngram_n_min=1)
            draft.reset()
            target.reset()
            real = GenerationStats()
            sp = make_speculator(kind, spec, sampling, CostModel(FLAT, c_draft=0.001), draft)
            out = [t for st in speculate(target, prompt, sampling, np.random.default_rng(0), max_tokens=n, speculator=sp, stats=real)
                   for t in st.tokens]
            assert out == plain
            rep, _ = replay.run_one(data["prompts"][0], data, kind, curves.Curve(verify=dict(FLAT), draft=0.001), replay.new_state(
                curves.Curve(verify=dict(FLAT), draft=0.001)), spec)
            assert (rep.n_cycles, rep.n_drafted, rep.n_accepted) == (real.n_cycles, real.n_drafted, real.n_accepted), kind
            assert rep.n_drafted > 0


def test_replay_reproduces_a_real_run_of_the_suffix_drafters_on_tiny_models(tiny, monkeypatch):
    """The suffix drafters verify token trees: with a fixed shape the replay's cycles, nodes and accepted tokens equal a
    real run's on tiny models (target loaded with tree sequences, a fresh memory on both sides)."""
    from edgespec.llama.backend import Model
    from edgespec.config import ModelSpec
    from edgespec.runtime.speculate import speculate
    from edgespec.drafting import make_speculator
    from edgespec.stats import GenerationStats
    from edgespec.drafting.suffix_index import SuffixIndex

    prompt = [ord(c) for c in "abc d ab abd abc ab"]
    n = 48
    sampling = SamplingParams(temperature=0)
    spec = SpecConfig(draft_max=4, adaptive=False, tree_nodes=6, tree_width=2)
    with Model(ModelSpec(tiny["target"], n_ctx=512, n_threads=1), tree_paths=spec.tree_nodes) as target, \
            Model(ModelSpec(tiny["draft"], n_ctx=512, n_threads=1)) as draft:
        plain, data = record_tiny(target, draft, prompt, n)
        trees = 0
        tree_decodes = []
        orig = recorded.TraceTarget.decode_tree
        monkeypatch.setattr(recorded.TraceTarget, "decode_tree", lambda self, *a: (tree_decodes.append(len(a[0])), orig(self, *a))[1])
        for kind in replay.TREE_KINDS:
            draft.reset()
            target.reset()
            real = GenerationStats()
            sp = make_speculator(kind, spec, sampling, CostModel(FLAT, c_draft=0.001), draft, memory=SuffixIndex())
            out = []
            for st in speculate(target, prompt, sampling, np.random.default_rng(0), max_tokens=n, speculator=sp, stats=real):
                out += st.tokens
            assert out == plain
            curve = curves.Curve(verify=dict(FLAT), draft=0.001)
            rep, _ = replay.run_one(data["prompts"][0], data, kind, curve, replay.new_state(curve), spec)
            assert (rep.n_cycles, rep.n_drafted, rep.n_accepted) == (real.n_cycles, real.n_drafted, real.n_accepted), kind
            assert rep.source_counts == real.source_counts and rep.source_counts.get("suffix"), kind
            trees += real.n_drafted
        assert trees > 0 and max(tree_decodes) > 2  # trees were verified (not only chains)


def test_the_replay_of_draft_model_trees_stays_below_the_tree_oracle(tiny):
    """Format-2 traces (the draft's alternatives recorded) on a flat curve: the draft model's chains carry siblings,
    the replay's output is still the trace (run_one checks it), siblings are verified and kept, and neither the policy
    nor the chain oracle beats the tree oracle."""
    from edgespec.llama.backend import Model
    from edgespec.config import ModelSpec

    prompt = [ord(c) for c in "abc d ab abd abc"]
    with Model(ModelSpec(tiny["target"], n_ctx=512, n_threads=1)) as target, \
            Model(ModelSpec(tiny["draft"], n_ctx=512, n_threads=1)) as draft:
        _, data = record_tiny(target, draft, prompt, 64)
    data["format"] = 2
    curve = curves.Curve(verify=dict(FLAT), draft=0.001)
    assert replay.replay_tree_paths("model", SpecConfig(), data) == 5
    assert replay.replay_tree_paths("model", SpecConfig(draft_siblings=0), data) == 0
    assert replay.replay_tree_paths("model", SpecConfig(), {**data, "format": 1}) == 0
    res = speedup.predict(data, curve, SpecConfig(draft_max=8))
    o = res["overall"]
    assert o["oracle"]["model tree"] >= o["oracle"]["model"] - 1e-9
    assert o["oracle"]["model+ngram tree"] >= o["oracle"]["model+ngram"] - 1e-9
    assert o["model"]["speedup"] <= o["oracle"]["model tree"] + 1e-9
    assert o["model+ngram"]["speedup"] <= o["oracle"]["model+ngram tree"] + 1e-9
    hits = oracle.model_sibling_hits(data["prompts"][0], data, oracle.model_proposals(data["prompts"][0], data, 8))
    assert hits is not None and any(hits)  # the tiny draft's second choice is sometimes the target's
    chains = speedup.predict(data, curve, SpecConfig(draft_max=8, draft_siblings=0))
    assert chains["overall"]["oracle"]["model"] == o["oracle"]["model"]
    assert o["model"]["drafted"] > chains["overall"]["model"]["drafted"]  # the trees' extra nodes


def test_committed_traces_file():
    path = RESEARCH / "data" / "traces.json.gz"
    if not path.exists():
        pytest.skip("no recorded traces yet")
    assert path.stat().st_size < 2 * 2**20
    data = rt.load_traces(path)
    assert data["draft_len"] >= 8 and data["n_vocab"] > 150_000 and data["eog_ids"]
    for rec in data["prompts"]:
        for t in range(len(rec["trace"])):
            toks, conf = rt.continuation(rec["segments"], t, data["draft_len"])
            assert toks and len(toks) == len(conf) and all(0 < c <= 1 for c in conf)
    res = speedup.predict(data, curves.load_curve(RESEARCH / "data" / "curve_gpu_flat.json"), SpecConfig(), [data["prompts"][0]["suite"]])
    assert res["overall"]["model+ngram"]["speedup"] > 1.0


# --------------------------------------------------------------------------------------------- synthetic models
def test_synthetic_model_from_a_spec(tiny, tmp_path):
    from edgespec.bench import synth as sm

    from edgespec.llama.backend import Model
    from edgespec.config import ModelSpec
    from support.tiny import write_tiny_model

    real = write_tiny_model(tmp_path / "real.gguf", seed=3, d_model=256, n_layers=2, d_ff=512)
    spec_path = tmp_path / "spec.json.xz"
    spec = sm.write_spec({"target": str(real)}, spec_path)
    loaded = sm.load_spec(spec_path)
    assert loaded["models"]["target"]["tensors"] == spec["models"]["target"]["tensors"]
    res = sm.make(loaded, "target", tmp_path / "synth.gguf", ftype="Q4_K_M", threads=1)
    assert not list(tmp_path.glob("synth-*")), "the F16 intermediate must be deleted"
    assert "Q4_K" in res["types"] or "Q5_0" in res["types"] or "Q8_0" in res["types"]
    a = {t["name"]: t["shape"] for t in sm.read_model_spec(tmp_path / "synth.gguf")[0]["tensors"]}
    assert a == {t["name"]: t["shape"] for t in spec["models"]["target"]["tensors"]}
    with Model(ModelSpec(str(tmp_path / "synth.gguf"), n_ctx=64, n_threads=1)) as m:
        logits = m.decode([1, 2, 3], 0, (-1,))
        assert np.isfinite(logits).all() and m.n_vocab == len(spec["tokenizer"]["tokenizer.ggml.tokens"]["value"])


def test_committed_pair_spec_has_the_real_shapes():
    from edgespec.bench import synth as sm

    spec = sm.load_spec(DEFAULT_SPEC)
    kv = {role: {k: v for k, _, _, v in m["kv"]} for role, m in spec["models"].items()}
    assert (kv["target"]["qwen2.block_count"], kv["target"]["qwen2.embedding_length"], kv["target"]["qwen2.feed_forward_length"],
            kv["target"]["qwen2.attention.head_count"], kv["target"]["qwen2.attention.head_count_kv"]) == (28, 1536, 8960, 12, 2)
    assert (kv["draft"]["qwen2.block_count"], kv["draft"]["qwen2.embedding_length"], kv["draft"]["qwen2.feed_forward_length"],
            kv["draft"]["qwen2.attention.head_count"], kv["draft"]["qwen2.attention.head_count_kv"]) == (24, 896, 4864, 14, 2)
    assert len(spec["tokenizer"]["tokenizer.ggml.tokens"]["value"]) == 151936
    assert sum(spec["models"]["target"]["types"].values()) == len(spec["models"]["target"]["tensors"]) == 339


# --------------------------------------------------------------------------------------------- the device script
@pytest.mark.slow
def test_gpu_check_quick_runs_end_to_end(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path / "out"), "GPU_CHECK_WORK": str(tmp_path / "work"), "GPU_CHECK_QUICK": "1",
           "GPU_CHECK_BUDGET": "300", "PYTHON": sys.executable}
    r = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh")], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads((tmp_path / "out" / "gpu_check.json").read_text())
    st = {k: v["status"] for k, v in res["steps"].items()}
    assert st["build"] in ("skipped", "ok", "cached")
    assert st["synth"] == st["tests"] == st["curve"] == st["predict"] == "ok", (st, r.stderr[-3000:])
    assert "verify" in res["steps"]["curve"]["result"]
    assert isinstance(res["steps"]["predict"]["result"], list)
    assert (tmp_path / "out" / "gpu_check.txt").read_text().startswith("gpu_check:")
    assert not list((tmp_path / "work" / "models").glob("*-f16.gguf"))


def test_gzip_roundtrip_of_the_trace_format(tmp_path):
    data = synthetic_data(3, n=20, prompts=1)
    p = tmp_path / "t.json.gz"
    with gzip.open(p, "wt") as f:
        json.dump(data, f)
    assert rt.load_traces(p)["prompts"][0]["trace"] == data["prompts"][0]["trace"]


# --------------------------------------------------------------------------------------------- profiles (issue 23)
def test_curve_profiles_load_and_name_their_sources():
    files = sorted(DEFAULT_PROFILES.glob("*.json"))
    assert len(files) >= 7
    for f in files:
        raw = json.loads(f.read_text())
        assert raw.get("source") and raw.get("assumptions") and raw.get("name"), f.name
        c = curves.load_curve(f)
        assert set(range(1, 10)) <= set(c.verify) and max(c.verify) >= 16 and c.draft > 0, f.name
        v = VerifyCurve(c.verify)
        assert all(v(n + 1) >= v(n) for n in range(1, 17)), f.name
    a100 = curves.load_curve(DEFAULT_PROFILES / "a100_q8_0.json")
    assert a100.verify[8] / a100.verify[1] < 2.0 and a100.verify[9] / a100.verify[1] == pytest.approx(3.9)


def test_draft_relative_rescales_the_draft_and_its_catch_up_curve():
    c = curves.Curve(verify=dict(FLAT), draft=0.004, draft_verify={1: 0.004, 4: 0.006})
    r = c.with_draft_relative(0.8)
    assert r.draft == pytest.approx(0.008) and r.draft_verify == {1: pytest.approx(0.008), 4: pytest.approx(0.012)}
    assert c.draft == 0.004 and "0.8" in r.name
    with pytest.raises(ValueError):
        c.with_draft_relative(-1)


def test_profile_rows_and_goals():
    data = synthetic_data(5)
    rows = speedup.profile_rows(data, [("flat", curves.Curve(verify=dict(FLAT), draft=0.003)), ("cpu", curves.Curve(verify=dict(CPU), draft=0.02))],
                           [0.3, 0.8], SpecConfig())
    assert len(rows) == 2 * 2 * 3  # 2 profiles x 2 draft costs x (2 suites + overall)
    for r in rows:
        assert r["default"] <= r["oracle_default"] * (1 + 1e-9) and r["model"] <= r["oracle_model"] * (1 + 1e-9)
    goals = speedup.goals_check(rows)
    assert set(goals) == {"flat", "cpu"} and all(isinstance(g["met"], bool) for g in goals.values())
    text = speedup.format_profiles(rows)
    assert "flat" in text and "goals" in text
    made = [{"profile": "gpu", "draft": 0.3, "suite": s, "default": 0.985, "oracle_default": 1.0} for s in ("a", "overall")]
    assert speedup.goals_check(made)["gpu"]["met"]  # >= 0.98x plain and >= 0.90x the oracle
    made = [dict(r, profile="apple_metal_q4") for r in made]
    assert not speedup.goals_check(made)["apple_metal_q4"]["met"]  # where nothing pays: >= 0.99x plain


def test_streams_replay_batches_and_drafts_shorter_beside_others():
    """predict_streams (issue 34): 4 recorded code-completion prompts replayed together through the engine's loop on
    the RTX 3090 profile (every stream's output checked against its trace inside): batching plain decoding's rows gains
    more than 2x over one after another, and a draft model beside three others drafts less per cycle than alone; on
    this machine's near-linear profile batching gains little."""
    from edgespec.config import SpecConfig

    data = rt.load_traces(DEFAULT_TRACES)
    gpu = replay.predict_streams(data, curves.load_curve(DEFAULT_PROFILES / "rtx3090.json"), SpecConfig(), 4, ["code-completion"], ["model"])
    row = gpu["suites"]["code-completion"]
    assert row["plain"]["ratio"] > 2.0
    alone, together = row["model"]["drafted_per_cycle"]
    assert together < alone
    cpu = replay.predict_streams(data, curves.load_curve(DEFAULT_PROFILES / "this_machine_epyc2.json"), SpecConfig(), 4, ["code-completion"], ["model"])
    assert cpu["suites"]["code-completion"]["plain"]["ratio"] < 1.5
