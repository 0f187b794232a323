"""Tool calling on chat completions: the tool definitions, `tool_choice`, the JSON schema a
forced choice makes the grammar enforce, and the messages the chat template receives.

- `none`: no tool call is parsed (the template still sees the tools, as in OpenAI).
- `auto`: the model may call; `--tool-call-parser` reads its calls from the text. With an
  output format (`response_format`, the Responses API's `text.format`) the grammar allows
  the answer in that format or one call written as the parser reads calls
  (`answer_or_call`), so the format never keeps the model from calling a tool.
- `required`: the output must be a JSON array of one or more calls (one when
  `parallel_tool_calls` is false), `[{"name": ..., "parameters": {...}}]` (vLLM's shape).
- a named function: the output must be that function's arguments object.
Both forced shapes are enforced with the grammar, so any model answers with arguments
that validate against the tool's `parameters`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from sluice.runtime.constrained import spec as grammar_spec
from sluice.runtime.entrypoints.tool_parsers import (
    NamedFunctionParser,
    RequiredParser,
    ToolParser,
    get_tool_parser,
)
from sluice.runtime.ipc.messages import Constraint

ANY_OBJECT: dict[str, Any] = {"type": "object"}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionDef(_Strict):
    name: str = Field(pattern=r"^[a-zA-Z0-9_.\-]{1,64}$")
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(_Strict):
    type: Literal["function"] = "function"
    function: FunctionDef


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: FunctionName


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice


class ToolError(ValueError):
    """A tool request that cannot be served; `param` names the field."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.param = param


def _params(f: FunctionDef) -> dict[str, Any]:
    return f.parameters if f.parameters else ANY_OBJECT


def _strict(functions: list[FunctionDef]) -> bool:
    """OpenAI's per-function `strict`; unset means xgrammar's strict mode (vLLM's default)."""
    return all(f.strict is not False for f in functions)


def required_schema(tools: list[ToolDef], parallel: bool) -> dict[str, Any]:
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t.function.name]},
                "parameters": _params(t.function),
            },
            "required": ["name", "parameters"],
        }
        for t in tools
    ]
    schema: dict[str, Any] = {
        "type": "array",
        "minItems": 1,
        "items": calls[0] if len(calls) == 1 else {"anyOf": calls},
    }
    if not parallel:
        schema["maxItems"] = 1
    return schema


def named_tool(tools: list[ToolDef] | None, choice: NamedToolChoice) -> ToolDef:
    for t in tools or []:
        if t.function.name == choice.function.name:
            return t
    raise ToolError(
        f"tool_choice names the function {choice.function.name!r}, which is not in tools",
        "tool_choice",
    )


def tool_constraint(
    tools: list[ToolDef] | None, choice: ToolChoice, parallel: bool
) -> Constraint | None:
    """The grammar a forced tool_choice needs (None for none/auto)."""
    if choice in ("none", "auto"):
        return None
    if not tools:
        raise ToolError("tool_choice requires tools", "tool_choice")
    if choice == "required":
        return grammar_spec.json_schema(
            required_schema(tools, parallel), _strict([t.function for t in tools])
        )
    assert isinstance(choice, NamedToolChoice)
    f = named_tool(tools, choice).function
    return grammar_spec.json_schema(_params(f), _strict([f]))


def answer_or_call(answer: Constraint, tools: list[ToolDef], parser: ToolParser) -> Constraint:
    """`tool_choice: auto` with an output format: the output is the answer in the format,
    or one call to one of the tools written the way `parser` reads calls (its arguments
    valid for the tool's parameters), so the format never keeps the model from calling."""
    frame = parser.call_frame
    if frame is None:
        raise ToolError(f"the {parser.name} tool parser cannot be combined with an output "
                        "format", "tool_choice")  # fmt: skip
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t.function.name]},
                frame.arguments_key: _params(t.function),
            },
            "required": ["name", frame.arguments_key],
        }
        for t in tools
    ]
    call = grammar_spec.json_schema(
        calls[0] if len(calls) == 1 else {"anyOf": calls}, _strict([t.function for t in tools])
    )
    framed: list[str | Constraint] = [p for p in (frame.before, call, frame.after) if p != ""]
    return grammar_spec.any_of([[answer], framed])


def output_parser(
    tools: list[ToolDef] | None, choice: ToolChoice, server_parser: str
) -> ToolParser | None:
    """How this request's output becomes tool calls (None: it stays content)."""
    if choice == "none" or not tools:
        return None
    if choice == "required":
        return RequiredParser()
    if isinstance(choice, NamedToolChoice):
        return NamedFunctionParser(choice.function.name)
    if not server_parser:
        raise ToolError(
            '"auto" tool choice needs the server started with --tool-call-parser '
            "(hermes, qwen25 or llama3_json); or send tool_choice \"none\", \"required\" "
            "or a named function",
            "tool_choice",
        )
    return get_tool_parser(server_parser)


def template_tools(tools: list[ToolDef] | None) -> list[dict[str, Any]] | None:
    return [t.model_dump(exclude_none=True) for t in tools] if tools else None


def template_message(message: Any) -> dict[str, Any]:
    """A chat message as Hugging Face chat templates expect it: plain-text content, and an
    assistant's tool call arguments as a dict (templates render them with `tojson`)."""
    out: dict[str, Any] = dict(message.model_extra or {})
    out["role"] = message.role
    out["content"] = message.text
    if message.name is not None:
        out["name"] = message.name
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.tool_calls:
        calls = []
        for call in message.tool_calls:
            call = dict(call)
            function = dict(call.get("function") or {})
            args = function.get("arguments")
            if isinstance(args, str):
                try:
                    function["arguments"] = json.loads(args)
                except ValueError:
                    pass  # a template may still print the string
            call["function"] = function
            calls.append(call)
        out["tool_calls"] = calls
    return out
