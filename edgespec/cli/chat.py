"""`edgespec chat`: an interactive terminal chat (the library part is edgespec.runtime.chat.ChatSession).

On a terminal, input has line editing and history (prompt_toolkit; the history file is EDGESPEC_DATA_DIR/chat_history,
of which only the last HISTORY_TAIL_BYTES are read; a history file that cannot be used is replaced by an in-memory
history and said once). Otherwise lines are read plainly from stdin (invalid UTF-8 becomes U+FFFD), so
`printf 'hi\\n/stats\\n' | edgespec chat` works.

Ctrl-C during an answer (or while its prompt is being processed) cancels it: the engine stops within one cycle or
one prefill chunk, and the partial answer stays in the conversation.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable, Iterable

import click

from edgespec.errors import BackendLostError, EdgespecError
from edgespec.paths import data_dir
from edgespec.stats import summary_line
from .common import load_engine, make_sampling, model_options, sampling_options

FENCE = '"""'
HISTORY_TAIL_BYTES = 256 * 1024
MAX_LINE_BYTES = 16 * 1024 * 1024

HELP = f"""\
Commands:
  /help            this help
  /reset           clear the conversation (the system prompt stays)
  /system TEXT     set the system prompt and start over (/system alone shows it)
  /stats           session totals: turns, tokens, tok/s, μ, acceptance
  /save FILE       save the conversation as JSON (docs/api.md: the conversation file)
  /load FILE       go on with a saved conversation (its messages, settings and cache)
  /exit            leave (also Ctrl-D)
Multi-line input: a line with just {FENCE} starts a block, another {FENCE} line ends and sends it
  (text may follow the opening {FENCE} or precede the closing one). On a terminal, Esc Enter / Alt-Enter also
  inserts a newline.
Ctrl-C stops an answer and keeps what was written; at the prompt it clears the line, twice leaves."""


class Output:
    """stdout with styling only on a terminal (never escape codes in a pipe)."""

    def __init__(self, show_draft: bool) -> None:
        self.tty = sys.stdout.isatty()
        self.show_draft = show_draft and self.tty

    def write(self, text: str, **style: Any) -> None:
        click.echo(click.style(text, **style) if (self.tty and style) else text, nl=False)
        sys.stdout.flush()

    def line(self, text: str = "", **style: Any) -> None:
        self.write(text + "\n", **style)

    def dim(self, text: str) -> None:
        self.line(text, dim=True)

    def chunk(self, text: str, from_draft: bool) -> None:
        self.write(text, fg="cyan") if self.show_draft and from_draft else self.write(text)


# --------------------------------------------------------------------------------------------- input
class _Interrupt(Exception):
    """Ctrl-C at an empty prompt."""


def _history(notes: list[str]) -> Any:
    """prompt_toolkit history backed by a file, reading only its tail; in memory when the file cannot be used."""
    from prompt_toolkit.history import History, InMemoryHistory

    path = data_dir() / "chat_history"

    class TailFileHistory(History):
        def load_history_strings(self) -> Iterable[str]:
            with open(path, "rb") as fh:
                size = fh.seek(0, os.SEEK_END)
                fh.seek(max(0, size - HISTORY_TAIL_BYTES))
                data = fh.read().decode("utf-8", "replace")
            entries, lines = [], []
            for line in data.splitlines():
                if line.startswith("+"):
                    lines.append(line[1:])
                elif lines:
                    entries.append("\n".join(lines))
                    lines = []
            if lines:
                entries.append("\n".join(lines))
            return list(reversed(entries))

        def store_string(self, string: str) -> None:
            try:
                with open(path, "ab") as fh:
                    fh.write(f"\n# {datetime.datetime.now()}\n".encode())
                    for line in string.split("\n"):
                        fh.write(f"+{line}\n".encode("utf-8", "replace"))
            except OSError as e:
                if not notes:
                    notes.append(f"(input history not saved: {e.strerror or e})")

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and not path.is_file():
            raise IsADirectoryError(21, f"{path} is not a file")
        with open(path, "ab"):
            pass
        history = TailFileHistory()
        list(history.load_history_strings())
        return history
    except OSError as e:
        notes.append(f"(input history off: {path}: {e.strerror or e})")
        return InMemoryHistory()


def _tty_reader(notes: list[str]) -> Callable[[str], str]:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.key_binding import KeyBindings

    kb = KeyBindings()

    @kb.add("escape", "enter")
    def _newline(event: Any) -> None:  # Esc Enter / Alt-Enter: a newline in the same message
        event.current_buffer.insert_text("\n")

    @kb.add("c-c")
    def _ctrl_c(event: Any) -> None:  # clear the line; on an empty line, report it (twice leaves)
        buf = event.current_buffer
        if buf.text:
            buf.reset()
        else:
            event.app.exit(exception=_Interrupt())

    session: Any = PromptSession(history=_history(notes), key_bindings=kb, enable_history_search=False)
    return lambda prompt: session.prompt(prompt)


