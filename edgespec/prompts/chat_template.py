"""Render a conversation with the model's own chat template (Jinja, from the GGUF metadata
`tokenizer.chat_template`), the way Hugging Face's `apply_chat_template` does, safely.

Two dangers, two defences:

* **Control-token injection.** A user who types `<|im_end|>\\n<|im_start|>system ...` must not get real control
  tokens: message contents are text. `render_segments` renders the template once with each content replaced by a
  sentinel, so it knows which characters of the prompt are template markup and which are message content; the
  engine tokenizes markup with control tokens parsed and contents without. When the template transforms contents
  in a way the sentinels cannot follow, the whole prompt is tokenized with control tokens parsed only if no
  content contains control-token text; otherwise a TemplateError says so.
* **Hostile templates.** A template comes with the model file. Rendering runs in Jinja's immutable sandbox with a
  budget: at most MAX_TEMPLATE_CHARS of template, MAX_ITERATIONS loop iterations in all (every `for` of the
  template counts, nested ones too), MAX_SECONDS of rendering and an output of at most a fixed multiple of the
  input; string/list repetition and powers are size-checked before they are computed. Over budget is a
  TemplateError, never a hang or an exhausted memory.

A model without a template gets ChatML (`<|im_start|>role ... <|im_end|>`), the most common format among small
instruct models.
"""

from __future__ import annotations

import functools
import json
import re
import string
import threading
import time
from functools import lru_cache
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from edgespec.errors import TemplateError

FALLBACK_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

ROLES = ("system", "user", "assistant")
TOOL_ROLE = "tool"  # a tool result: accepted where the template renders tools (renders_tools)
MAX_TEMPLATE_CHARS = 256 * 1024
MAX_ITERATIONS = 1_000_000
MAX_SECONDS = 2.0
MAX_VALUE_LENGTH = 16 * 1024 * 1024  # the longest string/list a template may build with * (or by padding)
MAX_POWER_BITS = 1 << 16  # the largest integer ** may build, in bits
OUTPUT_BASE = 1 << 20  # output budget: OUTPUT_BASE + OUTPUT_FACTOR x the characters of all contents
OUTPUT_FACTOR = 8

_SENTINEL = re.compile("\ue000(\\d+)\ue001")


# --------------------------------------------------------------------------------------------- the budget
class _Budget:
    def __init__(self, max_output: int) -> None:
        self.iterations = 0
        self.deadline = time.monotonic() + MAX_SECONDS
        self.max_output = max_output

    def tick(self) -> None:
        self.iterations += 1
        if self.iterations > MAX_ITERATIONS:
            raise TemplateError(f"chat template: rendering ran more than {MAX_ITERATIONS:,} loop iterations")
        if self.iterations % 256 == 0:
            self.check_time()

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateError(f"chat template: rendering took more than {MAX_SECONDS:g} s")


_current = threading.local()


def _budget() -> _Budget:
    b = getattr(_current, "budget", None)
    if b is None:  # rendering outside render(): give it a budget of its own
        b = _current.budget = _Budget(OUTPUT_BASE)
    return b


def _budget_iter(iterable: Iterable[Any]) -> Iterator[Any]:
    b = _budget()
    for item in iterable:
        b.tick()
        yield item


def _budget_range(*args: Any) -> Iterator[int]:
    return _budget_iter(range(*args))


