"""The conditions of one Deployment of runtime pods: one pure function per condition.

`RuntimePods` is what the reconcile read of it (the Deployment, the ReplicaSet of its
current pod template and that ReplicaSet's pods, its HPA); `pods_state` derives Available,
Progressing, Degraded and Ready from it, as status.py describes them. The service's status
is this for its one Deployment, or with spec.disaggregation the two pools' combined
(pool_status.py).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import constants as c
from .pods import NO_GRACE, CapacityWait, Grace, capacity_waits, worst_problem


@dataclass(frozen=True)
class RuntimePods:
    """One Deployment of runtime pods and what decides how many must serve."""

    deployment: Mapping[str, Any] | None
    replica_set: Mapping[str, Any] | None = None  # the one running the current template
    pods: tuple[Mapping[str, Any], ...] = ()  # that ReplicaSet's pods
    hpa: Mapping[str, Any] | None = None
    autoscaling: bool = False
    min_replicas: int = 1  # autoscaling.minReplicas
    default_replicas: int = 1  # desired replicas when the Deployment does not say


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


@dataclass(frozen=True)
class Rollout:
    """The facts `kubectl rollout status` looks at, read from a Deployment and the
    ReplicaSet of its current template."""

    desired: int
    replicas: int
    ready: int
    updated: int
    available: int
    current_available: int  # available pods of the current template
    observed: bool  # the Deployment controller has seen its latest spec
    reported: bool  # the Deployment has any status at all
    deadline_exceeded: bool = False
    deadline_message: str = ""
    failure_reason: str | None = None
    failure_message: str = ""
    conditions: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    @property
    def old(self) -> int:
        """Pods of earlier templates still running."""
        return max(0, self.replicas - self.updated)


def read_rollout(
    deployment: Mapping[str, Any], replica_set: Mapping[str, Any] | None, default_replicas: int
) -> Rollout:
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    generation = (deployment.get("metadata") or {}).get("generation")
    conditions = {cond.get("type"): cond for cond in status.get("conditions") or []}
    progressing = conditions.get("Progressing") or {}
    failure = conditions.get("ReplicaFailure") or {}
    observed_generation = status.get("observedGeneration")
    observed = observed_generation is not None and (
        generation is None or observed_generation >= generation
    )
    replicas = status.get("replicas", 0)
    updated = status.get("updatedReplicas", 0)
    available = status.get("availableReplicas", 0)
    if replica_set is not None:
        current_available = (replica_set.get("status") or {}).get("availableReplicas", 0)
    elif observed:  # no ReplicaSet seen: the available pods that cannot be old ones
        current_available = min(updated, max(0, available - max(0, replicas - updated)))
    else:  # the counts may still describe the previous template
        current_available = 0
    return Rollout(
        desired=spec.get("replicas", default_replicas),
        replicas=replicas,
        ready=status.get("readyReplicas", 0),
        updated=updated,
        available=available,
        current_available=current_available,
        observed=observed,
        reported=bool(status),
        deadline_exceeded=progressing.get("status") == "False"
        and progressing.get("reason") == "ProgressDeadlineExceeded",
        deadline_message=progressing.get("message", ""),
        failure_reason=failure.get("reason") if failure.get("status") == "True" else None,
        failure_message=failure.get("message", ""),
        conditions=conditions,
    )


# --- one function per condition -----------------------------------------------------------


def available_condition(rollout: Rollout | None) -> Condition:
    if rollout is None:
        return Condition(c.CONDITION_AVAILABLE, False, "DeploymentNotFound", _NO_DEPLOYMENT)
    if rollout.available > 0:
        return Condition(
            c.CONDITION_AVAILABLE, True, "ReplicasAvailable", f"{_counts(rollout)} available"
        )
    if rollout.desired == 0:
        return Condition(c.CONDITION_AVAILABLE, False, "ScaledToZero", _SCALED_TO_ZERO)
    return Condition(
        c.CONDITION_AVAILABLE, False, "NoReplicasAvailable", f"{_counts(rollout)} available"
    )


def progressing_condition(
    rollout: Rollout | None, waits: Sequence[CapacityWait] = (), pods: int = 0
) -> Condition:
    """`waits`: pods of the current template waiting for capacity within the grace (the
    first to run out first), of `pods`; they make a starting rollout WaitingForCapacity."""
    condition = _progressing(rollout)
    if waits and condition.status and condition.reason in ("RollingOut", "ReplicasStarting"):
        first = waits[0]
        affected = f"; {len(waits)} of {pods} pods waiting" if pods > 1 else ""
        message = (
            f"pod {first.pod} waits for a node: {first.message} (Unschedulable from"
            f" {first.until} unless a node joins{affected})"
        )
        return Condition(c.CONDITION_PROGRESSING, True, "WaitingForCapacity", message)
    return condition


def _progressing(rollout: Rollout | None) -> Condition:
    kind = c.CONDITION_PROGRESSING
    if rollout is None:
        return Condition(kind, False, "DeploymentNotFound", _NO_DEPLOYMENT)
    if rollout.deadline_exceeded:
        message = rollout.deadline_message or f"{_counts(rollout)} available"
        return Condition(kind, False, "ProgressDeadlineExceeded", message)
    if not rollout.reported:
        return Condition(kind, True, "DeploymentCreated", "waiting for the Deployment controller")
    if not rollout.observed:
        message = "waiting for the Deployment controller to observe the new spec"
        return Condition(kind, True, "DeploymentUpdated", message)
    if rollout.old > 0:
        message = (
            f"rolling out: {rollout.current_available}/{rollout.desired} replicas of the new"
            f" version available, {rollout.old} of the previous still running"
        )
        return Condition(kind, True, "RollingOut", message)
    if rollout.current_available < rollout.desired:
        message = f"{rollout.current_available}/{rollout.desired} replicas available"
        return Condition(kind, True, "ReplicasStarting", message)
    if rollout.replicas > rollout.desired:
        message = f"scaling down from {rollout.replicas} to {rollout.desired} replicas"
        return Condition(kind, True, "ScalingDown", message)
    if rollout.desired == 0:
        return Condition(kind, False, "ScaledToZero", _SCALED_TO_ZERO)
    return Condition(kind, False, "RolloutComplete", f"{_counts(rollout)} available")


def degraded_condition(
    rollout: Rollout | None,
    pods: Sequence[Mapping[str, Any]],
    hpa: Mapping[str, Any] | None,
    grace: Grace = NO_GRACE,
) -> Condition:
    kind = c.CONDITION_DEGRADED
    if rollout is not None and rollout.deadline_exceeded:
        message = rollout.deadline_message or f"{_counts(rollout)} available"
        return Condition(kind, True, "ProgressDeadlineExceeded", message)
    problem = worst_problem(pods, grace)
    if problem is not None:
        worst, count = problem
        affected = f" ({count} of {len(pods)} pods affected)" if len(pods) > 1 else ""
        return Condition(kind, True, worst.reason, f"pod {worst.pod}: {worst.message}{affected}")
    if rollout is not None and rollout.failure_reason:
        message = rollout.failure_message or rollout.failure_reason
        return Condition(kind, True, rollout.failure_reason, message)
    scaling = hpa_problem(hpa)
    if scaling is not None:
        return Condition(kind, True, *scaling)
    return Condition(kind, False, "AsExpected", "")


def ready_condition(
    pods: RuntimePods, rollout: Rollout | None, degraded: Condition, progressing: Condition
) -> Condition:
    kind = c.CONDITION_READY
    if rollout is None:
        return Condition(kind, False, "DeploymentNotFound", _NO_DEPLOYMENT)
    if rollout.desired == 0:
        return Condition(kind, False, "ScaledToZero", _SCALED_TO_ZERO)
    needed = serving_floor(pods, rollout)
    have = rollout.current_available
    message = f"{have}/{rollout.desired} replicas of the current version available"
    if needed < rollout.desired:
        message += f" (serving needs {needed})"
    # the counts written beside the condition (status.readyReplicas: the Deployment's own)
    # lag the ReplicaSet's; Ready waits for them, so a Ready status never says 0 ready
    if have >= needed and rollout.ready >= needed:
        return Condition(kind, True, "Serving", message)
    if have >= needed:
        return Condition(
            kind, False, "CountsPending", f"{message}; the Deployment's counts not yet updated"
        )
    if degraded.status:
        return Condition(kind, False, degraded.reason, degraded.message)
    if progressing.status:
        return Condition(kind, False, progressing.reason, progressing.message)
    return Condition(kind, False, "ReplicasUnavailable", message)


def serving_floor(pods: RuntimePods, rollout: Rollout) -> int:
    """How many replicas of the current template must be available to call it Ready."""
    if pods.autoscaling:
        return max(1, min(rollout.desired, pods.min_replicas))
    return rollout.desired


def hpa_problem(hpa: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(reason, message) when the HPA cannot scale; all of its status the operator reads."""
    if hpa is None:
        return None
    conditions = {
        cond.get("type"): cond for cond in (hpa.get("status") or {}).get("conditions") or []
    }
    for kind, reason in (
        ("AbleToScale", "AutoscalerCannotScale"),
        ("ScalingActive", "AutoscalingInactive"),
    ):
        cond = conditions.get(kind) or {}
        if cond.get("status") == "False":
            detail = cond.get("message") or cond.get("reason") or kind
            return (
                reason,
                f"HorizontalPodAutoscaler {kind}=False ({cond.get('reason', '')}): {detail}",
            )
    return None


