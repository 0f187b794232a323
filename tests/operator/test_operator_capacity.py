"""A pod no node fits yet, while a cluster autoscaler may be adding one: Progressing
(WaitingForCapacity) within the scheduling grace, with no Warning Event; Degraded
(Unschedulable) past it. Pod statuses are shaped as the scheduler writes them: a
PodScheduled=False condition with reason Unschedulable and a lastTransitionTime."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.operator.pods import Grace, capacity_waits, parse_time
from sluice.operator.status import (
    Event,
    Observed,
    capacity_recheck,
    compute_status,
    transition_events,
)

GRACE = 600.0
SINCE = "2026-01-01T00:00:00Z"  # the scheduler marked the pod Unschedulable
SCHEDULER = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
TEMPLATE = {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "runtime"}]}}


def deployment(desired: int, available: int) -> dict[str, Any]:
    return {
        "metadata": {"generation": 1, "uid": "dep-uid"},
        "spec": {"replicas": desired, "template": TEMPLATE},
        "status": {
            "observedGeneration": 1,
            "replicas": desired,
            "updatedReplicas": desired,
            "readyReplicas": available,
            "availableReplicas": available,
        },
    }


def replica_set(available: int) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "chat-abc",
            "ownerReferences": [{"uid": "dep-uid", "controller": True}],
        },
        "spec": {"template": TEMPLATE},
        "status": {"availableReplicas": available},
    }


def pending(name: str, since: str | None = SINCE, message: str = SCHEDULER) -> dict[str, Any]:
    scheduled = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                 "message": message}  # fmt: skip
    if since is not None:
        scheduled["lastTransitionTime"] = since
    return {"metadata": {"name": name}, "status": {"phase": "Pending", "conditions": [scheduled]}}


RUNNING = {
    "metadata": {"name": "chat-abc-0"},
    "status": {
        "phase": "Running",
        "conditions": [{"type": "PodScheduled", "status": "True"}],
        "containerStatuses": [
            {"name": "runtime", "ready": True, "restartCount": 0, "state": {"running": {}}}
        ],
    },
}


def observed(pods: tuple, desired: int = 1, available: int = 0, **more: Any) -> Observed:
    return Observed(
        name="chat",
        namespace="ml",
        generation=4,
        deployment=deployment(desired, available),
        replica_set=replica_set(available),
        pods=pods,
        default_replicas=desired,
        **more,
    )


def status_at(now: str, obs: Observed, previous: dict | None = None, grace: float = GRACE) -> dict:
    return compute_status(
        obs, previous=previous or {}, now=now, cluster_domain="cluster.local",
        scheduling_grace_seconds=grace,
    )  # fmt: skip


def summary(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def message(status: dict[str, Any], type_: str) -> str:
    return next(c["message"] for c in status["conditions"] if c["type"] == type_)


def test_within_the_grace_a_new_service_waits_for_capacity_not_degraded():
    status = status_at("2026-01-01T00:05:00Z", observed((pending("chat-abc-1"),)))

    assert status["phase"] == "Progressing"
    assert summary(status)["Progressing"] == ("True", "WaitingForCapacity")
    assert summary(status)["Degraded"] == ("False", "AsExpected")
    assert summary(status)["Ready"] == ("False", "WaitingForCapacity")
    assert SCHEDULER in message(status, "Progressing")  # the scheduler's words
    assert "chat-abc-1" in message(status, "Progressing")
    assert "2026-01-01T00:10:00Z" in message(status, "Progressing")  # when the grace ends
    assert transition_events({}, status) == []


def test_past_the_grace_it_is_degraded_unschedulable_with_a_warning():
    waiting = status_at("2026-01-01T00:09:59Z", observed((pending("chat-abc-1"),)))
    stuck = status_at("2026-01-01T00:10:00Z", observed((pending("chat-abc-1"),)), waiting)

    assert stuck["phase"] == "Degraded"
    assert summary(stuck)["Degraded"] == ("True", "Unschedulable")
    assert summary(stuck)["Ready"] == ("False", "Unschedulable")
    assert summary(stuck)["Progressing"] == ("True", "ReplicasStarting")
    assert SCHEDULER in message(stuck, "Degraded")
    assert transition_events(waiting, stuck) == [
        Event("Warning", "Unschedulable", message(stuck, "Degraded"))
    ]


def test_an_autoscaled_scale_up_onto_a_new_node_never_leaves_ready():
    """Two replicas serve; the HPA asks for a third, which waits for a node, then lands."""
    serving = status_at(
        "2026-01-01T00:00:00Z", observed((RUNNING,), desired=2, available=2), grace=GRACE
    )
    obs = observed(
        (RUNNING, pending("chat-abc-2")), desired=3, available=2, autoscaling=True, min_replicas=2
    )
    scaling = status_at("2026-01-01T00:03:00Z", obs, serving)
    obs_landed = observed((RUNNING, RUNNING), desired=3, available=3, autoscaling=True)
    landed = status_at("2026-01-01T00:04:00Z", obs_landed, scaling)

    assert [s["phase"] for s in (serving, scaling, landed)] == ["Ready"] * 3
    assert summary(scaling)["Progressing"] == ("True", "WaitingForCapacity")
    assert summary(scaling)["Degraded"] == ("False", "AsExpected")
    assert "1 of 2 pods waiting" in message(scaling, "Progressing")
    assert transition_events(serving, scaling) == []
    assert transition_events(scaling, landed) == []


def test_the_waiting_message_is_stable_so_a_resync_writes_nothing():
    obs = observed((pending("chat-abc-1"),))
    first = status_at("2026-01-01T00:01:00Z", obs)
    later = status_at("2026-01-01T00:02:00Z", obs, first)

    assert later["conditions"] == first["conditions"]


@pytest.mark.parametrize(
    ("case", "the_pod", "grace"),
    [
        ("grace 0", pending("chat-abc-1"), 0.0),
        ("no transition time", pending("chat-abc-1", since=None), GRACE),
    ],
)
def test_without_a_grace_an_unschedulable_pod_is_degraded_at_once(case, the_pod, grace):
    status = status_at("2026-01-01T00:00:01Z", observed((the_pod,)), grace=grace)

    assert summary(status)["Degraded"] == ("True", "Unschedulable"), case
    assert status["phase"] == "Degraded"


def test_a_worse_problem_on_another_pod_is_still_degraded():
    crashing = {
        "metadata": {"name": "chat-abc-0"},
        "status": {"phase": "Running", "containerStatuses": [{
            "name": "runtime", "ready": False, "restartCount": 4,
            "state": {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off"}},
        }]},
    }  # fmt: skip
    status = status_at("2026-01-01T00:01:00Z", observed((crashing, pending("chat-abc-1")), 2))

    assert summary(status)["Degraded"] == ("True", "CrashLoopBackOff")
    assert status["phase"] == "Degraded"


def test_the_recheck_is_due_when_the_first_grace_ends():
    obs = observed((pending("chat-abc-1", "2026-01-01T00:02:00Z"), pending("chat-abc-2", SINCE)), 2)

    assert capacity_recheck(obs, now="2026-01-01T00:04:00Z", grace_seconds=GRACE) == 360
    assert capacity_recheck(obs, now="2026-01-01T00:11:00Z", grace_seconds=GRACE) == 60
    assert capacity_recheck(obs, now="2026-01-01T00:12:00Z", grace_seconds=GRACE) is None
    assert capacity_recheck(obs, now="2026-01-01T00:04:00Z", grace_seconds=0) is None
    assert capacity_recheck(observed((RUNNING,)), now=SINCE, grace_seconds=GRACE) is None


def test_waits_read_rfc3339_times_with_offsets():
    now = parse_time("2026-01-01T01:05:00+01:00")
    assert now is not None
    waits = capacity_waits([pending("p", "2026-01-01T00:00:00Z")], Grace(now, GRACE))

    assert [(w.pod, w.seconds_left, w.until) for w in waits] == [
        ("p", 300.0, "2026-01-01T00:10:00Z")
    ]
    assert parse_time("not a time") is None
