"""A loaded model's vocabulary, read through llama.cpp: tokenize (linear in the text: SpecialSplitter), detokenize,
token bytes, the special tokens, and the views other wings take from it, each built once per model: the FIM tokens
(prompts/infill), the constraints' Vocabulary (decoding/constraint), the infill sampler's InfillVocab.

Vocabulary calls may come from any thread, at once (llama.cpp's tokenizer is read-only); `release_when_idle` lets the
model's owner free the model when none is in progress (a long text is tokenized in pieces: at most one piece's wait).
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import threading
import time
from typing import Any, Callable, Iterator, Sequence

from edgespec.decoding.constraint import Vocabulary
from edgespec.errors import BackendError
from edgespec.prompts.infill import FimTokens, InfillVocab
from .binding import C

# tokens that text parsed with parse_special becomes (llama.cpp matches control and unknown ones only then; unused
# ones too, to be safe): what a message content must never turn into
PARSED_SPECIAL = C.LLAMA_TOKEN_ATTR_CONTROL | C.LLAMA_TOKEN_ATTR_UNKNOWN | C.LLAMA_TOKEN_ATTR_UNUSED
# Texts longer than this many bytes are tokenized in pieces cut where llama.cpp's own special-token partition cuts
# (SpecialSplitter): its partition walks a list from its start for every special token it finds, so one call on a
# text of n special tokens costs O(n^2) (40k of them: 2.9 s, 200k: 76 s); pieces of this size cost ~1 ms each.
TOKENIZE_PIECE_BYTES = 4096
_SPACE = frozenset(b" \t\n\v\f\r")  # C isspace() in the C locale: what LSTRIP/RSTRIP tokens strip


class SpecialSplitter:
    """Where a UTF-8 text may be cut so that llama.cpp tokenizes the pieces, one call each, into exactly the ids of
    the whole text (its tokenizer_st_partition cuts the text at special-token matches, then tokenizes each raw
    fragment on its own; add_special only adds tokens around the whole).

    texts: the text of every token the partition looks for (control, unknown and user-defined tokens with
    parse_special, user-defined ones only without) -> whether one of those tokens has the LSTRIP attribute.

    A cut at byte p is safe when a token text starts at p, no token text occurrence straddles p, every occurrence
    that overlaps the longest one at p starts at p, and no whitespace next to p can be stripped across it (text[p]
    is not a space; text[p-1] is not one when a token at p strips to its left). Then, whatever the order in which
    llama.cpp tries its tokens, every match and strip lies on one side of p, the token at p is matched at p in both
    the whole text and the right piece, and the right piece starts with that token (the SPM space prefix, given
    after every special token, is the same)."""

    def __init__(self, texts: dict[bytes, bool]) -> None:
        self.texts = {t: ls for t, ls in texts.items() if t}
        self.lengths = sorted({len(t) for t in self.texts}, reverse=True)
        self.longest = self.lengths[0] if self.lengths else 0
        order = sorted(self.texts, key=len, reverse=True)
        self.pattern = re.compile(b"|".join(re.escape(t) for t in order)) if order else None

    def _longest_at(self, data: bytes, s: int) -> int:
        for n in self.lengths:
            if s + n <= len(data) and data[s:s + n] in self.texts:
                return n
        return 0

    def safe(self, data: bytes, p: int) -> bool:
        """Whether a cut at byte p is safe (see the class docstring)."""
        if p <= 0 or p >= len(data) or data[p] in _SPACE:
            return False
        longest = self._longest_at(data, p)
        if longest == 0:
            return False
        if data[p - 1] in _SPACE and any(p + n <= len(data) and self.texts.get(data[p:p + n]) for n in self.lengths):
            return False
        for s in range(max(0, p - self.longest + 1), p):  # an occurrence that straddles p
            for n in self.lengths:
                if s + n > p and s + n <= len(data) and data[s:s + n] in self.texts:
                    return False
        return not any(self._longest_at(data, s) for s in range(p + 1, min(len(data), p + longest)))

    def cuts(self, data: bytes, size: int) -> list[int]:
        """Safe cuts about `size` bytes apart (none where the text has no safe place: it is then one piece)."""
        out: list[int] = []
        if self.pattern is None:
            return out
        start = 0
        while len(data) - start > size:
            q = start + size
            while True:
                m = self.pattern.search(data, q)
                if m is None:
                    return out
                if self.safe(data, m.start()):
                    break
                q = m.start() + 1
            start = m.start()
            out.append(start)
        return out


class _Users:
    """Vocabulary calls (any number at once, from any thread) against the model's release: `release_when_idle`
    frees at once when no call is in progress, else after a short wait, else when the last call in progress returns
    (the owner has marked the model closed first, so no new call starts)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._users = 0
        self._pending: Callable[[], None] | None = None

    @contextlib.contextmanager
    def use(self) -> Iterator[None]:
        with self._cond:
            self._users += 1
        try:
            yield
        finally:
            with self._cond:
                self._users -= 1
                run, self._pending = (self._pending, None) if self._users == 0 else (None, self._pending)
                self._cond.notify_all()
            if run is not None:
                run()

    def release_when_idle(self, free: Callable[[], None], wait: float) -> bool:
        """free() now if no call is in progress within `wait` seconds (True), else when the last one ends (False)."""
        deadline = time.monotonic() + wait
        with self._cond:
            while self._users and (left := deadline - time.monotonic()) > 0:
                self._cond.wait(left)
            if self._users:
                self._pending = free
                return False
        free()
        return True


