"""A work queue of object keys, as controller-runtime's (client-go's workqueue) is.

- A key is queued at most once however often it is added; a key being worked on is not
  handed to a second worker; added again meanwhile, it is queued once the first is done.
- `add_after` queues a key later (the periodic resync, a retry); an earlier add wins.
- `add_rate_limited` retries with per-key exponential back-off (base · 2^failures, capped);
  `forget` resets the key's failures after a success.

Everything runs on one asyncio event loop; no locks are needed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass
class Backoff:
    base: float
    cap: float

    def delay(self, failures: int) -> float:
        return min(self.cap, self.base * 2 ** max(0, failures - 1))


@dataclass
class WorkQueue(Generic[K]):
    backoff: Backoff
    _queue: asyncio.Queue[K] = field(default_factory=asyncio.Queue)
    _queued: set[K] = field(default_factory=set)
    _active: set[K] = field(default_factory=set)
    _dirty: set[K] = field(default_factory=set)
    _timers: dict[K, tuple[float, asyncio.TimerHandle]] = field(default_factory=dict)
    _failures: dict[K, int] = field(default_factory=dict)
    _closed: bool = False

    def add(self, key: K) -> None:
        if self._closed:
            return
        self._cancel_timer(key)
        if key in self._active:
            self._dirty.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def add_after(self, key: K, delay: float) -> None:
        """Queue `key` in `delay` seconds, unless it is due earlier already."""
        if self._closed:
            return
        if delay <= 0:
            self.add(key)
            return
        loop = asyncio.get_running_loop()
        due = loop.time() + delay
        current = self._timers.get(key)
        if current is not None and current[0] <= due:
            return
        self._cancel_timer(key)
        self._timers[key] = (due, loop.call_at(due, self._fire, key))

    def add_rate_limited(self, key: K) -> float:
        """Retry `key` after its back-off; returns the delay."""
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        delay = self.backoff.delay(failures)
        self.add_after(key, delay)
        return delay

    def forget(self, key: K) -> None:
        """The key succeeded: its next failure starts the back-off anew."""
        self._failures.pop(key, None)

    def discard(self, key: K) -> None:
        """The object is gone: no retry, no resync."""
        self._cancel_timer(key)
        self._failures.pop(key, None)
        self._dirty.discard(key)

    def failures(self, key: K) -> int:
        return self._failures.get(key, 0)

    async def get(self) -> K:
        """The next key; the caller must call `done(key)` when finished with it."""
        key = await self._queue.get()
        self._queued.discard(key)
        self._active.add(key)
        return key

    def done(self, key: K) -> None:
        self._active.discard(key)
        if key in self._dirty:
            self._dirty.discard(key)
            self.add(key)

    def close(self) -> None:
        self._closed = True
        for _, handle in self._timers.values():
            handle.cancel()
        self._timers.clear()

    def __len__(self) -> int:
        return len(self._queued)

    def _fire(self, key: K) -> None:
        self._timers.pop(key, None)
        self.add(key)

    def _cancel_timer(self, key: K) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer[1].cancel()
