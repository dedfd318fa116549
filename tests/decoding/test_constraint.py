"""Constrained generation (edgespec.decoding.constraint) through the real llama.cpp on tiny generated models.

* Validity: 1,000 seeded generations per constraint type (JSON schema, any JSON object, regex, choice, Lark grammar,
  GBNF grammar), speculative with forced drafts and a draft model, temperature 1: every output that ends (eos)
  parses / matches, and at least 95% end within max_tokens (bounded schemas: all of them).
* Distribution identity: the exact law of constrained generations (plain; a draft model with and without forced
  drafts; suffix-index trees after forced tokens) is enumerated on numpy fakes with the real Matcher in
  test_loop_laws.test_constrained_generations_are_exact. Here, on llama.cpp, one chi-square smoke test: a draft
  model + forced drafts at T = 1 against the exact masked distribution over the first 3 tokens (enumerated from the
  target alone with the same masks), **N = SMOKE_N = 5,000 sequences, significance 1e-3**, cells with expected count
  < 5 merged; a sequence outside the masked support fails at once. Fixed seed.
* Forced tokens: where the grammar allows one token only, the forced draft is accepted every time (1,000 runs,
  temperature 1.5: accepted == drafted exactly).
* Rollback: the masks of a chain / tree verify leave the matcher where it was; after generations with many
  rejections the matcher's state equals a fresh matcher advanced along the output.
* Greedy: speculative constrained output == plain constrained output token for token.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from edgespec.llama.backend import Model
from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.decoding.constraint import Constraint, ConstraintError, Matcher, apply_mask
from edgespec.drafting.costs import CostModel
from edgespec.drafting.model_policy import Controller
from edgespec.decoding.sampling import warp
from edgespec.runtime.constrained import chain_masks as _chain_masks, tree_masks as _tree_masks
from edgespec.runtime.speculate import speculate
from edgespec.drafting import ModelSpeculator
from edgespec.stats import GenerationStats
from edgespec.decoding.tree import TokenTree

from support.shared import chi_square
from support.tiny import token_id, write_tiny_model

SMOKE_N = 5_000
ALPHA = 1e-3
N_VALID = 1_000
FLAT = {1: 1.0, 2: 1.05, 4: 1.1, 8: 1.2, 16: 1.3}
PROMPT = [ord(c) for c in "abc d"]
EOS = 256 + 4 + 2  # <|im_end|> in the tiny vocabulary
# a target whose likely tokens are JSON's own characters (and the end token), so free JSON ends by itself
JSON_HOT = tuple(token_id(c) for c in '{}[]":,ab1 ') + (EOS,)


@pytest.fixture(scope="module")
def models(tiny, tmp_path_factory):
    d = tmp_path_factory.mktemp("json-tiny")
    jt = write_tiny_model(d / "json-target.gguf", seed=11, hot_tokens=JSON_HOT, name="json-target")
    jd = write_tiny_model(d / "json-draft.gguf", seed=12, hot_tokens=JSON_HOT, layer_scale=0.4, name="json-draft")
    opened = {
        "target": Model(ModelSpec(tiny["target"], n_ctx=512, n_batch=64, n_threads=1), tree_paths=8),
        "draft": Model(ModelSpec(tiny["draft"], n_ctx=512, n_batch=64, n_threads=1)),
        "json_target": Model(ModelSpec(jt, n_ctx=512, n_batch=64, n_threads=1)),
        "json_draft": Model(ModelSpec(jd, n_ctx=512, n_batch=64, n_threads=1)),
    }
    yield opened
    for m in opened.values():
        m.close()


def matcher(model: Model, c: Constraint) -> Matcher:
    return Matcher(c, model.constraint_vocab(), model.n_vocab)


def reset(m: Matcher) -> None:
    m.rollback(m.n_advanced)


def model_speculator(model, sp, k):
    spec = SpecConfig(draft_max=k, adaptive=False)
    return ModelSpeculator(model, sp, Controller(spec, CostModel(FLAT, c_draft=0.02, frozen=True)))


def suffix_speculator(memory):
    from edgespec.drafting.lookup_policy import TreePolicy
    from edgespec.drafting import SuffixSpeculator

    cost = CostModel(FLAT, frozen=True)
    return SuffixSpeculator(memory, TreePolicy(SpecConfig(adaptive=False, draft_max=4), cost, 8, 3, min_gain=0.0))


def run(target, ctx, sp, rng, max_tokens, constraint, speculator=None, stats=None, forced=True):
    out = []
    for step in speculate(
        target, ctx, sp, rng, max_tokens=max_tokens, speculator=speculator, stats=stats, constraint=constraint, forced_drafts=forced
    ):
        out.extend(step.tokens)
    return out


def text_of(model: Model, tokens: list[int]) -> str:
    return b"".join(model.token_bytes(t) for t in tokens if not model.is_eog(t)).decode("utf-8", "replace")


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    "make",
    [
        lambda: Constraint.regex("("),
        lambda: Constraint.json_schema({"type": "nonsense"}),
        lambda: Constraint.json_schema("{not json"),
        lambda: Constraint.grammar("start: undefined_rule"),
        lambda: Constraint.grammar("root ::= ("),
        lambda: Constraint.choice([]),
        lambda: Constraint.choice(["a", 3]),
        lambda: Constraint("xml"),
    ],
)
def test_invalid_constraints_are_one_line_errors(make):
    with pytest.raises(ConstraintError) as e:
        make()
    assert "\n" not in str(e.value) and str(e.value)


def test_a_regex_that_matches_nothing_is_refused_before_decoding(models):
    with pytest.raises(ConstraintError, match="allows no output"):
        matcher(models["target"], Constraint.regex("[^\\x00-\\U0010ffff]"))


# ------------------------------------------------------------------------------------------------ validity
BOUNDED_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 4},
        "n": {"type": "integer", "minimum": 0, "maximum": 99},
        "ok": {"type": "boolean"},
        "tag": {"enum": ["red", "green"]},
        "xs": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "maxItems": 3},
    },
    "required": ["name", "n", "ok", "tag", "xs"],
    "additionalProperties": False,
}
LARK = 'start: greeting " " name\ngreeting: "hi" | "hey"\nname: /[a-h]{1,5}/\n'
GBNF = 'root ::= ("yes" | "no") " " [a-h]{1,4}\n'


def _check_schema(obj):
    assert set(obj) == {"name", "n", "ok", "tag", "xs"}
    assert isinstance(obj["name"], str) and len(obj["name"]) <= 4
    assert isinstance(obj["n"], int) and 0 <= obj["n"] <= 99
    assert isinstance(obj["ok"], bool) and obj["tag"] in ("red", "green")
    assert isinstance(obj["xs"], list) and len(obj["xs"]) <= 3 and all(isinstance(x, int) and 0 <= x <= 9 for x in obj["xs"])


VALIDITY = {
    "json_schema": (Constraint.json_schema(BOUNDED_SCHEMA), lambda s: _check_schema(json.loads(s)), "json", 120),
    "json_object": (Constraint.json_object(), lambda s: isinstance(json.loads(s), dict) or pytest.fail(s), "json", 256),
    "regex": (Constraint.regex(r"[a-c]{2,4}-[0-9]{1,3}"), lambda s: re.fullmatch(r"[a-c]{2,4}-[0-9]{1,3}", s) or pytest.fail(s), "plain", 16),
    "choice": (Constraint.choice(["alpha", "beta", "gamma delta"]), lambda s: s in ("alpha", "beta", "gamma delta") or pytest.fail(s), "plain", 16),
    "lark": (Constraint.grammar(LARK), lambda s: re.fullmatch(r"(hi|hey) [a-h]{1,5}", s) or pytest.fail(s), "plain", 16),
    "gbnf": (Constraint.grammar(GBNF), lambda s: re.fullmatch(r"(yes|no) [a-h]{1,4}", s) or pytest.fail(s), "plain", 16),
}


@pytest.mark.slow
@pytest.mark.parametrize("kind", list(VALIDITY))
def test_every_constrained_output_is_valid(models, kind):
    c, check, which, max_tokens = VALIDITY[kind]
    target = models["json_target" if which == "json" else "target"]
    draft = models["json_draft" if which == "json" else "draft"]
    sp = SamplingParams(temperature=1.0)
    m = matcher(target, c)
    ended = 0
    stats = GenerationStats()
    for seed in range(N_VALID):
        reset(m)
        rng = np.random.default_rng(seed)
        out = run(target, PROMPT, sp, rng, max_tokens, m, model_speculator(draft, sp, 3), stats)
        if out and target.is_eog(out[-1]):
            ended += 1
            check(text_of(target, out))
    assert stats.n_drafted > 0 and stats.n_accepted > 0
    need = N_VALID if kind != "json_object" else int(0.95 * N_VALID)
    assert ended >= need, f"{kind}: only {ended}/{N_VALID} outputs ended within {max_tokens} tokens"


# ------------------------------------------------------------------------------------------------ exactness
def exact_masked(target: Model, m: Matcher, ctx: list[int], sp: SamplingParams, n: int) -> dict[tuple[int, ...], float]:
    """P(x1..xn | ctx) under the constraint, enumerated from the target alone (masked warp), pruning < 1e-12."""
    out: dict[tuple[int, ...], float] = {}

    def rec(prefix: list[int], mass: float) -> None:
        full = ctx + prefix
        p = warp(apply_mask(target.sync(full)[0], m.mask()), sp, full)
        for x in np.flatnonzero(p > 0):
            mm = mass * float(p[x])
            if mm < 1e-12:
                continue
            key = tuple(prefix + [int(x)])
            if len(key) == n or target.is_eog(int(x)):
                out[key] = out.get(key, 0.0) + mm
            else:
                assert m.advance(int(x))
                rec(list(key), mm)
                m.rollback(1)

    rec([], 1.0)
    return out


# a grammar that forbids some hot tokens, forces a cold one ("x") after the first token and then allows a few hot
# ones: the masked distribution differs from the unmasked one everywhere
EXACT_REGEX = r"[abc]x[a-e ]{1,2}"
EXACT_SETTINGS = {
    "T1.0": SamplingParams(temperature=1.0),
    "T1.0-topk3": SamplingParams(temperature=1.0, top_k=3),
    "T1.5-topp0.9": SamplingParams(temperature=1.5, top_p=0.9),
}


# the smoke test on llama.cpp; every other case (plain, each setting, trees) is an exact law in test_loop_laws
EXACT_CASES = [("draft+forced", "T1.0")]


@pytest.mark.slow
@pytest.mark.parametrize("how,name", EXACT_CASES)
def test_constrained_speculation_matches_masked_distribution(models, name, how):
    """Generations run to 5 tokens (so that after the forced "x" the suffix tree still has room); the first 3 are
    compared with the enumeration."""
    from edgespec.drafting.suffix_index import SuffixIndex

    sp = EXACT_SETTINGS[name]
    target = models["target"]
    m = matcher(target, Constraint.regex(EXACT_REGEX))
    exact = exact_masked(target, m, PROMPT, sp, 3)
    assert m.n_advanced == 0
    memory = SuffixIndex()
    stats = GenerationStats()
    rng = np.random.default_rng(7000 + 10 * list(EXACT_SETTINGS).index(name) + ["plain", "draft+forced", "tree+forced"].index(how))
    seqs = []
    for _ in range(SMOKE_N):
        reset(m)
        if how == "plain":
            spec, forced = None, False
        elif how == "draft+forced":
            spec, forced = model_speculator(models["draft"], sp, 2), True
        else:
            spec, forced = suffix_speculator(memory), True
        seqs.append(tuple(run(target, PROMPT, sp, rng, 5 if how == "tree+forced" else 3, m, spec, stats, forced)[:3]))
    if how != "plain":
        assert stats.n_drafted > 1000 and 0 < stats.n_accepted < stats.n_drafted
    if how == "tree+forced":
        assert stats.source_counts.get("suffix", 0) > 1000  # trees were really verified
    p = chi_square(seqs, exact)
    assert p > ALPHA, f"{how} {name}: chi-square p = {p:.2e} (N={SMOKE_N})"


def test_forced_tokens_are_accepted_with_probability_one(models):
    """Only forced drafts (no speculator): in 1,000 runs at temperature 1.5 every drafted token is accepted."""
    target = models["target"]
    m = matcher(target, Constraint.regex(r"[ab]xyz[a-h]{2}qq"))
    sp = SamplingParams(temperature=1.5)
    stats = GenerationStats()
    for seed in range(1000):
        reset(m)
        out = run(target, PROMPT, sp, np.random.default_rng(seed), 12, m, None, stats, True)
        assert re.fullmatch(r"[ab]xyz[a-h]{2}qq", text_of(target, out))
    assert stats.n_drafted >= 2 * 1000  # "xyz" and "qq" (and the first one's row) come as forced drafts
    assert stats.n_accepted == stats.n_drafted


def test_forced_drafts_save_decodes(models):
    target = models["target"]
    c = Constraint.json_schema(BOUNDED_SCHEMA)
    sp = SamplingParams(temperature=0.0)
    m = matcher(target, c)
    plain = GenerationStats()
    out_plain = run(target, PROMPT, sp, np.random.default_rng(0), 80, m, None, plain, forced=False)
    reset(m)
    fast = GenerationStats()
    out_fast = run(target, PROMPT, sp, np.random.default_rng(0), 80, m, None, fast, forced=True)
    assert out_plain == out_fast
    assert fast.n_cycles < plain.n_cycles / 2, (fast.n_cycles, plain.n_cycles)


class RowRecorder:
    """A target that records which logits rows every decode asked for (and forwards everything to the real one)."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.requested: list[tuple[int, int]] = []  # (tokens decoded, rows asked for) per decode

    def __getattr__(self, name):
        return getattr(self.model, name)

    def decode(self, tokens, start_pos, rows=(-1,)):
        rows = list(rows)
        self.requested.append((len(tokens), len(rows)))
        return self.model.decode(tokens, start_pos, rows)


