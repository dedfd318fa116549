"""A multi-turn chat on top of the Engine, with KV-cache reuse across turns (no terminal code here).

    from edgespec import Engine
    from edgespec.runtime.chat import ChatSession
    eng = Engine.load("target.gguf", "draft.gguf")
    chat = ChatSession(eng, system="You are terse.", sampling=SamplingParams(temperature=0))
    for chunk in chat.send("Write a haiku"):
        print(chunk.text, end="")
    turn = chat.send("Another one")       # decodes only the new message's tokens
    print(turn.result().text)

KV reuse. The session keeps `tokens`: the last prompt's token ids followed by the ids the model generated
(including its end token, e.g. <|im_end|>), and `text`, the template text those tokens stand for. A new user
turn renders the whole conversation with the model's chat template; when the rendering starts with `text` (the
usual case: ChatML's delta is "\\n<|im_start|>user\\n...") only the delta is tokenized and appended, so the token
sequence stays exactly what the models' caches hold and only the new tokens are decoded. Otherwise (a template
that rewrites history, an answer cut inside a UTF-8 character, dropped turns) the conversation is tokenized afresh
and the engine still reuses the longest common prefix. Several sessions may share one engine: the engine keeps a
snapshot of each conversation's cache, so switching back decodes only the new message.

Message contents are text: control-token text a user types stays text (engine.chat_segments).

Context. Before a turn the prompt plus a reserve for the answer (min(max_tokens, n_ctx // 2) + 1) must fit in the
target's context; if it does not, the oldest user/assistant turns are dropped (the system prompt stays) until
the kept history fits in half of the room, or at least fits. If even the new message alone leaves no room for
a short answer, `send` raises ChatContextError and the conversation is unchanged.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from edgespec.prompts.chat_template import clip_segments
from edgespec.config import DEFAULT_SAMPLING, SamplingParams, check_stop
from edgespec.decoding.detok import complete_utf8
from edgespec.errors import ConfigError, ContextFullError, EdgespecError
from edgespec.fsutil import atomic_write_text, read_json_file
from .request import GenerationRequest
from edgespec.stats import GenerationStats, Totals

if TYPE_CHECKING:  # pragma: no cover
    from edgespec.decoding.constraint import Constraint
    from .engine import Chunk, Engine, Generation

MIN_ANSWER_TOKENS = 16  # with no history left, a message is accepted if at least this many answer tokens fit


class ChatError(EdgespecError):
    """A chat-level problem (bad file for /save, ...)."""


class ChatContextError(ChatError):
    """The new message does not fit in the context window even without any history."""


class Turn:
    """One answer being generated: an iterator of Chunks (like engine.Generation) that records itself in the
    session when it ends: exhausted, `close()`d (an interrupted answer is kept as it stands), or superseded by
    the next `send`/`reset`."""

    def __init__(
        self,
        session: "ChatSession",
        gen: "Generation",
        user: dict[str, str],
        prompt_tokens: list[int],
        prompt_text: str,
        *,
        n_new_tokens: int,
        reused: bool,
        dropped: int,
        short_room: bool,
    ) -> None:
        self._session = session
        self._gen = gen
        self.user = user
        self.prompt_tokens = prompt_tokens
        self.prompt_text = prompt_text
        self.n_new_tokens = n_new_tokens  # prompt tokens appended to the session's token sequence for this turn
        self.reused = reused  # True: the delta was appended to the previous tokens; False: full re-tokenization
        self.dropped = dropped  # oldest user/assistant turns dropped to make room
        self.short_room = short_room  # True: less room than max_tokens for the answer
        self.done = False
        self.interrupted = False
        self.content = ""  # the assistant message as recorded (set when the turn ends)

    @property
    def notice(self) -> str | None:
        """A one-line remark for the user about this turn's context handling, or None."""
        parts = []
        if self.dropped:
            parts.append(
                f"context full: dropped the {self.dropped} oldest turn{'s' if self.dropped != 1 else ''} "
                f"(prompt now {len(self.prompt_tokens)} of {self._session.n_ctx} tokens)"
            )
        if self.short_room:
            room = self._session.n_ctx - len(self.prompt_tokens)
            parts.append(f"only {room} tokens of context left for the answer")
        return "; ".join(parts) or None

    # -------------------------------------------------------------- Generation-like surface
    def __iter__(self) -> Iterator["Chunk"]:
        return self

    def __next__(self) -> "Chunk":
        if self.done:
            raise StopIteration
        try:
            return next(self._gen)
        except StopIteration:
            self._finish()
            raise
        except BaseException:
            self._gen.close()
            self._finish()
            raise

    def cancel(self) -> None:
        """Ask the answer to stop (any thread); iteration then ends and the partial answer is kept."""
        self._gen.cancel()

    def close(self) -> None:
        """Stop generating now; the partial answer becomes the assistant message."""
        if self.done:
            return
        self._gen.close()
        self._finish()

    def result(self) -> "Turn":
        for _ in self:
            pass
        return self

    @property
    def text(self) -> str:
        return self.content if self.done else self._gen.text

    @property
    def token_ids(self) -> list[int]:
        return self._gen.token_ids

    @property
    def stats(self) -> GenerationStats:
        return self._gen.stats

    @property
    def finish_reason(self) -> str:
        return "interrupted" if self.interrupted else self._gen.finish_reason

    def _finish(self) -> None:
        if self.done:
            return
        self._gen.wait()
        self.done = True
        self.interrupted = self._gen.finish_reason == "cancelled" or self._gen._job.error is not None
        self._session._commit(self)


