"""Reading a request body as JSON, refusing what would break the layers behind it.

`json.loads` alone accepts what is not JSON (`NaN`, `Infinity`), strings that are not
Unicode (a lone surrogate escape, `"\\ud800"`, which no tokenizer or encoder downstream
can take), and nesting deep enough to exhaust the interpreter's recursion (in the decoder,
or later in validation, templates and grammars). Each is a 400 here.
"""

from __future__ import annotations

import json
import re
from typing import Any

from sluice.runtime.entrypoints.errors import ProtocolError

MAX_JSON_DEPTH = 64  # nested arrays/objects; a JSON schema of 30 levels fits
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _invalid(message: str, param: str | None = None) -> ProtocolError:
    return ProtocolError(message, param=param, code="invalid_json")


def load_json_body(raw: bytes) -> Any:
    """The body's JSON value; a ProtocolError (400) for anything a client must fix."""
    try:
        data = json.loads(raw, parse_constant=_no_constant)
    except RecursionError as exc:
        raise _invalid(f"The JSON body is nested more than {MAX_JSON_DEPTH} levels deep.") from exc
    except (ValueError, UnicodeDecodeError) as exc:
        raise _invalid(f"Malformed JSON body: {exc}") from exc
    check_json_value(data, surrogates_possible=_SURROGATE_ESCAPE.search(raw) is not None)
    return data


def check_json_value(data: Any, surrogates_possible: bool = True) -> None:
    """Refuse nesting deeper than MAX_JSON_DEPTH and strings holding lone surrogates."""
    stack: list[tuple[Any, int, str]] = [(data, 1, "")]
    while stack:
        value, depth, path = stack.pop()
        if isinstance(value, dict):
            items: Any = value.items()
        elif isinstance(value, list):
            items = enumerate(value)
        else:
            if surrogates_possible and isinstance(value, str):
                _check_text(value, path)
            continue
        if depth > MAX_JSON_DEPTH:
            raise _invalid(
                f"The JSON body is nested more than {MAX_JSON_DEPTH} levels deep.",
                _top(path),
            )
        for key, item in items:
            where = f"{path}.{key}" if path else str(key)
            if surrogates_possible and isinstance(key, str):
                _check_text(key, where)
            if isinstance(item, dict | list) or (surrogates_possible and isinstance(item, str)):
                stack.append((item, depth + 1, where))


def _check_text(text: str, path: str) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        where = _printable(path) or "body"
        raise _invalid(
            f"{where}: the string holds a lone surrogate ({exc.object[exc.start]!a}), "
            "which is not valid Unicode",
            _printable(_top(path)),
        ) from exc


def _top(path: str) -> str | None:
    return path.split(".")[0] if path else None


def _printable(text: str | None) -> str | None:
    """`text` as the error can carry it (a key may be the lone surrogate itself)."""
    return text.encode("utf-8", "backslashreplace").decode() if text is not None else None
