"""Atomic writes: every file a user can see is replaced whole or not at all.

The data goes to a temporary file in the same directory, is flushed and fsynced, then renamed over the target
(`os.replace`, atomic on POSIX and Windows). A failure at any point (a full disk, a permission, a signal) leaves
the old file as it was and removes the temporary one. A symlink is followed (the file it points to is replaced,
the link stays); a target that exists but is not a regular file (a device such as /dev/full, a FIFO, a folder) is
refused, since renaming over it would replace it.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator, Union

PathLike = Union[str, "os.PathLike[str]"]


@contextlib.contextmanager
def atomic_open(path: PathLike, mode: str = "w", *, encoding: str | None = "utf-8") -> Iterator[IO]:
    """Open a temporary file next to `path` for writing; on a clean exit it replaces `path` atomically.

    Mode is "w" (text) or "wb" (bytes). The target's permissions are kept when it exists (else 0o644 minus umask).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open writes only ('w' or 'wb'), got {mode!r}")
    target = Path(os.path.realpath(os.fspath(path)))  # through symlinks: replace the file, not the link
    if target.exists() and not target.is_file():  # a device, a FIFO, a folder: renaming over it would replace it
        raise OSError(errno.EINVAL, "not a regular file", str(target))
    directory = target.parent if str(target.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=directory)
    ok = False
    try:
        with os.fdopen(fd, mode, encoding=encoding if "b" not in mode else None) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        try:
            mode_bits = target.stat().st_mode & 0o777
        except OSError:
            umask = os.umask(0)
            os.umask(umask)
            mode_bits = 0o644 & ~umask
        with contextlib.suppress(OSError):
            os.chmod(tmp, mode_bits)
        os.replace(tmp, target)
        ok = True
    finally:
        if not ok:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def atomic_write_text(path: PathLike, text: str, *, encoding: str = "utf-8") -> None:
    """Replace `path` with `text`, atomically (see the module docstring)."""
    with atomic_open(path, "w", encoding=encoding) as fh:
        fh.write(text)


def atomic_write_bytes(path: PathLike, data: bytes) -> None:
    """Replace `path` with `data`, atomically."""
    with atomic_open(path, "wb", encoding=None) as fh:
        fh.write(data)


__all__ = ["atomic_open", "atomic_write_text", "atomic_write_bytes"]
