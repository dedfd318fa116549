"""Per-file locks in the model cache, and the removal of what interrupted pulls left behind.

A process that writes or re-hashes ``<file>`` holds ``.locks/<file>.lock`` (flock(2), advisory, released by the
kernel when the process dies however it dies). So a leftover whose lock can be taken belongs to no running pull.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from edgespec.errors import ModelsError
from edgespec.fsutil import clear_odd_file


def lock_path(cache: Path, file: str) -> Path:
    return cache / ".locks" / (file + ".lock")


@contextlib.contextmanager
def try_lock(path: Path) -> Iterator[bool]:
    """Try to take the advisory lock ``path`` without waiting; yields whether it was taken (always True where
    fcntl is missing, e.g. Windows)."""
    try:
        import fcntl
    except ImportError:  # Windows
        yield True
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = _open_lock(path)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            got = False
        else:
            got = True
        try:
            yield got
        finally:
            if got:
                fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _open_lock(path: Path) -> int:
    """The lock file's descriptor. A lock file is edgespec's own: whatever else stands at its path (a FIFO, a device,
    a symlink loop, an empty folder) is removed and a regular file made (never a wait: opened non-blocking); an
    OSError when that cannot be done."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    for attempt in range(2):
        try:
            fd = os.open(path, flags, 0o644)
        except OSError:
            if attempt or not clear_odd_file(path):
                raise
            continue
        if stat.S_ISREG(os.fstat(fd).st_mode):
            return fd
        os.close(fd)
        if attempt or not clear_odd_file(path):
            break
    raise OSError(errno.EINVAL, "not a regular file", str(path))


@contextlib.contextmanager
def lock(path: Path) -> Iterator[None]:
    """One writer (or verifier) per cache file; a ModelsError when another process holds it, or when the lock file
    cannot be made (a folder with contents in its place, a read-only cache)."""
    with contextlib.ExitStack() as stack:
        try:
            got = stack.enter_context(try_lock(path))
        except OSError as e:
            raise ModelsError(f"cannot use the lock {path}: {e.strerror or e}") from None
        if not got:
            name = path.name[: -len(".lock")]
            raise ModelsError(
                f"another edgespec process (a pull or verify) is using {name} (lock {path}); try again when it ends"
            )
        yield


_NOT_LEFTOVER = ""


def _leftover_owner(name: str) -> str | None:
    """The cache file a leftover belongs to, None for a leftover of unknown owner (an older edgespec's download
    dir), or _NOT_LEFTOVER."""
    if name.endswith(".partial") and not name.startswith("."):
        return name[: -len(".partial")]
    if name.endswith(".verified.tmp") and not name.startswith("."):  # an older edgespec's record temp file
        return name[: -len(".verified.tmp")]
    if name.startswith(".download-"):
        rest = name[len(".download-"):]
        return rest.rsplit(".", 1)[0] if "." in rest else None  # .download-<file>.<random>
    if name.startswith(".") and name.endswith(".tmp") and ".verified." in name:  # atomic_write_text's temp file
        return name[1: name.index(".verified.")]
    return _NOT_LEFTOVER


def _remove(p: Path) -> bool:
    try:
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        else:
            p.unlink()
        return True
    except OSError:  # gone already, or not ours to remove
        return False


def remove_leftovers(cache: Path) -> list[Path]:
    """Remove what interrupted pulls left in the cache (``<file>.partial``, ``.download-*`` dirs, record temp
    files). A file's leftovers go only when its lock is free, i.e. no pull of it is running now; leftovers that name
    no file go only when no lock at all is held. Returns what was removed."""
    try:
        entries = sorted(cache.iterdir())
    except OSError:
        return []
    groups: dict[str | None, list[Path]] = {}
    for e in entries:
        owner = _leftover_owner(e.name)
        if owner != _NOT_LEFTOVER:
            groups.setdefault(owner, []).append(e)
    removed: list[Path] = []
    for owner, items in groups.items():
        with contextlib.ExitStack() as stack:
            if owner is not None:
                locks = [lock_path(cache, owner)]
            else:
                locks = sorted((cache / ".locks").glob("*.lock")) if (cache / ".locks").is_dir() else []
            try:
                free = all(stack.enter_context(try_lock(lk)) for lk in locks)
            except OSError:
                free = False
            if free:
                removed += [p for p in items if _remove(p)]
    return removed


__all__ = ["lock_path", "try_lock", "lock", "remove_leftovers"]
