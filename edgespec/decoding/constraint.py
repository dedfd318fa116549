"""Constraints on what may be generated (JSON schema, any JSON object, a regex, a choice, a Lark/GBNF grammar), as
token masks. Pure: no llama.cpp here; the vocabulary comes in as token bytes (backend.Model.constraint_vocab).

Under a constraint the target distribution is the *masked* one: before `warp`, every token the grammar forbids at
that point gets logit -inf, then penalties, temperature, top-k/p and min-p apply as usual (as llama.cpp's and vLLM's
grammar samplers do: the filters then never leave an empty set). The plain path and every verification row apply
the mask computed for that row's own prefix (history + drafts[:i], or the path to a tree node), so the exact rules
of acceptance.py / tree.py hold unchanged on the masked distribution; a drafted token the grammar forbids has
probability 0 and is rejected with certainty (it is never decoded).

The loop talks to a `TokenConstraint` (the protocol below): `mask()` for the next token after what was advanced,
`advance(token)`, `rollback(n)`, `forced()` (the tokens the grammar forces next). `Matcher` implements it over
llguidance's LLMatcher. Why llguidance (checked against the libraries' docs and PyPI pages, Dec 2026):

* llguidance (Microsoft, Rust; what llama.cpp's `--grammar` with `%llguidance` and vLLM/SGLang use): JSON schema,
  regex, Lark (and GBNF via a converter), choices; masks computed on the fly per step (~tens of µs, no
  ahead-of-time compile, so any schema starts at once), `rollback(n)` for speculation, `compute_ff_tokens()` for
  forced tokens, a tokenizer built from raw token bytes (the GGUF's own vocabulary: no hub download). Wheels are
  abi3 (one per platform), no torch dependency.
* xgrammar (MLC): fast masks after a per-grammar compile, rollback and jump-forward strings, but its tokenizer
  info is built from a HF tokenizer or a vocab list plus a vocab type guess, its main API is torch tensors, and the
  compile step costs time for every new schema (a server sees a new schema per request).
* outlines-core (dottxt): regex/JSON schema compiled to an index over the whole vocabulary ahead of time (slow for
  large schemas and 150k vocabularies), no context-free grammars, no rollback in its Guide at the time of writing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from edgespec.errors import ConfigError
from edgespec.untrusted import JSONDepthError, check_json_depth, check_text, loads as loads_json

KINDS = ("json_schema", "json_object", "regex", "choice", "grammar")
# JSON is written on one line the way json.dumps and most models write it ({"a": 1, "b": [2, 3]}): no free
# whitespace, so the grammar forces the separators and the model spends no tokens (or probability) on layout.
# A schema's own "x-guidance" options override this.
JSON_LAYOUT: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
# llguidance holds at most 65,525 grammar symbols (a Rust assertion past that); each choice costs one or more, and
# compiling 100,000 of them takes seconds before it fails: refused here at once, with a clear message
MAX_CHOICES = 10_000
MAX_CHOICE_BYTES = 1 << 20


class ConstraintError(ConfigError):
    """A constraint that cannot be used: an invalid schema, regex or grammar, or one that allows no output."""


class TokenConstraint(Protocol):
    """What the speculation loop needs from a constraint (see the module docstring)."""

    def mask(self) -> np.ndarray:
        """Boolean array over the vocabulary: the tokens allowed after everything advanced so far."""
        ...

    def advance(self, token: int) -> bool:
        """Consume one token if the constraint allows it (True); otherwise change nothing and return False."""
        ...

    def rollback(self, n: int) -> None:
        """Undo the last n advances."""
        ...

    def forced(self) -> list[int]:
        """Tokens the constraint forces next (may be empty). Verified like any other draft, they are accepted
        with probability 1 wherever the mask allows that token alone."""
        ...

    @property
    def error(self) -> str:
        """Non-empty when the constraint can go no further (a dead end): generation stops there."""
        ...


@dataclass(frozen=True)
class Constraint:
    """What the output must look like. Build with the class methods:

    Constraint.json_schema({...}) (a dict or its JSON text), Constraint.json_object(), Constraint.regex("..."),
    Constraint.choice(["yes", "no"]), Constraint.grammar("start: ...") (Lark syntax as llguidance reads it, or
    llama.cpp GBNF: `root ::= ...`).
    """

    kind: str
    value: Any = None
    _grammar: str = field(default="", compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConstraintError(f"a constraint kind is one of {', '.join(KINDS)}, got {self.kind!r}")
        object.__setattr__(self, "_grammar", _compile(self.kind, self.value))

    @classmethod
    def json_schema(cls, schema: Mapping[str, Any] | str) -> "Constraint":
        if isinstance(schema, str):
            try:
                schema = loads_json(schema, "the JSON schema")
            except JSONDepthError as e:
                raise ConstraintError(str(e)) from None
            except ValueError as e:
                raise ConstraintError(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, Mapping):
            raise ConstraintError(f"a JSON schema must be an object, got {type(schema).__name__}")
        return cls("json_schema", dict(schema))

    @classmethod
    def json_object(cls) -> "Constraint":
        return cls("json_object")

    @classmethod
    def regex(cls, pattern: str) -> "Constraint":
        return cls("regex", pattern)

    @classmethod
    def choice(cls, options: Sequence[str]) -> "Constraint":
        return cls("choice", tuple(options) if isinstance(options, (list, tuple)) else options)

    @classmethod
    def grammar(cls, text: str) -> "Constraint":
        return cls("grammar", text)

    @property
    def llguidance_grammar(self) -> str:
        """The grammar in llguidance's own format (what LLMatcher takes)."""
        return self._grammar

    def describe(self) -> str:
        return self.kind


