"""InferenceService status from its Deployment: phase, conditions and replica counts.

Pure: the caller passes the observed Deployment, the previous status (to keep
`lastTransitionTime` of conditions that did not change) and the current time.

Phases:
  Pending      no Deployment yet, it has not reported status, or it is scaled to zero
  Progressing  a rollout is under way (pods starting, model loading, updating)
  Ready        the rollout is complete and every desired replica is ready
  Degraded     the rollout exceeded its deadline, pods cannot be created, or replicas
               were lost after the rollout completed
  Failed       the spec is invalid or its children cannot be applied (children, if
               any, keep their last valid version)

Conditions (each with reason and message): Ready, Available (at least one replica serves
the model), Progressing (a rollout is under way), Degraded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from . import constants as c
from .builders.common import selector_string
from .builders.service import service_url


@dataclass(frozen=True)
class Observed:
    """Everything the status is derived from."""

    name: str
    namespace: str
    generation: int | None  # the InferenceService generation this status describes
    deployment: Mapping[str, Any] | None
    default_replicas: int = 1  # desired replicas when the Deployment does not say
    served_model_name: str | None = None
    failure_reason: str | None = None  # set when the spec cannot be applied (phase Failed)
    failure_message: str = ""


@dataclass(frozen=True)
class Rollout:
    """The facts `kubectl rollout status` looks at, read from a Deployment."""

    desired: int
    replicas: int
    ready: int
    updated: int
    available: int
    observed: bool  # the Deployment controller has seen its latest spec
    reported: bool  # the Deployment has any status at all
    progressing_reason: str | None
    deadline_exceeded: bool
    deadline_message: str
    failure_reason: str | None
    failure_message: str

    @property
    def complete(self) -> bool:
        return (
            self.observed
            and self.updated >= self.desired
            and self.replicas == self.updated
            and self.available >= self.updated
        )


@dataclass(frozen=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


def read_rollout(deployment: Mapping[str, Any], default_replicas: int) -> Rollout:
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    generation = (deployment.get("metadata") or {}).get("generation")
    conditions = {cond.get("type"): cond for cond in status.get("conditions") or []}
    progressing = conditions.get("Progressing") or {}
    failure = conditions.get("ReplicaFailure") or {}
    observed_generation = status.get("observedGeneration")
    return Rollout(
        desired=spec.get("replicas", default_replicas),
        replicas=status.get("replicas", 0),
        ready=status.get("readyReplicas", 0),
        updated=status.get("updatedReplicas", 0),
        available=status.get("availableReplicas", 0),
        observed=observed_generation is not None
        and (generation is None or observed_generation >= generation),
        reported=bool(status),
        progressing_reason=progressing.get("reason"),
        deadline_exceeded=progressing.get("status") == "False"
        and progressing.get("reason") == "ProgressDeadlineExceeded",
        deadline_message=progressing.get("message", ""),
        failure_reason=failure.get("reason") if failure.get("status") == "True" else None,
        failure_message=failure.get("message", ""),
    )


def compute_status(
    observed: Observed, *, previous: Mapping[str, Any], now: str, cluster_domain: str
) -> dict[str, Any]:
    """The full status object; absent values are None so a merge patch clears them."""
    deployment = observed.deployment
    rollout = (
        read_rollout(deployment, observed.default_replicas) if deployment is not None else None
    )
    phase, conditions = _assess(observed, rollout)
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": _with_times(conditions, previous, now, observed.generation),
        "replicas": rollout.replicas if rollout else 0,
        "readyReplicas": rollout.ready if rollout else 0,
        "desiredReplicas": rollout.desired if rollout else 0,
        "url": service_url(observed.name, observed.namespace, cluster_domain)
        if deployment
        else None,
        "selector": selector_string(observed.name),
        "servedModelName": observed.served_model_name,
    }
    if observed.generation is not None:
        status["observedGeneration"] = observed.generation
    return status


def _assess(observed: Observed, rollout: Rollout | None) -> tuple[str, list[Condition]]:
    available, progressing, degraded, phase, ready_reason, ready_message = _from_rollout(rollout)
    if observed.failure_reason is not None:
        phase = c.PHASE_FAILED
        ready_reason, ready_message = observed.failure_reason, observed.failure_message
    return phase, [
        Condition(c.CONDITION_READY, phase == c.PHASE_READY, ready_reason, ready_message),
        available,
        progressing,
        degraded,
    ]


def _from_rollout(
    rollout: Rollout | None,
) -> tuple[Condition, Condition, Condition, str, str, str]:
    if rollout is None:
        message = "the Deployment does not exist yet"
        return (
            Condition(c.CONDITION_AVAILABLE, False, "DeploymentNotFound", message),
            Condition(c.CONDITION_PROGRESSING, False, "DeploymentNotFound", message),
            Condition(c.CONDITION_DEGRADED, False, "AsExpected", ""),
            c.PHASE_PENDING,
            "DeploymentNotFound",
            message,
        )
    counts = f"{rollout.ready}/{rollout.desired} replicas ready"
    if rollout.ready > 0:
        available = Condition(c.CONDITION_AVAILABLE, True, "ReplicasReady", counts)
    elif rollout.desired == 0:
        available = Condition(
            c.CONDITION_AVAILABLE, False, "ScaledToZero", "scaled to zero replicas"
        )
    else:
        available = Condition(c.CONDITION_AVAILABLE, False, "NoReplicasReady", counts)

    if rollout.deadline_exceeded:
        reason, message = "ProgressDeadlineExceeded", rollout.deadline_message or counts
        return (
            available,
            Condition(c.CONDITION_PROGRESSING, False, reason, message),
            Condition(c.CONDITION_DEGRADED, True, reason, message),
            c.PHASE_DEGRADED,
            reason,
            message,
        )
    if rollout.failure_reason:
        reason, message = rollout.failure_reason, rollout.failure_message or counts
        return (
            available,
            Condition(
                c.CONDITION_PROGRESSING,
                not rollout.complete,
                rollout.progressing_reason or reason,
                counts,
            ),
            Condition(c.CONDITION_DEGRADED, True, reason, message),
            c.PHASE_DEGRADED,
            reason,
            message,
        )
    healthy = Condition(c.CONDITION_DEGRADED, False, "AsExpected", "")
    if rollout.desired == 0:
        return (
            available,
            Condition(c.CONDITION_PROGRESSING, False, "ScaledToZero", "scaled to zero replicas"),
            healthy,
            c.PHASE_PENDING,
            "ScaledToZero",
            "scaled to zero replicas",
        )
    if not rollout.reported:
        message = "waiting for the Deployment controller"
        return (
            available,
            Condition(c.CONDITION_PROGRESSING, True, "DeploymentCreated", message),
            healthy,
            c.PHASE_PENDING,
            "DeploymentCreated",
            message,
        )
    if not rollout.complete:
        reason = rollout.progressing_reason or "RollingOut"
        message = f"rolling out: {rollout.updated}/{rollout.desired} updated, {counts}"
        return (
            available,
            Condition(c.CONDITION_PROGRESSING, True, reason, message),
            healthy,
            c.PHASE_PROGRESSING,
            reason,
            message,
        )
    done = Condition(c.CONDITION_PROGRESSING, False, "RolloutComplete", counts)
    if rollout.ready < rollout.desired:
        reason = "ReplicasUnavailable"
        return (
            available,
            done,
            Condition(c.CONDITION_DEGRADED, True, reason, counts),
            c.PHASE_DEGRADED,
            reason,
            counts,
        )
    return available, done, healthy, c.PHASE_READY, "AllReplicasReady", counts


def _with_times(
    conditions: list[Condition], previous: Mapping[str, Any], now: str, generation: int | None
) -> list[dict[str, Any]]:
    """Keep a condition's lastTransitionTime while its status does not change."""
    before = {cond.get("type"): cond for cond in previous.get("conditions") or []}
    result = []
    for cond in conditions:
        status = "True" if cond.status else "False"
        old = before.get(cond.type) or {}
        since = old.get("lastTransitionTime") if old.get("status") == status else None
        item: dict[str, Any] = {
            "type": cond.type,
            "status": status,
            "reason": cond.reason,
            "message": cond.message,
            "lastTransitionTime": since or now,
        }
        if generation is not None:
            item["observedGeneration"] = generation
        elif "observedGeneration" in old:
            item["observedGeneration"] = old["observedGeneration"]
        result.append(item)
    return result


def status_changed(current: Mapping[str, Any], desired: Mapping[str, Any]) -> bool:
    """Whether patching `desired` over `current` would change anything."""
    return any(current.get(key) != value for key, value in desired.items())
