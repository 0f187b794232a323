"""The routing key of a request: what the cache-aware policy matches prefixes of.

- `/v1/completions`: the prompt (text; token ids as a tuple of ints; the first of a batch).
- `/v1/chat/completions`: the messages in order, each as `<role>` + its text, so that a
  conversation's next turn extends the key of the turn before it (its cached prefix).
- `/generate`: `text`, else `input_ids`.

The key never fails a request: a body the router cannot read routes with an empty key (no
prefix to match) and the worker answers it with its own error.
"""

from __future__ import annotations

import json
from typing import Any

from sluice.runtime.router.prefix_tree import Key

EMPTY: Key = ""


def routing_key(path: str, body: bytes) -> Key:
    try:
        data = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError):
        return EMPTY
    if not isinstance(data, dict):
        return EMPTY
    if path.endswith("/chat/completions"):
        return _chat_key(data.get("messages"))
    if path.endswith("/completions"):
        return _prompt_key(data.get("prompt"))
    if path == "/generate":
        text = data.get("text")
        return _prompt_key(text if text is not None else data.get("input_ids"))
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