def _compile(kind: str, value: Any) -> str:
    """The llguidance grammar for a constraint, checked (grammar errors become one-line ConstraintErrors)."""
    import llguidance
    from llguidance.gbnf_to_lark import any_to_lark

    if kind == "json_object":
        grammar = llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_LAYOUT)  # type: ignore[arg-type]  # a dict of JsonCompileOptions' keys
    elif kind == "json_schema":
        if not isinstance(value, Mapping):
            raise ConstraintError("a JSON schema must be an object")
        try:
            check_json_depth(value, "the JSON schema")
        except JSONDepthError as e:
            raise ConstraintError(str(e)) from None
        try:
            text = json.dumps(value, ensure_ascii=False)
        except (ValueError, TypeError, RecursionError) as e:
            raise ConstraintError(f"invalid JSON schema: {_one_line(e)}") from None
        check_text(text, "the JSON schema", ConstraintError)
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(text, defaults=JSON_LAYOUT)  # type: ignore[arg-type]  # a dict of JsonCompileOptions' keys
        except (ValueError, TypeError) as e:
            raise ConstraintError(f"invalid JSON schema: {_one_line(e)}") from None
    elif kind == "regex":
        if not isinstance(value, str) or not value:
            raise ConstraintError("a regex constraint must be a non-empty string")
        check_text(value, "the regex", ConstraintError)
        try:
            re.compile(value)  # a clear message for the common mistakes; llguidance checks its own syntax below
        except re.error as e:
            raise ConstraintError(f"invalid regex: {e}") from None
        grammar = llguidance.LLMatcher.grammar_from_regex(value)
    elif kind == "choice":
        if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
            raise ConstraintError("a choice constraint needs a non-empty list of strings")
        if len(value) > MAX_CHOICES:
            raise ConstraintError(f"a choice constraint has {len(value):,} options; at most {MAX_CHOICES:,}")
        if not all(isinstance(v, str) and v for v in value):
            raise ConstraintError("every choice must be a non-empty string")
        if sum(len(v) for v in value) > MAX_CHOICE_BYTES:
            raise ConstraintError(f"the choices hold more than {MAX_CHOICE_BYTES:,} characters in all (the limit)")
        for i, v in enumerate(value):
            check_text(v, f"choice {i + 1}", ConstraintError)
        grammar = llguidance.LLMatcher.grammar_from_lark("start: " + " | ".join(json.dumps(v) for v in value))
    else:  # grammar: Lark, or GBNF converted to Lark
        if not isinstance(value, str) or not value.strip():
            raise ConstraintError("a grammar constraint must be non-empty text")
        check_text(value, "the grammar", ConstraintError)
        text = value
        if "::=" in text:
            try:
                text = any_to_lark(text)
            except Exception as e:  # the converter raises plain exceptions of several kinds
                raise ConstraintError(f"cannot read the GBNF grammar: {_one_line(e)}") from None
        grammar = llguidance.LLMatcher.grammar_from_lark(text)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar)
    if is_error:
        raise ConstraintError(f"invalid {kind.replace('_', ' ')}: {_one_line(messages[0] if messages else 'rejected')}")
    return grammar


