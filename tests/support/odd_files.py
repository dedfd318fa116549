"""Files that are not what a cache expects where it expects one (test_cache_files, in the test process and in a child
process that imports this module): FIFOs, folders, symlink loops, devices, dangling symlinks, and JSON no reader
should choke on."""

from __future__ import annotations

import os
from pathlib import Path

ODD = ("a FIFO", "a directory", "a symlink loop", "a device", "a dangling symlink")  # what make_odd makes
# JSON a cache file may hold that no reader may choke on (deep, huge or non-finite numbers, bad UTF-8)
BAD_JSON = {
    "100,000-deep nesting": "[" * 100_000 + "]" * 100_000,
    "a 5,000-digit number": '{"a": ' + "7" * 5000 + "}",
    "a 5,000-digit float": '{"a": 0.' + "7" * 5000 + "}",
    "Infinity": '{"a": Infinity}',
    "-Infinity": '{"a": -Infinity}',
    "NaN": '{"a": NaN}',
    "1e999": '{"a": 1e999}',
    "invalid UTF-8": b'{"a": "\xff"}',
    "not JSON": "{{{",
}


def make_odd(path: Path, kind: str) -> Path:
    """Put `kind` (one of ODD) at `path`, its folder made first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if kind == "a FIFO":
        os.mkfifo(path)
    elif kind == "a directory":
        path.mkdir()
    elif kind == "a symlink loop":
        path.symlink_to(path)
    elif kind == "a device":
        path.symlink_to("/dev/zero")
    elif kind == "a dangling symlink":
        path.symlink_to(path.parent / "nowhere")
    return path