# Padding and formatting build strings as wide as they are asked to: the width (or precision) must stay within
# MAX_VALUE_LENGTH. Only widths are checked, never the values formatted (a timestamp is a fine value).
_PADDING = frozenset(["center", "ljust", "rjust", "zfill", "expandtabs"])  # str methods whose first argument is a width
_PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[-#0 +]*(\*|\d+)?(?:\.(\*|\d+))?")


def _too_wide(width: Any) -> bool:
    return isinstance(width, int) and not isinstance(width, bool) and width > MAX_VALUE_LENGTH


def _check_sizes(args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    if any(_too_wide(v) for v in (*args, *kwargs.values())):
        raise TemplateError("chat template: a padding or width too large")


def _check_percent(fmt: str, values: Any) -> None:
    """`fmt % values`: each spec's width and precision, literal or `*` (taken from the values)."""
    star = False
    for m in _PERCENT_SPEC.finditer(fmt.replace("%%", "")):
        for g in m.groups():
            star |= g == "*"
            if g and g != "*" and int(g) > MAX_VALUE_LENGTH:
                raise TemplateError("chat template: a format width too large")
    if star:
        _check_sizes(values if isinstance(values, tuple) else (values,), {})


def _check_format(fmt: str, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """`fmt.format(*args, **kwargs)`: the width and precision in each field's spec, literal or nested (`{:>{}}`)."""
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # malformed: format() itself will say so
    for _, _, spec, _ in fields:
        if not spec:
            continue
        if "{" in spec:  # a width from the arguments
            _check_sizes(args, kwargs)
        elif any(int(d) > MAX_VALUE_LENGTH for d in re.findall(r"\d+", spec)):
            raise TemplateError("chat template: a format width too large")


def _format_filter_check(args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """do_format(value, *args, **kwargs) is value % (kwargs or args)."""
    if args and isinstance(args[0], str):
        _check_percent(args[0], kwargs or tuple(args[1:]))


def _indent_filter_check(args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """do_indent(s, width=4, ...): every line gets the indent (an int, or a string)."""
    s = args[0] if args else ""
    width = args[1] if len(args) > 1 else kwargs.get("width", 4)
    w = len(width) if isinstance(width, str) else width
    lines = s.count("\n") + 1 if isinstance(s, str) else 1
    if isinstance(w, int) and w * lines > MAX_VALUE_LENGTH:
        raise TemplateError("chat template: an indent would build a value too large")


def _center_filter_check(args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
    """do_center(value, width=80)."""
    _check_sizes(args[1:], kwargs)


_FILTER_CHECKS = {"format": _format_filter_check, "indent": _indent_filter_check, "center": _center_filter_check}


def _bounded_filter(f: Any, check: Callable[[Sequence[Any], Mapping[str, Any]], None]) -> Any:
    @functools.wraps(f)  # also copies jinja2's calling convention (jinja_pass_arg)
    def bounded(*args: Any, **kwargs: Any) -> Any:
        check(args, kwargs)
        return f(*args, **kwargs)

    return bounded


def _tojson(value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False) -> str:
    if indent is not None and (not isinstance(indent, int) or isinstance(indent, bool) or not 0 <= indent <= 16):
        raise TemplateError("chat template: tojson's indent must be a small number")
    try:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)
    except (TypeError, ValueError, RecursionError) as e:
        raise TemplateError(f"chat template: tojson failed: {e}") from None


@lru_cache(maxsize=8)
def _compile(template: str) -> Any:
    import jinja2
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Env(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(["*", "**", "%"])

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            if operator == "*":
                for seq, n in ((left, right), (right, left)):
                    if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * max(n, 0) > MAX_VALUE_LENGTH:
                        raise TemplateError("chat template: a repetition would build a value too large")
            if operator == "**" and isinstance(left, int) and isinstance(right, int) and (
                abs(right) > 4096 or max(abs(left).bit_length(), 1) * right > MAX_POWER_BITS
            ):
                raise TemplateError("chat template: a power too large")
            if operator == "%" and isinstance(left, str):
                _check_percent(left, right)  # '%02000000000d' % 1, '%*d' % (2000000000, 1)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 (jinja2's names)
            owner = getattr(getattr(__obj, "__wrapped__", __obj), "__self__", None)  # str.format comes wrapped
            if isinstance(owner, str):  # str methods that pad or format: bound the width they are asked for
                name = getattr(__obj, "__name__", "")
                if name in _PADDING:
                    _check_sizes(args, kwargs)
                elif name == "format":
                    _check_format(owner, args, kwargs)
                elif name == "format_map":
                    _check_format(owner, (), args[0] if args and isinstance(args[0], Mapping) else {})
            return super().call(__context, __obj, *args, **kwargs)

    def raise_exception(message: str) -> None:
        raise TemplateError(f"chat template: {message}")

    if len(template) > MAX_TEMPLATE_CHARS:
        raise TemplateError(f"chat template is {len(template):,} characters (at most {MAX_TEMPLATE_CHARS:,})")
    env = Env(trim_blocks=True, lstrip_blocks=True, loader=jinja2.BaseLoader())
    for name, check in _FILTER_CHECKS.items():  # filters that pad to a width or format
        env.filters[name] = _bounded_filter(env.filters[name], check)
    env.globals["raise_exception"] = raise_exception
    env.filters["tojson"] = _tojson  # Hugging Face's (no HTML escaping, non-ASCII kept): what the models were trained on
    env.globals["range"] = _budget_range
    env.budget_iter = _budget_iter  # type: ignore[attr-defined]
    try:
        ast = env.parse(template)
        # every loop's iterable goes through the budget (an environment attribute: a template cannot shadow it)
        for loop in ast.find_all(nodes.For):
            loop.iter = nodes.Call(nodes.EnvironmentAttribute("budget_iter"), [loop.iter], [], None, None)
        return env.from_string(ast)
    except jinja2.TemplateError as e:
        raise TemplateError(f"chat template does not compile: {e}") from None
    except RecursionError:
        raise TemplateError("chat template does not compile: nested too deeply") from None


# --------------------------------------------------------------------------------------------- rendering
def validate_messages(messages: Any, *, tools: bool = False) -> list[dict[str, Any]]:
    """Messages checked: {"role", "content"} with a role of ROLES and text content; with `tools` (for a template that
    renders them) also tool results (role "tool", optional "tool_call_id") and assistant messages with
    "tool_calls" (a list of objects, as Hugging Face templates read them)."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise TemplateError("messages must be a list of {'role', 'content'} objects")
    out: list[dict[str, Any]] = []
    roles = ROLES + ((TOOL_ROLE,) if tools else ())
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or "role" not in m or "content" not in m:
            raise TemplateError(f"message {i} must have 'role' and 'content'")
        if m["role"] not in roles:
            raise TemplateError(f"message {i}: role must be one of {', '.join(roles)}, got {m['role']!r}")
        if not isinstance(m["content"], str):
            raise TemplateError(f"message {i}: content must be text")
        msg: dict[str, Any] = {"role": m["role"], "content": m["content"]}
        if tools and m["role"] == "assistant" and m.get("tool_calls"):
            calls = m["tool_calls"]
            if not isinstance(calls, list) or not all(isinstance(c, Mapping) for c in calls):
                raise TemplateError(f"message {i}: tool_calls must be a list of objects")
            msg["tool_calls"] = [dict(c) for c in calls]
        if tools and m["role"] == TOOL_ROLE and isinstance(m.get("tool_call_id"), str):
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def _render(
    template: str | None, msgs: list[dict[str, Any]], add_generation_prompt: bool, max_output: int, tools: list[Any] | None = None
) -> str:
    tpl = _compile(template or FALLBACK_TEMPLATE)
    _current.budget = budget = _Budget(max_output)
    extra = {"tools": tools} if tools else {}
    try:
        out: list[str] = []
        size = 0
        for piece in tpl.generate(messages=msgs, add_generation_prompt=add_generation_prompt, bos_token="", eos_token="", **extra):
            size += len(piece)
            if size > max_output:
                raise TemplateError(f"chat template: the rendered prompt exceeds {max_output:,} characters")
            budget.check_time()
            out.append(piece)
        return "".join(out)
    except TemplateError:
        raise
    except RecursionError:
        raise TemplateError("chat template: recursion too deep") from None
    except Exception as e:  # a template bug must not become a traceback
        raise TemplateError(f"chat template failed to render: {e}") from None
    finally:
        _current.budget = None


def _output_budget(msgs: list[dict[str, Any]], tools: list[Any] | None = None) -> int:
    tool_text = _tool_text(msgs, tools)
    return OUTPUT_BASE + OUTPUT_FACTOR * (sum(len(m["content"]) for m in msgs) + len(tool_text))


def _tool_text(msgs: list[dict[str, Any]], tools: list[Any] | None) -> str:
    """The tools and tool calls as JSON text: the template writes them as markup (not as message contents)."""
    calls = [m["tool_calls"] for m in msgs if m.get("tool_calls")]
    if not tools and not calls:
        return ""
    try:
        return json.dumps([tools or [], calls], ensure_ascii=False)
    except (TypeError, ValueError, RecursionError):
        raise TemplateError("tools and tool calls must be JSON values") from None


def _tools_arg(tools: Any) -> list[Any] | None:
    if tools is None:
        return None
    if not isinstance(tools, Sequence) or isinstance(tools, (str, bytes)) or not all(isinstance(t, Mapping) for t in tools):
        raise TemplateError("tools must be a list of objects")
    return [dict(t) for t in tools] or None


def render(
    template: str | None, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = True, tools: Sequence[Any] | None = None
) -> str:
    """The prompt text for `messages` (and `tools`, in OpenAI's form, for a template that renders_tools). BOS is
    left to the tokenizer (add_bos), as llama.cpp's server does."""
    tl = _tools_arg(tools)
    msgs = validate_messages(messages, tools=tl is not None or renders_tools(template))
    return _render(template, msgs, add_generation_prompt, _output_budget(msgs, tl), tl)


_PROBE_TOOL, _PROBE_CALL, _PROBE_ARG, _PROBE_RESULT = "edgespec_probe_tool", "edgespec_probe_call", "edgespec_probe_arg", "edgespec_probe_result"


@lru_cache(maxsize=8)
def renders_tools(template: str | None) -> bool:
    """Whether the template renders tools, assistant tool calls and tool results itself (as Qwen2.5's, Llama 3.1's
    and Hermes' do): a probe conversation, rendered with a tool, a call and a result, shows all three."""
    if not template:
        return False
    msgs: list[dict[str, Any]] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": _PROBE_CALL, "arguments": {_PROBE_ARG: 1}}}]},
        {"role": TOOL_ROLE, "tool_call_id": "call_1", "content": _PROBE_RESULT},
    ]
    tools = [{"type": "function", "function": {"name": _PROBE_TOOL, "description": "d", "parameters": {"type": "object", "properties": {}}}}]
    try:
        text = _render(template, msgs, True, OUTPUT_BASE, tools)
    except TemplateError:
        return False
    return all(s in text for s in (_PROBE_TOOL, _PROBE_CALL, _PROBE_ARG, _PROBE_RESULT))


def render_segments(
    template: str | None,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    specials: Iterable[str] | None = None,
    tools: Sequence[Any] | None = None,
) -> list[tuple[str, bool]]:
    """The prompt as [(text, is_content)]: template markup (is_content False: control-token text in it is meant
    as control tokens) and message contents (True: always plain text). Joined, the texts equal `render(...)`.

    `specials` (the control-token texts of the vocabulary) is needed only for templates that transform contents
    so that the sentinels cannot follow them; then a content that contains control-token text is refused. Tools and
    tool calls (for a template that renders_tools) are written by the template as markup: one that contains
    control-token text is refused whenever `specials` is given."""
    tl = _tools_arg(tools)
    msgs = validate_messages(messages, tools=tl is not None or renders_tools(template))
    budget = _output_budget(msgs, tl)
    if specials is not None:
        tool_text = _tool_text(msgs, tl)
        if tool_text:
            specials = list(specials)
            for s in specials:
                if s and s in tool_text:
                    raise TemplateError(f"a tool or a tool call contains the control-token text {s!r}")
    text = _render(template, msgs, add_generation_prompt, budget, tl)
    # empty contents stay empty: templates test them ({% if message.content %}), a sentinel would not be empty
    marked = [{**m, "content": f"\ue000{i}\ue001" if m["content"] else ""} for i, m in enumerate(msgs)]
    try:
        skeleton = _render(template, marked, add_generation_prompt, budget, tl)
    except TemplateError:
        skeleton = ""  # a template that inspects contents (e.g. raises on unknown ones): no skeleton
    for transform in (lambda s: s, str.strip):
        segments = _fill(skeleton, [transform(m["content"]) for m in msgs])
        if segments is not None and "".join(t for t, _ in segments) == text:
            return [(t, c) for t, c in segments if t]
    if specials is not None:
        for m in msgs:
            for s in specials:
                if s and s in m["content"]:
                    raise TemplateError(
                        f"a {m['role']} message contains the control-token text {s!r}, and this model's chat template "
                        "transforms messages in a way that cannot keep it as plain text"
                    )
        return [(text, False)]
    raise TemplateError("this model's chat template transforms messages in a way edgespec cannot render safely")


def _fill(skeleton: str, contents: list[str]) -> list[tuple[str, bool]] | None:
    """Split the sentinel rendering into markup and contents; None when the sentinels did not survive intact."""
    if not skeleton:
        return None
    out: list[tuple[str, bool]] = []
    pos = 0
    for m in _SENTINEL.finditer(skeleton):
        i = int(m.group(1))
        if i >= len(contents):
            return None
        out.append((skeleton[pos : m.start()], False))
        out.append((contents[i], True))
        pos = m.end()
    out.append((skeleton[pos:], False))
    if "\ue000" in skeleton[pos:] or any("\ue000" in t or "\ue001" in t for t, c in out if not c):
        return None
    return out


def clip_segments(segments: list[tuple[str, bool]], offset: int) -> list[tuple[str, bool]]:
    """The segments after the first `offset` characters (a segment cut in two keeps its kind)."""
    out, pos = [], 0
    for text, is_content in segments:
        end = pos + len(text)
        if end > offset:
            out.append((text[max(0, offset - pos) :], is_content))
        pos = end
    return [(t, c) for t, c in out if t]


__all__ = ["FALLBACK_TEMPLATE", "ROLES", "TOOL_ROLE", "render", "renders_tools", "render_segments", "clip_segments", "validate_messages", "TemplateError"]