# llguidance reports a Rust panic as its error text, with a backtrace after it: the message keeps what the panic
# said (translated where it is a known limit), never the backtrace
_PANIC_TAILS = ("<backtrace>", "stack backtrace:", "note: run with `RUST_BACKTRACE")
_KNOWN_PANICS = {"grammar.symbols.len() < u16::MAX": "the grammar is too large for llguidance (at most 65,525 symbols)"}


def _one_line(e: Any) -> str:
    s = str(e)
    for tail in _PANIC_TAILS:
        s = s.split(tail, 1)[0]
    if "panic" in s:
        for key, says in _KNOWN_PANICS.items():
            if key in s:
                s = says
    s = " ".join(s.split())
    return s[:300] + ("..." if len(s) > 300 else "")


# --------------------------------------------------------------------------------------------- vocabulary
@dataclass
class Vocabulary:
    """A model's vocabulary as llguidance needs it: every token's bytes (control tokens marked), the
    end-of-generation ids, and the model's own tokenizer (text -> ids, control-token text kept as text)."""

    tokens: list[bytes]
    eos_ids: list[int]
    special_ids: list[int]
    tokenize: Callable[[str], list[int]]
    _lltok: Any = field(default=None, repr=False)

    def lltokenizer(self) -> Any:
        """llguidance's LLTokenizer for this vocabulary (built once: ~1 s for 150k tokens)."""
        if self._lltok is None:
            import llguidance

            specials = set(self.special_ids)
            # llguidance reads a leading 0xff byte as "special token" (never produced by plain text)
            toks = [b"\xff" + t if i in specials else t for i, t in enumerate(self.tokens)]
            self._lltok = llguidance.LLTokenizer(
                llguidance.TokenizerWrapper(_Wrapped(toks, self.eos_ids, sorted(specials), self.tokenize)),
                n_vocab=len(toks),
                eos_token=list(self.eos_ids),
            )
        return self._lltok


class _Wrapped:
    """The duck-typed tokenizer object llguidance.TokenizerWrapper reads."""

    def __init__(self, tokens: list[bytes], eos: list[int], specials: list[int], tokenize: Callable[[str], list[int]]) -> None:
        self.tokens = tokens
        self.eos_token_id = eos[0]
        self.bos_token_id = None
        self.special_token_ids = specials
        self._tokenize = tokenize

    def __call__(self, s: Any) -> list[int]:
        if isinstance(s, bytes):  # TokenizerWrapper probes with bytes; text only here (it then passes str)
            raise TypeError("text only")
        return list(self._tokenize(s))


