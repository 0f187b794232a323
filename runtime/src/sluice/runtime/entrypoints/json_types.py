"""The strict JSON types the request models are built of: a string where a number belongs
is refused, not coerced; an integer must fit in int64; a float must be finite.

`StopList` (a string or a list of at most `MAX_STOP_STRINGS` strings of at most
`MAX_STOP_STRING_CHARS` characters, empty ones dropped) and `Prompts` (one prompt, a string
or token ids, or a list of at most `MAX_PROMPTS` of them) validate and normalise to a list.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, StrictBool, WithJsonSchema
from pydantic_core import PydanticCustomError

SEED_MIN, SEED_MAX = -(2**63), 2**63 - 1
MAX_PROMPTS = 1024  # prompts in one batched request
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256


def _number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PydanticCustomError("number_type", "Input should be a number")
    return value


def _int64(value: int) -> int:
    if not SEED_MIN <= value <= SEED_MAX:
        raise PydanticCustomError("int64", "Input should fit in a signed 64-bit integer")
    return value


def _finite(value: float) -> float:
    if not math.isfinite(value):  # 1e999 parses as infinity
        raise PydanticCustomError("finite_number", "Input should be a finite number")
    return value


Int = Annotated[int, BeforeValidator(_number), AfterValidator(_int64)]
Float = Annotated[float, BeforeValidator(_number), AfterValidator(_finite)]
Bool = StrictBool
TokenId = Annotated[Int, Field(ge=0)]




def _stop_list(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise PydanticCustomError("stop_type", "Input should be a string or a list of strings")
    stops = [s for s in dict.fromkeys(value) if s]
    if len(stops) > MAX_STOP_STRINGS:
        raise PydanticCustomError("too_many_stop_strings", "at most {limit} stop strings",
                                  {"limit": MAX_STOP_STRINGS})  # fmt: skip
    if any(len(s) > MAX_STOP_STRING_CHARS for s in stops):
        raise PydanticCustomError("stop_string_too_long",
                                  "a stop string has at most {limit} characters",
                                  {"limit": MAX_STOP_STRING_CHARS})  # fmt: skip
    return stops


def _is_token_ids(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def _prompts(value: Any) -> list[str | list[int]]:
    """One prompt (a string or token ids) or a list of them, as a list."""
    if isinstance(value, str) or (_is_token_ids(value) and value):
        return [value]
    if (
        isinstance(value, list)
        and value
        and all(isinstance(p, str) or (_is_token_ids(p) and p) for p in value)
    ):
        if len(value) > MAX_PROMPTS:
            raise PydanticCustomError(
                "too_many_prompts", "at most {limit} prompts per request", {"limit": MAX_PROMPTS}
            )
        return list(value)
    raise PydanticCustomError(
        "prompt_type",
        "Input should be a string, a non-empty list of token ids, or a list of those",
    )


_TOKEN_IDS = {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}
StopList = Annotated[
    list[str],
    BeforeValidator(_stop_list),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]}),
]
Prompts = Annotated[
    list[str | list[int]],
    BeforeValidator(_prompts),
    WithJsonSchema({"anyOf": [
        {"type": "string"},
        _TOKEN_IDS,
        {"type": "array", "minItems": 1, "maxItems": MAX_PROMPTS,
         "items": {"anyOf": [{"type": "string"}, _TOKEN_IDS]}},
    ]}),
]  # fmt: skip
