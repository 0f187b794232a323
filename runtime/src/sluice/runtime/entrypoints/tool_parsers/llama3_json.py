"""Llama 3.1/3.2 JSON tool calls: the whole output is `{"name": ..., "parameters": {...}}`
(optionally after `<|python_tag|>`), several separated by `;`. An output that does not
begin with `{` (or the tag) is plain content; text after the calls is content too.
"""

from __future__ import annotations

from dataclasses import dataclass

from sluice.runtime.entrypoints.tool_parsers.base import (
    CallFrame,
    ScanningToolParser,
    StreamDelta,
    StreamingToolParser,
    ToolCallDelta,
    ToolParser,
)
from sluice.runtime.entrypoints.tool_parsers.calls import CallEmitter, skip

PYTHON_TAG = "<|python_tag|>"


@dataclass
class SequenceStream(ScanningToolParser):
    """Call objects one after another, `separators` between them; `opener` (if any) must
    come first and `closer` ends the sequence. Anything else turns the rest into content."""

    separators: str = ";"
    opener: str = ""
    closer: str = ""
    tag: str = ""  # an optional prefix before the first call
    mode: str = "start"  # start | calls | sep | content | done
    emitter: CallEmitter | None = None
    calls: int = 0

    def _step(self, deltas: list[ToolCallDelta]) -> bool:  # noqa: C901
        buf = self.buffer
        j = skip(buf, self.pos)
        if self.mode == "content":
            self.content.add(buf[self.pos :])
            self.pos = len(buf)
            return False
        if self.mode == "done":
            self.pos = len(buf)
            return False
        if j == len(buf):
            return False
        if self.mode == "start":
            rest = buf[j:]
            if self.tag and (self.tag.startswith(rest) and rest != self.tag):
                return False  # maybe the tag: wait
            if self.tag and rest.startswith(self.tag):
                j += len(self.tag)
            if self.opener:
                if buf[j] != self.opener:
                    self.mode = "content"
                    return True
                j += 1
            self.pos, self.mode = j, "calls"
            return True
        if self.mode == "sep":
            if self.closer and buf[j] == self.closer:
                self.pos, self.mode = j + 1, "done"
                return True
            if buf[j] in self.separators:
                self.pos, self.mode = j + 1, "calls"
                return True
            self.pos, self.mode = j, "content"
            return True
        # calls
        if self.emitter is None:
            if buf[j] != "{":
                self.mode = "content" if not (self.closer and buf[j] == self.closer) else "done"
                self.pos = j if self.calls else 0  # no call at all: the output is content as is
                return True
            self.emitter = CallEmitter(self.calls, j)
        new, scan = self.emitter.advance(buf)
        deltas.extend(new)
        if scan.end is None and not scan.broken:
            return False
        announced = self.emitter.announced
        start = self.emitter.start
        self.emitter = None
        if not announced or scan.end is None:
            self.pos, self.mode = start, "content"
            return True
        self.calls += 1
        self.content.after_call()
        self.pos, self.mode = scan.end, "sep"
        return True

    def finish(self) -> StreamDelta:
        if self.mode == "start" or (self.mode == "calls" and self.calls == 0 and not (
            self.emitter is not None and self.emitter.announced
        )):
            self.content.add(self.buffer)  # never a call: all of it is content
        elif self.mode == "content":
            self.content.add(self.buffer[self.pos :])
        self.content.flush()
        return StreamDelta(self.content.take())


class Llama3JsonParser(ToolParser):
    name = "llama3_json"
    call_frame = CallFrame("", "parameters", "")

    def streaming(self) -> StreamingToolParser:
        return SequenceStream(separators=";", tag=PYTHON_TAG)
