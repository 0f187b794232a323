"""Streaming the calls of a JSON object sequence (`{...}; {...}` or `[{...}, {...}]`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sluice.runtime.entrypoints.tool_parsers.base import ToolCallDelta, new_call_id
from sluice.runtime.entrypoints.tool_parsers.json_scan import CallScan, scan_call

WS = " \t\r\n"


def skip(text: str, pos: int, chars: str = WS) -> int:
    while pos < len(text) and text[pos] in chars:
        pos += 1
    return pos


def partial_suffix(text: str, tag: str, start: int) -> int:
    """Length of the longest suffix of `text[start:]` that is a proper prefix of `tag`."""
    for k in range(min(len(tag) - 1, len(text) - start), 0, -1):
        if tag.startswith(text[-k:]):
            return k
    return 0


@dataclass
class CallEmitter:
    """One call object at `buffer[start]`: announces it once the name is known, then
    streams the raw arguments text."""

    index: int
    start: int
    id: str = field(default_factory=new_call_id)
    announced: bool = False
    sent: int = -1  # buffer index up to which arguments were emitted
    any_arguments: bool = False

    def advance(self, buffer: str) -> tuple[list[ToolCallDelta], CallScan]:
        scan = scan_call(buffer, self.start)
        out = []
        if not self.announced and scan.name is not None:
            self.announced = True
            out.append(ToolCallDelta(self.index, self.id, scan.name, ""))
        if self.announced and scan.args_start is not None:
            end = scan.args_end if scan.args_end is not None else len(buffer)
            begin = max(self.sent, scan.args_start)
            if end > begin:
                out.append(ToolCallDelta(self.index, arguments=buffer[begin:end]))
                self.sent = end
                self.any_arguments = True
        if self.announced and scan.end is not None and not self.any_arguments:
            out.append(ToolCallDelta(self.index, arguments="{}"))  # a call without arguments
            self.any_arguments = True
        return out, scan