@pytest.mark.parametrize("how", ["forced", "draft+forced", "plain"])
def test_rows_the_grammar_fixes_are_not_computed_and_nothing_changes(models, monkeypatch, how):
    """Where a row's mask allows one token, the verify does not ask the target for that row (constrained.known_rows);
    the tokens are the same as when every row is computed, and the logprobs up to float noise: 20 seeds at
    temperature 1.5 and 20 greedy runs, for forced drafts alone, forced drafts with a draft model, and plain steps."""
    import edgespec.runtime.speculate as S

    target = models["target"]
    m = matcher(target, Constraint.regex(r"[ab]xyz[a-h]{2}qq"))
    rows_asked = {}
    for skip in (True, False):
        monkeypatch.setattr(S, "SKIP_KNOWN_ROWS", skip)
        rec = RowRecorder(target)
        outs = []
        for temperature in (1.5, 0.0):
            sp = SamplingParams(temperature=temperature)
            for seed in range(20):
                reset(m)
                spec = model_speculator(models["draft"], sp, 3) if how == "draft+forced" else None
                steps = list(S.speculate(rec, PROMPT, sp, np.random.default_rng(seed), max_tokens=12, speculator=spec,
                                         constraint=m, forced_drafts=how != "plain", logprobs=2))
                toks = [t for st in steps for t in st.tokens]
                assert re.fullmatch(r"[ab]xyz[a-h]{2}qq", text_of(target, toks))
                outs.append((toks, [(lp.token, lp.logprob, [t for t, _ in lp.top]) for st in steps for lp in st.logprobs or []]))
        rows_asked[skip] = (outs, sum(r for _, r in rec.requested), sum(n for n, _ in rec.requested))
    (out_skip, rows_skip, decoded_skip), (out_all, rows_all, decoded_all) = rows_asked[True], rows_asked[False]
    # the same tokens; logprobs equal up to float noise (fewer output rows change llama.cpp's batch shapes a little)
    for (toks_a, lps_a), (toks_b, lps_b) in zip(out_skip, out_all):
        assert toks_a == toks_b and len(lps_a) == len(lps_b)
        for (ta, la, topa), (tb, lb, topb) in zip(lps_a, lps_b):
            assert ta == tb and topa == topb and abs(la - lb) < 1e-3
    assert decoded_skip == decoded_all  # the same tokens went through the target
    # "xyz" and "qq" are fixed by the grammar: at least 4 of their 5 rows per run are not computed (40 runs)
    assert rows_skip <= rows_all - 4 * 40, (rows_skip, rows_all)


