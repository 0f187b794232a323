"""One choice's text as it streams, split into its parts: the reasoning (with
--reasoning-parser), the content, and the tool calls (with a tool parser). Chat's chunks
and the Responses API's items are both built from these pieces, fed chunk by chunk, so a
streamed and a whole answer split the same way."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sluice.runtime.entrypoints.reasoning import ReasoningSplitter
from sluice.runtime.entrypoints.tool_parsers import StreamingToolParser, ToolCallDelta


@dataclass(frozen=True)
class OutputPieces:
    reasoning: str = ""
    content: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()


class TokenOutput(Protocol):
    """A reply read from its token ids rather than its text (`harmony.HarmonyOutput`)."""

    def feed(self, token_ids: list[int], last: bool) -> OutputPieces: ...


@dataclass
class ChoiceOutput:
    """`splitter`: None without --reasoning-parser; `parser`: None when the request's
    output is not read for tool calls; `tokens`: the reply is read from its token ids
    (gpt-oss's Harmony), and then the other two are None."""

    splitter: ReasoningSplitter | None = None
    parser: StreamingToolParser | None = None
    tokens: TokenOutput | None = None

    def feed(self, text: str, last: bool, token_ids: list[int] | None = None) -> OutputPieces:
        """The pieces of one delta (its text, and its token ids); `last`: the choice ends
        with it (whatever the splitter and the parser held back comes out)."""
        if self.tokens is not None:
            return self.tokens.feed(list(token_ids or []), last)
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
