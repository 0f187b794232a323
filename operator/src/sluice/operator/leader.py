"""Leader election on a coordination.k8s.io/v1 Lease, with a fence on every write.

Several operator replicas may run (a hot standby); one holds the Lease and reconciles. The
algorithm is client-go's (controller-runtime's leader election):

- A candidate reads the Lease every `retry_period`. It takes it when there is none, when
  it is already the holder, or when the holder's record has not changed for
  `lease_duration` by the candidate's own clock (clocks of two machines are never
  compared: the remote renewTime is not trusted, only the moment a change was observed).
  The write carries the Lease's resourceVersion, so two candidates cannot both win.
- The holder renews every `retry_period`. If it has not renewed for `renew_deadline`
  (< lease_duration), it stops leading.
- **The fence**: before each write to the API server (KubeApi calls `check`), the holder
  verifies that its last renewal is younger than `renew_deadline`. A replica that was
  paused (SIGSTOP, a stalled node, a long GC) wakes up with an old renewal and cannot
  write a single object before it has renewed — which it cannot, once another replica
  took the Lease. Without the fence, its queued reconciles would write until its
  election loop next ran.
- A holder that stops (SIGTERM) releases the Lease (empties holderIdentity), so a
  standby takes over at its next retry instead of after `lease_duration`.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from .kube import LEASES, ApiError, KubeApi
from .settings import LeaseTiming

logger = logging.getLogger("sluice.operator")


class NotLeader(Exception):
    """A write was fenced off: this replica does not hold a fresh Lease."""


def _micro_time() -> str:
    """The Lease's MicroTime format."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElection:
    def __init__(
        self,
        api: KubeApi,
        *,
        namespace: str,
        name: str,
        identity: str,
        timing: LeaseTiming | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self.namespace, self.name, self.identity = namespace, name, identity
        self.timing = timing or LeaseTiming()
        self._now = now
        self._renewed_at: float | None = None  # start of our last successful write
        # the Lease's (holder, renewTime) as last seen, and when this replica first saw it
        self._observed: tuple[tuple[str, str], float] | None = None
        self.leading = asyncio.Event()

    # -- the fence
    def fresh(self) -> bool:
        return (
            self._renewed_at is not None
            and self._now() - self._renewed_at < self.timing.renew_deadline
        )

    def check(self) -> None:
        """Raise NotLeader unless this replica may write now (KubeApi's write fence)."""
        if not self.fresh():
            raise NotLeader(
                f"not the leader ({self.namespace}/{self.name} held by"
                f" {self.holder or 'nobody'}): write refused"
            )

    @property
    def holder(self) -> str:
        return self._observed[0][0] if self._observed else ""

    # -- the loop
    async def run(
        self,
        started_leading: Callable[[], None],
        stopped_leading: Callable[[], Awaitable[None]],
    ) -> None:
        """Campaign, lead while the Lease is renewed, and campaign again after losing it;
        until cancelled (then the Lease is released if held)."""
        try:
            while True:
                renewed = await self._try_acquire_or_renew()
                if renewed and not self.leading.is_set():
                    logger.info(f"Became the leader ({self.namespace}/{self.name}).")
                    self.leading.set()
                    started_leading()
                if self.leading.is_set() and not self.fresh():
                    await self._stop(stopped_leading, "the Lease was not renewed in time")
                await asyncio.sleep(self.timing.retry_period)
        finally:
            if self.leading.is_set():
                self.leading.clear()
                self._renewed_at = None
                await asyncio.shield(self._release())

    async def _stop(self, stopped_leading: Callable[[], Awaitable[None]], why: str) -> None:
        logger.warning(f"Stopped leading ({self.namespace}/{self.name}): {why}.")
        self.leading.clear()
        self._renewed_at = None
        await stopped_leading()

    async def _try_acquire_or_renew(self) -> bool:
        started = self._now()
        try:
            lease = await self._api.get(LEASES, self.namespace, self.name)
            if lease is None:
                await self._api.create_lease(self.namespace, self._lease_body(None))
                self._won(started)
                return True
            spec = lease.get("spec") or {}
            holder = str(spec.get("holderIdentity") or "")
            record = (holder, str(spec.get("renewTime") or ""))
            if self._observed is None or self._observed[0] != record:
                self._observed = (record, started)
            expired = started - self._observed[1] >= self.timing.lease_duration
            if holder and holder != self.identity and not expired:
                return False
            await self._api.update_lease(self.namespace, self.name, self._lease_body(lease))
        except ApiError as error:
            if error.status != 409:  # a lost race is the normal case; anything else is news
                logger.warning(f"Leader election ({self.namespace}/{self.name}): {error}")
            return False
        self._won(started)
        return True

    def _won(self, started: float) -> None:
        self._renewed_at = started
        self._observed = ((self.identity, ""), started)

    def _lease_body(self, current: dict[str, Any] | None) -> dict[str, Any]:
        spec = dict((current or {}).get("spec") or {})
        now = _micro_time()
        if spec.get("holderIdentity") != self.identity:
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (
                1 if current is not None else 0
            )
        spec.update(
            holderIdentity=self.identity,
            leaseDurationSeconds=max(1, round(self.timing.lease_duration)),
            renewTime=now,
        )
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if current is not None:
            metadata["resourceVersion"] = current["metadata"]["resourceVersion"]
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }

    async def _release(self) -> None:
        """Give the Lease up on a clean stop so a standby need not wait for it to expire."""
        try:
            lease = await self._api.get(LEASES, self.namespace, self.name)
            if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            body = self._lease_body(lease)
            body["spec"]["holderIdentity"] = ""
            body["spec"]["leaseDurationSeconds"] = 1
            await self._api.update_lease(self.namespace, self.name, body)
            logger.info(f"Released the Lease {self.namespace}/{self.name}.")
        except ApiError as error:
            logger.warning(f"Could not release the Lease {self.namespace}/{self.name}: {error}")
