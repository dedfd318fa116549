"""A model whose logits hold NaN, under the engine: its decodes skip the backend's own pass over each row
(Model.check_logits False) and the loop's sampling finds the NaN instead, so the error is still the model's one-line
BackendError, for the target and for the draft, greedy and sampled (each path: greedy argmax, top-k candidates,
temperature alone, min-p alone). Tiny GGUF models whose output bias is NaN (every row is NaN)."""

from __future__ import annotations

import pytest

from edgespec import Engine
from edgespec.llama.backend import Model
from edgespec.config import ModelSpec, SamplingParams, SpecConfig
from edgespec.errors import BackendError

from support.tiny import write_tiny_model

SETTINGS = [
    dict(temperature=0.0),
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05),
    dict(temperature=1.0),
    dict(temperature=1.0, min_p=0.1),
]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("nan")
    return {
        "good": write_tiny_model(d / "good.gguf", seed=1, name="tiny-good"),
        "nan": write_tiny_model(d / "nan.gguf", seed=1, bias=float("nan"), name="tiny-nan"),
        "nan_draft": write_tiny_model(d / "nan-draft.gguf", seed=2, bias=float("nan"), name="tiny-nan-draft"),
    }


def test_a_model_alone_still_checks_its_rows(files):
    m = Model(ModelSpec(str(files["nan"]), n_ctx=256, n_threads=1))
    try:
        assert m.check_logits
        with pytest.raises(BackendError, match="NaN"):
            m.decode([1, 2, 3], 0)
    finally:
        m.close()


@pytest.mark.parametrize("kw", SETTINGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_nan_target_under_the_engine_is_its_backend_error(files, kw):
    eng = Engine.load(ModelSpec(str(files["nan"]), n_ctx=256, n_threads=1), None, drafter="none",
                      calibrate_costs=False, memory=False, parallel=1)
    try:
        assert not eng.target.check_logits
        with pytest.raises(BackendError, match="nan.gguf.*NaN|NaN"):
            eng.generate("hi", max_tokens=3, sampling=SamplingParams(**kw, seed=3))
    finally:
        eng.close()


@pytest.mark.parametrize("kw", SETTINGS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_nan_draft_under_the_engine_is_the_drafts_backend_error(files, kw):
    eng = Engine.load(ModelSpec(str(files["good"]), n_ctx=256, n_threads=1),
                      ModelSpec(str(files["nan_draft"]), n_ctx=256, n_threads=1), drafter="model",
                      spec=SpecConfig(draft_max=4, adaptive=False, draft_siblings=0), calibrate_costs=False,
                      memory=False, parallel=1)
    try:
        with pytest.raises(BackendError, match="NaN") as info:
            eng.generate("hi", max_tokens=6, sampling=SamplingParams(**kw, seed=3))
        assert "nan-draft" in str(info.value)
    finally:
        eng.close()
