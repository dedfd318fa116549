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
import math
import os
import stat
import tempfile
from pathlib import Path
from typing import IO, Any, Iterator, Union

from .config import max_json_depth
from .untrusted import JSONDepthError, loads as loads_untrusted

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


# ------------------------------------------------------------------------------------------------- reading
MAX_JSON_NUMBER_DIGITS = 100  # no number edgespec stores has more digits; 5,000 digits is a tampered file


def read_regular_bytes(path: PathLike, limit: int) -> bytes:
    """The bytes of the regular file at `path` (symlinks followed), at most `limit` of them; an OSError (one line in
    its strerror) for anything else: a FIFO or a device (opened non-blocking and checked before any read, so
    nothing waits for a writer), a directory, a symlink loop, a path with a NUL byte, a file larger than `limit`."""
    try:
        fd = os.open(os.fspath(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except ValueError:  # an embedded NUL byte
        raise OSError(errno.EINVAL, "the path has a NUL byte", str(path)) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise OSError(errno.EISDIR, "is a directory", str(path))
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", str(path))
        if st.st_size > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
        chunks, n = [], 0
        while n <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - n))
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
        if n > limit:
            raise OSError(errno.EFBIG, f"larger than {limit} bytes", str(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def _bounded_int(text: str) -> int:
    if len(text) > MAX_JSON_NUMBER_DIGITS + 1:
        raise ValueError(f"a number of {len(text)} digits")
    return int(text)


def _finite_float(text: str) -> float:
    if len(text) > 4 * MAX_JSON_NUMBER_DIGITS:
        raise ValueError(f"a number of {len(text)} characters")
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"{text} is out of range")
    return v


def loads_json(data: str | bytes) -> Any:
    """Strict JSON for files edgespec reads back: a ValueError (never a RecursionError or an OverflowError) for
    NaN/Infinity, numbers of more than MAX_JSON_NUMBER_DIGITS digits or out of float range, invalid UTF-8, and
    nesting deeper than config.max_json_depth()."""
    try:
        return loads_untrusted(data, "the file", parse_constant=_no_constant, parse_int=_bounded_int, parse_float=_finite_float)
    except JSONDepthError:  # a ValueError too; this message is what callers quote
        raise ValueError(f"JSON nested too deeply (more than {max_json_depth()} levels)") from None


def clear_odd_file(path: PathLike) -> bool:
    """For a cache file edgespec owns: remove what stands at `path` when it is not a regular file (a FIFO, a device
    node, a socket, a symlink that loops or leads to no file, an empty folder), so that the cache can be written again;
    True when something was removed. A folder with contents is left alone (the write then fails, and the cache stays
    off). Never raises."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        if os.path.islink(p):  # a dangling link: the write would follow it somewhere else
            with contextlib.suppress(OSError):
                os.unlink(p)
                return True
        return False
    except (OSError, ValueError):  # a symlink loop (ELOOP), a name too long, a NUL byte
        if os.path.islink(p):
            with contextlib.suppress(OSError):
                os.unlink(p)
                return True
        return False
    if stat.S_ISREG(st.st_mode):
        return False
    try:
        if os.path.islink(p):
            os.unlink(p)
        elif stat.S_ISDIR(st.st_mode):
            os.rmdir(p)
        else:
            os.unlink(p)
    except OSError:
        return False
    return True


def read_json_file(path: PathLike, limit: int) -> Any:
    """read_regular_bytes + loads_json: an OSError when the file cannot be read as a file, a ValueError when it is
    not strict JSON."""
    return loads_json(read_regular_bytes(path, limit))


__all__ = ["atomic_open", "atomic_write_text", "atomic_write_bytes", "read_regular_bytes", "loads_json", "read_json_file", "clear_odd_file",
           "MAX_JSON_NUMBER_DIGITS"]
