"""Drafting across vocabularies on tiny real GGUF models (docs/vocabularies.md): the pair's mode from the headers,
greedy, seeded and constrained speculative output equal to plain decoding with a draft of another tokenizer (an intersection:
other ids, merges and control tokens) and with one that differs only in a control token (ids mapped), the refusal
of a draft that shares nothing, and the hardware gate keeping a draft that cannot pay switched off."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from edgespec.errors import IncompatiblePairError
from edgespec.cli import main
from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.drafting.calibration import Calibration
from edgespec.llama.backend import Model
from edgespec.llama.gguf_check import inspect_gguf
from edgespec.llama.vocab_pair import pair_vocab
from edgespec.runtime.engine import Engine

from support.cost_curves import DESKTOP
from support.tiny import write_tiny_foreign_draft, write_tiny_model, write_tiny_other_script

GREEDY = SamplingParams(temperature=0)
PROMPTS = ["abc d", "the cat", "a b c d e f", "ba ba ba", "hello there"]
FIXED = SpecConfig(draft_max=4, adaptive=False)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("xvocab")
    return {
        "target": write_tiny_model(d / "target.gguf", seed=1, name="tiny-target"),
        "foreign": write_tiny_foreign_draft(d / "foreign.gguf"),
        # the same ordinary tokens, another first control token
        "mapped": write_tiny_model(d / "mapped.gguf", seed=2, layer_scale=0.4, token_overrides={260: "<|begin|>"}, name="tiny-mapped"),
        "other": write_tiny_other_script(d / "other.gguf"),
    }


def _load(target: Path, draft: Path | None, **kw: object) -> Engine:
    d = ModelSpec(str(draft), n_ctx=512, n_threads=1) if draft is not None else None
    kw.setdefault("spec", FIXED)
    return Engine.load(ModelSpec(str(target), n_ctx=512, n_threads=1), d, calibrate_costs=False, memory=False, **kw)  # type: ignore[arg-type]


def test_modes_from_the_headers(files: dict[str, Path]) -> None:
    t = inspect_gguf(files["target"])
    assert pair_vocab(t, t).mode == "same"
    assert pair_vocab(t, inspect_gguf(files["mapped"])).mode == "mapped"
    inter = pair_vocab(t, inspect_gguf(files["foreign"]))
    assert inter.mode == "intersection" and inter.vmap is not None
    assert 0.9 < inter.coverage < 1.0  # the byte tokens are shared, the merges are not
    assert pair_vocab(t, inspect_gguf(files["other"])).mode == "none"


@pytest.mark.parametrize("draft", ["foreign", "mapped"])
def test_greedy_and_seeded_output_equal_plain(files: dict[str, Path], draft: str) -> None:
    plain = _load(files["target"], None, drafter="none")
    spec = _load(files["target"], files[draft], drafter="model")
    try:
        assert spec.vocab_pair is not None and spec.vocab_pair.mode == ("intersection" if draft == "foreign" else "mapped")
        drafted = accepted = 0
        for p in PROMPTS:
            a = plain.generate(p, sampling=GREEDY, max_tokens=40)
            b = spec.generate(p, sampling=GREEDY, max_tokens=40)
            assert b.token_ids == a.token_ids, p
            drafted, accepted = drafted + b.stats.n_drafted, accepted + b.stats.n_accepted
            assert b.stats.controller["vocabulary"]["mode"] == spec.vocab_pair.mode
            seeded = SamplingParams(temperature=0.9, seed=7)
            assert spec.generate(p, sampling=seeded, max_tokens=30).token_ids == plain.generate(p, sampling=seeded, max_tokens=30).token_ids
        assert drafted > 0 and accepted > 0
        # under a constraint the draft's restricted row is masked as the target's: still plain decoding's output
        from edgespec.decoding.constraint import Constraint

        c = Constraint.regex(r"(ab|ba|cd)[a-h ]{6,12}")
        b = spec.generate("abc", sampling=GREEDY, max_tokens=20, constraint=c)
        assert b.token_ids == plain.generate("abc", sampling=GREEDY, max_tokens=20, constraint=c).token_ids
        # a conversation goes on: the draft's cache follows by common prefix, rolled back after rejections
        for _ in range(2):
            b = spec.generate(PROMPTS[0] + " xyz", sampling=GREEDY, max_tokens=20)
            assert b.token_ids == plain.generate(PROMPTS[0] + " xyz", sampling=GREEDY, max_tokens=20).token_ids
    finally:
        plain.close()
        spec.close()


def test_a_draft_that_shares_nothing_is_refused(files: dict[str, Path]) -> None:
    with pytest.raises(IncompatiblePairError, match="not worth drafting"):
        _load(files["target"], files["other"], drafter="model")
    r = CliRunner().invoke(main, ["info", str(files["target"]), str(files["other"])])
    assert r.exit_code == 1 and "drafting: not worth drafting" in r.output
    r = CliRunner().invoke(main, ["info", "--json", str(files["target"]), str(files["foreign"])])
    assert r.exit_code == 0
    v = json.loads(r.stdout)["vocabulary"]
    assert v["mode"] == "intersection" and 0.9 < v["coverage"] < 1.0 and v["shared"] > 256


def test_the_gate_keeps_a_draft_that_cannot_pay_switched_off(files: dict[str, Path]) -> None:
    """On a CPU-like curve with a dear draft the adaptive controller never runs the cross-vocabulary draft."""
    t = Model(ModelSpec(str(files["target"]), n_ctx=512, n_threads=1))
    d = Model(ModelSpec(str(files["foreign"]), n_ctx=512, n_threads=1))
    cpu = Calibration({n: 0.01 * r for n, r in DESKTOP.items()}, 0.008, "fixed")
    e = Engine(t, d, drafter="model", spec=SpecConfig(), calibration=cpu)
    try:
        r = e.generate("abc d", sampling=GREEDY, max_tokens=30)
        assert r.stats.n_drafted == 0 and not e.draft_gate_open
    finally:
        e.close()