@pytest.mark.parametrize("kind", ["json_schema", "regex", "lark"])
def test_greedy_speculative_equals_plain(models, kind):
    c, _, which, max_tokens = VALIDITY[kind]
    target = models["json_target" if which == "json" else "target"]
    draft = models["json_draft" if which == "json" else "draft"]
    sp = SamplingParams(temperature=0.0)
    m = matcher(target, c)
    for prompt in (PROMPT, [ord(c) for c in "hello"], [ord(c) for c in "{\"a\": 1"]):
        reset(m)
        plain = run(target, prompt, sp, np.random.default_rng(0), max_tokens, m, None, None, False)
        reset(m)
        stats = GenerationStats()
        fast = run(target, prompt, sp, np.random.default_rng(0), max_tokens, m, model_speculator(draft, sp, 4), stats)
        assert fast == plain
        assert stats.n_drafted > 0


# ------------------------------------------------------------------------------------------------ rollback
def test_chain_and_tree_masks_leave_the_matcher_where_it_was(models):
    target = models["target"]
    m = matcher(target, Constraint.regex(r"[abc]{1,3}x[a-e]{2}"))
    assert m.advance(ord("a"))
    before = (m.n_advanced, m.mask().copy(), m.forced())
    masks, n_ok = _chain_masks(m, [ord("b"), ord("c"), ord("q"), ord("x")])
    assert n_ok == 2 and len(masks) == 3
    assert masks[2][ord("x")] and not masks[2][ord("q")]
    assert (m.n_advanced, m.forced()) == (before[0], before[2]) and (m.mask() == before[1]).all()
    tree = TokenTree()
    b = tree.add(-1, ord("b"))
    tree.add(-1, ord("q"))  # forbidden: skipped with its subtree
    x = tree.add(b, ord("x"))
    tree.add(x, ord("a"))
    tree.add(b, ord("c"))
    tmasks, skip = _tree_masks(m, tree)
    assert skip == {1} and set(tmasks) == {0, 1, 3, 4, 5}
    assert tmasks[3][ord("a")] and not tmasks[3][ord("x")]  # after "abx": [a-e] only
    assert (m.n_advanced, m.forced()) == (before[0], before[2]) and (m.mask() == before[1]).all()


