"""edgespec: exact speculative decoding for local GGUF models through llama.cpp.

Public API::

    from edgespec import Engine, ModelSpec, SamplingParams, SpecConfig
    with Engine.load(ModelSpec("target.gguf"), ModelSpec("draft.gguf")) as eng:
        print(eng.generate("Hello", sampling=SamplingParams(temperature=0)).text)

Errors meant for people are `EdgespecError` subclasses (edgespec.errors).
"""

__version__ = "0.2.0"

from .config import DEFAULT_SAMPLING, ModelSpec, SamplingParams, SpecConfig  # noqa: E402
from .errors import (  # noqa: E402
    BackendError,
    BackendLostError,
    ConfigError,
    ContextFullError,
    EdgespecError,
    EngineClosedError,
    ModelFileError,
    PromptTooLongError,
    QueueFullError,
    TemplateError,
)
from .config import DrafterKind  # noqa: E402
from .runtime.request import GenerationRequest, InfillPrompt  # noqa: E402
from .stats import GenerationStats  # noqa: E402

_LAZY = {
    "Engine": "runtime.engine",
    "Result": "runtime.engine",
    "Chunk": "runtime.engine",
    "Generation": "runtime.engine",
    "ChatSession": "runtime.chat",
    "Constraint": "decoding.constraint",
    "ConstraintError": "decoding.constraint",
}


def __getattr__(name: str):  # lazy: importing edgespec must not load llama.cpp
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(name)


__all__ = [
    "Engine",
    "Result",
    "Chunk",
    "Generation",
    "ChatSession",
    "Constraint",
    "ConstraintError",
    "ModelSpec",
    "SamplingParams",
    "DEFAULT_SAMPLING",
    "SpecConfig",
    "GenerationRequest",
    "InfillPrompt",
    "DrafterKind",
    "GenerationStats",
    "EdgespecError",
    "ConfigError",
    "ModelFileError",
    "PromptTooLongError",
    "BackendError",
    "BackendLostError",
    "ContextFullError",
    "EngineClosedError",
    "QueueFullError",
    "TemplateError",
    "__version__",
]
