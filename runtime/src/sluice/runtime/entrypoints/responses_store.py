"""Stored responses (`store: true`, OpenAI's default): the response object as the client got
it, and the conversation through it as chat messages, so that `previous_response_id`
continues it (the next prompt extends this one, and the radix cache already holds its
prefix).

The store is this process's memory, bounded two ways: at most `max_entries` responses
(the least recently used go first) and each for at most `ttl_s` seconds after it was last
used. A restart forgets every response; a second replica holds its own (the router sends a
`previous_response_id` to the replica that stored it). `max_entries` 0 stores nothing: the
responses then say `store: false`.
"""

from __future__ import annotations

import dataclasses
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoredResponse:
    body: dict[str, Any]  # the response object
    # the conversation through its output, as chat messages; None while a background
    # response runs, and for one that was cancelled or failed (it cannot be continued)
    messages: list[dict[str, Any]] | None
    input_items: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # its own input


class ResponseStore:
    def __init__(
        self, max_entries: int, ttl_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.max_entries = max_entries
        self.ttl_s = ttl_s
        self._clock = clock
        self._entries: OrderedDict[str, tuple[float, StoredResponse]] = OrderedDict()

    @property
    def enabled(self) -> bool:
        return self.max_entries > 0

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def __contains__(self, rid: object) -> bool:
        """Held now (its time-to-live is not started again)."""
        self._expire()
        return rid in self._entries

    def put(self, rid: str, stored: StoredResponse) -> None:
        if not self.enabled:
            return
        self._entries[rid] = (self._clock(), stored)
        self._entries.move_to_end(rid)
        self._expire()
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def get(self, rid: str) -> StoredResponse | None:
        """The stored response (its time-to-live starts again), or None: never stored,
        deleted, expired or evicted."""
        self._expire()
        entry = self._entries.get(rid)
        if entry is None:
            return None
        self._entries[rid] = (self._clock(), entry[1])
        self._entries.move_to_end(rid)
        return entry[1]

    def delete(self, rid: str) -> bool:
        self._expire()
        return self._entries.pop(rid, None) is not None

    def _expire(self) -> None:
        """Drop what was last used more than `ttl_s` ago (the oldest are first)."""
        cutoff = self._clock() - self.ttl_s
        while self._entries:
            rid, (used, _) = next(iter(self._entries.items()))
            if used >= cutoff:
                break
            del self._entries[rid]
