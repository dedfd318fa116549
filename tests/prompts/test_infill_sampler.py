"""llama.cpp's `infill` sampler (infill.infill_filter, SamplingParams.infill).

* The pure function against a line-by-line transcription of llama.cpp's llama_sampler_infill_apply followed by its
  `dist` (vendor/llama.cpp/src/llama-sampler.cpp in llama-cpp-python 0.3.36): hand-made cases for each branch and
  threshold, then every candidate set of small vocabularies with shared prefixes, equal texts, empty (control) texts
  and EOG tokens under many random logits.
* warp applies it last; greedy rows are unchanged.
* Through the real llama.cpp on tiny models whose likely tokens share prefixes (" ", " t", " the", "h", "he", ...):
  speculative output == plain output with infill on, greedy and seeded, for a draft model, the n-gram lookup and
  suffix trees, and the infill step really changes the text.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from edgespec.llama.backend import Model
from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.drafting.costs import CostModel
from edgespec.errors import ConfigError
from edgespec.prompts.infill import InfillVocab, infill_filter
from edgespec.drafting.ngram import NgramIndex
from edgespec.drafting.lookup_policy import NgramPolicy
from edgespec.drafting.model_policy import Controller
from edgespec.decoding.sampling import PositionalUniforms, warp
from edgespec.runtime.speculate import speculate
from edgespec.drafting import LookupSpeculator, ModelSpeculator
from edgespec.stats import GenerationStats

from support.tiny import token_id, write_tiny_model

NEG_INF = float("-inf")


# --------------------------------------------------------------------------------------------- the transcription
def llama_cpp_infill(cands, pieces, eog, eot, eos):
    """llama_sampler_infill_apply then llama_sampler_dist_apply's distribution, transcribed statement by statement
    (float64; the sort's ties, which std::partial_sort leaves open, go to the lower id). cands: (id, logit) of the
    tokens the earlier samplers left. Returns {id: probability} for the ids dist can draw."""
    data = [[t, lg, 0.0] for t, lg in sorted(cands, key=lambda c: (-c[1], c[0]))]  # llama_token_data {id, logit, p}
    # llama_sampler_softmax_impl(cur_p, true)
    max_l = data[0][1]
    cum_sum = 0.0
    for d in data:
        d[2] = math.exp(d[1] - max_l)
        cum_sum += d[2]
    for d in data:
        d[2] /= cum_sum
    p_txt_sum = 0.0
    p_eog_sum = 0.0
    for d in data:
        if d[0] in eog:
            p_eog_sum += d[2]
        else:
            p_txt_sum += d[2]
    if 3 * p_eog_sum * len(data) > p_txt_sum:
        data = [d for d in data if d[0] in eog]
        return _dist(data)
    for i0 in range(len(data)):
        for i1 in range(len(data)):
            if data[i0][1] == NEG_INF:
                break
            if i0 == i1 or data[i1][1] == NEG_INF:
                continue
            buf0, buf1 = pieces[data[i0][0]], pieces[data[i1][0]]
            len0, len1 = len(buf0), len(buf1)
            if len0 > 0 and len0 <= len1 and buf0 == buf1[:len0]:
                dst, src = i0, i1
                if data[i1][2] > data[i0][2]:
                    dst, src = src, dst
                data[dst][2] += data[src][2]
                data[src][1] = NEG_INF
                data[src][2] = 0.0
    n_non_eog = 0
    p_sum = 0.0
    thold = 0.2
    kept = []
    for d in data:
        is_eog = d[0] in eog
        if d[2] < thold and not is_eog:
            continue
        if not is_eog:
            n_non_eog += 1
        p_sum += d[2]
        kept.append(d)
    data = kept
    if n_non_eog == 0:
        return {eot if eot is not None else eos: 1.0}
    for d in data:
        d[2] /= p_sum
    thold = 1.0 / (n_non_eog + 1)
    data = [d for d in data if not (d[2] < thold and d[0] not in eog)]
    return _dist(data)


def _dist(data):
    """llama_sampler_dist_apply: a softmax of the logits of what is left (the p written before are not read)."""
    max_l = max(d[1] for d in data)
    w = {d[0]: math.exp(d[1] - max_l) for d in data if d[1] != NEG_INF}
    total = sum(w.values())
    return {t: v / total for t, v in w.items() if v > 0.0}


def edgespec_infill(cands, pieces, eog, end):
    """infill_filter on the same candidates, as warp hands them over: a distribution over the vocabulary."""
    logits = np.full(len(pieces), -np.inf)
    for t, lg in cands:
        logits[t] = lg
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    out = infill_filter(probs, InfillVocab(pieces, frozenset(eog), end))
    assert out.shape == probs.shape and math.isclose(out.sum(), 1.0, rel_tol=1e-12)
    return {int(t): float(out[t]) for t in np.flatnonzero(out)}


def assert_same(got, want):
    assert set(got) == set(want), (got, want)
    for t in want:
        assert math.isclose(got[t], want[t], rel_tol=1e-9), (got, want)


# Text pieces with shared prefixes, an equal pair, control tokens (b'': llama.cpp writes no text for them without
# special) and two EOG tokens (7: the EOT, 8: the EOS, both with empty text).
PIECES = [b"a", b"ab", b"abc", b"b", b" t", b" ", b" the", b"", b"", b"ab", b"x", b""]
EOG = {7, 8}
EOT, EOS = 7, 8


def both(cands, pieces=PIECES, eog=EOG, eot=EOT, eos=EOS):
    want = llama_cpp_infill(cands, pieces, eog, eot, eos)
    got = edgespec_infill(cands, pieces, eog, eot if eot is not None else eos)
    assert_same(got, want)
    return got


def lg(*ps):
    return [math.log(p) for p in ps]


# --------------------------------------------------------------------------------------------- hand-made cases
def test_eog_mass_above_a_third_of_the_text_mass_per_candidate_keeps_only_eog():
    # 3 candidates: 3 * 3 * p_eog > p_txt  <=>  p_eog > p_txt / 9
    t = lg(0.5, 0.39, 0.11)
    got = both([(3, t[0]), (10, t[1]), (8, t[2])])
    assert got == {8: 1.0}
    # just below: the EOG token stays beside the text (every EOG token is always kept)
    t = lg(0.5, 0.41, 0.09)
    got = both([(3, t[0]), (10, t[1]), (8, t[2])])
    assert set(got) == {3, 10, 8}


def test_merged_mass_decides_what_stays_but_not_how_likely():
    # "a" 0.3 absorbs "ab" 0.25 (the lower p gives): "a" 0.55, "b" 0.45 pass both thresholds; "ab" is dropped.
    t = lg(0.45, 0.3, 0.25)
    got = both([(3, t[0]), (0, t[1]), (1, t[2])])
    assert set(got) == {0, 3}
    assert math.isclose(got[0], 0.3 / 0.75) and math.isclose(got[3], 0.45 / 0.75)  # the original probabilities


def test_the_longer_token_absorbs_the_prefix_when_it_is_more_likely():
    t = lg(0.4, 0.25, 0.35)
    got = both([(1, t[0]), (0, t[1]), (3, t[2])])  # "ab" 0.4 takes "a" 0.25
    assert set(got) == {1, 3} and math.isclose(got[1], 0.4 / 0.75)


def test_no_text_token_above_one_fifth_ends_the_completion_with_the_eot():
    t = lg(*([0.19] * 5 + [0.05]))
    cands = list(zip([0, 3, 4, 10, 2, 11], t))  # "a" and "abc" merge: 0.38, the one text token kept
    assert set(both(cands)) == {0}
    cands = list(zip([3, 5, 10, 11, 0, 7], lg(*([0.19] * 5 + [0.01]))))  # unrelated texts, an EOG below its share
    assert both(cands) == {EOT: 1.0}
    assert both(cands, eot=None) == {EOS: 1.0}  # no EOT in the vocabulary: the EOS


def test_second_threshold_is_one_over_kept_text_tokens_plus_one():
    # three text tokens pass 0.2 (0.4, 0.35, 0.25): thold 1/4 keeps all; with an EOG token kept beside them the
    # renormalised 0.25 falls under it
    got = both(list(zip([3, 5, 10], lg(0.4, 0.35, 0.25))))
    assert set(got) == {3, 5, 10}
    got = both(list(zip([3, 5, 10, 8], lg(0.38, 0.33, 0.24, 0.05))))
    assert set(got) == {3, 5, 8}


def test_equal_texts_and_control_tokens():
    # 1 and 9 are both "ab": the first in order absorbs the other; control tokens (b'') never merge
    got = both(list(zip([1, 9, 11, 3], lg(0.3, 0.3, 0.2, 0.2))))
    assert 1 in got and 9 not in got
    got = both(list(zip([11, 7, 3], lg(0.5, 0.02, 0.48))))
    assert set(got) == {11, 7, 3}


def test_a_chain_of_prefixes_merges_in_llama_cpps_order():
    # " " < " t" < " the": the order of the candidates decides who absorbs whom
    for ps in itertools.permutations([0.3, 0.25, 0.2, 0.15, 0.1]):
        both(list(zip([5, 4, 6, 0, 2], lg(*ps))))


def test_one_hot_rows_come_back_unchanged():
    for t in (0, 7, 10):
        p = np.zeros(len(PIECES))
        p[t] = 1.0
        assert np.array_equal(infill_filter(p, InfillVocab(PIECES, frozenset(EOG), EOT)), p)


# --------------------------------------------------------------------------------------------- enumeration
ALPH_PIECES = [b"", b"a", b"b", b"aa", b"ab", b"ba", b"aab", b"aba", b"abb", b"a", b"", b"bb", b"b"]


@pytest.mark.parametrize("eog", [frozenset(), frozenset({0}), frozenset({0, 10}), frozenset({1, 10})])
def test_every_candidate_set_matches_the_transcription(eog):
    """Every candidate set of 1..6 tokens of a 13-token vocabulary over {a, b} (prefix chains, equal texts, empty
    texts; one EOG set gives an EOG token a text), under random logits on several scales."""
    rng = np.random.default_rng(len(eog))
    ids = range(len(ALPH_PIECES))
    end = 0 if 0 in eog else 10
    n_cases = 0
    outcomes = set()
    for size in range(1, 7):
        for subset in itertools.combinations(ids, size):
            for scale in (0.05, 0.3, 1.5, 4.0):  # near-flat to peaked
                logits = rng.standard_normal(size) * scale
                got = both(list(zip(subset, logits)), ALPH_PIECES, set(eog), 0 if 0 in eog else None, 10)
                if got == {end: 1.0} and size >= 5:
                    outcomes.add("ended")
                elif eog and set(got) <= eog:
                    outcomes.add("eog only")
                else:
                    outcomes.add("merged" if len(got) < size - sum(t in eog for t in subset) else "text")
                n_cases += 1
    assert n_cases > 6000
    assert outcomes >= {"ended", "merged", "text"} | ({"eog only"} if eog else set())  # every branch was taken


# --------------------------------------------------------------------------------------------- warp
def test_warp_applies_infill_last_and_needs_the_vocabulary():
    vocab = InfillVocab(ALPH_PIECES, frozenset({0}), 0)
    rng = np.random.default_rng(5)
    for _ in range(50):
        logits = rng.standard_normal(len(ALPH_PIECES)).astype(np.float32) * 2
        for base in (SamplingParams(temperature=0.7), SamplingParams(temperature=1.0, top_k=6, top_p=0.9, min_p=0.02)):
            on = SamplingParams(**{**base.__dict__, "infill": True})
            assert np.array_equal(warp(logits, on, (), vocab), infill_filter(warp(logits, base), vocab))
    greedy = SamplingParams(temperature=0, infill=True)
    assert np.array_equal(warp(logits, greedy), warp(logits, SamplingParams(temperature=0)))  # no vocabulary needed
    with pytest.raises(ValueError, match="infill_vocab"):
        warp(logits, SamplingParams(infill=True))
    with pytest.raises(ConfigError, match="infill"):
        SamplingParams(infill=1)  # type: ignore[arg-type]


def test_prefixes_lists_shorter_and_equal_texts():
    v = InfillVocab(ALPH_PIECES, frozenset(), 0)
    assert sorted(v.prefixes(6)) == [1, 3, 9]  # "aab": "a" twice, "aa"
    assert sorted(v.prefixes(1)) == [9] and v.prefixes(0) == () and v.prefixes(10) == ()
    assert sorted(v.prefixes(11)) == [2, 12]


# --------------------------------------------------------------------------------------------- real models
# hot tokens whose texts share prefixes: " " < " t" < " the", "h" < "he", "i" < "in", "t", "a"
HOT = (token_id(" "), 256, 258, token_id("h"), 257, token_id("i"), 259, token_id("t"), token_id("a"))


@pytest.fixture(scope="module")
def prefix_models(tmp_path_factory):
    d = tmp_path_factory.mktemp("prefix")
    t = write_tiny_model(d / "t.gguf", seed=11, hot_tokens=HOT, hot_scale=0.6, name="tiny-prefix")
    dr = write_tiny_model(d / "d.gguf", seed=12, hot_tokens=HOT, hot_scale=0.6, layer_scale=0.4, name="tiny-prefix-d")
    target = Model(ModelSpec(str(t), n_ctx=512, n_batch=64, n_threads=1), tree_paths=8)
    draft = Model(ModelSpec(str(dr), n_ctx=512, n_batch=64, n_threads=1))
    yield {"target": target, "draft": draft, "paths": (t, dr)}
    target.close()
    draft.close()


def _run(target, ctx, sp, speculator=None, max_tokens=40, stats=None):
    rng = PositionalUniforms(sp.seed) if sp.seed is not None else np.random.default_rng(0)
    out = []
    for step in speculate(target, ctx, sp, rng, max_tokens=max_tokens, speculator=speculator, stats=stats):
        out.extend(step.tokens)
    return out


def _speculator(kind, models, sp):
    flat = CostModel({1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.3}, frozen=True)
    if kind == "draft":
        return ModelSpeculator(models["draft"], sp, Controller(SpecConfig(draft_max=4, adaptive=False), flat))
    if kind == "lookup":
        cost = CostModel({1: 1.0, 2: 1.1, 4: 1.3, 8: 1.8, 16: 2.5}, frozen=True)
        return LookupSpeculator(NgramIndex(4, 1), NgramPolicy(SpecConfig(), cost))
    from edgespec.drafting.lookup_policy import TreePolicy
    from edgespec.drafting import SuffixSpeculator
    from edgespec.drafting.suffix_index import SuffixIndex

    return SuffixSpeculator(SuffixIndex(), TreePolicy(SpecConfig(adaptive=False, draft_max=4), flat, 8, 3, min_gain=0.0))


def test_the_vocabulary_from_llama_cpp(prefix_models):
    v = prefix_models["target"].infill_vocab()
    assert v is prefix_models["target"].infill_vocab()  # built once
    assert v.pieces[258] == b" the" and v.pieces[262] == b"" and v.end in v.eog  # control tokens: no text
    assert sorted(v.prefixes(258)) == [token_id(" "), 256]


PROMPTS = [[ord(c) for c in s] for s in ("the thin hat", " a tin", "hi", "ta ta ta ta", "in the heat the")]


@pytest.mark.parametrize("kind", ["draft", "lookup", "suffix"])
def test_speculative_equals_plain_with_infill_seeded(prefix_models, kind):
    target = prefix_models["target"]
    changed = drafted = 0
    for seed in range(4):
        for ctx in PROMPTS:
            sp = SamplingParams(temperature=1.0, top_k=40, top_p=0.9, seed=seed, infill=True)
            plain = _run(target, ctx, sp)
            stats = GenerationStats()
            assert _run(target, ctx, sp, _speculator(kind, prefix_models, sp), stats=stats) == plain, (kind, seed, ctx)
            drafted += stats.n_drafted
            changed += plain != _run(target, ctx, SamplingParams(temperature=1.0, top_k=40, top_p=0.9, seed=seed))
    assert drafted > 0 and changed > 0  # it drafted, and the infill step changed some outputs


@pytest.mark.parametrize("kind", ["draft", "lookup"])
def test_speculative_equals_plain_with_infill_greedy(prefix_models, kind):
    target = prefix_models["target"]
    for ctx in PROMPTS:
        sp = SamplingParams(temperature=0, infill=True)
        plain = _run(target, ctx, sp)
        assert plain == _run(target, ctx, SamplingParams(temperature=0))  # greedy: infill changes nothing
        assert _run(target, ctx, sp, _speculator(kind, prefix_models, sp)) == plain


def test_unseeded_speculative_rows_are_the_plain_ones(prefix_models):
    """Without a seed the exact rule runs on warp's p with infill, the same p as plain decoding: the first token's
    frequencies over many runs follow it (a coarse check; the distribution tests cover the rule)."""
    target = prefix_models["target"]
    ctx = PROMPTS[0]
    sp = SamplingParams(temperature=1.0, top_k=40, top_p=0.9, infill=True)
    row = target.sync(ctx)[0]
    p = warp(row, sp, ctx, target.infill_vocab())
    assert np.count_nonzero(p) < 9  # infill dropped some of the hot tokens
    spec = _speculator("draft", prefix_models, sp)
    rng = np.random.default_rng(7)
    counts: dict[int, int] = {}
    n = 400
    for _ in range(n):
        first = next(iter(speculate(target, ctx, sp, rng, max_tokens=2, speculator=spec))).tokens[0]
        counts[first] = counts.get(first, 0) + 1
    assert set(counts) <= set(np.flatnonzero(p).tolist())
    for t, c in counts.items():
        assert abs(c / n - p[t]) < 5 * math.sqrt(p[t] * (1 - p[t]) / n) + 1e-9
