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

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

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


def indent_cut(text: str, n_indent: int, start: int = 0) -> int | None:
    """llama-server's `n_indent` for a completion: where to cut `text`, or None to go on.

    Every line after the first (the first continues the cursor's line) must be indented by at least n_indent
    spaces or tabs; at the first line that has something after a shorter indentation (a character, or the end of
    an empty line), the completion stops and is cut after that line's indentation, as llama-server does. start: an
    index at or before the last newline already looked at (lines that ended before it were decided)."""
    if n_indent <= 0:
        return None
    nl = text.find("\n", start)
    while nl != -1:
        pos = nl + 1
        while pos < len(text) and text[pos] in " \t":
            pos += 1
        if pos < len(text) and pos - (nl + 1) < n_indent:
            return pos
        nl = text.find("\n", nl + 1)
    return None


# --------------------------------------------------------------------------------------------- the infill sampler
INFILL_P_MIN = 0.2  # llama.cpp's first threshold: a text token needs this much (merged) probability to stay


@dataclass
class InfillVocab:
    """What llama.cpp's `infill` sampler reads from a vocabulary (backend.Model.infill_vocab builds it once per model):
    each token's text as llama_token_to_piece writes it without special tokens (control tokens: b''), the
    end-of-generation ids, and `end`, the token it ends a completion with (the vocabulary's EOT, else its EOS).

    prefixes(t): the other tokens whose (non-empty) text is a prefix of t's (an equal text included), found through a
    text -> ids table built on first use and remembered per token: the sampler only asks about its candidates."""

    pieces: Sequence[bytes]
    eog: frozenset[int]
    end: int
    _by_piece: dict[bytes, list[int]] | None = field(default=None, repr=False)
    _prefixes: dict[int, tuple[int, ...]] = field(default_factory=dict, repr=False)

    def prefixes(self, token: int) -> tuple[int, ...]:
        hit = self._prefixes.get(token)
        if hit is not None:
            return hit
        if self._by_piece is None:
            table: dict[bytes, list[int]] = {}
            for i, s in enumerate(self.pieces):
                if s:
                    table.setdefault(s, []).append(i)
            self._by_piece = table
        s = self.pieces[token]
        out: list[int] = []
        for n in range(1, len(s) + 1):
            out += [u for u in self._by_piece.get(s[:n], ()) if u != token]
        self._prefixes[token] = found = tuple(out)
        return found


def _seq_sum(x: np.ndarray) -> float:
    """x summed left to right (as llama.cpp's loops add; np.sum adds pairwise)."""
    return float(np.cumsum(x)[-1]) if x.size else 0.0


def infill_filter(probs: np.ndarray, vocab: InfillVocab) -> np.ndarray:
    """llama.cpp's `infill` sampler (llama_sampler_infill_apply), then its final `dist`: the distribution a completion
    draws its next token from, given `probs`, the distribution after the samplers before it (float64, length V).

    The candidates are the tokens with probs > 0, ordered by probability (ties: the lower id first), p their
    probabilities renormalised over them, n their number. Then, as llama.cpp:

    1. If 3 * n * (EOG mass) > (text mass), only the end-of-generation candidates are kept.
    2. Otherwise tokens sharing a prefix are merged: for each candidate i0 in order and each candidate i1 in order
       (i1 != i0, both not merged away yet) whose text starts with i0's (non-empty) text, the one with the lower p
       (i1 on a tie) gives its p to the other and is dropped.
    3. Text tokens with merged p < 0.2 are dropped (EOG tokens always stay). If no text token is left, the result is
       `vocab.end` with probability 1 (end the completion). Else the kept p are renormalised and text tokens with
       p < 1 / (m + 1) are dropped, m = the text tokens kept in this step.

    The result is `probs` restricted to the kept tokens (those merged away excluded) and renormalised: llama.cpp's
    `dist` recomputes the softmax from the candidates' logits, so the merged probabilities decide which tokens stay,
    not how likely each is. Sums run in candidate order in float64 (llama.cpp's float32 can differ at an exact
    threshold tie). A one-hot row (temperature 0) comes back unchanged. Cost: O(V) to find the candidates, then the
    prefix pairs among them (llama.cpp compares all n^2 pairs).
    """
    probs = np.asarray(probs, dtype=np.float64)
    cand = np.flatnonzero(probs > 0.0)
    if cand.size == 0:
        raise ValueError("probs must have a positive entry")
    order = cand[np.lexsort((cand, -probs[cand]))]
    n = order.size
    p = probs[order] / _seq_sum(probs[order])
    is_eog = np.fromiter((int(t) in vocab.eog for t in order), dtype=bool, count=n)
    out = np.zeros(probs.size)
    if 3.0 * _seq_sum(p[is_eog]) * n > _seq_sum(p[~is_eog]):
        keep = order[is_eog]
        out[keep] = probs[keep] / probs[keep].sum()
        return out
    rank = {int(t): r for r, t in enumerate(order)}
    pairs = sorted((rank[a], r1) for r1, t in enumerate(order) for a in vocab.prefixes(int(t)) if a in rank)
    m = p.copy()
    alive = np.ones(n, dtype=bool)
    for r0, r1 in pairs:
        if alive[r0] and alive[r1]:
            dst, src = (r1, r0) if m[r1] > m[r0] else (r0, r1)
            m[dst] += m[src]
            m[src] = 0.0
            alive[src] = False
    kept = np.flatnonzero(is_eog | (m >= INFILL_P_MIN))
    n_text = int(np.count_nonzero(~is_eog[kept]))
    if n_text == 0:
        out[vocab.end] = 1.0
        return out
    m2 = m[kept] / _seq_sum(m[kept])
    kept = kept[is_eog[kept] | (m2 >= 1.0 / (n_text + 1))]
    keep = order[kept[alive[kept]]]
    out[keep] = probs[keep] / probs[keep].sum()
    return out


__all__ = ["FimTokens", "ExtraChunk", "InfillVocab", "fim_layout", "indent_cut", "infill_filter", "REPO_NAME", "FILE_NAME",
           "MAX_EXTRA_CHUNKS"]
