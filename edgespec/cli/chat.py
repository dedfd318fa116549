"""`edgespec chat`: an interactive terminal chat (the library part is edgespec.chat.ChatSession).

On a terminal, input has line editing and history (prompt_toolkit; history in
platformdirs.user_data_dir("edgespec")/chat_history, or $EDGESPEC_DATA_DIR/chat_history). Otherwise lines are read
plainly from stdin, so `printf 'hi\\n/stats\\n' | edgespec chat` works.

Ctrl-C during an answer stops that answer (the partial answer stays in the conversation); the SIGINT handler
installed while generating only sets a flag, checked between chunks, so no KeyboardInterrupt can land inside
the engine between a decode and the cache bookkeeping.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from typing import Any, Callable

import click

from .common import load_engine, make_sampling, model_options, sampling_options
from ..config import EdgespecError

FENCE = '"""'

HELP = f"""\
Commands:
  /help            this help
  /reset           clear the conversation (the system prompt stays)
  /system TEXT     set the system prompt and start over (/system alone shows it)
  /stats           session totals: turns, tokens, tok/s, μ, acceptance
  /save FILE       save the conversation as JSON {{"system", "messages", "settings"}}
  /exit            leave (also Ctrl-D)
Multi-line input: a line with just {FENCE} starts a block, another {FENCE} line ends and sends it
  (text may follow the opening {FENCE} or precede the closing one). On a terminal, Esc Enter / Alt-Enter also
  inserts a newline.
Ctrl-C stops an answer and keeps what was written; at the prompt it clears the line, twice leaves."""


def data_dir() -> Path:
    env = os.environ.get("EDGESPEC_DATA_DIR")
    if env:
        return Path(env).expanduser()
    import platformdirs

    return Path(platformdirs.user_data_dir("edgespec"))


# --------------------------------------------------------------------------------------------- formatting
def format_stats(stats: Any, *, interrupted: bool = False) -> str:
    """One line: tokens, tok/s, μ, acceptance, draft/target split, prefill."""
    t = stats.timings
    parts = [f"{stats.n_generated} tokens", f"{stats.tokens_per_second:.1f} tok/s"]
    if stats.n_drafted:
        parts.append(f"μ {stats.mu:.2f}")
        parts.append(f"accepted {100 * stats.acceptance:.0f}%")
    busy = t.draft + t.target
    if busy > 0:
        parts.append(f"draft {t.draft:.2f}s / target {t.target:.2f}s ({100 * t.draft / busy:.0f}/{100 * t.target / busy:.0f})")
    parts.append(f"prefill {stats.n_prefill} tok {t.prefill:.2f}s")
    reason = "interrupted" if interrupted else stats.stop_reason
    if reason and reason != "eos":
        parts.append(reason)
    return "[" + " · ".join(parts) + "]"


def format_totals(tot: Any) -> str:
    parts = [f"{tot.turns} turn{'s' if tot.turns != 1 else ''}", f"{tot.n_generated} tokens", f"{tot.tokens_per_second:.1f} tok/s"]
    if tot.n_drafted:
        parts += [f"μ {tot.mu:.2f}", f"accepted {100 * tot.acceptance:.0f}%"]
    parts.append(f"draft {tot.timings.draft:.2f}s / target {tot.timings.target:.2f}s")
    parts.append(f"prefill {tot.n_prefill} of {tot.n_prompt} prompt tokens {tot.timings.prefill:.2f}s")
    if tot.interrupted:
        parts.append(f"{tot.interrupted} interrupted")
    if tot.dropped_turns:
        parts.append(f"{tot.dropped_turns} turns dropped for context")
    return "session: " + ", ".join(parts)


class Output:
    """stdout with styling only on a terminal (never escape codes in a pipe)."""

    def __init__(self, show_draft: bool) -> None:
        self.tty = sys.stdout.isatty()
        self.show_draft = show_draft and self.tty

    def write(self, text: str, **style: Any) -> None:
        click.echo(click.style(text, **style) if (self.tty and style) else text, nl=False)

    def line(self, text: str = "", **style: Any) -> None:
        self.write(text, **style)
        click.echo("")

    def dim(self, text: str) -> None:
        self.line(text, dim=True)

    def chunk(self, text: str, from_draft: bool) -> None:
        if self.show_draft and from_draft:
            self.write(text, fg="cyan")
        else:
            self.write(text)


# --------------------------------------------------------------------------------------------- input
class _Interrupt(Exception):
    """Ctrl-C at an empty prompt."""


def _tty_reader() -> Callable[[str], str]:
    from prompt_toolkit import PromptSession
    from prompt_toolkit.history import FileHistory, InMemoryHistory
    from prompt_toolkit.key_binding import KeyBindings

    history: Any
    try:
        d = data_dir()
        d.mkdir(parents=True, exist_ok=True)
        history = FileHistory(str(d / "chat_history"))
    except OSError:
        history = InMemoryHistory()
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

    session: Any = PromptSession(history=history, key_bindings=kb, enable_history_search=False)

    def read(prompt: str) -> str:
        return session.prompt(prompt)

    return read


