"""The workers the router knows: their health, in-flight counts and prefix trees.

A worker is routable only while `healthy`. It starts unhealthy and joins on its first good
/health probe; it is taken out by failed probes or by a failed proxied request, and then
probed again with exponential backoff until it answers (it rejoins with an empty tree: a
worker that was down has most likely restarted with a cold cache).

Workers come from `--worker-urls` (static, never removed) and from discovery (removed when
their endpoint stops being ready). A removed worker's in-flight requests finish; their
counts go to the detached `Worker` object.

Each worker's `GET /v1/models` is read with its health probes: `adapters` holds the names and
folders (`root`) of the LoRA adapters it lists (cards with a `parent`), `base_models` the id
and root of its base model (cards without one). A worker taken out forgets its adapters.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sluice.runtime.router.prefix_tree import PrefixTree

logger = logging.getLogger("sluice.router")

STATIC = "static"
DISCOVERED = "discovered"


@dataclass(eq=False)
class Worker:
    url: str
    tree: PrefixTree
    source: str = STATIC
    healthy: bool = False
    in_flight: int = 0
    probe_failures: int = 0  # consecutive failed /health probes
    backoff: float = 0.0  # seconds until the next probe of an out worker
    next_probe_at: float = 0.0  # time.monotonic(); 0: probe at once
    down_reason: str = "not probed yet"
    adapters: frozenset[str] = frozenset()  # LoRA adapters its /v1/models lists (name, root)
    base_models: frozenset[str] | None = None  # its base model (id, root); None: not read yet

    def set_models(self, cards: Any) -> None:
        """Take in a /v1/models `data` list; anything else leaves what is known unchanged."""
        if not isinstance(cards, list):
            return
        adapters: set[str] = set()
        bases: set[str] = set()
        for card in cards:
            if not isinstance(card, dict):
                continue
            names = {v for v in (card.get("id"), card.get("root")) if isinstance(v, str) and v}
            (adapters if card.get("parent") else bases).update(names)
        self.adapters, self.base_models = frozenset(adapters), frozenset(bases)


@dataclass
class BackoffPolicy:
    initial: float
    maximum: float

    def next(self, current: float) -> float:
        return self.initial if current <= 0 else min(self.maximum, current * 2)


@dataclass
class WorkerPool:
    tree_size: int
    backoff: BackoffPolicy
    workers: dict[str, Worker] = field(default_factory=dict)
    # called with a worker that left the pool (metrics drop its series)
    on_removed: list[Callable[[Worker], None]] = field(default_factory=list)

    def add(self, url: str, source: str = STATIC) -> Worker:
        if url in self.workers:
            return self.workers[url]
        worker = Worker(url=url, tree=PrefixTree(self.tree_size), source=source)
        self.workers[url] = worker
        logger.info("worker added url=%s source=%s", url, source)
        return worker

    def remove(self, url: str) -> None:
        worker = self.workers.pop(url, None)
        if worker is None:
            return
        worker.healthy = False
        worker.tree.clear()
        logger.info("worker removed url=%s in_flight=%d", url, worker.in_flight)
        for callback in self.on_removed:
            callback(worker)

    def sync_discovered(self, urls: Iterable[str]) -> None:
        """Discovery's current view: ready endpoints join, discovered ones not in it leave."""
        wanted = set(urls)
        for url in sorted(wanted - set(self.workers)):
            self.add(url, DISCOVERED)
        for url, worker in list(self.workers.items()):
            if worker.source == DISCOVERED and url not in wanted:
                self.remove(url)

    def healthy(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.healthy]

    def adapters_wanted(self, model: str | None, adapters: frozenset[str]) -> frozenset[str]:
        """The adapters a request needs: /generate's, else its `model` unless that is a base
        model some worker serves (or no worker's model list is known yet)."""
        if adapters or model is None:
            return adapters
        known = [w.base_models for w in self.workers.values() if w.base_models is not None]
        if not known or any(model in bases for bases in known):
            return frozenset()
        return frozenset({model})

    def mark_up(self, worker: Worker) -> None:
        worker.probe_failures = 0
        worker.backoff = 0.0
        if not worker.healthy:
            worker.healthy = True
            worker.tree.clear()
            logger.info("worker up url=%s", worker.url)

    def mark_down(self, worker: Worker, reason: str, now: float | None = None) -> None:
        """Take a worker out (if it is still in the pool) and schedule its next probe."""
        now = time.monotonic() if now is None else now
        worker.backoff = self.backoff.next(worker.backoff)
        worker.next_probe_at = now + worker.backoff
        worker.down_reason = reason
        worker.adapters = frozenset()
        if worker.healthy:
            worker.healthy = False
            worker.tree.clear()
            logger.warning(
                "worker down url=%s reason=%s retry_in=%.1fs", worker.url, reason, worker.backoff
            )
