"""The output shapes `tool_choice` forces through the grammar (see `entrypoints/tools.py`):
a named function's output is its arguments object; `required`'s is a JSON array of
`{"name": ..., "parameters": {...}}`."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.runtime.entrypoints.tool_parsers.base import (
    StreamDelta,
    StreamingToolParser,
    ToolCallDelta,
    ToolParser,
    new_call_id,
)
from sluice.runtime.entrypoints.tool_parsers.llama3_json import SequenceStream


@dataclass
class NamedStream(StreamingToolParser):
    name: str
    id: str = field(default_factory=new_call_id)
    announced: bool = False

    def feed(self, text: str) -> StreamDelta:
        calls = []
        if not self.announced:
            self.announced = True
            calls.append(ToolCallDelta(0, self.id, self.name, ""))
        if text:
            calls.append(ToolCallDelta(0, arguments=text))
        return StreamDelta("", tuple(calls))

    def finish(self) -> StreamDelta:
        return self.feed("") if not self.announced else StreamDelta()


@dataclass
class NamedFunctionParser(ToolParser):
    function: str

    def streaming(self) -> StreamingToolParser:
        return NamedStream(self.function)


class RequiredParser(ToolParser):
    name = "required"

    def streaming(self) -> StreamingToolParser:
        return SequenceStream(separators=",", opener="[", closer="]")
