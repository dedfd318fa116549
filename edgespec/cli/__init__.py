"""`edgespec` command line: a thin layer over the library.

Exit codes: 0 success; 1 an error with a one-line message (bad model file, missing model, incompatible pair, bad
setting); 2 a usage error (unknown option, bad value type); 75 an RPC server the model ran on was lost (try again once
it is back; docs/rpc.md); 130 interrupted with Ctrl-C.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import sys
import warnings
from typing import Any

import click

from edgespec import __version__
from edgespec.config import max_json_depth
from edgespec.errors import EXIT_BACKEND_LOST, BackendLostError, EdgespecError


class Group(click.Group):
    """Turns library errors into one line on stderr and exit code 1, usage errors into one line and 2, Ctrl-C into
    130: never a traceback."""

    def main(self, *args: Any, standalone_mode: bool = True, **kwargs: Any) -> Any:  # type: ignore[override]
        if not standalone_mode:
            return super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[call-overload]
        _stand_in_for_closed_streams()
        old_format, warnings.formatwarning = warnings.formatwarning, _one_line_warning  # a library warning: one line
        try:
            self._standalone(*args, **kwargs)
        finally:
            warnings.formatwarning = old_format

    def _standalone(self, *args: Any, **kwargs: Any) -> None:
        try:
            rv = super().main(*args, standalone_mode=False, **kwargs)  # type: ignore[call-overload]
        except click.UsageError as e:  # click prints usage, a hint and the error: one line is enough
            where = e.ctx.command_path if e.ctx is not None else "edgespec"
            click.echo(f"Error: {e.format_message()} (see `{where} --help`)", err=True)
            sys.exit(e.exit_code)
        except click.ClickException as e:
            e.show()
            sys.exit(e.exit_code)
        except click.exceptions.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        sys.exit(rv if isinstance(rv, int) else 0)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            max_json_depth()  # a bad EDGESPEC_MAX_JSON_DEPTH: one line now, not a puzzling error per request later
            return super().invoke(ctx)
        except BackendLostError:  # rpc.lost wrote the one line and ends the process with this code in a moment
            ctx.exit(EXIT_BACKEND_LOST)
        except EdgespecError as e:
            raise click.ClickException(str(e)) from None
        except KeyboardInterrupt:
            click.echo("\ninterrupted", err=True)
            ctx.exit(130)
        except BrokenPipeError:  # `edgespec generate ... | head`
            _silence_stdout()
            ctx.exit(0)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.EIO, errno.EDQUOT, errno.EBADF):  # stdout on a full disk, a closed fd
                _silence_stdout()
                raise click.ClickException(f"cannot write the output: {e.strerror or e}") from None
            raise


class _ClosedStream(io.TextIOBase):
    """Stands in for a stream the process was started without (`>&-`): writing to stdout fails like a write to a
    closed descriptor (one line, exit 1); what would go to a closed stderr is dropped."""

    def __init__(self, name: str, fail: bool) -> None:
        self._name, self._fail = name, fail

    def write(self, s: str) -> int:
        if self._fail and s:
            raise OSError(errno.EBADF, f"{self._name} is closed")
        return len(s)

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        raise OSError(errno.EBADF, f"{self._name} is closed")


def _one_line_warning(message: Any, category: Any, filename: str, lineno: int, line: str | None = None) -> str:
    text = str(message)
    return f"{text if text.startswith('edgespec: ') else 'edgespec: ' + text}\n"


def _devnull_onto(fd: int) -> None:
    """Make descriptor `fd` write to /dev/null (it may be closed now)."""
    with contextlib.suppress(OSError):
        null = os.open(os.devnull, os.O_WRONLY)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)


def _stand_in_for_closed_streams() -> None:
    for fd in (1, 2):  # a closed descriptor would be the next file opened, and llama.cpp's own prints would land there
        try:
            os.fstat(fd)
        except OSError:
            _devnull_onto(fd)
    if sys.stderr is None:
        sys.stderr = _ClosedStream("stderr", fail=False)
    if sys.stdout is None:
        sys.stdout = _ClosedStream("stdout", fail=True)


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that Python's flush at exit does not fail a second time."""
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError, AttributeError):  # no descriptor behind it (closed, or a stand-in)
        return
    _devnull_onto(fd)


@click.group(cls=Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", "-V", prog_name="edgespec")
def main() -> None:
    """edgespec: exact speculative decoding for local GGUF models (llama.cpp backend).

    A small draft model (or an n-gram lookup) proposes tokens, the target verifies them in one batched pass, and
    an exact acceptance rule keeps the output distribution identical to the target's alone.

    Models: --target/--draft take a GGUF path or a known pair name; defaults come from $EDGESPEC_TARGET and
    $EDGESPEC_DRAFT, else the default pair in the model cache (`edgespec models pull`).
    """


from .bench import bench  # noqa: E402
from .chat import chat  # noqa: E402
from .generate import generate  # noqa: E402
from .info import info  # noqa: E402
from .infill import infill  # noqa: E402
from .models import models  # noqa: E402
from .rpc_server import rpc_server  # noqa: E402
from .serve import serve  # noqa: E402

for _cmd in (info, generate, infill, chat, bench, models, serve, rpc_server):
    main.add_command(_cmd)
