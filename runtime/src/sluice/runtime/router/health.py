"""Probing workers' `GET /health`.

A healthy worker is probed every `interval`; `failure_threshold` failures in a row take it
out. An out (or never yet healthy) worker is probed when its backoff is over (doubling from
`backoff_initial` to `backoff_max`), and rejoins on its first 200. A 503 (starting,
draining) is a failure like a refused connection.

After each good probe the worker's `GET /v1/models` is read too (its LoRA adapters, for
adapter affinity); a failed or unreadable answer (e.g. 401 from a worker with an API key,
which the router does not hold) leaves what the router knew of it unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import httpx

from sluice.runtime.constants import HEALTH_PATH
from sluice.runtime.router.workers import Worker, WorkerPool

logger = logging.getLogger("sluice.router")

MODELS_PATH = "/v1/models"
TICK_S = 0.1  # how often the monitor looks for probes that are due


@dataclass(frozen=True)
class HealthConfig:
    interval: float
    timeout: float
    failure_threshold: int


class HealthMonitor:
    def __init__(self, pool: WorkerPool, config: HealthConfig, client: httpx.AsyncClient) -> None:
        self.pool = pool
        self.config = config
        self.client = client
        self._probing: set[Worker] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def probe(self, worker: Worker) -> bool:
        try:
            resp = await self.client.get(worker.url + HEALTH_PATH, timeout=self.config.timeout)
            return resp.status_code == 200
        except httpx.HTTPError:
            return False

    async def read_models(self, worker: Worker) -> None:
        try:
            resp = await self.client.get(worker.url + MODELS_PATH, timeout=self.config.timeout)
            if resp.status_code == 200:
                worker.set_models(resp.json().get("data"))
            else:
                logger.debug("GET /v1/models of %s: HTTP %d", worker.url, resp.status_code)
        except (httpx.HTTPError, ValueError, AttributeError) as exc:
            logger.debug("GET /v1/models of %s failed: %r", worker.url, exc)

    async def check(self, worker: Worker) -> None:
        """One probe, and what follows from it."""
        ok = await self.probe(worker)
        now = time.monotonic()
        if worker.url not in self.pool.workers:
            return  # left the pool meanwhile
        if ok:
            await self.read_models(worker)  # before it joins: its adapters are known then
            now = time.monotonic()
            if worker.url not in self.pool.workers:
                return
            self.pool.mark_up(worker)
            worker.next_probe_at = now + self.config.interval
            return
        worker.probe_failures += 1
        if worker.healthy and worker.probe_failures < self.config.failure_threshold:
            worker.next_probe_at = now + min(self.config.interval, self.pool.backoff.initial)
            return
        reason = f"health probe failed {worker.probe_failures}x"
        self.pool.mark_down(worker, reason, now)

    def due(self, now: float) -> list[Worker]:
        return [
            w
            for w in self.pool.workers.values()
            if w.next_probe_at <= now and w not in self._probing
        ]

    async def run(self) -> None:
        while True:
            for worker in self.due(time.monotonic()):
                self._probing.add(worker)
                task = asyncio.get_running_loop().create_task(self._guarded(worker))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
            await asyncio.sleep(TICK_S)

    async def _guarded(self, worker: Worker) -> None:
        try:
            await self.check(worker)
        except Exception:
            logger.exception("health probe of %s failed unexpectedly", worker.url)
            worker.next_probe_at = time.monotonic() + self.config.interval
        finally:
            self._probing.discard(worker)
