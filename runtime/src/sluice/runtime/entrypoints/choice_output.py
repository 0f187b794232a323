"""One choice's text as it streams, split into its parts: the reasoning (with
--reasoning-parser), the content, and the tool calls (with a tool parser). Chat's chunks
and the Responses API's items are both built from these pieces, fed chunk by chunk, so a
streamed and a whole answer split the same way."""

from __future__ import annotations

from dataclasses import dataclass

from sluice.runtime.entrypoints.reasoning import ReasoningSplitter
from sluice.runtime.entrypoints.tool_parsers import StreamingToolParser, ToolCallDelta


@dataclass(frozen=True)
class OutputPieces:
    reasoning: str = ""
    content: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()


@dataclass
class ChoiceOutput:
    """`splitter`: None without --reasoning-parser; `parser`: None when the request's
    output is not read for tool calls."""

    splitter: ReasoningSplitter | None = None
    parser: StreamingToolParser | None = None

    def feed(self, text: str, last: bool) -> OutputPieces:
        """The pieces of one text delta; `last`: the choice ends with it (whatever the
        splitter and the parser held back comes out)."""
        thought = ""
        if self.splitter is not None:
            split = self.splitter.feed(text)
            thought, text = split.reasoning, split.content
            if last:
                end = self.splitter.finish()
                thought, text = thought + end.reasoning, text + end.content
        if self.parser is None:
            return OutputPieces(thought, text)
        d = self.parser.feed(text)
        calls = d.tool_calls
        content = d.content
        if last:
            end = self.parser.finish()
            content, calls = content + end.content, calls + end.tool_calls
        return OutputPieces(thought, content, calls)
