"""Shared fixtures: tiny real GGUF models written at test time (edgespec.tiny) and the real pair when cached."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from edgespec.tiny import write_tiny_set

    return write_tiny_set(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Calibration tables etc. go to a per-run folder; model files stay where EDGESPEC_MODELS_DIR/defaults say.
    os.environ.setdefault("EDGESPEC_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


def real_pair_paths() -> tuple[Path, Path] | None:
    try:
        from edgespec.models import resolve_model

        return resolve_model(None, "target"), resolve_model(None, "draft")
    except Exception:
        return None


@pytest.fixture(scope="session")
def real_pair() -> tuple[Path, Path]:
    paths = real_pair_paths()
    if paths is None:
        if os.environ.get("EDGESPEC_REQUIRE_REAL") == "1":
            pytest.fail("the real model pair is not in the cache (run `edgespec models pull`)")
        pytest.skip("real model pair not in the cache (edgespec models pull)")
    return paths