# --------------------------------------------------------------------------------------------- matcher
class Matcher:
    """A TokenConstraint over llguidance's LLMatcher (see the module docstring). One per generation."""

    def __init__(self, constraint: Constraint, vocab: Vocabulary, n_vocab: int | None = None) -> None:
        import llguidance

        self.constraint = constraint
        self.n_vocab = n_vocab if n_vocab is not None else len(vocab.tokens)
        self._m = llguidance.LLMatcher(vocab.lltokenizer(), constraint.llguidance_grammar, log_level=0)
        if self._m.is_error():
            raise ConstraintError(f"invalid {constraint.kind.replace('_', ' ')}: {_one_line(self._m.get_error())}")
        self.n_advanced = 0
        self.eos_ids = list(vocab.eos_ids)
        self._eos = set(self.eos_ids)
        # per advance: True = consumed by llguidance, False = an end token (never consumed: llguidance's rollback
        # over an end token leaves a wrong state; nothing follows one anyway)
        self._consumed: list[bool] = []
        first = self.mask()
        first[[t for t in self.eos_ids if t < first.size]] = False
        if self._m.is_error() or not (first.any() or self._m.is_accepting()):
            raise ConstraintError(f"the {constraint.kind.replace('_', ' ')} allows no output with this vocabulary")

    def mask(self) -> np.ndarray:
        if self._consumed and not self._consumed[-1]:  # after an end token: only end tokens (never used)
            m = np.zeros(self.n_vocab, dtype=bool)
            m[[t for t in self.eos_ids if t < self.n_vocab]] = True
            return m
        bits = np.frombuffer(self._m.compute_bitmask(), dtype=np.uint8)
        m = np.unpackbits(bits, bitorder="little").view(bool)
        if m.size >= self.n_vocab:
            return m[: self.n_vocab]
        return np.concatenate([m, np.zeros(self.n_vocab - m.size, dtype=bool)])

    def allows(self, token: int) -> bool:
        if self._consumed and not self._consumed[-1]:
            return False
        if int(token) in self._eos:
            return bool(self._m.is_accepting()) and not self._m.is_error()
        return self._m.validate_tokens([int(token)]) == 1

    def advance(self, token: int) -> bool:
        if not self.allows(token):
            return False
        real = int(token) not in self._eos
        if real and not self._m.consume_token(int(token)):
            return False  # a limit hit while consuming (e.g. a forced run that never ends): `error` says why
        self._consumed.append(real)
        self.n_advanced += 1
        return True

    def rollback(self, n: int) -> None:
        if n:
            if n > self.n_advanced:
                raise RuntimeError(f"cannot roll the matcher back {n} tokens ({self.n_advanced} advanced)")
            real = sum(self._consumed[-n:])
            if real and not self._m.rollback(real):
                raise RuntimeError(f"cannot roll the matcher back {n} tokens ({self.n_advanced} advanced)")
            del self._consumed[-n:]
            self.n_advanced -= n

    def forced(self) -> list[int]:
        if self._m.is_stopped() or (self._consumed and not self._consumed[-1]):
            return []
        return [int(t) for t in self._m.compute_ff_tokens()]

    @property
    def error(self) -> str:
        """Why the constraint can go no further ("" while it can): the grammar dead-ended or hit a limit."""
        if not self._m.is_error():
            return ""
        return _one_line(self._m.get_error().split("\n", 1)[0]) or "the grammar cannot continue"

    @property
    def accepting(self) -> bool:
        """The text so far is a complete match."""
        return bool(self._m.is_accepting())

    @property
    def stopped(self) -> bool:
        return bool(self._m.is_stopped())


def apply_mask(logits: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """A copy of one logits row with every token the mask forbids at -inf (ids past the mask are forbidden)."""
    if mask is None:
        return logits
    out = np.full(logits.shape, -np.inf, dtype=logits.dtype)
    n = min(mask.size, logits.size)
    keep = mask[:n]
    out[:n][keep] = logits[:n][keep]
    return out


__all__ = ["Constraint", "ConstraintError", "KINDS", "Matcher", "TokenConstraint", "Vocabulary", "apply_mask"]
