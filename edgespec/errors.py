"""Every error edgespec raises on purpose, in one place.

Each one is meant for a person: its message is one line that says what is wrong and, where it helps, what to do.
The CLI prints it and exits 1; an app catches `EdgespecError` (or a subclass) and shows the message. Anything else
that escapes the library is a bug.
"""

from __future__ import annotations


class EdgespecError(Exception):
    """An error meant for the user: one clear line, no traceback."""


class ConfigError(EdgespecError, ValueError):
    """A setting or argument is out of range or of the wrong type."""


class ModelFileError(EdgespecError):
    """A model file that llama.cpp must not be given (damaged, unsupported, hostile)."""


class IncompatiblePairError(EdgespecError):
    """Draft and target share too little of a vocabulary for the draft to propose from (docs/vocabularies.md)."""


class BackendError(EdgespecError):
    """llama.cpp refused or failed an operation."""


def non_finite_logits(model: str) -> BackendError:
    """The error for a model whose logits hold NaN or +inf (found by the backend's own check, or by the loop's sampling
    where the backend skips it)."""
    return BackendError(f"{model} produced NaN or infinite logits (a damaged or incompatible model file)")


EXIT_BACKEND_LOST = 75  # EX_TEMPFAIL: the exit code of a process that lost an RPC server (try again once it is back)


class BackendLostError(BackendError):
    """A server the model's layers run on (an RPC server) is gone: this engine cannot go on, and the process ends
    with EXIT_BACKEND_LOST moments later (edgespec/llama/rpc.py); `edgespec serve --rpc` reloads once the server answers."""


class ContextFullError(BackendError):
    """The tokens would not fit in the context window."""


class PromptTooLongError(ContextFullError):
    """A prompt that leaves no room in the context for what the request asks to generate."""

    def __init__(self, n_prompt: int, n_ctx: int) -> None:
        super().__init__(
            f"the prompt has {n_prompt} tokens but the context holds {n_ctx} (the prompt and at least one generated token must fit)"
        )
        self.n_prompt = n_prompt
        self.n_ctx = n_ctx


class EngineClosedError(EdgespecError):
    """The engine was closed; load a new one."""


class QueueFullError(EdgespecError):
    """Too many generations are waiting for the engine."""


class TemplateError(EdgespecError):
    """The chat template cannot render these messages (or misbehaves)."""


class ModelsError(EdgespecError):
    """A model-cache problem (bad manifest, missing file, failed pull)."""


class UnknownModelError(ModelsError):
    """A model name that no discovered model, pair or file has; close_matches: the known names nearest to it."""

    def __init__(self, message: str, close_matches: list[str] | None = None) -> None:
        super().__init__(message)
        self.close_matches = list(close_matches or [])


class StopRequested(Exception):
    """Raised inside the engine when a cancel request is seen between prefill chunks. Not an error: it never
    leaves the engine (the generation ends with finish reason "cancelled")."""


__all__ = [
    "EdgespecError",
    "ConfigError",
    "ModelFileError",
    "IncompatiblePairError",
    "BackendError",
    "non_finite_logits",
    "BackendLostError",
    "ContextFullError",
    "PromptTooLongError",
    "EngineClosedError",
    "QueueFullError",
    "TemplateError",
    "ModelsError",
    "UnknownModelError",
    "StopRequested",
]
