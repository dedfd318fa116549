"""Shared fixtures: tiny real GGUF models written at test time (tests/support/tiny.py), the tiny FIM pair and its
engines and server (the infill and server tests'), and the real pair when cached. Helpers the tests import are in
tests/support/ (pyproject.toml puts tests/ on the path)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any, Iterator

import pytest

# A run started in the background by a shell without job control (`make test &` in a script) inherits Ctrl-C ignored,
# and so would every process the tests start: the Ctrl-C tests want a terminal's default handling.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from support.tiny import write_tiny_set

    return write_tiny_set(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def fim_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny target and draft whose vocabulary has the fill-in-the-middle tokens."""
    from support.tiny import write_tiny_fim_pair

    return write_tiny_fim_pair(tmp_path_factory.mktemp("fim"))


FIM_N_CTX = 2048  # the context of fim_engine and fim_reference


def _fim_engine(fim_pair: dict[str, Path]) -> Iterator[Any]:
    from support.engines import load

    eng = load(fim_pair["target"], fim_pair["draft"], n_ctx=FIM_N_CTX)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def fim_engine(fim_pair: dict[str, Path]) -> Iterator[Any]:
    """The FIM pair loaded with its draft (support.engines.load: every cycle drafts 4, no calibration)."""
    yield from _fim_engine(fim_pair)


@pytest.fixture(scope="module")
def fim_reference(fim_pair: dict[str, Path]) -> Iterator[Any]:
    """A second, fresh engine like fim_engine: what a server over fim_engine answers must equal what it answers."""
    yield from _fim_engine(fim_pair)


@pytest.fixture(scope="module")
def fim_srv(fim_engine: Any) -> Iterator[Any]:
    """uvicorn serving fim_engine in a thread (support.server_thread.ServerThread)."""
    from edgespec.server import create_app
    from support.server_thread import ServerThread

    s = ServerThread(create_app(fim_engine))
    yield s
    s.stop()


def _resolve_real_pair() -> tuple[tuple[Path, Path] | None, str]:
    try:
        from edgespec.models import resolve_model

        return (resolve_model(None, "target"), resolve_model(None, "draft")), ""
    except Exception as e:  # noqa: BLE001 - any reason means: no usable real pair
        return None, str(e)


# Resolved at import, before _isolated_cache points EDGESPEC_CACHE_DIR (and so the model cache) at a temp folder.
_REAL_PAIR, _REAL_PAIR_WHY = _resolve_real_pair()


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Calibration tables, model files etc. go to a per-run folder; the real pair's paths were resolved above.
    os.environ.setdefault("EDGESPEC_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


def real_pair_paths() -> tuple[Path, Path] | None:
    """The real pair's (target, draft) in the user's model cache, as resolved when the test session started."""
    return _REAL_PAIR


@pytest.fixture(scope="session")
def real_pair() -> tuple[Path, Path]:
    paths = real_pair_paths()
    if paths is None:
        if os.environ.get("EDGESPEC_REQUIRE_REAL") == "1":
            pytest.fail(f"the real model pair is not usable: {_REAL_PAIR_WHY}")
        pytest.skip(f"real model pair not usable: {_REAL_PAIR_WHY}")
    return paths
