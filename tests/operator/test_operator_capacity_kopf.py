"""The scheduling grace end to end on the emulator: a pod no node fits is Progressing
(WaitingForCapacity) with no Warning Event, and the operator comes back by itself when the
grace ends (nothing else changes: the resync here is 300 s away) to make it Degraded
(Unschedulable) with a Warning Event."""

from __future__ import annotations

from datetime import datetime, timezone

from kopf_testkit import (
    DEPLOYMENT,
    WAIT_S,
    condition,
    create,
    events,
    get,
    report_rollout,
    run_pod,
    status,
)
from operator_cluster import wait_for

GRACE_S = 6.0
OPERATOR_ENV = {"SLUICE_RESYNC_SECONDS": "300", "SLUICE_SCHEDULING_GRACE_SECONDS": str(GRACE_S)}
SCHEDULER = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."


def test_an_unschedulable_pod_waits_for_capacity_then_is_degraded(cluster, ns):
    create(cluster, ns, "chat")
    wait_for(lambda: get(cluster, DEPLOYMENT, ns, "chat"), what="the Deployment")
    since = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    run_pod(cluster, ns, "chat", {"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": SCHEDULER, "lastTransitionTime": since},
    ]})  # fmt: skip
    report_rollout(cluster, ns, "chat", ready=0, conditions=[
        {"type": "Progressing", "status": "True", "reason": "ReplicaSetUpdated"},
        {"type": "Available", "status": "False", "reason": "MinimumReplicasUnavailable"},
    ])  # fmt: skip

    waiting = wait_for(
        lambda: (
            (p := condition(cluster, ns, "chat", "Progressing")).get("reason")
            == "WaitingForCapacity"
            and p
        ),
        what="Progressing: WaitingForCapacity",
    )
    assert SCHEDULER in waiting["message"]
    # no Warning while still in the grace (events read before the status: the operator
    # posts its Events after writing the status)
    warned = events(cluster, ns, "Unschedulable")
    seen = status(cluster, ns, "chat")
    if seen["phase"] != "Degraded":
        assert seen["phase"] == "Progressing"
        assert warned == []

    degraded = wait_for(
        lambda: (d := condition(cluster, ns, "chat", "Degraded")).get("status") == "True" and d,
        timeout=GRACE_S + WAIT_S,
        what="Degraded after the grace",
    )
    assert degraded["reason"] == "Unschedulable"
    assert SCHEDULER in degraded["message"]
    assert status(cluster, ns, "chat")["phase"] == "Degraded"
    event = wait_for(lambda: events(cluster, ns, "Unschedulable"), what="a Warning event")[0]
    assert event["type"] == "Warning"
    assert events(cluster, ns, "WaitingForCapacity") == []