class ChatSession:
    """A conversation with an Engine: system prompt, user/assistant messages, and the token sequence that the
    models' KV caches hold. Used from one thread at a time (a Turn's cancel() works from any thread)."""

    def __init__(
        self,
        engine: "Engine",
        system: str | None = None,
        *,
        sampling: SamplingParams | None = None,
        max_tokens: int = 1024,
        stop: Sequence[str] = (),
        speculative: bool = True,
    ) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ChatError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        if system is not None and not isinstance(system, str):
            raise ChatError("the system prompt must be text")
        self.engine = engine
        self.system = system or None
        self.sampling = sampling or DEFAULT_SAMPLING
        self.max_tokens = max_tokens
        try:
            self.stop = check_stop(stop)
        except ConfigError as e:
            raise ChatError(str(e)) from None
        self.speculative = speculative
        self.messages: list[dict[str, str]] = []  # user/assistant only; the system prompt is separate
        self.tokens: list[int] = []  # last prompt + generated ids (what the caches hold after a turn)
        self.text = ""  # the template text `tokens` stand for
        self.totals = Totals()
        self.dropped_turns = 0  # turns dropped to make room, over the whole session
        self.notes: list[str] = []  # remarks from the last load() for the user (a foreign cache, another model)
        self._pending: Turn | None = None

    # -------------------------------------------------------------- conversation state
    @property
    def n_ctx(self) -> int:
        return self.engine.target.n_ctx

    @property
    def reserve(self) -> int:
        """Context kept free for the answer when deciding whether history must be dropped."""
        return min(self.max_tokens, self.n_ctx // 2) + 1

    def conversation(self, messages: Sequence[dict[str, str]] | None = None) -> list[dict[str, str]]:
        msgs = list(self.messages if messages is None else messages)
        return ([{"role": "system", "content": self.system}] if self.system else []) + msgs

    def reset(self) -> None:
        """Forget the conversation (the system prompt stays). The caches are re-synchronised lazily."""
        self._settle()
        self.messages = []
        self.tokens = []
        self.text = ""

    def set_system(self, system: str | None) -> None:
        """Set (or clear, with None/"") the system prompt and start a new conversation. A system prompt that
        leaves no room for a message and a short answer is refused (ChatContextError) and nothing changes."""
        self._settle()
        if system is not None and not isinstance(system, str):
            raise ChatError("the system prompt must be text")
        if system:
            toks, _ = self._full([{"role": "system", "content": system}, {"role": "user", "content": ""}], system=False)
            if len(toks) + min(MIN_ANSWER_TOKENS, self.reserve) > self.n_ctx:
                raise ChatContextError(
                    f"the system prompt does not fit: {len(toks)} tokens leave no room for a message and an answer in a "
                    f"context of {self.n_ctx} tokens"
                )
        self.system = system or None
        self.reset()

    # -------------------------------------------------------------- turns
    def _full(self, messages: Sequence[dict[str, str]], system: bool = True) -> tuple[list[int], str]:
        conv = self.conversation(messages) if system else list(messages)
        segments = self.engine.chat_segments(conv, add_generation_prompt=True)
        return self.engine.segment_tokens(segments, add_bos=True), "".join(t for t, _ in segments)

    def _prompt_for(self, messages: list[dict[str, str]]) -> tuple[list[int], str, int, bool]:
        """(tokens, text, new tokens, reused) for the prompt ending with the generation prompt after `messages`."""
        segments = self.engine.chat_segments(self.conversation(messages), add_generation_prompt=True)
        text = "".join(t for t, _ in segments)
        if self.tokens and self.text and text.startswith(self.text) and len(text) > len(self.text):
            delta = self.engine.segment_tokens(clip_segments(segments, len(self.text)), add_bos=False)
            return self.tokens + delta, text, len(delta), True
        toks = self.engine.segment_tokens(segments, add_bos=True)
        return toks, text, len(toks), False

    def send(self, text: str, *, constraint: Constraint | Mapping[str, Any] | None = None) -> Turn:
        """Add a user message and start the answer. Iterate the returned Turn for Chunks (or call .result());
        the answer is recorded in the conversation when it ends or is closed.

        constraint: what this answer must look like (a constraint.Constraint, or an OpenAI `response_format` dict),
        as Engine.stream takes it; the answer joins the conversation as text like any other. A constraint that
        cannot be used raises ChatError before anything changes."""
        if not isinstance(text, str):
            raise ChatError("a message must be text")
        try:
            self.engine.check_prompt_size(len(text))  # before rendering and tokenizing a message that cannot fit
        except ContextFullError as e:
            raise ChatContextError(f"the message does not fit: {e}") from None
        self._settle()
        user = {"role": "user", "content": text}
        msgs = self.messages + [user]
        tokens, ptext, n_new, reused = self._prompt_for(msgs)
        dropped = 0
        if len(tokens) + self.reserve > self.n_ctx:
            tokens, ptext, dropped = self._make_room(msgs)
            n_new, reused = len(tokens), False
        short = len(tokens) + self.reserve > self.n_ctx
        max_tokens = max(1, min(self.max_tokens, self.n_ctx - len(tokens)))
        try:
            gen = self.engine.start(GenerationRequest(
                tokens=tokens, sampling=self.sampling, max_tokens=max_tokens, stop=self.stop, speculative=self.speculative,
                constraint=constraint,
            ))
        except ConfigError as e:
            raise ChatError(str(e)) from None
        if dropped:
            self.messages = msgs[_drop_index(msgs, dropped):-1]
            self.dropped_turns += dropped
        turn = Turn(self, gen, user, tokens, ptext, n_new_tokens=n_new, reused=reused, dropped=dropped, short_room=short)
        self._pending = turn
        return turn

    def _make_room(self, msgs: list[dict[str, str]]) -> tuple[list[int], str, int]:
        """Drop the oldest turns of `msgs` (its last message is the new one) until the prompt fits; prefer keeping
        at most half the room so that the next turns do not have to drop (and re-prefill) again: the fewest turns
        dropped that leave at most half the room, else every earlier turn when that fits the room.

        A prompt never grows when more turns are dropped, so the count is found by bisection: O(log n) renderings
        of n messages, where trying each count in turn was O(n^2) (2,000 short messages: 193 s)."""
        room = self.n_ctx - self.reserve
        n_turns = _count_turns(msgs[:-1])
        tried: dict[int, tuple[list[int], str]] = {}

        def full(k: int) -> tuple[list[int], str]:
            if k not in tried:
                tried[k] = self._full(msgs[_drop_index(msgs, k):])
            return tried[k]

        lo, hi = 1, n_turns  # the answer lies in [lo, hi] if any k <= n_turns leaves half the room
        if n_turns >= 1 and len(full(n_turns)[0]) <= room // 2:
            while lo < hi:
                mid = (lo + hi) // 2
                if len(full(mid)[0]) <= room // 2:
                    hi = mid
                else:
                    lo = mid + 1
            return (*full(lo), lo)
        if n_turns >= 1 and len(full(n_turns)[0]) <= room:
            return (*full(n_turns), n_turns)
        toks, text = self._full(msgs[-1:])
        if len(toks) + min(MIN_ANSWER_TOKENS, self.reserve) > self.n_ctx:
            raise ChatContextError(
                f"the message does not fit: {len(toks)} prompt tokens leave no room for an answer in a context "
                f"of {self.n_ctx} tokens (use a shorter message or a larger --ctx)"
            )
        return toks, text, n_turns

    def _settle(self) -> None:
        """End a turn that the caller abandoned without closing it."""
        if self._pending is not None and not self._pending.done:
            self._pending.close()
        self._pending = None

    def _commit(self, turn: Turn) -> None:
        tgt = self.engine.target
        ids = list(turn.token_ids)
        if turn.interrupted:
            ids = complete_utf8(ids, tgt.token_bytes)
        if self.stop and turn.finish_reason == "stop":
            content = turn._gen.text  # a stop string ended it: record what was shown
        else:
            content = b"".join(tgt.token_bytes(t) for t in ids if not tgt.is_eog(t)).decode("utf-8", "replace")
        turn.content = content
        self.messages.append(turn.user)
        self.messages.append({"role": "assistant", "content": content})
        self.tokens = list(turn.prompt_tokens) + ids
        self.text = turn.prompt_text + b"".join(tgt.token_bytes(t, special=True) for t in ids).decode("utf-8", "replace")
        self.totals.add(turn.stats)
        if self._pending is turn:
            self._pending = None

    # -------------------------------------------------------------- persistence
    def settings(self) -> dict[str, Any]:
        """What the conversation was generated with. target..n_ctx describe the engine (informative on load); the
        rest (max_tokens, stop, speculative, sampling) are the session's own and are restored by load()."""
        eng = self.engine
        return {
            "target": os.path.abspath(eng.target.spec.path),
            "draft": os.path.abspath(eng.draft.spec.path) if eng.draft is not None else None,
            "drafter": eng.drafter_kind,
            "draft_max": eng.spec.draft_max,
            "n_ctx": self.n_ctx,
            "max_tokens": self.max_tokens,
            "stop": list(self.stop),
            "speculative": self.speculative,
            "sampling": asdict(self.sampling),
        }

    def as_dict(self) -> dict[str, Any]:
        """The conversation as it stands, in the file format of save()/load() (docs/api.md): every ended turn, then
        a turn still being answered with its answer so far (taking a snapshot never stops an answer), and the token
        ids the caches hold for the ended turns."""
        msgs = [dict(m) for m in self.messages]
        turn = self._pending
        if turn is not None and not turn.done:
            msgs += [dict(turn.user), {"role": "assistant", "content": turn.text}]
        from .engine import vocab_fingerprint

        return {
            "format": FILE_FORMAT,
            "version": FILE_VERSION,
            "system": self.system,
            "messages": msgs,
            "settings": self.settings(),
            "cache": {"vocab": vocab_fingerprint(self.engine.target), "tokens": list(self.tokens)},
        }

    def save(self, path: str | os.PathLike[str]) -> Path:
        """Write as_dict() as JSON, atomically (a failed save leaves the old file as it was, and the conversation as
        it is); a ChatError (one line) for any path that cannot be written (a NUL byte, a folder, a device, no
        permission, a missing folder)."""
        p = _user_path(path, "save to")
        data = json.dumps(self.as_dict(), indent=2, ensure_ascii=False) + "\n"
        try:
            if p.is_dir():
                raise IsADirectoryError(21, "Is a directory")
            atomic_write_text(p, data)
        except (OSError, ValueError) as e:  # ValueError: a path the OS layer refuses (an embedded NUL byte)
            raise ChatError(f"cannot write {_shown(p)}: {getattr(e, 'strerror', None) or e}") from None
        return p

    @classmethod
    def load(cls, engine: "Engine", path: str | os.PathLike[str]) -> "ChatSession":
        """A session on `engine` that goes on with the conversation saved at `path` (by save() or /save): its system
        prompt, messages and settings (sampling, max_tokens, stop, speculative), and the token ids the caches held
        when their vocabulary is this engine's (the engine reuses its caches by content, so only what it does not
        hold is decoded). A file that is not such a conversation raises ChatError (one line), and nothing is loaded."""
        session = cls(engine)
        session.resume(path)
        return session

    def resume(self, path: str | os.PathLike[str]) -> None:
        """Replace this session's conversation and settings with the one saved at `path` (load() for a session that
        exists: `/load` in the chat). All or nothing: on a ChatError this session is unchanged."""
        from .engine import vocab_fingerprint

        data = read_conversation(path)
        conv = parse_conversation(data)  # its cache's ids matter only for the vocabulary they were saved with
        if conv.tokens and conv.vocab == vocab_fingerprint(self.engine.target):
            parse_conversation(data, n_vocab=self.engine.target.n_vocab)  # ids outside it: a tampered file
        if conv.system:
            toks, _ = self._full([{"role": "system", "content": conv.system}, {"role": "user", "content": ""}], system=False)
            if len(toks) + MIN_ANSWER_TOKENS > self.n_ctx:
                raise ChatContextError(
                    f"the saved system prompt does not fit: {len(toks)} tokens leave no room for a message and an answer in a "
                    f"context of {self.n_ctx} tokens (use a larger --ctx)"
                )
        tokens, text = self._cached_tokens(conv)
        saved = conv.settings.get("target")
        if isinstance(saved, str) and saved != os.path.abspath(self.engine.target.spec.path):
            conv.notes.append(f"saved with the target {saved}; going on with {self.engine.target.spec.path}")
        self._settle()
        self.system = conv.system
        self.messages = conv.messages
        self.sampling = conv.sampling if conv.sampling is not None else self.sampling
        self.max_tokens = conv.max_tokens if conv.max_tokens is not None else self.max_tokens
        self.stop = conv.stop if conv.stop is not None else self.stop
        self.speculative = conv.speculative if conv.speculative is not None else self.speculative
        self.tokens, self.text = tokens, text
        self.notes = conv.notes

    def _cached_tokens(self, conv: "Conversation") -> tuple[list[int], str]:
        """The saved token ids and their text when they can stand for the start of the conversation: saved for this
        vocabulary, within the context, starting as the template's rendering does. The rendering stays the truth: a
        turn reuses the ids only where their text is a prefix of the conversation's rendering (ChatSession.send),
        so ids that say something else are never shown to the model as this conversation."""
        from .engine import vocab_fingerprint

        tgt = self.engine.target
        if not conv.tokens or conv.vocab != vocab_fingerprint(tgt):
            if conv.tokens:
                conv.notes.append("the saved cache is for another vocabulary: the conversation is tokenized afresh")
            return [], ""
        if len(conv.tokens) > self.n_ctx:
            return [], ""
        toks = conv.tokens
        head = self.engine.segment_tokens([], add_bos=True)  # what every prompt starts with ([BOS] or nothing)
        if toks[: len(head)] != head:
            return [], ""
        # A control token only where the template puts markup, never inside a message's content: ids that spell a
        # content's "<|im_end|>" as the control token would smuggle a turn the messages do not show.
        conv_msgs = ([{"role": "system", "content": conv.system}] if conv.system else []) + conv.messages
        segments = self.engine.chat_segments(conv_msgs, add_generation_prompt=False) if conv_msgs else []
        markup: list[tuple[int, int]] = []
        pos = 0
        for seg_text, is_content in segments:
            n = len(seg_text.encode("utf-8", "surrogateescape"))
            if not is_content:
                markup.append((pos, pos + n))
            pos += n
        control = set(tgt.control_tokens())
        pieces, off = [], 0
        for t in toks[len(head):]:
            piece = tgt.token_bytes(t, special=True)
            if t in control and piece and not any(a <= off and off + len(piece) <= b for a, b in markup):
                conv.notes.append("the saved cache puts a control token where the conversation has text: tokenized afresh")
                return [], ""
            pieces.append(piece)
            off += len(piece)
        return list(toks), b"".join(pieces).decode("utf-8", "replace")


# ------------------------------------------------------------------------------------------------- file format
FILE_FORMAT = "edgespec-chat"
FILE_VERSION = 1
MAX_FILE_BYTES = 64 * 1024 * 1024  # far past any conversation a context holds; larger is a wrong file
MAX_MESSAGES = 100_000
ROLES = ("user", "assistant")
_SESSION_SETTINGS = ("max_tokens", "stop", "speculative", "sampling")
_ENGINE_SETTINGS = ("target", "draft", "drafter", "draft_max", "n_ctx")


class Conversation:
    """A saved conversation, checked (parse_conversation): everything load() restores."""

    def __init__(self) -> None:
        self.system: str | None = None
        self.messages: list[dict[str, str]] = []
        self.sampling: SamplingParams | None = None
        self.max_tokens: int | None = None
        self.stop: tuple[str, ...] | None = None
        self.speculative: bool | None = None
        self.vocab: str | None = None
        self.tokens: list[int] = []
        self.settings: dict[str, Any] = {}  # as saved (the engine's part is informative)
        self.notes: list[str] = []  # remarks for the user (a foreign cache dropped, ...)


def read_conversation(path: str | os.PathLike[str]) -> Any:
    """The JSON in a conversation file; ChatError (one line) for a path that is not a readable regular file of at
    most MAX_FILE_BYTES (a FIFO or a device is never waited on, a folder, a symlink loop) or not strict JSON (NaN,
    a 5,000-digit number, nesting too deep)."""
    p = _user_path(path, "load")
    try:
        return read_json_file(p, MAX_FILE_BYTES)
    except OSError as e:
        raise ChatError(f"cannot read {_shown(p)}: {e.strerror or e}") from None
    except ValueError as e:
        raise ChatError(f"{_shown(p)} is not a saved conversation (not valid JSON: {_one_line(e)})") from None


def parse_conversation(data: Any, *, n_vocab: int | None = None) -> Conversation:
    """Check a saved conversation (the JSON of save(), any version up to FILE_VERSION; a file without a version is
    the first format, without a cache) and return what load() restores; ChatError naming the first problem.
    n_vocab: token ids must be below it (ids out of range are a tampered file)."""
    def bad(why: str) -> ChatError:
        return ChatError(f"not a saved conversation: {why}")

    if not isinstance(data, dict):
        raise bad(f"the file holds a JSON {_json_type(data)}, not an object")
    version = data.get("version", 0)
    if "version" in data or "format" in data:
        if data.get("format") != FILE_FORMAT:
            raise bad(f"format must be {FILE_FORMAT!r}, got {_short(data.get('format'))}")
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise bad(f"version must be a positive integer, got {_short(version)}")
        if version > FILE_VERSION:
            raise bad(f"version {version} was written by a newer edgespec (this one reads up to {FILE_VERSION})")
    unknown = sorted(set(data) - {"format", "version", "system", "messages", "settings", "cache"})
    if unknown:
        raise bad(f"unknown field {_short(unknown[0])}")
    conv = Conversation()
    system = data.get("system")
    if system is not None:
        conv.system = _text(system, "the system prompt", bad) or None
    msgs = data.get("messages")
    if not isinstance(msgs, list):
        raise bad(f"messages must be a list, got {_json_type(msgs)}")
    if len(msgs) > MAX_MESSAGES:
        raise bad(f"{len(msgs)} messages (at most {MAX_MESSAGES})")
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise bad(f"message {i + 1} is a JSON {_json_type(m)}, not an object")
        if set(m) != {"role", "content"}:
            extra = sorted(set(m) - {"role", "content"})
            raise bad(f"message {i + 1} " + (f"has an unknown field {_short(extra[0])}" if extra else "needs a role and a content"))
        role = m["role"]
        want = ROLES[i % 2]
        if role != want:
            raise bad(f"message {i + 1} must have role {want!r} (user and assistant alternate), got {_short(role)}")
        conv.messages.append({"role": role, "content": _text(m["content"], f"message {i + 1}'s content", bad)})
    settings = data.get("settings", {})
    if not isinstance(settings, dict):
        raise bad(f"settings must be an object, got {_json_type(settings)}")
    unknown = sorted(set(settings) - set(_SESSION_SETTINGS) - set(_ENGINE_SETTINGS))
    if unknown:
        raise bad(f"unknown setting {_short(unknown[0])}")
    conv.settings = dict(settings)
    try:
        if settings.get("sampling") is not None:
            sp = settings["sampling"]
            if not isinstance(sp, dict):
                raise bad(f"settings.sampling must be an object, got {_json_type(sp)}")
            names = set(SamplingParams.__dataclass_fields__)
            extra = sorted(set(sp) - names)
            if extra:
                raise bad(f"unknown sampling setting {_short(extra[0])}")
            conv.sampling = SamplingParams(**sp)
        if settings.get("max_tokens") is not None:
            mt = settings["max_tokens"]
            if isinstance(mt, bool) or not isinstance(mt, int) or not 1 <= mt <= 1 << 20:
                raise bad(f"settings.max_tokens must be an integer in [1, {1 << 20}], got {_short(mt)}")
            conv.max_tokens = mt
        if settings.get("stop") is not None:
            conv.stop = check_stop(settings["stop"])
            for s in conv.stop:
                _text(s, "a stop string", bad)
        if settings.get("speculative") is not None:
            if not isinstance(settings["speculative"], bool):
                raise bad(f"settings.speculative must be true or false, got {_short(settings['speculative'])}")
            conv.speculative = settings["speculative"]
    except ConfigError as e:
        raise bad(f"settings: {e}") from None
    for key in ("target", "draft", "drafter"):
        if settings.get(key) is not None and not isinstance(settings[key], str):
            raise bad(f"settings.{key} must be text, got {_json_type(settings[key])}")
    for key in ("draft_max", "n_ctx"):
        v = settings.get(key)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise bad(f"settings.{key} must be a non-negative integer, got {_short(v)}")
    cache = data.get("cache")
    if cache is not None:
        if not isinstance(cache, dict) or set(cache) - {"vocab", "tokens"}:
            raise bad("cache must be an object with vocab and tokens")
        vocab, tokens = cache.get("vocab"), cache.get("tokens", [])
        if not isinstance(vocab, str) or not isinstance(tokens, list):
            raise bad("cache.vocab must be text and cache.tokens a list")
        for t in tokens:
            if isinstance(t, bool) or not isinstance(t, int) or t < 0 or (n_vocab is not None and t >= n_vocab):
                where = f" [0, {n_vocab})" if n_vocab is not None else ""
                raise bad(f"cache.tokens holds {_short(t)}, not a token id{where}")
        conv.vocab, conv.tokens = vocab, tokens
    return conv


def _text(v: Any, what: str, bad: Any) -> str:
    if not isinstance(v, str):
        raise bad(f"{what} must be text, got {_json_type(v)}")
    try:
        v.encode("utf-8")
    except UnicodeEncodeError:
        raise bad(f"{what} is not valid text (a lone surrogate)") from None
    return v


def _json_type(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null", int: "number", float: "number"}.get(
        type(v), type(v).__name__
    )


def _short(v: Any) -> str:
    r = repr(v)
    return r if len(r) <= 40 else r[:37] + "..."


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:200]


