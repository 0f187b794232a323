"""Constraint kinds, their xgrammar grammars, and the errors a bad one raises.

Tokenizer-free: the API process calls `validate` to refuse a constraint with a 400 before
it reaches the scheduler (a few milliseconds; no vocabulary is involved), and the
scheduler's `GrammarCompiler` builds the same `grammar_of` and compiles it against the
tokenizer.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sluice.runtime.ipc.messages import Constraint

JSON_SCHEMA = "json_schema"
JSON_OBJECT = "json_object"
REGEX = "regex"
CHOICE = "choice"
EBNF = "ebnf"
LARK = "lark"
# alternatives, each a sequence of literal text and constraints (spec: the JSON of
# `[[part, ...], ...]`, a part a string or `{"kind", "spec", "strict"}`): the answer in a
# format, or a tool call in the tool parser's frame
ANY_OF = "any_of"
CONSTRAINT_KINDS = (JSON_SCHEMA, JSON_OBJECT, REGEX, CHOICE, EBNF, LARK, ANY_OF)

# xgrammar prefixes its C++ errors with "[hh:mm:ss] /path/file.cc:123: "
_LOCATION = re.compile(r"^\s*\[[0-9:]+\]\s+\S+?:\d+:\s*")
_OBJECT_SCHEMA = '{"type": "object"}'


class GrammarError(ValueError):
    """A constraint the grammar library refuses. `reason` is the library's own message."""

    def __init__(self, kind: str, reason: str) -> None:
        super().__init__(f"invalid {kind} constraint: {reason}")
        self.kind = kind
        self.reason = reason


GRAMMAR_PACKAGE = "xgrammar"


class GrammarUnavailable(GrammarError):
    """The grammar library is not installed: the server runs, constrained requests are
    refused (a 400 naming the package)."""

    def __init__(self, kind: str) -> None:
        super().__init__(
            kind,
            f"constrained decoding needs the Python package '{GRAMMAR_PACKAGE}', which is "
            f"not installed on this server (pip install {GRAMMAR_PACKAGE})",
        )


def grammar_library(kind: str = "output") -> Any:
    """The `xgrammar` module; raises GrammarUnavailable when it is not installed."""
    try:
        import xgrammar
    except ImportError as exc:
        raise GrammarUnavailable(kind) from exc
    return xgrammar


def library_reason(exc: BaseException) -> str:
    """xgrammar's message without its timestamp and source location."""
    text = str(exc).strip()
    return _LOCATION.sub("", text.splitlines()[0] if text else type(exc).__name__)


def json_schema(schema: dict[str, Any] | bool | str, strict: bool = True) -> Constraint:
    spec = schema if isinstance(schema, str) else json.dumps(schema, ensure_ascii=False)
    return Constraint(JSON_SCHEMA, spec, strict)


def choice(choices: list[str]) -> Constraint:
    return Constraint(CHOICE, json.dumps(list(choices), ensure_ascii=False))


def grammar(text: str) -> Constraint:
    """vLLM's `guided_grammar`: xgrammar EBNF when it has `::=` rules, otherwise Lark."""
    return Constraint(EBNF if "::=" in text else LARK, text)


def any_of(alternatives: list[list[str | Constraint]]) -> Constraint:
    """Output matching one of the alternatives; each is its parts one after another."""
    parts = [
        [p if isinstance(p, str) else {"kind": p.kind, "spec": p.spec, "strict": p.strict}
         for p in alt]
        for alt in alternatives
    ]  # fmt: skip
    return Constraint(ANY_OF, json.dumps(parts, ensure_ascii=False))


def _any_of_grammar(spec: str, any_whitespace: bool) -> Any:
    xgr = grammar_library(ANY_OF)
    try:
        alternatives = json.loads(spec)
    except ValueError as exc:
        raise GrammarError(ANY_OF, f"not JSON: {exc}") from exc
    if not isinstance(alternatives, list) or not alternatives:
        raise GrammarError(ANY_OF, "a non-empty list of alternatives is needed")
    grammars = []
    for alt in alternatives:
        if not isinstance(alt, list) or not alt:
            raise GrammarError(ANY_OF, "each alternative is a non-empty list of parts")
        parts = []
        for part in alt:
            if isinstance(part, str):
                parts.append(xgr.Grammar.from_ebnf(f"root ::= {json.dumps(part, ensure_ascii=False)}"))
            elif isinstance(part, dict) and part.get("kind") not in (None, ANY_OF):
                inner = Constraint(part["kind"], str(part.get("spec", "")), bool(part.get("strict", True)))
                parts.append(grammar_of(inner, any_whitespace))
            else:
                raise GrammarError(ANY_OF, f"a part is literal text or a constraint, not {part!r}")
        grammars.append(parts[0] if len(parts) == 1 else xgr.Grammar.concat(*parts))
    return grammars[0] if len(grammars) == 1 else xgr.Grammar.union(*grammars)


def choice_ebnf(choices: list[str]) -> str:
    """An EBNF whose only sentences are the choices (JSON string escapes, raw UTF-8)."""
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def _choices(spec: str) -> list[str]:
    try:
        choices = json.loads(spec)
    except ValueError as exc:
        raise GrammarError(CHOICE, f"not a JSON list: {exc}") from exc
    if (
        not isinstance(choices, list)
        or not choices
        or not all(isinstance(c, str) and c for c in choices)
    ):
        raise GrammarError(CHOICE, "choices must be a non-empty list of non-empty strings")
    return choices


def grammar_of(c: Constraint, any_whitespace: bool = False) -> Any:
    """The `xgrammar.Grammar` for a constraint; raises GrammarError with xgrammar's reason.

    `any_whitespace`: JSON may hold any whitespace between tokens (small models tend to
    loop on it); False allows exactly the compact `json.dumps` layout (", " and ": ").
    """
    if c.kind not in CONSTRAINT_KINDS:
        raise GrammarError(c.kind, f"unknown kind; expected one of {', '.join(CONSTRAINT_KINDS)}")
    xgr = grammar_library(c.kind)
    try:
        if c.kind in (JSON_SCHEMA, JSON_OBJECT):
            schema = _OBJECT_SCHEMA if c.kind == JSON_OBJECT else c.spec
            json.loads(schema)  # a clearer message than the converter's for broken JSON
            return xgr.Grammar.from_json_schema(
                schema,
                any_whitespace=any_whitespace,
                strict_mode=c.strict if c.kind == JSON_SCHEMA else False,
            )
        if c.kind == REGEX:
            return xgr.Grammar.from_regex(c.spec)
        if c.kind == CHOICE:
            return xgr.Grammar.from_ebnf(choice_ebnf(_choices(c.spec)))
        if c.kind == EBNF:
            return xgr.Grammar.from_ebnf(c.spec)
        if c.kind == ANY_OF:
            return _any_of_grammar(c.spec, any_whitespace)
        return xgr.Grammar.from_lark(c.spec)
    except GrammarError:
        raise
    except json.JSONDecodeError as exc:
        raise GrammarError(c.kind, f"the schema is not valid JSON: {exc}") from exc
    except Exception as exc:  # xgrammar raises RuntimeError/ValueError subclasses
        raise GrammarError(c.kind, library_reason(exc)) from exc


def validate(c: Constraint) -> None:
    """Raise GrammarError if xgrammar cannot build the constraint's grammar."""
    grammar_of(c)
