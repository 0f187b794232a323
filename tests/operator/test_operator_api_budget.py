"""The operator's API budget, counted request by request on the emulator (the figures are
in operator/README.md; run with `-s` to print them).

- a status-only child event (the HPA writing its metrics) costs nothing: no write, no read;
- a Deployment status event costs the one status write it causes, and no read;
- 50 autoscaled services whose HPAs keep writing metrics cost well under 0.1 requests/s
  each (the resync, once per SLUICE_RESYNC_SECONDS, is the only steady cost).

The operator here resyncs every 300 s (the default), so every request in a window is
caused by the events of that window, once the events before it are settled (`settled`)."""

from __future__ import annotations

import sys
import time

import pytest
from kopf_testkit import (
    DEPLOYMENT,
    HANDOVER,
    HPA,
    HPA_MANAGER,
    OPERATOR_AGENTS,
    WAIT_S,
    condition,
    create,
    events,
    get,
    replicas_owners,
    report_replicas,
    status,
)
from operator_cluster import wait_for

OPERATOR_ENV = {"SLUICE_RESYNC_SECONDS": "300"}
AUTOSCALED = {"enabled": True, "minReplicas": 1, "maxReplicas": 6}


def operator_calls(cluster, since: int) -> list[dict]:
    """The operator's requests after the `since`-th one, its watch streams left out."""
    return [
        r for r in cluster.requests()[since:]
        if r["user_agent"].startswith(OPERATOR_AGENTS) and r["params"].get("watch") != "true"
    ]  # fmt: skip


def summary(calls: list[dict]) -> dict[str, int]:
    reads = sum(1 for r in calls if r["method"] == "GET")
    status_writes = sum(1 for r in calls if r["path"].endswith("/status"))
    events = sum(1 for r in calls if r["method"] == "POST" and r["path"].endswith("/events"))
    return {
        "requests": len(calls),
        "reads": reads,
        "child writes": len(calls) - reads - status_writes - events,
        "status writes": status_writes,
        "events": events,
    }


def report(what: str, figures: dict[str, object]) -> None:
    """Print the figures (to the real stdout: the Kopf runner swaps sys.stdout)."""
    line = f"API budget: {what}: " + ", ".join(f"{k} {v}" for k, v in figures.items())
    print("\n" + line, file=sys.__stdout__, flush=True)


def hpa_metrics(cluster, ns: str, name: str, value: int, *, able: bool = True) -> None:
    """Act as the HPA controller writing its status (every 15 s on a real cluster)."""
    conditions = [
        {"type": "AbleToScale", "status": "True" if able else "False",
         "reason": "ReadyForNewScale" if able else "FailedGetScale",
         "message": "recommended size matches current size" if able else "scale denied",
         "lastTransitionTime": "2026-01-01T00:00:00Z"},
        {"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound",
         "message": "the HPA was able to compute the replica count",
         "lastTransitionTime": "2026-01-01T00:00:00Z"},
    ]  # fmt: skip
    cluster.patch(
        *HPA,
        ns,
        name,
        {
            "status": {
                "currentReplicas": 1,
                "desiredReplicas": 1,
                "currentMetrics": [
                    {
                        "type": "Pods",
                        "pods": {
                            "metric": {"name": "sluice_queue_requests"},
                            "current": {"averageValue": str(value)},
                        },
                    }
                ],
                "conditions": conditions,
            }
        },
        subresource="status",
        field_manager=HPA_MANAGER,
    )


def serving(cluster, ns: str, name: str) -> None:
    """Create an autoscaled service and bring it to Ready, as the cluster's controllers."""
    create(cluster, ns, name, autoscaling=AUTOSCALED)
    wait_for(lambda: get(cluster, HPA, ns, name), what=f"the HPA of {name}")
    report_replicas(cluster, ns, name, replicas=1, available=1)
    hpa_metrics(cluster, ns, name, 0)
    handed_over(cluster, ns, name)


def handed_over(cluster, ns: str, name: str, timeout: float = WAIT_S) -> None:
    """The last child writes for a new autoscaled service are the hand-over of
    spec.replicas (replicas.py), in the first reconcile after the one that created the
    Deployment: once the hand-over manager alone owns the field, a reconcile of the same
    spec applies nothing."""
    wait_for(lambda: replicas_owners(get(cluster, DEPLOYMENT, ns, name) or {"metadata": {}})
             == {HANDOVER}, timeout=timeout, what=f"the hand-over of {name}'s replicas")  # fmt: skip


def settled(
    cluster, ns: str, name: str, conditions: dict[str, tuple[str, str]], *,
    counts: dict[str, int] | None = None, events_of: tuple[str, ...] = (),
    timeout: float = WAIT_S,
) -> None:  # fmt: skip
    """The barrier before a window: the status shows the outcome of every write so far,
    each condition's (status, reason) and the `counts` (readyReplicas...), and the Events
    of the `events_of` reasons are posted (after the status write that turned them, in the
    same reconcile). That outcome is the operator's fixpoint for those writes: a reconcile
    still queued, or one that a late watch event starts, writes and posts nothing.

    One condition is not enough: the operator watches Deployments, ReplicaSets and HPAs
    on separate streams, so it may see an HPA problem before the rollout that came first,
    show the problem, and report the rollout (Ready, its Event) inside the window."""

    def outcome() -> bool:
        now = status(cluster, ns, name)
        shown = {c["type"]: (c["status"], c["reason"]) for c in now.get("conditions", [])}
        return all(shown.get(k) == v for k, v in conditions.items()) and all(
            now.get(k) == v for k, v in (counts or {}).items()
        )

    wait_for(outcome, timeout=timeout, what=f"{name}'s status to show {conditions} {counts}")
    for reason in events_of:
        wait_for(lambda r=reason: any(e["involvedObject"]["name"] == name
                                      for e in events(cluster, ns, r)),
                 timeout=timeout, what=f"the {reason} Event of {name}")  # fmt: skip


