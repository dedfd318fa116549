"""edgespec: exact speculative decoding for local GGUF models through llama.cpp.

Public API::

    from edgespec import Engine, ModelSpec, SamplingParams, SpecConfig
    with Engine.load(ModelSpec("target.gguf"), ModelSpec("draft.gguf")) as eng:
        print(eng.generate("Hello", sampling=SamplingParams(temperature=0)).text)
"""

__version__ = "0.1.0"

from .config import ConfigError, EdgespecError, ModelSpec, SamplingParams, SpecConfig  # noqa: E402


def __getattr__(name: str):  # lazy: importing edgespec must not load llama.cpp
    if name in ("Engine", "Result", "Chunk", "Generation"):
        from . import engine

        return getattr(engine, name)
    raise AttributeError(name)


__all__ = ["Engine", "Result", "Chunk", "Generation", "ModelSpec", "SamplingParams", "SpecConfig", "EdgespecError", "ConfigError", "__version__"]
