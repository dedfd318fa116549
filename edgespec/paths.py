"""Where edgespec keeps things on disk. One variable moves each:

    EDGESPEC_CACHE_DIR   everything that can be rebuilt or re-downloaded: models/, calibration.json, wheels/,
                         llamacpp/ (default: the platform's user cache dir, e.g. ~/.cache/edgespec)
    EDGESPEC_DATA_DIR    what the user made: chat input history (default: the platform's user data dir)
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "EDGESPEC_CACHE_DIR"
DATA_ENV = "EDGESPEC_DATA_DIR"


def cache_dir() -> Path:
    """The cache root (not created here)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("edgespec"))


def data_dir() -> Path:
    """The user-data root (not created here)."""
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("edgespec"))


__all__ = ["CACHE_ENV", "DATA_ENV", "cache_dir", "data_dir"]
