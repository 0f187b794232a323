"""What OpenAI requires of each chat message, beyond its fields' types: a 400 naming the
message's index and field (`messages.[i].field`, OpenAI's own `param` form).

- `system`, `developer` and `user` messages carry content (not null);
- an `assistant` message carries content or tool calls;
- a `tool` message answers a call: `tool_call_id` and content.
(The role itself is one of OpenAI's, checked with the message's type.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]  # OpenAI's


class _Message(Protocol):
    role: str
    content: Any
    tool_calls: Any
    tool_call_id: str | None


def message_param(index: int, field: str) -> str:
    return f"messages.[{index}].{field}"


def message_problem(messages: Sequence[_Message]) -> tuple[str, str] | None:
    """(param, message) of the first message OpenAI would refuse, else None."""
    for i, m in enumerate(messages):
        if m.role in ("system", "developer", "user") and m.content is None:
            return message_param(i, "content"), f"a {m.role} message needs content, not null"
        if m.role == "assistant" and m.content is None and not m.tool_calls:
            return message_param(i, "content"), "an assistant message needs content or tool_calls"
        if m.role == "tool":
            if not m.tool_call_id:
                return message_param(i, "tool_call_id"), "a tool message needs the tool_call_id it answers"
            if m.content is None:
                return message_param(i, "content"), "a tool message needs content, not null"
    return None
