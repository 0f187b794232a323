"""The routing key of a request: what the cache-aware policy matches prefixes of.

- `/v1/completions`: the prompt (text; token ids as a tuple of ints; the first of a batch).
- `/v1/chat/completions`: the messages in order, each as `<role>` + its text, so that a
  conversation's next turn extends the key of the turn before it (its cached prefix).
- `/generate`: `text`, else `input_ids`.
- `/v1/responses`: `instructions` (as `<system>`, like chat's system message), then the
  input: a string (as `<user>`), or its message items in order, each as `<role>` + its
  `content` string or its `input_text`/`output_text` parts (other items: tool calls, their
  outputs, reasoning, carry no key), so that a conversation resent whole extends its key.
  A request that names a `previous_response_id` goes to the worker holding that response
  (`responses.py`); its key is only the new input.

The key never fails a request: a body the router cannot read routes with an empty key (no
prefix to match) and the worker answers it with its own error.

`request_route` also reads, from the same parse of the body, what adapter affinity needs:
the OpenAI routes' `model` (an adapter's name, or the base model's) and /generate's
`lora_path` (a name or folder; one, or one per prompt) or `lora_name`; and, for response
affinity, /v1/responses' `previous_response_id`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sluice.runtime.constants import RESPONSES_PATH
from sluice.runtime.router.prefix_tree import Key

EMPTY: Key = ""


@dataclass(frozen=True)
class RequestRoute:
    key: Key = EMPTY
    model: str | None = None  # OpenAI routes: the `model` field
    adapters: frozenset[str] = frozenset()  # /generate: the adapters lora_path/lora_name name
    previous_response_id: str | None = None  # /v1/responses: the stored response it continues


def routing_key(path: str, body: bytes) -> Key:
    return request_route(path, body).key


def request_route(path: str, body: bytes) -> RequestRoute:
    """The routing key and the adapter fields, from one parse of the body."""
    try:
        data = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return RequestRoute()
    if not isinstance(data, dict):
        return RequestRoute()
    key = _key(path, data)
    if path == "/generate":
        return RequestRoute(key, adapters=_generate_adapters(data))
    model = data.get("model")
    previous = data.get("previous_response_id") if path == RESPONSES_PATH else None
    return RequestRoute(
        key,
        model=model if isinstance(model, str) and model else None,
        previous_response_id=previous if isinstance(previous, str) and previous else None,
    )


def _generate_adapters(data: dict[str, Any]) -> frozenset[str]:
    lora_path = data.get("lora_path")
    wanted = lora_path if isinstance(lora_path, list) else [lora_path]
    if lora_path is None:
        wanted = [data.get("lora_name")]
    return frozenset(v for v in wanted if isinstance(v, str) and v)


def _key(path: str, data: dict[str, Any]) -> Key:
    if path.endswith("/chat/completions"):
        return _chat_key(data.get("messages"))
    if path.endswith("/completions"):
        return _prompt_key(data.get("prompt"))
    if path == "/generate":
        text = data.get("text")
        return _prompt_key(text if text is not None else data.get("input_ids"))
    if path == RESPONSES_PATH:
        return _responses_key(data.get("instructions"), data.get("input"))
    return EMPTY


def _prompt_key(prompt: Any) -> Key:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return tuple(prompt)
        return _prompt_key(prompt[0])  # a batch: route by its first prompt
    return EMPTY


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: the text ones count
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


def _chat_key(messages: Any) -> Key:
    if not isinstance(messages, list):
        return EMPTY
    parts = []
    for m in messages:
        if isinstance(m, dict):
            parts.append(f"<{m.get('role', '')}>{_content_text(m.get('content'))}")
    return "".join(parts)


RESPONSE_TEXT_PARTS = ("input_text", "output_text")


def _responses_key(instructions: Any, input_: Any) -> Key:
    parts = [f"<system>{instructions}"] if isinstance(instructions, str) and instructions else []
    if isinstance(input_, str):
        parts.append(f"<user>{input_}")
    elif isinstance(input_, list):
        for item in input_:
            if isinstance(item, dict) and item.get("type", "message") == "message":
                parts.append(f"<{item.get('role', '')}>{_item_text(item.get('content'))}")
    return "".join(parts)


def _item_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # input_text / output_text parts; images etc. carry no text
        return "".join(
            p.get("text", "")
            for p in content
            if isinstance(p, dict)
            and p.get("type") in RESPONSE_TEXT_PARTS
            and isinstance(p.get("text"), str)
        )
    return ""
