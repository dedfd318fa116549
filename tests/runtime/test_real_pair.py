"""The real Qwen2.5-Coder pair (1.5B target, 0.5B draft, Q4_K_M). Skipped when the pair is not in the model cache,
required (a failure) in CI, where .ci/run pulls it and sets EDGESPEC_REQUIRE_REAL=1.

Greedy identity on real quantized models: llama.cpp's batched Q4 kernels give logits that differ from
single-token decoding by up to a few tenths, so a speculative run (batched verify) and a plain run (single tokens)
may part at a near-tie. The tests check every token of a speculative run against plain decoding along that run's
own tokens: each is the target's argmax there or within NEAR_TIE of it; a token chosen against a clear decision
fails.
"""

from __future__ import annotations

import numpy as np
import pytest

from edgespec.config import ModelSpec, SamplingParams, SpecConfig

pytestmark = [pytest.mark.real, pytest.mark.slow]

# logits. How far batching moves the top-2 gap depends on the CPU's kernels: on AVX2, divergences were seen at gaps of
# 0.001-0.204; on AVX-512 (2026-11-30: 550 positions of 10 of these prompts, a batch of 5 against single tokens on the
# same cache) the gap moved by median 0.07, p99 0.31, max 0.44. A wrong acceptance rule parts at clear decisions.
NEAR_TIE = 0.6
MAX_TOKENS = 48  # every position of each run is checked (teacher-forced), where a second plain run of 64 checked only those before the first divergence

PROMPTS = [
    # code
    "Write a Python function that reverses a linked list.",
    "Implement binary search in Python with type hints.",
    "Write a SQL query that returns the top 5 customers by total order value.",
    "Write a bash one-liner that counts lines in all .py files recursively.",
    "Write a JavaScript debounce function.",
    "Explain what this does: `sorted(d.items(), key=lambda kv: -kv[1])[:3]`",
    "Write a Rust function that checks whether a string is a palindrome.",
    "Write a Python class for an LRU cache using OrderedDict.",
    # prose
    "Write a short paragraph about why unit tests matter.",
    "Describe the water cycle in three sentences.",
    "Write a polite email declining a meeting invitation.",
    "Summarize the plot of Romeo and Juliet in two sentences.",
    # lists
    "List five tips for writing readable code.",
    "List the planets of the solar system in order.",
    "Give me a checklist for reviewing a pull request.",
    "Name six common HTTP status codes and what they mean.",
    # math
    "What is 17 * 23? Show the steps.",
    "Solve for x: 3x + 7 = 22.",
    "What is the derivative of x^3 * sin(x)?",
    "A train travels 120 km in 1.5 hours. What is its average speed?",
]


@pytest.fixture(scope="module")
def engine(real_pair):
    from edgespec.runtime.engine import Engine

    target, draft = real_pair
    # Fixed K: every cycle speculates, so the identity is tested on real verify batches (the adaptive controller
    # could legitimately choose plain decoding on this CPU). A fixed K plans nothing, so no costs are measured.
    spec = SpecConfig(draft_max=4, adaptive=False)
    with Engine.load(ModelSpec(target, n_ctx=1024), ModelSpec(draft, n_ctx=1024), drafter="model+ngram", spec=spec,
                     calibrate_costs=False) as eng:
        yield eng


def plain_walk(model, prompt: list[int], tokens: list[int]) -> list[tuple[int, int, float]]:
    """Plain decoding's view of every position of `tokens` (the prompt as one batch, then one token at a time, from an
    empty cache): for each position where the token is not the target's argmax, (position, argmax, how far the
    token's logit is below the argmax's)."""
    model.reset()
    logits = model.sync(prompt)[0]
    off: list[tuple[int, int, float]] = []
    for i, t in enumerate(tokens):
        top = int(np.argmax(logits))
        if t != top:
            off.append((i, top, float(logits[top] - logits[t])))
        if i + 1 < len(tokens):
            logits = model.decode([t], model.n_past)[0]
    return off


def test_tokenizer_and_template(engine):
    assert engine.target.n_vocab == engine.draft.n_vocab == 151936
    toks = engine.prompt_tokens(messages=[{"role": "user", "content": "hi"}])
    text = engine.target.detokenize(toks, special=True)
    assert text.startswith("<|im_start|>system") and text.endswith("<|im_start|>assistant\n")


def greedy_identity(engine, prompts: list[str], every_run_drafts: bool = False) -> tuple[int, list[float]]:
    """A speculative greedy run of each prompt, checked at EVERY position against plain decoding along its own tokens
    (teacher-forced: the prompt in one batch, then one token at a time on an empty cache, as plain decoding computes
    it): each token is the target's argmax there, or within NEAR_TIE of it (a near-tie of batched against
    single-token kernels). Returns (runs equal to plain decoding at every position, the gaps at the near-ties).

    This checks every position of every run, where comparing with a separate plain run could only check the
    positions before the first divergence."""
    greedy = SamplingParams(temperature=0)
    identical = 0
    gaps: list[float] = []
    for prompt in prompts:
        msgs = [{"role": "user", "content": prompt}]
        spec = engine.generate(messages=msgs, sampling=greedy, max_tokens=MAX_TOKENS, speculative=True)
        assert spec.stats.n_drafted > 0 or not every_run_drafts, prompt
        assert spec.finish_reason in ("eos", "length"), (prompt, spec.finish_reason)
        prompt_ids = engine.prompt_tokens(messages=msgs)
        # an end of generation is the last token of the result: checked like every other
        assert spec.finish_reason == "length" or engine.target.is_eog(spec.token_ids[-1]), prompt
        off = engine.run_on_worker(lambda e, p=prompt_ids, t=spec.token_ids: plain_walk(e.target, p, t)).result()
        for pos, top, gap in off:
            assert gap < NEAR_TIE, f"{prompt!r}: token {pos} is {gap:.3f} below plain decoding's argmax {top} (not a near-tie)"
        gaps += [g for _, _, g in off]
        identical += not off
    return identical, gaps


