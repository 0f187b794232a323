"""What every tool-call parser produces, and the one rule that keeps streaming and
non-streaming identical: a non-streamed parse is the streamed parse of the whole text,
assembled (`ToolParser.parse`).

A streamed call is announced by one delta carrying its index, id, type and function name
(with `arguments: ""`, as OpenAI sends it); every later delta of that call carries only
argument text. Concatenating a call's argument fragments gives its arguments exactly.
Whitespace that only separates content from a tool call is dropped.
"""

from __future__ import annotations

import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the model wrote it


@dataclass(frozen=True)
class ToolCallDelta:
    index: int
    id: str | None = None  # set (with name) in the first delta of a call only
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class StreamDelta:
    content: str = ""
    tool_calls: tuple[ToolCallDelta, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.content or self.tool_calls)


@dataclass(frozen=True)
class ParsedOutput:
    content: str | None
    tool_calls: list[ToolCall]


class StreamingToolParser(ABC):
    """One choice's parse state. `feed` each text delta, then `finish` once."""

    @abstractmethod
    def feed(self, text: str) -> StreamDelta: ...

    @abstractmethod
    def finish(self) -> StreamDelta: ...


@dataclass(frozen=True)
class CallFrame:
    """How one call is written: `before`, the JSON object `{"name": ..., <arguments_key>:
    {...}}`, `after`. A grammar that allows "an answer or a call" writes calls this way."""

    before: str
    arguments_key: str
    after: str


class ToolParser(ABC):
    name: str = ""
    call_frame: CallFrame | None = None  # None: no grammar can write this parser's calls

    @abstractmethod
    def streaming(self) -> StreamingToolParser: ...

    def parse(self, text: str) -> ParsedOutput:
        stream = self.streaming()
        return assemble([stream.feed(text), stream.finish()])


def assemble(deltas: list[StreamDelta]) -> ParsedOutput:
    content = "".join(d.content for d in deltas)
    calls: dict[int, list[str]] = {}
    heads: dict[int, ToolCallDelta] = {}
    for d in deltas:
        for c in d.tool_calls:
            if c.name is not None:
                heads[c.index] = c
            calls.setdefault(c.index, []).append(c.arguments)
    tool_calls = [
        ToolCall(heads[i].id or new_call_id(), heads[i].name or "", "".join(calls[i]))
        for i in sorted(heads)
    ]
    return ParsedOutput(content or None, tool_calls)


@dataclass
class ContentStream:
    """Content text with whitespace next to a tool call dropped: trailing whitespace is
    held until more text follows; `drop_leading` drops whitespace right after a call."""

    held: str = ""
    drop_leading: bool = False
    out: list[str] = field(default_factory=list)

    def add(self, text: str) -> None:
        if self.drop_leading:
            text = text.lstrip()
            if not text:
                return
            self.drop_leading = False
        body = text.rstrip()
        if body:
            self.out.append(self.held + body)
            self.held = ""
        self.held += text[len(body) :]

    def before_call(self) -> None:
        self.held = ""

    def after_call(self) -> None:
        self.held, self.drop_leading = "", True

    def flush(self) -> None:
        if self.held:
            self.out.append(self.held)
            self.held = ""

    def take(self) -> str:
        text = "".join(self.out)
        self.out = []
        return text


@dataclass
class ScanningToolParser(StreamingToolParser):
    """A parser that scans its growing text `buffer` from `pos` one step at a time: `feed`
    appends the delta and runs `_step` until it needs more text."""

    buffer: str = ""
    pos: int = 0
    content: ContentStream = field(default_factory=ContentStream)

    def feed(self, text: str) -> StreamDelta:
        self.buffer += text
        deltas: list[ToolCallDelta] = []
        while self._step(deltas):
            pass
        return StreamDelta(self.content.take(), tuple(deltas))

    @abstractmethod
    def _step(self, deltas: list[ToolCallDelta]) -> bool:
        """Consume what the buffer allows, appending call deltas; False when it needs more."""
