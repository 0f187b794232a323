"""Status from the children: each condition, the phase derived from them, the Events of
their transitions. Pod statuses are shaped as the kubelet writes them."""

from __future__ import annotations

from typing import Any

import pytest

from sluice.operator.observe import current_replica_set
from sluice.operator.status import (
    Event,
    Failure,
    Observed,
    compute_status,
    status_changed,
    transition_events,
)

NOW = "2026-01-01T00:00:10Z"
EARLIER = "2026-01-01T00:00:00Z"
TEMPLATE = {"metadata": {"labels": {"app": "x"}}, "spec": {"containers": [{"name": "runtime"}]}}


def deployment(desired: int = 2, generation: int = 1, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"generation": generation, "uid": "dep-uid"},
        "spec": {"replicas": desired, "template": TEMPLATE},
        "status": status,
    }


def replica_set(available: int, template: dict | None = None, owner: str = "dep-uid") -> dict:
    tpl = {**(template or TEMPLATE)}
    tpl["metadata"] = {"labels": {**tpl["metadata"]["labels"], "pod-template-hash": "abc"}}
    return {
        "metadata": {
            "name": "chat-abc",
            "labels": {"pod-template-hash": "abc"},
            "ownerReferences": [{"uid": owner, "controller": True}],
        },
        "spec": {"template": tpl},
        "status": {"availableReplicas": available},
    }


def cond(type_: str, status: str, reason: str, message: str = "") -> dict[str, str]:
    return {"type": type_, "status": status, "reason": reason, "message": message}


def status_of(
    dep: dict[str, Any] | None,
    *,
    rs: dict | None = None,
    pods: tuple = (),
    hpa: dict | None = None,
    autoscaling: bool = False,
    min_replicas: int = 1,
    previous: dict[str, Any] | None = None,
    failure: Failure | None = None,
) -> dict[str, Any]:
    observed = Observed(
        name="chat",
        namespace="ml",
        generation=4,
        deployment=dep,
        replica_set=rs,
        pods=pods,
        hpa=hpa,
        autoscaling=autoscaling,
        min_replicas=min_replicas,
        default_replicas=2,
        served_model_name="m",
        image="img:1",
        failure=failure,
    )
    return compute_status(
        observed, previous=previous or {}, now=NOW, cluster_domain="cluster.local"
    )


def summary(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def message(status: dict[str, Any], type_: str) -> str:
    return next(c["message"] for c in status["conditions"] if c["type"] == type_)


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
                "Available": ("False", "NoReplicasAvailable"),
                "Progressing": ("True", "DeploymentCreated"),
                "Degraded": ("False", "AsExpected"),
            },
        ),
        (
            deployment(**ROLLING),
            "Progressing",
            {
                "Ready": ("False", "ReplicasStarting"),
                "Available": ("False", "NoReplicasAvailable"),
                "Progressing": ("True", "ReplicasStarting"),
                "Degraded": ("False", "AsExpected"),
            },
        ),
        (
            deployment(**READY),
            "Ready",
            {
                "Ready": ("True", "Serving"),
                "Available": ("True", "ReplicasAvailable"),
                "Progressing": ("False", "RolloutComplete"),
                "Degraded": ("False", "AsExpected"),
            },
        ),
        (
            deployment(**{**READY, "readyReplicas": 1, "availableReplicas": 1}),
            "Progressing",
            {
                "Ready": ("False", "ReplicasStarting"),
                "Available": ("True", "ReplicasAvailable"),
                "Progressing": ("True", "ReplicasStarting"),
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
                "Available": ("False", "NoReplicasAvailable"),
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
                "Available": ("False", "NoReplicasAvailable"),
                "Progressing": ("True", "ReplicasStarting"),
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
                "Ready": ("False", "DeploymentUpdated"),
                "Available": ("True", "ReplicasAvailable"),
                "Progressing": ("True", "DeploymentUpdated"),
                "Degraded": ("False", "AsExpected"),
            },
        ),
        (
            deployment(**{**READY, "replicas": 3, "updatedReplicas": 1, "availableReplicas": 3}),
            "Progressing",
            {
                "Ready": ("False", "RollingOut"),
                "Available": ("True", "ReplicasAvailable"),
                "Progressing": ("True", "RollingOut"),
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
        "rolling-out",
    ],
)
def test_phase_and_conditions_follow_the_deployment(dep, phase, conditions):
    status = status_of(dep)

    assert summary(status) == conditions
    assert status["phase"] == phase


def test_ready_status_reports_counts_url_selector_and_image():
    assert {k: v for k, v in status_of(deployment(**READY)).items() if k != "conditions"} == {
        "phase": "Ready",
        "replicas": 2,
        "readyReplicas": 2,
        "desiredReplicas": 2,
        "url": "http://chat.ml.svc.cluster.local",
        "selector": "app.kubernetes.io/instance=chat,app.kubernetes.io/name=sluice-runtime",
        "servedModelName": "m",
        "image": "img:1",
        "router": None,  # spec.router off: cleared
        "model": None,  # not an hf:// model: no pin
        "disaggregation": None,  # spec.disaggregation off: cleared
        "observedGeneration": 4,
    }