def _pipe_reader() -> Callable[[str], str]:
    stream = sys.stdin.buffer if sys.stdin is not None and hasattr(sys.stdin, "buffer") else None

    def read(prompt: str) -> str:
        if stream is None:
            raise EOFError
        try:
            raw = stream.readline(MAX_LINE_BYTES)
        except (OSError, ValueError):
            raise EOFError from None
        if not raw:
            raise EOFError
        return raw.decode("utf-8", "replace").rstrip("\r\n")

    return read


def read_message(read: Callable[[str], str], prompt: str, cont: str) -> str:
    """One message: a line, or a block between {FENCE} lines."""
    line = read(prompt)
    if not line.strip().startswith(FENCE):
        return line
    first = line.strip()[len(FENCE):]
    if first.endswith(FENCE) and len(line.strip()) >= 2 * len(FENCE):
        return first[: -len(FENCE)]
    lines = [first] if first else []
    while True:
        try:
            line = read(cont)
        except EOFError:
            break  # an unclosed block at end of input is sent as is
        if line.rstrip().endswith(FENCE):
            rest = line.rstrip()[: -len(FENCE)]
            if rest:
                lines.append(rest)
            break
        lines.append(line)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------- generation
class _CancelOnSigint:
    """While active, Ctrl-C cancels `turn` (the engine stops within a cycle or prefill chunk) instead of raising."""

    def __init__(self) -> None:
        self.turn: Any = None
        self.hit = False
        self._old: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        self.hit = True
        if self.turn is not None:
            self.turn.cancel()

    def __enter__(self) -> "_CancelOnSigint":
        try:
            self._old = signal.signal(signal.SIGINT, self._handler)
        except ValueError:  # not the main thread
            self._old = None
        return self

    def __exit__(self, *exc: object) -> None:
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)


def _answer(session: Any, text: str, out: Output) -> None:
    from edgespec.runtime.chat import ChatContextError

    with _CancelOnSigint() as guard:
        try:
            turn = session.send(text)
        except ChatContextError as e:
            out.dim(f"! {e}")
            return
        guard.turn = turn
        if guard.hit:
            turn.cancel()
        if turn.notice:
            out.dim(f"({turn.notice})")
        try:
            for chunk in turn:
                out.chunk(chunk.text, chunk.from_draft)
        finally:
            turn.close()  # a no-op when it ran to the end; otherwise waits for the engine and keeps the partial answer
    out.line("")
    line = summary_line(turn.stats)
    out.dim(f"[{line.replace('stop: cancelled', 'interrupted')}]")


def _command(session: Any, line: str, out: Output) -> bool:
    """Run a slash command; False means leave."""
    name, _, arg = line.strip().partition(" ")
    arg = arg.strip()
    name = name.lower()
    if name in ("/exit", "/quit", "/q"):
        return False
    if name in ("/help", "/?"):
        out.line(HELP)
    elif name == "/reset":
        session.reset()
        out.dim("(conversation cleared" + (", system prompt kept)" if session.system else ")"))
    elif name == "/system":
        if not arg:
            out.dim(f"system: {session.system!r}" if session.system else "(no system prompt)")
        else:
            session.set_system(arg)
            out.dim("(system prompt set; conversation cleared)")
    elif name == "/stats":
        tot = session.totals
        line = f"session: {tot.runs} turn{'s' if tot.runs != 1 else ''} · " + summary_line(tot).split(" · ", 1)[1]
        if session.dropped_turns:
            line += f" · {session.dropped_turns} turns dropped for context"
        out.line(line)
    elif name == "/save":
        if not arg:
            out.line("usage: /save FILE")
        else:
            p = session.save(arg)  # a ChatError (one line) leaves the conversation as it was
            out.dim(f"(saved {len(session.messages)} messages to {p})")
    elif name == "/load":
        if not arg:
            out.line("usage: /load FILE")
        else:
            session.resume(arg)  # all or nothing: a ChatError leaves the conversation as it was
            _loaded(session, arg, out)
    else:
        out.line(f"unknown command {name}: try /help, /reset, /system TEXT, /stats, /save FILE, /load FILE, /exit")
    return True


def _loaded(session: Any, path: str, out: Output) -> None:
    n = len(session.messages)
    out.dim(f"(loaded {n} message{'s' if n != 1 else ''} from {path})")
    for note in session.notes:
        out.dim(f"({note})")


def run_chat(session: Any, read: Callable[[str], str], out: Output, tty: bool) -> None:
    prompt, cont = ("> ", "… ") if tty else ("", "")
    interrupts = 0
    while True:
        try:
            text = read_message(read, prompt, cont)
        except EOFError:
            if tty:
                out.line("")
            return
        except (_Interrupt, KeyboardInterrupt):
            interrupts += 1
            if interrupts >= 2:
                return
            out.dim("(Ctrl-C again or Ctrl-D to leave)")
            continue
        interrupts = 0
        if not text.strip():
            continue
        try:
            if text.lstrip().startswith("/") and "\n" not in text.strip():
                if not _command(session, text, out):
                    return
            else:
                _answer(session, text, out)
        except KeyboardInterrupt:  # outside generation (printing, a command): back to the prompt
            out.line("")
        except BackendLostError:  # the process ends in a moment (rpc.lost): keep the conversation first
            _save_lost(session, out)
            raise
        except EdgespecError as e:  # never leave the chat on a library error
            out.line(f"error: {e}")