def _shown(p: Path) -> str:
    return _short(str(p))[1:-1] if "\x00" in str(p) or len(str(p)) > 200 else str(p)


def _user_path(path: Any, verb: str) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise ChatError(f"a file to {verb} must be a path, got {type(path).__name__}")
    name = os.fspath(path)
    if not isinstance(name, str):
        raise ChatError(f"a file to {verb} must be a text path, got {type(name).__name__}")
    if not name:
        raise ChatError(f"a file to {verb} needs a name")
    try:
        return Path(name).expanduser()
    except (RuntimeError, TypeError, ValueError) as e:  # ~user unknown, bytes, ...
        raise ChatError(f"cannot {verb} {path!r}: {_one_line(e)}") from None


# ------------------------------------------------------------------------------------------------- helpers
def _count_turns(msgs: Sequence[dict[str, str]]) -> int:
    return sum(1 for m in msgs if m["role"] == "user")


def _drop_index(msgs: Sequence[dict[str, str]], k: int) -> int:
    """Index of the first message kept after dropping the k oldest turns (a turn starts at a user message)."""
    seen = 0
    for i, m in enumerate(msgs):
        if m["role"] == "user":
            if seen == k:
                return i
            seen += 1
    return len(msgs) - 1


__all__ = ["ChatSession", "Turn", "ChatError", "ChatContextError", "MIN_ANSWER_TOKENS", "Conversation", "read_conversation",
           "parse_conversation", "FILE_FORMAT", "FILE_VERSION"]