def test_an_autoscaler_scaling_up_does_not_make_a_serving_service_unready():
    # the HPA raised 2 → 4; two new pods are loading, the two old ones serve
    scaling = deployment(
        desired=4, **{**READY, "replicas": 4, "updatedReplicas": 4, "availableReplicas": 2}
    )
    status = status_of(scaling, rs=replica_set(available=2), autoscaling=True, min_replicas=2)

    assert summary(status)["Ready"] == ("True", "Serving")
    assert summary(status)["Progressing"] == ("True", "ReplicasStarting")
    assert status["phase"] == "Ready"
    assert message(status, "Ready") == (
        "2/4 replicas of the current version available (serving needs 2)"
    )


def test_ready_counts_only_pods_of_the_current_template():
    # a new template is rolling out: 2 old pods serve, the new ReplicaSet has none yet
    rolling = deployment(**{**READY, "replicas": 3, "updatedReplicas": 1, "availableReplicas": 2})
    status = status_of(rolling, rs=replica_set(available=0), autoscaling=True, min_replicas=1)
    assert summary(status)["Ready"] == ("False", "RollingOut")
    assert summary(status)["Available"] == ("True", "ReplicasAvailable")  # old pods serve

    done = status_of(rolling, rs=replica_set(available=1), autoscaling=True, min_replicas=1)
    assert summary(done)["Ready"] == ("True", "Serving")


def test_ready_waits_for_the_counts_written_beside_it():
    # the ReplicaSet already has its pods available; the Deployment's status has not caught
    # up: a Ready=True status would say readyReplicas 0
    lagging = deployment(**{**READY, "readyReplicas": 0, "availableReplicas": 0})
    status = status_of(lagging, rs=replica_set(available=2))
    assert summary(status)["Ready"] == ("False", "CountsPending")
    assert status["readyReplicas"] == 0
    caught_up = status_of(deployment(**READY), rs=replica_set(available=2))
    assert summary(caught_up)["Ready"] == ("True", "Serving") and caught_up["readyReplicas"] == 2


def test_the_current_replica_set_is_the_one_with_the_deployments_template():
    dep = deployment()
    current = replica_set(1)
    older = replica_set(1, template={**TEMPLATE, "spec": {"containers": [{"name": "old"}]}})
    foreign = replica_set(1, owner="other-uid")

    assert current_replica_set(dep, [older, foreign, current]) is current
    assert current_replica_set(dep, [older, foreign]) is None