READY = {"Ready": ("True", "Serving"), "Available": ("True", "ReplicasAvailable"),
         "Progressing": ("False", "RolloutComplete")}  # fmt: skip
CANNOT_SCALE = ("True", "AutoscalerCannotScale")


def degraded_barrier(cluster, ns: str, name: str) -> None:
    """The HPA reports a problem to a serving service: settled once the status shows the
    rollout and the problem, and both Events (Ready, the problem) are posted."""
    hpa_metrics(cluster, ns, name, 0, able=False)
    settled(cluster, ns, name, {**READY, "Degraded": CANNOT_SCALE},
            counts={"readyReplicas": 1, "replicas": 1},
            events_of=("Ready", "AutoscalerCannotScale"))  # fmt: skip


def test_status_only_hpa_writes_cost_no_request(cluster, ns):
    serving(cluster, ns, "chat")
    degraded_barrier(cluster, ns, "chat")
    mark = len(cluster.requests())

    for value in range(1, 6):  # five status-only writes: the metric moves
        hpa_metrics(cluster, ns, "chat", value, able=False)
    hpa_metrics(cluster, ns, "chat", 6)  # then one the status shows: the problem is gone
    wait_for(lambda: condition(cluster, ns, "chat", "Degraded").get("status") == "False",
             what="the HPA problem gone from the status")  # fmt: skip

    figures = summary(operator_calls(cluster, mark))
    report("five status-only HPA writes, then one that clears an HPA problem", figures)
    # all of it is the last one's: one status write
    assert figures == {"requests": 1, "reads": 0, "child writes": 0, "status writes": 1,
                       "events": 0}  # fmt: skip


def test_a_deployment_status_event_costs_one_status_write(cluster, ns):
    serving(cluster, ns, "chat")
    cluster.patch(
        *DEPLOYMENT,
        ns,
        "chat",
        {"spec": {"replicas": 3}},
        subresource="scale",
        field_manager=HPA_MANAGER,
    )  # fmt: skip  the HPA scales up
    report_replicas(cluster, ns, "chat", replicas=3, available=2)
    settled(cluster, ns, "chat", {"Ready": ("True", "Serving"),
            "Available": ("True", "ReplicasAvailable"), "Degraded": ("False", "AsExpected"),
            "Progressing": ("True", "ReplicasStarting")},
            counts={"readyReplicas": 2, "replicas": 3}, events_of=("Ready",))  # fmt: skip
    mark = len(cluster.requests())

    # the Deployment controller counts the third pod ready
    cluster.patch(*DEPLOYMENT, ns, "chat", {"status": {"readyReplicas": 3}}, subresource="status")
    wait_for(lambda: status(cluster, ns, "chat").get("readyReplicas") == 3, what="3 ready")

    figures = summary(operator_calls(cluster, mark))
    report("a Deployment status event", figures)
    assert figures == {"requests": 1, "reads": 0, "child writes": 0, "status writes": 1,
                       "events": 0}  # fmt: skip


@pytest.mark.slow
def test_fifty_autoscaled_services_under_changing_metrics_stay_within_budget(cluster, ns):
    names = [f"svc-{i:02d}" for i in range(50)]
    for name in names:
        create(cluster, ns, name, autoscaling=AUTOSCALED)
    for name in names:
        wait_for(lambda n=name: status(cluster, ns, n).get("observedGeneration") == 1
                 and get(cluster, HPA, ns, n), timeout=3 * WAIT_S, what=f"{name} reconciled")  # fmt: skip
    last = names[-1]
    hpa_metrics(cluster, ns, last, 0, able=False)  # no pods yet: not Ready, the problem shown
    settled(cluster, ns, last, {"Ready": ("False", "AutoscalerCannotScale"),
            "Progressing": ("True", "DeploymentCreated"), "Degraded": CANNOT_SCALE},
            events_of=("AutoscalerCannotScale",), timeout=3 * WAIT_S)  # fmt: skip
    handed_over(cluster, ns, last, timeout=3 * WAIT_S)
    mark, started = len(cluster.requests()), time.monotonic()

    for value in range(1, 3):  # two rounds of metrics for every service
        for name in names:
            hpa_metrics(cluster, ns, name, value, able=name != last)
    hpa_metrics(cluster, ns, last, 9)
    wait_for(lambda: condition(cluster, ns, last, "Degraded").get("status") == "False",
             timeout=3 * WAIT_S, what="the last service's HPA problem gone")  # fmt: skip
    seconds = time.monotonic() - started

    figures = summary(operator_calls(cluster, mark))
    rate = figures["requests"] / len(names) / seconds
    report(
        f"50 services, 100 HPA metric writes in {seconds:.1f}s, then one that clears a problem",
        {**figures, "requests/s per service": f"{rate:.4f}"},
    )
    assert figures == {"requests": 1, "reads": 0, "child writes": 0, "status writes": 1,
                       "events": 0}  # fmt: skip
    assert rate <= 0.1
