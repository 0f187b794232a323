"""Tool-call parsers: model output text -> content + OpenAI tool calls, whole or streamed.

`--tool-call-parser` picks one for `tool_choice: auto`: `hermes` (also `qwen25`: Qwen2.5
writes the same `<tool_call>` blocks) and `llama3_json`. `tool_choice` required or a named
function use the grammar-forced shapes in `forced`.
"""

from __future__ import annotations

from sluice.runtime.entrypoints.tool_parsers.base import (
    ParsedOutput,
    StreamDelta,
    StreamingToolParser,
    ToolCall,
    ToolCallDelta,
    ToolParser,
)
from sluice.runtime.entrypoints.tool_parsers.forced import NamedFunctionParser, RequiredParser
from sluice.runtime.entrypoints.tool_parsers.hermes import HermesParser
from sluice.runtime.entrypoints.tool_parsers.llama3_json import Llama3JsonParser

TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesParser,
    "qwen25": HermesParser,
    "llama3_json": Llama3JsonParser,
}


def get_tool_parser(name: str) -> ToolParser:
    try:
        return TOOL_PARSERS[name]()
    except KeyError:
        raise ValueError(
            f"unknown tool call parser {name!r}; choose from {', '.join(TOOL_PARSERS)}"
        ) from None


__all__ = [
    "TOOL_PARSERS",
    "NamedFunctionParser",
    "ParsedOutput",
    "RequiredParser",
    "StreamDelta",
    "StreamingToolParser",
    "ToolCall",
    "ToolCallDelta",
    "ToolParser",
    "get_tool_parser",
]