def pod(name: str = "chat-abc-1", **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": name}, "status": {"phase": "Pending", **status}}


def waiting(reason: str, message: str = "", *, restarts: int = 0, last: dict | None = None) -> dict:
    container: dict[str, Any] = {
        "name": "runtime",
        "ready": False,
        "restartCount": restarts,
        "state": {"waiting": {"reason": reason, "message": message}},
    }
    if last:
        container["lastState"] = {"terminated": last}
    return container


CRASH_LOOP = pod(
    phase="Running",
    containerStatuses=[
        waiting(
            "CrashLoopBackOff",
            "back-off 5m0s restarting failed container=runtime",
            restarts=7,
            last={"exitCode": 1, "reason": "Error", "message": "scheduler process exited"},
        )
    ],
)
UNSCHEDULABLE = pod(
    conditions=[
        cond(
            "PodScheduled",
            "False",
            "Unschedulable",
            "0/3 nodes are available: 3 Insufficient nvidia.com/gpu.",
        )
    ]
)
NO_PVC = pod(
    conditions=[
        cond("PodScheduled", "False", "Unschedulable", 'persistentvolumeclaim "models" not found')
    ]
)
IMAGE_PULL = pod(
    containerStatuses=[
        waiting("ImagePullBackOff", 'Back-off pulling image "registry.example/sluice:nope"')
    ]
)
OOM = pod(
    phase="Running",
    containerStatuses=[
        waiting(
            "CrashLoopBackOff",
            "back-off 40s",
            restarts=3,
            last={"exitCode": 137, "reason": "OOMKilled"},
        )
    ],
)
MISSING_SECRET = pod(
    containerStatuses=[waiting("CreateContainerConfigError", 'secret "hf-token" not found')]
)
DOWNLOAD_FAILS = pod(
    phase="Pending",
    initContainerStatuses=[
        {**waiting("CrashLoopBackOff", "back-off 1m", restarts=4), "name": "model-download"}
    ],
)


@pytest.mark.parametrize(
    ("the_pod", "reason", "fragment"),
    [
        (CRASH_LOOP, "CrashLoopBackOff", "container runtime: CrashLoopBackOff: last exit code 1"),
        (UNSCHEDULABLE, "Unschedulable", "Insufficient nvidia.com/gpu"),
        (NO_PVC, "Unschedulable", 'persistentvolumeclaim "models" not found'),
        (IMAGE_PULL, "ImagePullBackOff", "registry.example/sluice:nope"),
        (OOM, "OOMKilled", "killed for exceeding its memory limit"),
        (MISSING_SECRET, "CreateContainerConfigError", 'secret "hf-token" not found'),
        (DOWNLOAD_FAILS, "CrashLoopBackOff", "init container model-download"),
    ],
    ids=["crash-loop", "no-gpu", "no-pvc", "image-pull", "oom", "missing-secret", "download"],
)
def test_a_pod_problem_is_degraded_with_its_reason_and_message(the_pod, reason, fragment):
    status = status_of(deployment(**ROLLING), rs=replica_set(0), pods=(the_pod,))

    assert summary(status)["Degraded"] == ("True", reason)
    assert fragment in message(status, "Degraded")
    assert message(status, "Degraded").startswith("pod chat-abc-1: ")
    assert summary(status)["Ready"] == ("False", reason)
    assert status["phase"] == "Degraded"


def test_the_worst_problem_wins_and_the_count_is_told():
    healthy = pod("chat-abc-0", phase="Running", containerStatuses=[
        {"name": "runtime", "ready": True, "restartCount": 0, "state": {"running": {}}}
    ])  # fmt: skip
    pods = (
        healthy,
        pod("chat-abc-1", **CRASH_LOOP["status"]),
        pod("chat-abc-2", **IMAGE_PULL["status"]),
    )
    status = status_of(deployment(**READY), rs=replica_set(1), pods=pods)

    assert summary(status)["Degraded"] == ("True", "ImagePullBackOff")
    assert message(status, "Degraded").endswith("(2 of 3 pods affected)")


def test_terminating_pods_are_not_problems():
    leaving = pod(**CRASH_LOOP["status"])
    leaving["metadata"]["deletionTimestamp"] = EARLIER
    status = status_of(deployment(**READY), rs=replica_set(2), pods=(leaving,))
    assert summary(status)["Degraded"] == ("False", "AsExpected")


def test_an_autoscaler_that_cannot_read_its_metrics_is_degraded():
    hpa = {
        "status": {
            "conditions": [
                cond("AbleToScale", "True", "SucceededGetScale"),
                cond(
                    "ScalingActive",
                    "False",
                    "FailedGetPodsMetric",
                    "unable to get metric sluice_queue_requests: no metrics returned",
                ),
            ]
        }
    }
    status = status_of(deployment(**READY), rs=replica_set(2), hpa=hpa, autoscaling=True)

    assert summary(status)["Degraded"] == ("True", "AutoscalingInactive")
    assert "FailedGetPodsMetric" in message(status, "Degraded")
    assert summary(status)["Ready"] == ("True", "Serving")  # it serves at its current size
    assert status["phase"] == "Degraded"


def test_invalid_spec_fails_and_says_why():
    failure = Failure("InvalidSpec", "spec.replicas: must be >= 0, got -1")
    status = status_of(deployment(**READY), failure=failure)

    assert status["phase"] == "Failed"
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "False",
        "InvalidSpec",
        "spec.replicas: must be >= 0, got -1",
    )
    assert summary(status)["Available"] == ("True", "ReplicasAvailable")  # the old version serves


def test_waiting_for_garbage_collection_is_pending_not_failed():
    failure = Failure(
        "WaitingForGarbageCollection", "Deployment ml/chat still belongs to ...", "Pending"
    )
    assert status_of(None, failure=failure)["phase"] == "Pending"


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
        Observed(
            "chat", "ml", 4, deployment(**READY), default_replicas=2, served_model_name="m",
            image="img:1",
        ),
        previous=status,
        now="2027-01-01T00:00:00Z",
        cluster_domain="cluster.local",
    )  # fmt: skip
    assert not status_changed(status, again)
    assert status_changed(status, status_of(deployment(**ROLLING), previous=status))


def test_events_mark_transitions_not_states():
    loading = status_of(deployment(**ROLLING))
    crashing = status_of(
        deployment(**ROLLING), rs=replica_set(0), pods=(CRASH_LOOP,), previous=loading
    )
    ready = status_of(deployment(**READY), previous=crashing)

    assert transition_events({}, loading) == []  # a rollout step is no news
    assert transition_events(loading, crashing) == [
        Event("Warning", "CrashLoopBackOff", message(crashing, "Degraded"))
    ]  # Ready=False for the same reason is the same news: one event
    assert transition_events(crashing, crashing) == []  # a resync posts nothing
    assert transition_events(crashing, ready) == [Event("Normal", "Ready", message(ready, "Ready"))]
