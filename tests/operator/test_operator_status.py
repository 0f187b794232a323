"""Status from the Deployment: phase, conditions with reasons, counts, transition times."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.operator.status import Observed, compute_status, status_changed

NOW = "2026-01-01T00:00:10Z"
EARLIER = "2026-01-01T00:00:00Z"


def deployment(desired: int = 2, generation: int = 1, **status: Any) -> dict[str, Any]:
    return {"metadata": {"generation": generation}, "spec": {"replicas": desired}, "status": status}


def cond(type_: str, status: str, reason: str, message: str = "") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def status_of(
    dep: dict[str, Any] | None, *, previous: dict[str, Any] | None = None, error: str | None = None
) -> dict[str, Any]:
    observed = Observed(
        name="chat",
        namespace="ml",
        generation=4,
        deployment=dep,
        default_replicas=2,
        served_model_name="m",
        failure_reason=error and "InvalidSpec",
        failure_message=error or "",
    )
    return compute_status(
        observed, previous=previous or {}, now=NOW, cluster_domain="cluster.local"
    )


def summary(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


ROLLING = dict(
    observedGeneration=1,
    replicas=2,
    updatedReplicas=2,
    readyReplicas=0,
    availableReplicas=0,
    conditions=[
        cond("Progressing", "True", "ReplicaSetUpdated"),
        cond("Available", "False", "MinimumReplicasUnavailable"),
    ],
)
READY = dict(
    observedGeneration=1,
    replicas=2,
    updatedReplicas=2,
    readyReplicas=2,
    availableReplicas=2,
    conditions=[
        cond("Progressing", "True", "NewReplicaSetAvailable"),
        cond("Available", "True", "MinimumReplicasAvailable"),
    ],
)


@pytest.mark.parametrize(
    ("dep", "phase", "conditions"),
    [
        (
            None,
            "Pending",
            {
                "Ready": ("False", "DeploymentNotFound"),
                "Available": ("False", "DeploymentNotFound"),
                "Progressing": ("False", "DeploymentNotFound"),
                "Degraded": ("False", "AsExpected"),
            },
        ),
        (
            deployment(),
            "Pending",
            {
                "Ready": ("False", "DeploymentCreated"),
                "Available": ("False", "NoReplicasReady"),
                "Progressing": ("True", "DeploymentCreated"),
                "Degraded": ("False", "AsExpected"),
            },
        ),
        (
            deployment(**ROLLING),
            "Progressing",
            {
                "Ready": ("False", "ReplicaSetUpdated"),
                "Available": ("False", "NoReplicasReady"),
                "Progressing": ("True", "ReplicaSetUpdated"),
                "Degraded": ("False", "AsExpected"),
            },
        ),
        (
            deployment(**READY),
            "Ready",
            {
                "Ready": ("True", "AllReplicasReady"),
                "Available": ("True", "ReplicasReady"),
                "Progressing": ("False", "RolloutComplete"),
                "Degraded": ("False", "AsExpected"),
            },
        ),
        (
            deployment(**{**READY, "readyReplicas": 1, "availableReplicas": 1}),
            "Progressing",
            {
                "Ready": ("False", "NewReplicaSetAvailable"),
                "Available": ("True", "ReplicasReady"),
                "Progressing": ("True", "NewReplicaSetAvailable"),
                "Degraded": ("False", "AsExpected"),
            },
        ),
        (
            deployment(
                **{
                    **ROLLING,
                    "conditions": [
                        cond("Progressing", "False", "ProgressDeadlineExceeded", "timed out")
                    ],
                }
            ),
            "Degraded",
            {
                "Ready": ("False", "ProgressDeadlineExceeded"),
                "Available": ("False", "NoReplicasReady"),
                "Progressing": ("False", "ProgressDeadlineExceeded"),
                "Degraded": ("True", "ProgressDeadlineExceeded"),
            },
        ),
        (
            deployment(
                **{
                    **ROLLING,
                    "conditions": [
                        cond("ReplicaFailure", "True", "FailedCreate", "quota exceeded")
                    ],
                }
            ),
            "Degraded",
            {
                "Ready": ("False", "FailedCreate"),
                "Available": ("False", "NoReplicasReady"),
                "Progressing": ("True", "FailedCreate"),
                "Degraded": ("True", "FailedCreate"),
            },
        ),
        (
            deployment(desired=0, observedGeneration=1),
            "Pending",
            {
                "Ready": ("False", "ScaledToZero"),
                "Available": ("False", "ScaledToZero"),
                "Progressing": ("False", "ScaledToZero"),
                "Degraded": ("False", "AsExpected"),
            },
        ),
        (
            deployment(generation=2, **READY),
            "Progressing",
            {
                "Ready": ("False", "NewReplicaSetAvailable"),
                "Available": ("True", "ReplicasReady"),
                "Progressing": ("True", "NewReplicaSetAvailable"),
                "Degraded": ("False", "AsExpected"),
            },
        ),
    ],
    ids=[
        "no-deployment",
        "just-created",
        "loading",
        "ready",
        "half-ready",
        "deadline",
        "replica-failure",
        "scaled-to-zero",
        "new-generation-unobserved",
    ],
)
def test_phase_and_conditions_follow_the_deployment(dep, phase, conditions):
    status = status_of(dep)

    assert status["phase"] == phase
    assert summary(status) == conditions


def test_ready_status_reports_counts_url_and_selector():
    assert {k: v for k, v in status_of(deployment(**READY)).items() if k != "conditions"} == {
        "phase": "Ready",
        "replicas": 2,
        "readyReplicas": 2,
        "desiredReplicas": 2,
        "url": "http://chat.ml.svc.cluster.local",
        "selector": "app.kubernetes.io/instance=chat,app.kubernetes.io/name=sluice-runtime",
        "servedModelName": "m",
        "observedGeneration": 4,
    }


def test_losing_a_replica_after_the_rollout_is_degraded():
    dep = deployment(**{**READY, "readyReplicas": 1, "availableReplicas": 2})
    status = status_of(dep)
    assert status["phase"] == "Degraded"
    assert summary(status)["Degraded"] == ("True", "ReplicasUnavailable")


def test_invalid_spec_fails_and_says_why():
    status = status_of(deployment(**READY), error="spec.replicas: must be >= 0, got -1")

    assert status["phase"] == "Failed"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "InvalidSpec",
        "spec.replicas: must be >= 0, got -1",
    )
    assert summary(status)["Available"] == ("True", "ReplicasReady")  # the old version still serves


def test_transition_time_is_kept_while_a_condition_holds():
    first = compute_status(
        Observed("chat", "ml", 1, deployment(**ROLLING)),
        previous={},
        now=EARLIER,
        cluster_domain="cluster.local",
    )
    second = compute_status(
        Observed("chat", "ml", 1, deployment(**READY)),
        previous=first,
        now=NOW,
        cluster_domain="cluster.local",
    )
    times = {c["type"]: c["lastTransitionTime"] for c in second["conditions"]}

    assert times == {"Ready": NOW, "Available": NOW, "Progressing": NOW, "Degraded": EARLIER}


def test_unchanged_status_is_not_rewritten():
    status = status_of(deployment(**READY))
    again = compute_status(
        Observed("chat", "ml", 4, deployment(**READY), default_replicas=2, served_model_name="m"),
        previous=status,
        now="2027-01-01T00:00:00Z",
        cluster_domain="cluster.local",
    )
    assert not status_changed(status, again)
    assert status_changed(status, status_of(deployment(**ROLLING), previous=status))