@dataclass(frozen=True)
class PodsState:
    """The four conditions of runtime pods, and their counts for the status."""

    ready: Condition
    available: Condition
    progressing: Condition
    degraded: Condition
    replicas: int = 0  # pods of every version
    ready_replicas: int = 0
    desired_replicas: int = 0


def pods_state(pods: RuntimePods, grace: Grace = NO_GRACE) -> PodsState:
    """`grace`: how long a pod no node fits counts as waiting for capacity."""
    rollout = (
        read_rollout(pods.deployment, pods.replica_set, pods.default_replicas)
        if pods.deployment is not None
        else None
    )
    available = available_condition(rollout)
    waits = capacity_waits(pods.pods, grace)
    progressing = progressing_condition(rollout, waits, len(pods.pods))
    degraded = degraded_condition(rollout, pods.pods, pods.hpa, grace)
    ready = ready_condition(pods, rollout, degraded, progressing)
    if rollout is None:
        return PodsState(ready, available, progressing, degraded)
    return PodsState(
        ready, available, progressing, degraded, rollout.replicas, rollout.ready, rollout.desired
    )


_NO_DEPLOYMENT = "the Deployment does not exist yet"
_SCALED_TO_ZERO = "scaled to zero replicas"


def _counts(rollout: Rollout) -> str:
    return f"{rollout.available}/{rollout.desired} replicas"