class Vocab:
    """The vocabulary of a loaded llama.cpp model (`model`, its pointer). live() raises when the model is closed
    (or closing): every call that reaches llama.cpp asks it first, inside the use that close waits for."""

    def __init__(self, model: Any, live: Callable[[], None]) -> None:
        self._model = model
        self._vocab = C.llama_model_get_vocab(model)
        self._live = live
        self._users = _Users()  # vocabulary calls vs the model's release
        self.n_vocab = int(C.llama_vocab_n_tokens(self._vocab))
        self.bos = int(C.llama_vocab_bos(self._vocab))
        self.eos = int(C.llama_vocab_eos(self._vocab))
        self.add_bos = bool(C.llama_vocab_get_add_bos(self._vocab))
        # every id of the vocabulary through ctypes costs ~0.1 s on a 152k vocabulary: acceptable once per load
        self.eog_ids = frozenset(i for i in range(self.n_vocab) if C.llama_vocab_is_eog(self._vocab, i))
        self._splitters: dict[bool, SpecialSplitter] = {}
        self._pieces: dict[tuple[int, bool], bytes] = {}
        self._constraint_vocab: Vocabulary | None = None
        self._infill_vocab: InfillVocab | None = None

    def release_when_idle(self, free: Callable[[], None], wait: float) -> bool:
        """free() once no vocabulary call is in progress (see _Users.release_when_idle)."""
        return self._users.release_when_idle(free, wait)

    # ----------------------------------------------------------------- facts
    @property
    def chat_template(self) -> str | None:
        with self._users.use():
            self._live()
            ptr = C.llama_model_chat_template(self._model, None)
            return ptr.decode("utf-8", "replace") if ptr else None

    def is_eog(self, token: int) -> bool:
        return token in self.eog_ids

    def control_tokens(self) -> list[int]:
        """The ids of the tokens that only text tokenized with parse_special becomes (control, unknown, unused)."""
        with self._users.use():
            self._live()
            attr = C.llama_vocab_get_attr
            return [i for i in range(self.n_vocab) if attr(self._vocab, i) & PARSED_SPECIAL]

    def fim_tokens(self) -> FimTokens:
        """The vocabulary's fill-in-the-middle tokens, as llama.cpp found them (GGUF metadata, or their known text)."""
        with self._users.use():
            self._live()

            def tok(fn: Any) -> int | None:
                t = int(fn(self._vocab))
                return t if 0 <= t < self.n_vocab else None

            return FimTokens(
                prefix=tok(C.llama_vocab_fim_pre), suffix=tok(C.llama_vocab_fim_suf), middle=tok(C.llama_vocab_fim_mid),
                pad=tok(C.llama_vocab_fim_pad), repo=tok(C.llama_vocab_fim_rep), sep=tok(C.llama_vocab_fim_sep),
            )

    def constraint_vocab(self) -> Vocabulary:
        """The vocabulary as constraints need it (constraint.Vocabulary): every token's bytes (control tokens
        marked special), the end-of-generation ids, and this model's tokenizer. Built once per model."""
        if self._constraint_vocab is None:
            control = self.control_tokens()
            tokens = [self.token_bytes(i, special=True) for i in range(self.n_vocab)]
            self._constraint_vocab = Vocabulary(
                tokens, sorted(self.eog_ids), control, lambda text: self.tokenize(text, parse_special=False)
            )
        return self._constraint_vocab

    def infill_vocab(self) -> InfillVocab:
        """The vocabulary as llama.cpp's infill sampler needs it (infill.InfillVocab): every token's text without
        special tokens, the end-of-generation ids, and the token that ends a completion (EOT, else EOS, else the first
        EOG id; BackendError for a vocabulary without any). Built once per model."""
        if self._infill_vocab is None:
            with self._users.use():
                self._live()
                ends = [int(C.llama_vocab_eot(self._vocab)), int(C.llama_vocab_eos(self._vocab))]
            ends += sorted(self.eog_ids)
            end = next((t for t in ends if 0 <= t < self.n_vocab), None)
            if end is None:
                raise BackendError("this model's vocabulary has no end-of-text token: the infill sampler cannot end a completion")
            pieces = [self.token_bytes(i) for i in range(self.n_vocab)]
            self._infill_vocab = InfillVocab(pieces, self.eog_ids, end)
        return self._infill_vocab

    # ----------------------------------------------------------------- text
    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids for `text`. parse_special: control-token text (e.g. "<|im_end|>") becomes the control token;
        without it such text is tokenized as plain characters.

        Time is linear in the text: a long one is tokenized in pieces cut where llama.cpp cuts it anyway
        (SpecialSplitter), with the same ids as one call on the whole; close() waits for one piece at most."""
        data = text.encode("utf-8", "replace")  # a lone surrogate (undecodable input) becomes "?"
        cuts = self.special_splitter(parse_special).cuts(data, TOKENIZE_PIECE_BYTES) if len(data) > TOKENIZE_PIECE_BYTES else []
        if not cuts:
            return self.tokenize_bytes(data, add_special, parse_special)
        bounds = [0, *cuts, len(data)]
        first = data[: bounds[1]]
        out = self.tokenize_bytes(first, False, parse_special)
        head: list[int] = []
        tail: list[int] = []
        if add_special:  # what add_special adds around the whole (BOS/CLS before, EOS/SEP after), from the first piece
            full = self.tokenize_bytes(first, True, parse_special)
            extra = len(full) - len(out)
            k = next((k for k in range(extra, -1, -1) if full[k:k + len(out)] == out), 0)
            head, tail = full[:k], full[k + len(out):]
        for a, b in zip(bounds[1:], bounds[2:]):
            out += self.tokenize_bytes(data[a:b], False, parse_special)
        return head + out + tail

    def special_splitter(self, parse_special: bool) -> SpecialSplitter:
        """The texts llama.cpp partitions a text at (see SpecialSplitter), built once per model and flag."""
        hit = self._splitters.get(parse_special)
        if hit is not None:
            return hit
        skip = 0 if parse_special else (C.LLAMA_TOKEN_ATTR_CONTROL | C.LLAMA_TOKEN_ATTR_UNKNOWN)
        want = C.LLAMA_TOKEN_ATTR_CONTROL | C.LLAMA_TOKEN_ATTR_USER_DEFINED | C.LLAMA_TOKEN_ATTR_UNKNOWN
        texts: dict[bytes, bool] = {}
        with self._users.use():
            self._live()
            for i in range(self.n_vocab):
                attr = int(C.llama_vocab_get_attr(self._vocab, i))
                if attr & want and not attr & skip:
                    t = C.llama_vocab_get_text(self._vocab, i) or b""
                    texts[t] = texts.get(t, False) or bool(attr & C.LLAMA_TOKEN_ATTR_LSTRIP)
        self._splitters[parse_special] = out = SpecialSplitter(texts)
        return out

    def tokenize_bytes(self, data: bytes, add_special: bool, parse_special: bool) -> list[int]:
        """One llama_tokenize call on the whole of `data`."""
        with self._users.use():
            self._live()
            n_max = len(data) + 16
            buf = (C.llama_token * n_max)()
            n = C.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
            if n < 0:
                n_max = -n
                buf = (C.llama_token * n_max)()
                n = C.llama_tokenize(self._vocab, data, len(data), buf, n_max, add_special, parse_special)
        if n < 0:
            raise BackendError("tokenization failed")
        return list(buf[:n])

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 character). Control tokens render as b'' unless
        `special`."""
        key = (int(token), special)
        hit = self._pieces.get(key)
        if hit is not None:
            return hit
        with self._users.use():
            self._live()
            buf = ctypes.create_string_buffer(64)
            n = C.llama_token_to_piece(self._vocab, int(token), buf, len(buf), 0, special)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = C.llama_token_to_piece(self._vocab, int(token), buf, len(buf), 0, special)
        self._pieces[key] = out = buf.raw[:n]
        return out

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return b"".join(self.token_bytes(t, special=special) for t in tokens).decode("utf-8", "replace")


__all__ = ["PARSED_SPECIAL", "SpecialSplitter", "TOKENIZE_PIECE_BYTES", "Vocab"]