def test_matcher_state_after_generation_equals_fresh_advance(models):
    """After sampled generations with a poor draft (many rejections and rollbacks), the matcher equals a fresh one
    advanced along the output."""
    target = models["target"]
    c = Constraint.regex(r"([a-h]{1,3} ){1,6}[a-h]")
    m = matcher(target, c)
    sp = SamplingParams(temperature=1.2)
    stats = GenerationStats()
    for seed in range(50):
        reset(m)
        out = run(target, PROMPT, sp, np.random.default_rng(seed), 14, m, model_speculator(models["draft"], sp, 4), stats)
        fresh = matcher(target, c)
        for t in out:
            assert fresh.advance(t)
        assert m.n_advanced == fresh.n_advanced == len(out)
        assert (m.mask() == fresh.mask()).all() and m.forced() == fresh.forced()
    assert stats.n_accepted < stats.n_drafted  # there were rejections


def test_a_dead_end_stops_with_reason_constraint(models):
    """A grammar whose forced run never ends (llguidance gives up on it): a clean stop, never a hang."""
    target = models["target"]
    try:
        m = matcher(target, Constraint.grammar('start: "a" start'))
    except ConstraintError:
        return  # refused up front: also fine
    stats = GenerationStats()
    out = run(target, PROMPT, SamplingParams(temperature=0.0), np.random.default_rng(0), 50, m, None, stats, True)
    assert stats.stop_reason in ("constraint", "length")
    assert len(out) <= 50


