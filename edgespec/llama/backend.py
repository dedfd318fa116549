"""`Model`: what the rest of edgespec holds of a loaded model. It puts together the loaded model and its context
(context.py), its vocabulary (vocab.py) and its `parallel` slots (slot.py), and is itself slot 0: `Model.slot(i)`
gives the others, each with its own sequences and its own `cached` tokens.

`PromptCache` (prompt_cache.py) keeps snapshots of a slot's cache contents (llama_state_seq_get_data) in host memory,
shared by the model's slots, so that a conversation the engine left for another is restored instead of decoded again
(`sync` swaps by content).

The file is validated with edgespec.llama.gguf_check before llama.cpp sees it, and models whose cache cannot be
truncated (recurrent / hybrid architectures) are refused up front.
"""

from __future__ import annotations

import contextlib
from typing import Any, Sequence

from edgespec.config import ModelSpec, check_slots_fit, check_tree_fits
from edgespec.decoding.constraint import Vocabulary
from edgespec.prompts.infill import FimTokens
from edgespec.errors import BackendError
from .context import Context, default_threads, fit_parallel, gpu_offload_supported  # the last two: for importers of backend
from .gguf_check import GGUFInfo, inspect_gguf
from .prompt_cache import PromptCache
from .slot import DecodePart, Slot
from .vocab import SpecialSplitter, Vocab


class Model(Slot):
    """One GGUF model loaded in llama.cpp with `parallel` slots (tree_paths tree sequences beside each one's main
    sequence), itself slot 0 (see the module docstring).

    Thread use: one thread at a time may compute (decode/truncate/sync/reset in any slot: the engine's worker); the
    vocabulary functions (tokenize, token_bytes, detokenize) may be called from any thread, at once, and `close` waits
    for them (a long text is tokenized in pieces: close waits for one piece, and the rest raises EngineClosedError).
    """

    CLOSE_WAIT = 2.0  # seconds close() waits for vocabulary calls in progress before leaving the release to them

    def __init__(
        self, spec: ModelSpec, info: GGUFInfo | None = None, *, prompt_cache_bytes: int = 0, tree_paths: int = 0,
        parallel: int = 1,
    ) -> None:
        if tree_paths > 0:
            check_tree_fits(spec, int(tree_paths))  # before loading: llama.cpp aborts the process on a smaller batch
        fit = parallel < 0  # -n: as many slots as fit, up to n
        if fit:
            parallel = fit_parallel(spec, -int(parallel), int(tree_paths))
        check_slots_fit(spec, int(parallel), int(tree_paths))
        self.spec = spec
        self.info = info if info is not None else inspect_gguf(spec.path)
        context = Context(spec, self.info, parallel=int(parallel), tree_paths=max(0, int(tree_paths)), fit=fit)
        try:
            vocab = Vocab(context.model, context.live)
        except BaseException:
            context.free()
            raise
        super().__init__(context, vocab, PromptCache(prompt_cache_bytes) if prompt_cache_bytes > 0 else None, 0)
        self.parallel = context.parallel  # fewer than asked where the machine's memory holds fewer caches
        self.n_threads = context.n_threads
        self.tuner = context.tuner
        self.bos, self.eos, self.add_bos, self.eog_ids = vocab.bos, vocab.eos, vocab.add_bos, vocab.eog_ids
        self._slots: list[Slot] = [self]

    def slot(self, i: int) -> Slot:
        """Slot i (0 <= i < parallel): the same context, vocabulary, batch and prompt cache, with its own sequences and
        its own `cached` tokens. Slot 0 is this object."""
        if not 0 <= i < self.parallel:
            raise BackendError(f"slot {i} does not exist: the model was loaded with parallel={self.parallel}")
        while len(self._slots) <= i:
            self._slots.append(Slot(self.context, self.vocab, self.prompt_cache, len(self._slots)))
        return self._slots[i]

    # ----------------------------------------------------------------- the context's
    @property
    def check_logits(self) -> bool:
        """Whether every decode checks that its rows are finite (the engine's loop checks them as it samples)."""
        return self.context.check_logits

    @check_logits.setter
    def check_logits(self, on: bool) -> None:
        self.context.check_logits = on

    @property
    def closed(self) -> bool:
        return self.context.closed

    @property
    def threads_now(self) -> int:
        """The thread count llama.cpp uses for the next small decode."""
        return self.context.threads_now

    def pinned_threads(self) -> contextlib.AbstractContextManager[None]:
        """Within the block every decode runs with the current count and teaches the tuner nothing (cost
        measurements compare batch sizes, not thread counts)."""
        return self.context.pinned_threads()

    def warm_threads(self) -> None:
        """Let the tuner compare its thread counts on a few single-token decodes (at load, before the costs are
        measured at the count it then prefers); the cache is left empty. Nothing to do with a fixed count."""
        if self.tuner is None:
            return
        self.reset()
        base = [self.bos if 0 <= self.bos < self.n_vocab else 0]
        self._decode(base, 0, (), None, None)
        for i in range(2 * len(self.tuner.candidates) + 2):
            if self.n_past + 1 > self.n_ctx:
                break
            self._decode([(7 * i + 11) % self.n_vocab], self.n_past, (), None, None)
        self.reset()

    def kv_bytes_per_token(self) -> int:
        """The KV cache's bytes per token of context (f16 keys and values of every layer's KV heads)."""
        return self.context.kv_bytes_per_token()

    # ----------------------------------------------------------------- the vocabulary's
    @property
    def chat_template(self) -> str | None:
        return self.vocab.chat_template

    def control_tokens(self) -> list[int]:
        """The ids of the tokens that only text tokenized with parse_special becomes (control, unknown, unused)."""
        return self.vocab.control_tokens()

    def fim_tokens(self) -> FimTokens:
        return self.vocab.fim_tokens()

    def constraint_vocab(self) -> Vocabulary:
        return self.vocab.constraint_vocab()

    def tokenize(self, text: str, *, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids for `text` (Vocab.tokenize): parse_special makes control-token text the control token."""
        return self.vocab.tokenize(text, add_special=add_special, parse_special=parse_special)

    def special_splitter(self, parse_special: bool) -> SpecialSplitter:
        return self.vocab.special_splitter(parse_special)

    def _tokenize_bytes(self, data: bytes, add_special: bool, parse_special: bool) -> list[int]:
        return self.vocab.tokenize_bytes(data, add_special, parse_special)  # one llama.cpp call: what tests compare with

    def detokenize(self, tokens: Sequence[int], *, special: bool = False) -> str:
        return self.vocab.detokenize(tokens, special=special)

    # ----------------------------------------------------------------- lifetime
    @property
    def _ctx(self) -> Any:  # llama.cpp's context; None once freed
        return self.context.ctx

    @property
    def _model(self) -> Any:  # llama.cpp's model; None once freed
        return self.context.model

    def close(self) -> None:
        """Free the model. Vocabulary calls in progress on other threads (a long tokenization is at most one piece
        of one, but a plain text is one llama.cpp call) get CLOSE_WAIT seconds; past that close() returns and the
        last of them frees the model as it ends. No call starts after close()."""
        context = self.__dict__.get("context")
        if context is None:  # the load failed: the context freed what it held
            return
        context.closing = True
        self.vocab.release_when_idle(self._free, self.CLOSE_WAIT)

    def _free(self) -> None:
        self.context.free()
        if self.prompt_cache is not None:
            self.prompt_cache.clear()

    def __enter__(self) -> "Model":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort
        try:
            self.close()
        except Exception:
            pass


__all__ = ["DecodePart", "Model", "Slot", "default_threads", "gpu_offload_supported"]
