"""Render a conversation with the model's own chat template (Jinja, from the GGUF metadata
`tokenizer.chat_template`), the way Hugging Face's `apply_chat_template` does.

A model without a template gets ChatML (`<|im_start|>role ... <|im_end|>`), the most common format among small
instruct models; pass your own template string to override.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Mapping, Sequence

from .errors import TemplateError

FALLBACK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

ROLES = ("system", "user", "assistant")


@lru_cache(maxsize=8)
def _compile(template: str) -> Any:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(f"chat template: {message}")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(template)
    except jinja2.TemplateError as e:
        raise TemplateError(f"chat template does not compile: {e}") from None


def validate_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise TemplateError(f"message {i} must have 'role' and 'content'")
        if m["role"] not in ROLES:
            raise TemplateError(f"message {i}: role must be one of {', '.join(ROLES)}, got {m['role']!r}")
        if not isinstance(m["content"], str):
            raise TemplateError(f"message {i}: content must be text")
        out.append({"role": m["role"], "content": m["content"]})
    return out


def render(
    template: str | None,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
) -> str:
    """The prompt text for `messages`. BOS is left to the tokenizer (add_bos), as llama.cpp's server does."""
    msgs = validate_messages(messages)
    tpl = _compile(template or FALLBACK_TEMPLATE)
    try:
        return tpl.render(
            messages=msgs, add_generation_prompt=add_generation_prompt, bos_token=bos_token, eos_token=eos_token
        )
    except TemplateError:
        raise
    except Exception as e:  # a template bug must not become a traceback
        raise TemplateError(f"chat template failed to render: {e}") from None