def _pipe_reader() -> Callable[[str], str]:
    stream = sys.stdin

    def read(prompt: str) -> str:
        line = stream.readline()
        if not line:
            raise EOFError
        return line.rstrip("\r\n")

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
class _SigintFlag:
    """While active, SIGINT only sets `.hit`; the previous handler is restored on exit."""

    def __init__(self) -> None:
        self.hit = False
        self._old: Any = None
        self._installed = False

    def _handler(self, signum: int, frame: Any) -> None:
        self.hit = True

    def __enter__(self) -> "_SigintFlag":
        try:
            self._old = signal.signal(signal.SIGINT, self._handler)
            self._installed = True
        except ValueError:  # not the main thread: no handler, no interruption
            pass
        return self

    def __exit__(self, *exc: object) -> None:
        if self._installed:
            signal.signal(signal.SIGINT, self._old)


def _answer(session: Any, text: str, out: Output) -> None:
    from ..chat import ChatContextError

    # From here until the answer is recorded, Ctrl-C only raises a flag: the engine is never interrupted between
    # a decode and its cache bookkeeping, and the session always records the (partial) answer.
    with _SigintFlag() as flag:
        try:
            turn = session.send(text)
        except ChatContextError as e:
            out.dim(f"! {e}")
            return
        if turn.notice:
            out.dim(f"({turn.notice})")
        try:
            if not flag.hit:
                for chunk in turn:
                    out.chunk(chunk.text, chunk.from_draft)
                    if flag.hit:
                        break
        finally:
            turn.close()  # a no-op when it ran to the end; otherwise stops it and keeps the partial answer
    out.line("")
    out.dim(format_stats(turn.stats, interrupted=turn.interrupted))


def _command(session: Any, line: str, out: Output) -> bool:
    """Run a slash command; False means leave."""
    from ..chat import ChatError

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
        out.line(format_totals(session.totals))
    elif name == "/save":
        if not arg:
            out.line("usage: /save FILE")
        else:
            try:
                p = session.save(arg)
            except ChatError as e:
                out.line(f"error: {e}")
            else:
                out.dim(f"(saved {len(session.messages)} messages to {p})")
    else:
        out.line(f"unknown command {name}: try /help, /reset, /system TEXT, /stats, /save FILE, /exit")
    return True


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
        except EdgespecError as e:  # never leave the chat on a library error
            out.line(f"error: {e}")


# --------------------------------------------------------------------------------------------- command
@click.command("chat")
@model_options
@sampling_options
@click.option("--system", "-s", default=None, help="System prompt.")
@click.option("--max-tokens", "-n", type=click.IntRange(min=1), default=1024, show_default=True, help="Most tokens per answer.")
@click.option("--show-draft", is_flag=True, help="Colour text that came from accepted draft tokens (terminal only).")
@click.option("--pull", is_flag=True, help="Download the default model pair first if it is missing (edgespec models pull).")
def chat(**kw: Any) -> None:
    """Chat with the model in the terminal, with KV-cache reuse across turns.

    Type a message and press Enter. A line with just \"\"\" starts a multi-line message, another \"\"\" line
    sends it (on a terminal Esc Enter / Alt-Enter also inserts a newline). Commands: /help, /reset,
    /system TEXT, /stats, /save FILE, /exit. Ctrl-C stops an answer; Ctrl-D leaves.
    """
    from ..chat import ChatSession

    sampling = make_sampling(kw)
    system, max_tokens = kw.pop("system"), kw.pop("max_tokens")
    show_draft, pull = kw.pop("show_draft"), kw.pop("pull")
    if pull:
        _pull(kw.get("target"))
    out = Output(show_draft)
    tty = sys.stdin.isatty()
    with load_engine(kw) as eng:
        session = ChatSession(eng, system=system, sampling=sampling, max_tokens=max_tokens)
        if tty:
            draft = f"draft {eng.draft.name}" if eng.draft is not None else f"drafter {eng.drafter_kind}"
            out.dim(
                f"edgespec chat · target {eng.target.name} · {draft} · ctx {eng.target.n_ctx}"
                " · /help for commands, Ctrl-D to leave"
            )
        read = _tty_reader() if tty else _pipe_reader()
        run_chat(session, read, out, tty)



def _pull(target: str | None) -> None:
    """Fetch the pair named by --target (or the default pair) unless --target is a file."""
    from .. import models

    if target is not None and Path(target).expanduser().exists():
        return
    pair = target if target is not None and target in models.load_manifests() else None
    if target is not None and pair is None:
        return  # a file name that resolve_model will explain
    models.pull(pair, progress=True)


__all__ = ["chat", "run_chat", "read_message", "format_stats", "format_totals", "HELP"]
