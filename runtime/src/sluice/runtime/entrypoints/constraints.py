"""The request fields that constrain the output, turned into one `Constraint`.

OpenAI `response_format` (json_object; json_schema with `strict`), vLLM's `guided_json`,
`guided_regex`, `guided_choice`, `guided_grammar` and `structured_outputs`, SGLang's
`regex`, `json_schema`, `ebnf` (top level and in /generate's `sampling_params`). At most
one may be given. Each is checked with the grammar library here, so a schema it cannot
compile is a 400 carrying the library's reason.
"""

from __future__ import annotations

import json
from typing import Any

from sluice.runtime.constrained import spec
from sluice.runtime.ipc.messages import Constraint


class ConstraintError(ValueError):
    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _schema(value: dict[str, Any] | str, param: str) -> str:
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError as exc:
            raise ConstraintError(f"{param}: the schema is not valid JSON: {exc}", param) from exc
        return value
    return json.dumps(value, ensure_ascii=False)


def _from_response_format(rf: Any) -> Constraint | None:
    if rf.type == "text":
        return None
    if rf.type == "json_object":
        return Constraint(spec.JSON_OBJECT, "")
    if rf.json_schema is None or rf.json_schema.schema_ is None:
        raise ConstraintError(
            "response_format: json_schema needs json_schema.schema", "response_format"
        )
    strict = rf.json_schema.strict is not False
    return Constraint(spec.JSON_SCHEMA, _schema(rf.json_schema.schema_, "response_format"), strict)


def _from_structured_outputs(so: Any) -> list[tuple[str, Constraint]]:
    found = []
    if so.json_ is not None:
        found.append(("structured_outputs.json", spec.json_schema(_schema(so.json_, "structured_outputs"))))
    if so.regex is not None:
        found.append(("structured_outputs.regex", Constraint(spec.REGEX, so.regex)))
    if so.choice is not None:
        found.append(("structured_outputs.choice", spec.choice(so.choice)))
    if so.grammar is not None:
        found.append(("structured_outputs.grammar", spec.grammar(so.grammar)))
    if so.json_object:
        found.append(("structured_outputs.json_object", Constraint(spec.JSON_OBJECT, "")))
    return found


def request_constraint(req: Any, prefix: str = "") -> tuple[str, Constraint] | None:
    """The (field name, constraint) a request asks for, validated; None if none.

    `req` is any request model; fields it does not have count as unset."""
    found: list[tuple[str, Constraint]] = []

    def field(name: str) -> Any:
        return getattr(req, name, None)

    if field("response_format") is not None:
        c = _from_response_format(req.response_format)
        if c is not None:
            found.append(("response_format", c))
    if field("guided_json") is not None:
        found.append(("guided_json", spec.json_schema(_schema(req.guided_json, "guided_json"))))
    if field("json_schema") is not None:
        found.append((prefix + "json_schema", spec.json_schema(_schema(req.json_schema, "json_schema"))))
    if field("guided_regex") is not None:
        found.append(("guided_regex", Constraint(spec.REGEX, req.guided_regex)))
    if field("regex") is not None:
        found.append((prefix + "regex", Constraint(spec.REGEX, req.regex)))
    if field("guided_choice") is not None:
        found.append(("guided_choice", spec.choice(req.guided_choice)))
    if field("guided_grammar") is not None:
        found.append(("guided_grammar", spec.grammar(req.guided_grammar)))
    if field("ebnf") is not None:
        found.append((prefix + "ebnf", Constraint(spec.EBNF, req.ebnf)))
    if field("structured_outputs") is not None:
        found.extend(_from_structured_outputs(req.structured_outputs))
    if not found:
        return None
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise ConstraintError(f"give at most one output constraint; got {names}", found[1][0])
    name, constraint = found[0]
    try:
        spec.validate(constraint)
    except spec.GrammarError as exc:
        raise ConstraintError(f"{name}: {exc}", name) from exc
    return name, constraint
