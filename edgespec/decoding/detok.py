"""Streaming detokenization: bytes of tokens in, text out, correct across tokens that split a UTF-8 character,
with stop strings that may span several tokens."""

from __future__ import annotations

import codecs
from typing import Callable, Sequence


class StreamingDetokenizer:
    """Feed token ids; `push` returns the text that is now safe to show.

    Text is held back while it (a) ends in an incomplete UTF-8 sequence or (b) could still be the start of a stop
    string. When a stop string appears, `stopped` becomes True and the text before it is returned; the stop
    string itself is not emitted.
    """

    def __init__(self, token_bytes: Callable[[int], bytes], stop: Sequence[str] = ()) -> None:
        self._token_bytes = token_bytes
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace")
        self._stop = [s for s in stop if s]
        self._hold = ""  # decoded text not yet released (possible stop-string prefix)
        self.text = ""  # everything released so far
        self.stopped = False

    def push(self, tokens: Sequence[int]) -> str:
        if self.stopped:
            return ""
        piece = self._utf8.decode(b"".join(self._token_bytes(t) for t in tokens))
        return self._release(self._hold + piece, final=False)

    def flush(self) -> str:
        """End of generation: release everything held (an incomplete UTF-8 tail becomes U+FFFD)."""
        if self.stopped:
            return ""
        return self._release(self._hold + self._utf8.decode(b"", final=True), final=True)

    def _release(self, pending: str, final: bool) -> str:
        for s in self._stop:
            i = pending.find(s)
            if i >= 0:
                self.stopped = True
                out = pending[:i]
                self._hold = ""
                self.text += out
                return out
        keep = 0
        if not final:
            for s in self._stop:
                for n in range(min(len(s) - 1, len(pending)), 0, -1):
                    if pending.endswith(s[:n]):
                        keep = max(keep, n)
                        break
        out = pending[: len(pending) - keep]
        self._hold = pending[len(pending) - keep :]
        self.text += out
        return out


def incomplete_utf8_tail(data: bytes) -> int:
    """How many bytes at the end of `data` start a UTF-8 character that is not complete (0 if none)."""
    for back in range(1, min(4, len(data)) + 1):
        b = data[-back]
        if b & 0xC0 == 0x80:  # continuation byte: look further back for the lead byte
            continue
        need = 2 if b & 0xE0 == 0xC0 else 3 if b & 0xF0 == 0xE0 else 4 if b & 0xF8 == 0xF0 else 1
        return back if need > back else 0
    return 0


def complete_utf8(ids: Sequence[int], token_bytes: Callable[[int], bytes]) -> list[int]:
    """`ids` without the trailing tokens that end inside a UTF-8 character (an answer cut mid-character)."""
    ids = list(ids)
    for _ in range(4):
        if not ids or not incomplete_utf8_tail(b"".join(token_bytes(t) for t in ids[-4:])):
            break
        ids.pop()
    return ids


__all__ = ["StreamingDetokenizer", "incomplete_utf8_tail", "complete_utf8"]
