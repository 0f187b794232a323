"""Hermes / Qwen2.5 tool calls: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`,
any number of them, with free text before (the content).

A block whose object has no name, or that does not begin with `{`, is not a call: its
text (tags included) stays in the content. Text inside a block after its object is
dropped. A block cut off by max_tokens keeps the arguments written so far.
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
from sluice.runtime.entrypoints.tool_parsers.calls import CallEmitter, partial_suffix, skip

START, END = "<tool_call>", "</tool_call>"


@dataclass
class HermesStream(ScanningToolParser):
    mode: str = "content"  # content | call | after | broken
    block_start: int = 0  # index of the current block's START tag
    emitter: CallEmitter | None = None
    calls: int = 0

    def _step(self, deltas: list[ToolCallDelta]) -> bool:  # noqa: C901
        buf = self.buffer
        if self.mode == "content":
            idx = buf.find(START, self.pos)
            if idx < 0:
                safe = len(buf) - partial_suffix(buf, START, self.pos)
                self.content.add(buf[self.pos : safe])
                self.pos = safe
                return False
            self.content.add(buf[self.pos : idx])
            self.content.before_call()
            self.block_start, self.pos, self.mode = idx, idx + len(START), "call"
            return True
        if self.mode == "call":
            j = skip(buf, self.pos)
            if j == len(buf):
                return False
            if self.emitter is None:
                if buf[j] != "{":
                    self.mode = "broken"
                    return True
                self.emitter = CallEmitter(self.calls, j)
            new, scan = self.emitter.advance(buf)
            deltas.extend(new)
            if scan.broken or scan.end is not None:
                announced = self.emitter.announced
                self.emitter = None
                if not announced:
                    self.mode = "broken"
                    return True
                self.calls += 1
                self.pos = scan.end if scan.end is not None else len(buf)
                self.mode = "after"
                return True
            return False
        idx = buf.find(END, self.pos)
        if idx < 0:
            return False
        if self.mode == "broken":
            self.content.add(buf[self.block_start : idx + len(END)])
        else:
            self.content.after_call()
        self.pos, self.mode = idx + len(END), "content"
        return True

    def finish(self) -> StreamDelta:
        if self.mode == "content":
            self.content.add(self.buffer[self.pos :])
        elif self.mode == "broken" or (self.mode == "call" and not self._announced()):
            self.content.add(self.buffer[self.block_start :])
        self.content.flush()
        return StreamDelta(self.content.take())

    def _announced(self) -> bool:
        return self.emitter is not None and self.emitter.announced


class HermesParser(ToolParser):
    name = "hermes"
    call_frame = CallFrame(START + "\n", "arguments", "\n" + END)

    def streaming(self) -> StreamingToolParser:
        return HermesStream()
