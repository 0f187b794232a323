"""Leader election's decisions (leader.py) on one shared Lease, with a clock the test moves.

The store below keeps the two API server behaviours the algorithm leans on: a create of an
existing Lease and a replace carrying an old resourceVersion both answer 409. The real API
server is the oracle in tests/cluster/test_cluster_operator_ha.py; these cover the timing
rules, which that tier cannot step through."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest

from sluice.operator.kube import ApiError
from sluice.operator.leader import LeaderElection, NotLeader
from sluice.operator.settings import LeaseTiming

TIMING = LeaseTiming(lease_duration=15, renew_deadline=10, retry_period=2)


class LeaseStore:
    def __init__(self) -> None:
        self.lease: dict[str, Any] | None = None
        self.version = 0

    async def get(self, resource, namespace, name):
        return copy.deepcopy(self.lease)

    async def create_lease(self, namespace, lease):
        if self.lease is not None:
            raise ApiError(409, "AlreadyExists", "leases already exists")
        self._store(lease)

    async def update_lease(self, namespace, name, lease):
        if lease["metadata"]["resourceVersion"] != self.lease["metadata"]["resourceVersion"]:
            raise ApiError(409, "Conflict", "the object has been modified")
        self._store(lease)

    def _store(self, lease):
        self.version += 1
        self.lease = copy.deepcopy(lease)
        self.lease["metadata"]["resourceVersion"] = str(self.version)

    @property
    def holder(self) -> str:
        return (self.lease or {}).get("spec", {}).get("holderIdentity", "")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def candidate(store: LeaseStore, clock: Clock, identity: str) -> LeaderElection:
    return LeaderElection(
        store, namespace="ops", name="sluice", identity=identity, timing=TIMING, now=clock
    )  # type: ignore[arg-type]


def run(coro):
    return asyncio.run(coro)


def test_a_lone_candidate_takes_the_lease_and_may_write():
    store, clock = LeaseStore(), Clock()
    a = candidate(store, clock, "a")
    with pytest.raises(NotLeader):
        a.check()
    assert run(a._try_acquire_or_renew())
    assert store.holder == "a" and store.lease["spec"]["leaseDurationSeconds"] == 15
    a.check()


def test_a_standby_waits_while_the_holder_renews_and_takes_over_when_it_stops():
    store, clock = LeaseStore(), Clock()
    a, b = candidate(store, clock, "a"), candidate(store, clock, "b")
    assert run(a._try_acquire_or_renew())
    for _ in range(20):  # 40 s of a renewing holder: b never takes it
        clock.t += 2
        assert run(a._try_acquire_or_renew())
        assert not run(b._try_acquire_or_renew())
    assert store.holder == "a"
    # a stops renewing: b takes over once the record is unchanged for lease_duration
    # by b's own clock
    clock.t += 14
    assert not run(b._try_acquire_or_renew())
    clock.t += 2
    assert run(b._try_acquire_or_renew())
    assert store.holder == "b" and store.lease["spec"]["leaseTransitions"] == 1
    b.check()


def test_a_paused_leader_is_fenced_before_anyone_else_can_lead():
    store, clock = LeaseStore(), Clock()
    a, b = candidate(store, clock, "a"), candidate(store, clock, "b")
    assert run(a._try_acquire_or_renew())
    assert not run(b._try_acquire_or_renew())
    clock.t += TIMING.renew_deadline  # a is paused: no renewal
    with pytest.raises(NotLeader):
        a.check()  # a write a woken replica would send is refused
    assert not run(b._try_acquire_or_renew())  # ... while b cannot lead yet either
    clock.t += TIMING.lease_duration - TIMING.renew_deadline
    assert run(b._try_acquire_or_renew())
    assert not run(a._try_acquire_or_renew())  # a wakes up: the Lease is b's
    with pytest.raises(NotLeader):
        a.check()


def test_two_candidates_racing_for_a_free_lease_cannot_both_win():
    store, clock = LeaseStore(), Clock()
    a, b = candidate(store, clock, "a"), candidate(store, clock, "b")

    async def race():
        return await asyncio.gather(a._try_acquire_or_renew(), b._try_acquire_or_renew())

    assert sorted(run(race())) == [False, True]


def test_a_leader_that_stops_releases_the_lease_for_an_immediate_takeover():
    store, clock = LeaseStore(), Clock()
    a, b = candidate(store, clock, "a"), candidate(store, clock, "b")
    started: list[str] = []

    async def lead_then_stop():
        task = asyncio.create_task(a.run(lambda: started.append("a"), _noop))
        while not a.leading.is_set():
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    run(lead_then_stop())
    assert started == ["a"] and store.holder == ""
    assert not a.leading.is_set()
    assert run(b._try_acquire_or_renew())  # no wait for the lease to expire


async def _noop() -> None:
    return None