def _save_lost(session: Any, out: Output) -> None:
    """An RPC server the model ran on is gone and the process ends (exit 75): save the conversation, its answer so far
    included, where `edgespec chat --resume` finds it."""
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    folder = data_dir() / "chats"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        p = session.save(folder / f"lost-{stamp}.json")
    except (OSError, EdgespecError) as e:
        out.line(f"error: the conversation could not be saved: {e}")
        return
    out.line(f"(the model's RPC server is gone; the conversation is saved: `edgespec chat --resume {p}` once it is back)")


# --------------------------------------------------------------------------------------------- command
@click.command("chat")
@model_options
@sampling_options
@click.option("--system", "-s", default=None, help="System prompt.")
@click.option("--max-tokens", "-n", type=click.IntRange(1, 1 << 20), default=1024, show_default=True, help="Most tokens per answer.")
@click.option("--show-draft", is_flag=True, help="Colour text that came from accepted draft tokens (terminal only).")
@click.option("--pull", is_flag=True, help="Download the default model pair first if it is missing (edgespec models pull).")
@click.option("--resume", metavar="FILE", default=None,
              help="Go on with a conversation saved by /save (its messages, settings and cache); sampling options and "
                   "--max-tokens given here win over the saved ones.")
def chat(**kw: Any) -> None:
    """Chat with the model in the terminal, with KV-cache reuse across turns.

    Type a message and press Enter. A line with just \"\"\" starts a multi-line message, another \"\"\" line
    sends it (on a terminal Esc Enter / Alt-Enter also inserts a newline). Commands: /help, /reset,
    /system TEXT, /stats, /save FILE, /load FILE, /exit. Ctrl-C stops an answer; Ctrl-D leaves.
    """
    from edgespec.runtime.chat import ChatSession
    from edgespec.runtime.chat_file import parse_conversation, read_conversation

    explicit = _explicit(SAMPLING_NAMES + ("max_tokens", "system"))
    sampling = make_sampling(kw)
    system, max_tokens = kw.pop("system"), kw.pop("max_tokens")
    show_draft, pull, resume = kw.pop("show_draft"), kw.pop("pull"), kw.pop("resume")
    if resume is not None:
        parse_conversation(read_conversation(resume))  # a bad file is refused before any model loads
        if "system" in explicit:
            click.echo("note: --system is ignored with --resume: the saved system prompt is kept (/system TEXT sets another "
                       "and starts over)", err=True)
    if pull:
        _pull(kw.get("target"))
    out = Output(show_draft)
    tty = sys.stdin is not None and sys.stdin.isatty()
    with load_engine(kw) as eng:
        if resume is not None:
            session = ChatSession.load(eng, resume)
            given = {k: getattr(sampling, k) for k in SAMPLING_NAMES if k in explicit}
            if given:
                session.sampling = dataclasses.replace(session.sampling, **given)
            if "max_tokens" in explicit:
                session.max_tokens = max_tokens
        else:
            session = ChatSession(eng, sampling=sampling, max_tokens=max_tokens)
            if system:
                session.set_system(system)
        notes: list[str] = []
        read = _tty_reader(notes) if tty else _pipe_reader()
        if tty:
            draft = f"draft {eng.draft.name}" if eng.draft is not None else f"drafter {eng.drafter_kind}"
            out.dim(
                f"edgespec chat · target {eng.target.name} · {draft} · ctx {eng.target.n_ctx}"
                " · /help for commands, Ctrl-D to leave"
            )
            for note in notes:
                out.dim(note)
        if resume is not None:
            _loaded(session, resume, out)
        run_chat(session, read, out, tty)


SAMPLING_NAMES = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "presence_penalty", "frequency_penalty", "seed")


def _explicit(names: Iterable[str]) -> set[str]:
    """The options among `names` the user gave (on the command line or in the environment), not defaults."""
    from click.core import ParameterSource

    ctx = click.get_current_context()
    given = (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)
    return {n for n in names if ctx.get_parameter_source(n) in given}


def _pull(target: str | None) -> None:
    """Fetch the pair named by --target (or the default pair) unless --target is a file."""
    from edgespec import models

    if target is not None and Path(target).expanduser().exists():
        return
    pair = target if target is not None and target in models.load_manifests() else None
    if target is not None and pair is None:
        return  # a file name that resolve_model will explain
    models.pull(pair, progress=True)


__all__ = ["chat", "run_chat", "read_message", "HELP"]