# ------------------------------------------------------------------------------------------------ logprobs
def test_logprobs_are_the_same_from_drafts_and_from_plain_decoding(tiny):
    """A seeded generation gives plain decoding's tokens whatever the drafts; their logprobs must match too (the
    target's own distribution at each position), constrained or not."""
    from edgespec.runtime.engine import Engine

    eng = Engine.load(ModelSpec(str(tiny["target"]), n_ctx=512, n_threads=1), ModelSpec(str(tiny["draft"]), n_ctx=512, n_threads=1),
                      spec=SpecConfig(draft_max=4, adaptive=False), calibrate_costs=False)
    try:
        for constraint in (None, Constraint.regex(r"[a-e ]{3,12}x")):
            sp = SamplingParams(temperature=0.9, seed=5)
            runs = []
            for speculative in (False, True):
                gen = eng.stream("abc d", sampling=sp, max_tokens=14, speculative=speculative, constraint=constraint, logprobs=3)
                chunks = list(gen)
                r = gen.result()
                lps = [lp for c in chunks for lp in (c.logprobs or [])]
                runs.append((r.token_ids, lps, r.stats.n_accepted))
            (ids_a, lps_a, _), (ids_b, lps_b, acc_b) = runs
            assert ids_a == ids_b and acc_b > 0
            text_ids = [t for t in ids_a if t != EOS]  # the end token has no text: no logprob entry
            assert [lp.token for lp in lps_a] == text_ids == [lp.token for lp in lps_b]
            for a, b in zip(lps_a, lps_b):
                assert abs(a.logprob - b.logprob) < 1e-4 and 1 <= len(a.top) <= 3  # tokens of probability 0 are left out
                assert [t for t, _ in a.top] == [t for t, _ in b.top] and a.top[0][1] >= a.top[-1][1]
                assert a.logprob <= 0.0 and any(t == a.token for t, _ in a.top) or a.logprob < a.top[-1][1] + 1e-9
    finally:
        eng.close()
