"""Every user-visible write is atomic: the old file survives a failed write whole, and no temporary file is left.

The failing writes are real: a child process runs each writer under RLIMIT_FSIZE (a file-size limit, the kernel
answers EFBIG as on a full disk), with SIGXFSZ ignored."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from edgespec.fsutil import atomic_open, atomic_write_bytes, atomic_write_text

from support import ROOT


def test_replaces_whole_and_keeps_permissions(tmp_path: Path) -> None:
    p = tmp_path / "f.txt"
    p.write_text("old")
    os.chmod(p, 0o600)
    atomic_write_text(p, "new")
    assert p.read_text() == "new" and stat.S_IMODE(p.stat().st_mode) == 0o600
    atomic_write_bytes(p, b"\x00\x01")
    assert p.read_bytes() == b"\x00\x01"
    assert [q.name for q in tmp_path.iterdir()] == ["f.txt"]


def test_an_error_while_writing_keeps_the_old_file(tmp_path: Path) -> None:
    p = tmp_path / "f.txt"
    p.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_open(p) as fh:
            fh.write("half")
            raise RuntimeError("interrupted")
    assert p.read_text() == "old" and [q.name for q in tmp_path.iterdir()] == ["f.txt"]


def test_a_symlink_is_followed_and_a_non_regular_target_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real.txt"
    real.write_text("old")
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    atomic_write_text(link, "new")
    assert link.is_symlink() and real.read_text() == "new"
    (tmp_path / "dir").mkdir()
    with pytest.raises(OSError, match="not a regular file"):
        atomic_write_text(tmp_path / "dir", "x")
    with pytest.raises(OSError, match="not a regular file"):
        atomic_write_text(os.devnull, "x")
    assert stat.S_ISCHR(os.stat(os.devnull).st_mode)


def test_mode_must_be_a_write_mode(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        with atomic_open(tmp_path / "f", "a"):
            pass


# Each writer: (setup code run before the limit, the write run under it). `old` is the file's path.
WRITERS = {
    "fsutil": ("old = work / 'f.txt'; old.write_text('old contents')",
               "atomic_write_text(old, 'x' * 10000)"),
    "calibration": ("from edgespec.drafting import calibration as cal\n"
                    "cal.store('k0', cal.Calibration({1: 0.03, 2: 0.05}, 0.01, 'measured'))\n"
                    "old = cal.cache_path()",
                    "for i in range(50): cal.store(f'key{i}', cal.Calibration({n: 0.01 * n for n in range(1, 64)}, 0.01, 'measured'))"),
    "model record": ("from edgespec.models import store\n"
                     "m = work / 'm.gguf'; m.write_bytes(b'GGUF' + bytes(1000))\n"
                     "store.write_record(m, '0' * 64)\n"
                     "old = store._record_path(m)",
                     "store.write_record(m, '1' * 64 + 'x' * 5000)"),
    "suffix memory": ("from edgespec.drafting.suffix_index import SuffixIndex\n"
                      "ix = SuffixIndex(); ix.add_document(list(range(20)))\n"
                      "old = work / 'memory.bin'; ix.save(old)",
                      "ix.add_document(list(range(5000))); ix.save(old)"),
}


@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_write_that_fails_for_lack_of_space_keeps_the_old_file(writer: str, tmp_path: Path) -> None:
    setup, write = WRITERS[writer]
    code = textwrap.dedent("""
        import os, resource, signal, sys
        from pathlib import Path
        from edgespec.fsutil import atomic_write_text
        work = Path(sys.argv[1])
    """) + setup + textwrap.dedent("""
        before = old.read_bytes()
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (len(before) + 16, resource.RLIM_INFINITY))
        try:
    """) + textwrap.indent(write, "    ") + textwrap.dedent("""
            print("wrote")
        except OSError as e:
            print("failed", e.errno)
        resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        assert old.read_bytes() == before, "the old file changed"
        left = [p.name for p in old.parent.iterdir() if p.name.endswith('.tmp')]
        assert not left, left
        print("intact")
    """)
    env = {**os.environ, "EDGESPEC_CACHE_DIR": str(tmp_path / "cache"), "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    out = r.stdout.split()
    assert out[-1] == "intact"
    # the write really failed (the calibration cache is advisory: it swallows the error, and its file stays as it was)
    assert "wrote" not in out or writer == "calibration", r.stdout