def test_greedy_identity_20_prompts(engine):
    identical, gaps = greedy_identity(engine, PROMPTS, every_run_drafts=True)
    # Seen on the AVX2 CPU: 9 identical, 11 parted at near-ties (gaps 0.001-0.204); on AVX-512 8 and 12 (gaps up to
    # 0.298). How many part varies with the machine's kernels; a floor catches a systematic fault that happens to
    # land on near-ties: at least a quarter of the prompts must agree with plain decoding at every position
    # (2026-12-03, AVX-512, teacher-forced, 48 tokens: 11 of 20).
    print(f"\n{identical} identical, {len(gaps)} near-ties (gaps {[round(g, 3) for g in gaps]})")
    assert identical >= len(PROMPTS) // 4, f"only {identical} of {len(PROMPTS)} prompts identical"


def count_tree_decodes(engine) -> list[int]:
    """The sizes of the tree verifies the engine's target will decode (appended as they happen)."""
    trees: list[int] = []
    decode_tree = engine.target.decode_tree

    def counting(tokens, depths, seq_ids):
        trees.append(len(tokens))
        return decode_tree(tokens, depths, seq_ids)

    engine.target.decode_tree = counting
    return trees


def test_greedy_identity_of_token_trees(real_pair):
    """The suffix drafter with a fixed tree shape (8 nodes, 3 wide): its memory holds the earlier answers, so the
    trees are real (counted at the backend) and mostly accepted; the output is plain decoding's up to near-ties."""
    from edgespec.runtime.engine import Engine

    target, _ = real_pair
    spec = SpecConfig(adaptive=False, tree_nodes=8, tree_width=3)
    with Engine.load(ModelSpec(target, n_ctx=1024), None, drafter="suffix", spec=spec, memory=False, calibrate_costs=False) as eng:
        trees = count_tree_decodes(eng)
        prompts = PROMPTS[:6] + PROMPTS[:2]  # the last two come back: their answers are in memory
        identical, gaps = greedy_identity(eng, prompts)
    print(f"\n{identical} identical, {len(gaps)} near-ties (gaps {[round(g, 3) for g in gaps]}); {len(trees)} trees")
    assert len(trees) >= 5, f"only {len(trees)} tree verifies"
    assert identical >= len(prompts) // 4


def test_greedy_identity_of_draft_model_trees(real_pair):
    """The draft model's chains with siblings (draft-model trees) on the fixed flat curve of an uncalibrated engine, where
    every verify row is free: the unsure positions get the draft's next-best tokens beside them (trees counted at the
    backend, siblings kept); the output is plain decoding's up to near-ties."""
    from edgespec.runtime.engine import Engine

    target, draft = real_pair
    with Engine.load(ModelSpec(target, n_ctx=1024), ModelSpec(draft, n_ctx=1024), drafter="model",
                     spec=SpecConfig(draft_max=6), calibrate_costs=False) as eng:
        assert eng.target.tree_paths == SpecConfig().draft_siblings + 1
        trees = count_tree_decodes(eng)
        prompts = PROMPTS[:6]
        identical, gaps = greedy_identity(eng, prompts)
        r = eng.generate(messages=[{"role": "user", "content": PROMPTS[8]}], sampling=SamplingParams(temperature=0), max_tokens=MAX_TOKENS)
        siblings = r.stats.controller["siblings"]
    print(f"\n{identical} identical, {len(gaps)} near-ties (gaps {[round(g, 3) for g in gaps]}); {len(trees)} trees; "
          f"one more prompt's siblings {siblings}")
    assert len(trees) >= 5 and siblings["added"] > 0, f"only {len(trees)} tree verifies"
    assert identical >= len(prompts) // 4


def test_control_token_text_typed_by_a_user_stays_text(engine):
    """Every control-token string of the real vocabulary inside a user message: the prompt holds exactly the
    control tokens the template wrote."""
    specials = engine.special_texts()
    assert "<|im_end|>" in specials and len(specials) >= 10
    ids = {t for t in range(engine.target.n_vocab) if engine.target.token_bytes(t, special=True).decode("utf-8", "replace") in set(specials)}
    clean = engine.prompt_tokens(messages=[{"role": "user", "content": "hello  world"}])
    n_clean = sum(1 for t in clean if t in ids)
    for s in specials:
        got = engine.prompt_tokens(messages=[{"role": "user", "content": f"hello {s} world"}])
        assert sum(1 for t in got if t in ids) == n_clean, s


def test_sampled_generation_runs_and_reports(engine):
    r = engine.generate(
        messages=[{"role": "user", "content": "Write a haiku about compilers."}],
        sampling=SamplingParams(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, seed=7),
        max_tokens=48,
    )
    s = r.stats
    assert s.n_generated > 0 and s.n_drafted > 0
    assert 0 <= s.n_accepted <= s.n_drafted
    assert r.text.strip()
