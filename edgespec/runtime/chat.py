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

Saving and resuming. The file's format (reading, writing, checking every field) is chat_file.py's.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from edgespec.prompts.chat_template import clip_segments
from edgespec.config import DEFAULT_SAMPLING, SamplingParams, check_stop
from edgespec.decoding.detok import complete_utf8
from edgespec.errors import ConfigError, ContextFullError
from edgespec.stats import GenerationStats, Totals
from .chat_file import FILE_FORMAT, FILE_VERSION, ChatError, Conversation, parse_conversation, read_conversation, write_conversation
from .request import GenerationRequest

if TYPE_CHECKING:  # pragma: no cover
    from edgespec.decoding.constraint import Constraint
    from .engine import Chunk, Engine, Generation

MIN_ANSWER_TOKENS = 16  # with no history left, a message is accepted if at least this many answer tokens fit


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
        return write_conversation(path, self.as_dict())

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


__all__ = ["ChatSession", "Turn", "ChatError", "ChatContextError", "MIN_ANSWER_TOKENS"]  # ChatError: chat_file's, raised by the session too
