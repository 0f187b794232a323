"""A scanner for one tool-call JSON object that may still be growing.

`scan_call(text, start)` reads the object that begins at `text[start] == "{"` as far as
the text goes and reports what is already certain: the function name (once its string is
closed), where the arguments value starts, and where it and the object end (once
closed). The arguments are never re-serialized: the raw text the model wrote is what is
streamed and returned, so streamed fragments add up to the non-streamed arguments.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

NAME_KEYS = ("name",)
ARGUMENT_KEYS = ("arguments", "parameters")
_WS = " \t\r\n"


@dataclass(frozen=True)
class CallScan:
    name: str | None  # the name, when its string value is complete
    args_start: int | None  # index of the arguments value's first character
    args_end: int | None  # index after the value, when complete
    end: int | None  # index after the object's closing brace, when complete
    broken: bool = False  # not a JSON object of the expected shape


def _string_value(text: str, start: int, end: int) -> str | None:
    try:
        value = json.loads(text[start:end])
    except ValueError:
        return None
    return value if isinstance(value, str) else None


def scan_call(text: str, start: int) -> CallScan:  # noqa: C901 - one small state machine
    depth = 0
    in_string = escape = False
    string_start = 0
    key: str | None = None
    expect = "key"  # at depth 1: "key", "colon", "value", "comma"
    name = None
    args_start = args_end = None
    value_start = None  # a scalar value at depth 1
    for i in range(start, len(text)):
        ch = text[i]
        if in_string:
            if escape:
                escape = False
            elif ch == "\\":
                escape = True
            elif ch == '"':
                in_string = False
                if depth == 1:
                    if expect == "key":
                        key = _string_value(text, string_start, i + 1)
                        expect = "colon"
                    elif expect == "value":
                        if key in NAME_KEYS:
                            name = _string_value(text, string_start, i + 1)
                        elif key in ARGUMENT_KEYS:
                            args_end = i + 1
                        expect = "comma"
            continue
        if ch in _WS:
            continue
        if depth == 0:
            if ch != "{":
                return CallScan(None, None, None, None, broken=True)
            depth = 1
            continue
        if depth == 1 and expect == "value" and value_start is None:
            if key in ARGUMENT_KEYS:
                args_start = i
            if ch not in '"{[':
                value_start = i
        if ch == '"':
            in_string, string_start = True, i
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            if depth == 1:
                if value_start is not None and key in ARGUMENT_KEYS:
                    args_end = len(text[:i].rstrip(_WS))
                return CallScan(name, args_start, args_end, i + 1)
            depth -= 1
            if depth == 1:
                if key in ARGUMENT_KEYS:
                    args_end = i + 1
                expect = "comma"
        elif depth == 1:
            if ch == ":" and expect == "colon":
                expect = "value"
            elif ch == ",":
                if value_start is not None and key in ARGUMENT_KEYS:
                    args_end = len(text[:i].rstrip(_WS))
                expect, key, value_start = "key", None, None
            elif expect not in ("value", "comma") or (expect == "comma" and value_start is None):
                return CallScan(name, args_start, args_end, None, broken=True)
    return CallScan(name, args_start, args_end, None)
