"""Fill-in-the-middle (code infill): the prompt layout, as pure functions over token ids (no model, no llama.cpp).

A FIM-trained model (Qwen2.5-Coder, StarCoder, CodeLlama, ...) reads the code before and after the cursor between
its own control tokens and writes the middle:

    [<|repo_name|> repo \\n  (<|file_sep|> path \\n text)*  <|file_sep|> path \\n]   (only with extra chunks)
    <|fim_prefix|> prefix prompt <|fim_suffix|> suffix <|fim_middle|>             -> the middle

This is llama.cpp's `/infill` layout (server `format_infill`, prefix-suffix-middle order), so an editor plugin made
for llama-server gets the same prompt here. The token ids come from the model's own vocabulary (backend.Model
.fim_tokens: llama.cpp reads them from the GGUF metadata or recognises their text); a model without the three
core tokens cannot infill (`FimTokens.missing`).

Speculation needs nothing special: the prompt holds the suffix and the extra chunks, and every lookup drafter
searches the whole context (prompt lookup) or the engine's memory of it (suffix index), so code copied from after
the cursor or from another open file is proposed from there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

REPO_NAME = "myproject"  # llama.cpp's placeholder repository name
FILE_NAME = "filename"  # llama.cpp's placeholder name for the file being edited
MAX_EXTRA_CHUNKS = 1024  # extra context chunks a prompt may have (editor plugins send tens; 1M one-byte chunks took 141 s)


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's fill-in-the-middle control tokens (None: the vocabulary has none)."""

    prefix: int | None
    suffix: int | None
    middle: int | None
    pad: int | None = None
    repo: int | None = None
    sep: int | None = None

    @property
    def missing(self) -> list[str]:
        """The core tokens the vocabulary lacks (empty: it can infill)."""
        return [n for n in ("prefix", "suffix", "middle") if getattr(self, n) is None]


@dataclass(frozen=True)
class ExtraChunk:
    """Context from another file (llama.cpp's `input_extra` item): its name and its text."""

    text: str
    filename: str = "tmp"


def fim_layout(
    fim: FimTokens,
    prefix: Sequence[int],
    suffix: Sequence[int],
    *,
    prompt: Sequence[int] = (),
    extra: Sequence[tuple[Sequence[int], Sequence[int]]] = (),
    repo: Sequence[int] = (),
    current_file: Sequence[int] = (),
    bos: int | None = None,
    budget: int | None = None,
) -> list[int]:
    """The infill prompt's token ids (see the module docstring).

    prefix, suffix, prompt: the tokens before the cursor, after it, and typed after the prefix (llama.cpp's
    `prompt`); extra: (file-name line, text) token pairs of other files; repo / current_file: the tokens of
    "name\\n" lines for the repository header and the edited file (used only when there are extra chunks and the
    vocabulary has the tokens); bos: prepended when the model wants one.

    budget: the most tokens the prompt may have. What gives way first is the extra context (the chunks farthest from
    the cursor: the first ones), then the start of the prefix, then the end of the suffix, keeping at least 3/4 of
    what remains for the prefix, as llama.cpp does.
    """
    if fim.missing:
        raise ValueError(f"the vocabulary has no FIM {', '.join(fim.missing)} token")
    assert fim.prefix is not None and fim.suffix is not None and fim.middle is not None
    head: list[int] = []
    if extra and fim.sep is not None:
        if fim.repo is not None:
            head += [fim.repo, *repo]
        for name, text in extra:
            head += [fim.sep, *name, *text]
        head += [fim.sep, *current_file]
    elif extra:  # no file separator token: plain text chunks, as llama.cpp's "--- snippet ---" fallback
        for name, text in extra:
            head += [*name, *text]
    pre = [*prefix, *prompt]
    suf = list(suffix)
    fixed = 3 + (bos is not None)
    if budget is not None:
        room = max(0, budget - fixed)
        if len(head) + len(pre) + len(suf) > room:
            head = head[max(0, len(head) - max(0, room - len(pre) - len(suf))):] if room > len(pre) + len(suf) else []
            room_ps = room - len(head)
            if len(pre) + len(suf) > room_ps:
                keep_suf = min(len(suf), max(room_ps // 4, room_ps - len(pre)))
                keep_pre = min(len(pre), room_ps - keep_suf)
                pre = pre[len(pre) - keep_pre:]
                suf = suf[:keep_suf]
    out = ([bos] if bos is not None else []) + head
    out += [fim.prefix, *pre, fim.suffix, *suf, fim.middle]
    return out


__all__ = ["FimTokens", "ExtraChunk", "fim_layout", "REPO_NAME", "FILE_NAME", "MAX_EXTRA_CHUNKS"]
