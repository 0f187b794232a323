"""The controller: a work queue of InferenceService keys and the workers that reconcile them.

As in controller-runtime: every trigger only queues the key (namespace, name); a worker
runs the one `reconcile` for it (reconcile.py). A key is never reconciled by two workers
at once, and triggers that arrive meanwhile coalesce into one more run. After a success
the key is queued again after the resync period (with a little jitter, so a fleet does not
resync in lockstep); after a failure, after an exponential back-off (retry delay, doubled
per consecutive failure, capped). A deleted object leaves the queue.

Triggers (handlers.py): an InferenceService that is new or whose generation (its spec), or
its `sluice.dev/refresh-revision` annotation, differs from the one last reconciled, and any event of a child, ReplicaSet or pod that
names one as its owner and changes what a reconcile reads (cache.relevant_view).
Metadata and status changes of an InferenceService (our own status writes among them)
wait for the resync.

A reconcile reads the watch cache (cache.py), except a fresh one, which reads the API
server: the first of a key, a retry after a failure, and at least once per resync period
(the resync itself), so a missed watch event is healed within one resync.

With leader election (leader.py) every replica queues what it sees, but workers run only
while it leads: they start when it takes the Lease and are cancelled when it loses it (a
reconcile cut short is queued again; the fence has already refused its writes).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping
from typing import Any

from .kube import ApiError
from .leader import LeaderElection, NotLeader
from .reconcile import Context, StatusConflict, Wanted, reconcile, wanted
from .workqueue import Backoff, WorkQueue

logger = logging.getLogger("sluice.operator")
Key = tuple[str, str]
RESYNC_JITTER = 0.1


class Controller:
    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx
        settings = ctx.settings
        self.queue: WorkQueue[Key] = WorkQueue(
            Backoff(settings.retry_delay_seconds, settings.retry_max_delay_seconds)
        )
        self._workers: list[asyncio.Task[None]] = []
        self._election: LeaderElection | None = None
        self._campaign: asyncio.Task[None] | None = None
        self._converged: dict[Key, Wanted] = {}  # what the last reconcile converged
        self._fresh_at: dict[Key, float] = {}  # when a reconcile last read everything fresh

    @property
    def running(self) -> bool:
        return bool(self._workers) or self._campaign is not None

    def elect(self, election: LeaderElection) -> None:
        """Reconcile only while holding this election's Lease (call before `start`)."""
        self._election = election

    def start(self) -> None:
        if self._election is None:
            self._start_workers()
            return
        self._campaign = asyncio.get_running_loop().create_task(
            self._election.run(self._start_workers, self._stop_workers), name="leader-election"
        )

    async def stop(self) -> None:
        self.queue.close()
        await self._stop_workers()
        if self._campaign is not None:
            self._campaign.cancel()
            await asyncio.gather(self._campaign, return_exceptions=True)
            self._campaign = None

    def _start_workers(self) -> None:
        for index in range(self.ctx.settings.workers):
            task = asyncio.get_running_loop().create_task(self._work(), name=f"reconciler-{index}")
            self._workers.append(task)

    async def _stop_workers(self) -> None:
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers.clear()

    def enqueue(self, key: Key) -> None:
        self.queue.add(key)

    def on_inferenceservice_event(self, event_type: str | None, body: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        key = (meta.get("namespace", ""), meta.get("name", ""))
        if event_type == "DELETED":
            self._forget(key)
            return
        if event_type == "MODIFIED" and wanted(body) == self._converged.get(key):
            return  # metadata or status only (our own status writes): nothing to converge
        self.queue.add(key)

    async def _work(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                await self._run(key)
            except asyncio.CancelledError:
                self.queue.add(key)  # cut short (leadership lost, or stopping): not done
                raise
            finally:
                self.queue.done(key)

    def _fresh(self, key: Key) -> bool:
        """Read everything from the API server (not the watch cache): the first reconcile
        of a key, a retry after a failure, and at least once per resync period."""
        now = asyncio.get_running_loop().time()
        last = self._fresh_at.get(key)
        due = self.ctx.settings.resync_seconds * (1 - RESYNC_JITTER)
        if last is None or self.queue.failures(key) > 0 or now - last >= due:
            self._fresh_at[key] = now
            return True
        return False

    def _forget(self, key: Key) -> None:
        self.queue.discard(key)
        self._converged.pop(key, None)
        self._fresh_at.pop(key, None)

    async def _run(self, key: Key) -> None:
        where = f"{key[0]}/{key[1]}"
        try:
            outcome = await reconcile(
                key,
                self.ctx,
                seen=lambda generation: self._converged.__setitem__(key, generation),
                fresh=self._fresh(key),
            )
        except NotLeader as fenced:
            logger.warning(f"[{where}] {fenced}")
            self.queue.add_rate_limited(key)
            return
        except StatusConflict:
            logger.info(f"[{where}] changed while reconciling; again")
            self.queue.add_rate_limited(key)
            return
        except ApiError as error:
            if error.namespace_terminating:  # final: the service goes with its namespace
                logger.info(f"[{where}] its namespace is being deleted; dropped")
                self._forget(key)
                return
            delay = self.queue.add_rate_limited(key)
            logger.warning(f"[{where}] Kubernetes API: {error}; retrying in {delay:.1f}s")
            return
        except asyncio.CancelledError:
            raise
        except Exception:
            delay = self.queue.add_rate_limited(key)
            logger.exception(f"[{where}] reconcile failed; retrying in {delay:.1f}s")
            return
        if outcome.gone:
            self._forget(key)
        elif outcome.retry:
            delay = self.queue.add_rate_limited(key)
            logger.info(f"[{where}] not converged; retrying in {delay:.1f}s")
        else:
            self.queue.forget(key)
            resync = self.ctx.settings.resync_seconds
            self.queue.add_after(key, resync * random.uniform(1 - RESYNC_JITTER, 1))
            if outcome.recheck is not None:  # a pod's scheduling grace ends (the earlier wins)
                self.queue.add_after(key, outcome.recheck)
