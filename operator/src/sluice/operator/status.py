"""InferenceService status from its children: one pure function per condition.

`Observed` is what the reconcile read (the Deployment, the ReplicaSet of its current pod
template and that ReplicaSet's pods, the HPA, and a failure to apply the spec, if any).
From it:

  Available    at least one replica (of any version) serves the model
  Progressing  a rollout or a scale is under way; False once done, or past its deadline.
               Reason WaitingForCapacity while a pod no node fits is within the
               scheduling grace (SLUICE_SCHEDULING_GRACE_SECONDS, from its PodScheduled
               condition's lastTransitionTime): a cluster autoscaler may be adding a node
  Degraded     something needs a human: a pod problem (CrashLoopBackOff, ImagePullBackOff,
               OOMKilled, Unschedulable past the grace, ...), the rollout's deadline passed, the
               Deployment cannot create pods, or the HPA cannot scale
  Ready        serving as asked: at least min(desired, minReplicas) replicas available on
               the current pod template (minReplicas only while autoscaling; otherwise all
               desired replicas). Scaling up does not make a serving service un-Ready; a
               new template is Ready once enough of its pods are.
  OptionalResourcesAvailable
               the optional APIs (PodMonitor, InferencePool): False, reason Forbidden,
               while the API server denies one (the service is reconciled without it)
  RouterReady  only with spec.router.enabled: all router replicas of the current template
               available and the model Service sending to them. Until then the Service
               selects the runtime pods directly, so Ready does not wait for the router.

`phase` is derived from the conditions, worst first: Failed (the spec cannot be applied),
Degraded, Ready, Progressing, Pending. `compute_status` builds the whole status;
`transition_events` says which changes deserve an Event.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import constants as c
from .builders.common import selector_string
from .builders.service import service_url
from .optional import OptionalState, optional_condition
from .pods import NO_GRACE, CapacityWait, Grace, capacity_waits, parse_time, worst_problem
from .revisions import ModelPin


@dataclass(frozen=True)
class Failure:
    """Why the spec is not (fully) applied; `phase` is Failed, or Pending for a wait."""

    reason: str
    message: str
    phase: str = c.PHASE_FAILED


@dataclass(frozen=True)
class RouterObserved:
    """The router Deployment (spec.router), the ReplicaSet of its current template and
    that ReplicaSet's pods; `routed`: the model Service selects the router pods."""

    deployment: Mapping[str, Any]
    replica_set: Mapping[str, Any] | None
    pods: tuple[Mapping[str, Any], ...]
    replicas: int
    routed: bool


@dataclass(frozen=True)
class Observed:
    """Everything the status is derived from."""

    name: str
    namespace: str
    generation: int | None  # the InferenceService generation this status describes
    deployment: Mapping[str, Any] | None
    replica_set: Mapping[str, Any] | None = None  # the one running the current template
    pods: tuple[Mapping[str, Any], ...] = ()  # that ReplicaSet's pods
    hpa: Mapping[str, Any] | None = None
    autoscaling: bool = False
    min_replicas: int = 1  # autoscaling.minReplicas
    default_replicas: int = 1  # desired replicas when the Deployment does not say
    served_model_name: str | None = None
    image: str | None = None  # the runtime image the children were applied with
    model_pin: ModelPin | None = None  # an hf:// model's resolved commit (revisions.py)
    failure: Failure | None = None
    router: RouterObserved | None = None  # None: spec.router is off
    optional: tuple[OptionalState, ...] = ()  # the optional APIs (none: not looked at)


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
    observed: Observed, rollout: Rollout | None, degraded: Condition, progressing: Condition
) -> Condition:
    kind = c.CONDITION_READY
    if observed.failure is not None:
        return Condition(kind, False, observed.failure.reason, observed.failure.message)
    if rollout is None:
        return Condition(kind, False, "DeploymentNotFound", _NO_DEPLOYMENT)
    if rollout.desired == 0:
        return Condition(kind, False, "ScaledToZero", _SCALED_TO_ZERO)
    needed = serving_floor(observed, rollout)
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


def router_ready_condition(router: RouterObserved) -> Condition:
    kind = c.CONDITION_ROUTER_READY
    rollout = read_rollout(router.deployment, router.replica_set, router.replicas)
    have = rollout.current_available
    message = f"{have}/{rollout.desired} router replicas of the current version available"
    problem = worst_problem(router.pods)
    if have >= rollout.desired and rollout.observed and router.routed:
        return Condition(kind, True, "RouterServing", message + "; the Service sends to them")
    if problem is not None:
        worst, _ = problem
        return Condition(kind, False, worst.reason, f"router pod {worst.pod}: {worst.message}")
    if rollout.deadline_exceeded:
        return Condition(kind, False, "ProgressDeadlineExceeded", rollout.deadline_message)
    if rollout.failure_reason:
        return Condition(kind, False, rollout.failure_reason, rollout.failure_message)
    if not router.routed:
        message += "; the Service sends to the runtime pods until one is"
        return Condition(kind, False, "RouterStarting", message)
    return Condition(kind, False, "RouterReplicasStarting", message)


def serving_floor(observed: Observed, rollout: Rollout) -> int:
    """How many replicas of the current template must be available to call it Ready."""
    if observed.autoscaling:
        return max(1, min(rollout.desired, observed.min_replicas))
    return rollout.desired


def derive_phase(
    failure: Failure | None, ready: Condition, progressing: Condition, degraded: Condition
) -> str:
    if failure is not None:
        return failure.phase
    if degraded.status:
        return c.PHASE_DEGRADED
    if ready.status:
        return c.PHASE_READY
    if progressing.status and progressing.reason not in ("DeploymentCreated",):
        return c.PHASE_PROGRESSING
    return c.PHASE_PENDING


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


# --- the whole status -------------------------------------------------------------------------


def scheduling_grace(now: str, seconds: float) -> Grace:
    """The grace an unschedulable pod gets, as of `now` (an RFC 3339 time)."""
    at = parse_time(now)
    return Grace(at, seconds) if at is not None and seconds > 0 else NO_GRACE


def capacity_recheck(observed: Observed, *, now: str, grace_seconds: float) -> float | None:
    """Seconds until the first pod waiting for capacity runs out of grace (when the status
    must be computed again, though nothing may have changed), or None."""
    waits = capacity_waits(observed.pods, scheduling_grace(now, grace_seconds))
    return waits[0].seconds_left if waits else None


def compute_status(
    observed: Observed,
    *,
    previous: Mapping[str, Any],
    now: str,
    cluster_domain: str,
    scheduling_grace_seconds: float = 0.0,
) -> dict[str, Any]:
    """The full status object; absent values are None so a merge patch clears them.
    `scheduling_grace_seconds`: how long a pod no node fits counts as waiting for capacity
    (Progressing) before it is Degraded."""
    deployment = observed.deployment
    rollout = (
        read_rollout(deployment, observed.replica_set, observed.default_replicas)
        if deployment is not None
        else None
    )
    available = available_condition(rollout)
    grace = scheduling_grace(now, scheduling_grace_seconds)
    waits = capacity_waits(observed.pods, grace)
    progressing = progressing_condition(rollout, waits, len(observed.pods))
    degraded = degraded_condition(rollout, observed.pods, observed.hpa, grace)
    ready = ready_condition(observed, rollout, degraded, progressing)
    phase = derive_phase(observed.failure, ready, progressing, degraded)
    conditions = [ready, available, progressing, degraded]
    if observed.router is not None and observed.failure is None:
        conditions.append(router_ready_condition(observed.router))
    if observed.optional:
        conditions.append(
            Condition(c.CONDITION_OPTIONAL_RESOURCES, *optional_condition(observed.optional))
        )
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
        "image": observed.image or previous.get("image"),
        "model": observed.model_pin.status()
        if observed.model_pin
        else previous.get("model")
        if observed.failure
        else None,
        "router": _router_status(observed.router),
    }
    if observed.generation is not None:
        status["observedGeneration"] = observed.generation
    return status


def _router_status(router: RouterObserved | None) -> dict[str, Any] | None:
    if router is None:
        return None
    status = router.deployment.get("status") or {}
    return {
        "replicas": int(status.get("replicas") or 0),
        "readyReplicas": int(status.get("readyReplicas") or 0),
        "routing": router.routed,
    }


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


# reasons of Ready=False that are not the normal course of a rollout
_QUIET_READY_REASONS = frozenset(
    {"DeploymentNotFound", "DeploymentCreated", "DeploymentUpdated", "RollingOut",
     "ReplicasStarting", "ScalingDown", "ScaledToZero", "WaitingForGarbageCollection",
     "WaitingForCapacity"}
)  # fmt: skip


@dataclass(frozen=True)
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


def transition_events(previous: Mapping[str, Any], current: Mapping[str, Any]) -> list[Event]:
    """Events for what changed between two statuses: Ready turning True (Normal), Ready
    turning False for a reason that is not a rollout step, Degraded turning True or
    changing its reason, and an optional API becoming denied (Warning). Unchanged conditions post nothing, so resyncs are quiet."""
    before = {cond.get("type"): cond for cond in previous.get("conditions") or []}
    events: list[Event] = []
    for cond in current.get("conditions") or []:
        old = before.get(cond["type"]) or {}
        if (old.get("status"), old.get("reason")) == (cond["status"], cond["reason"]):
            continue
        if cond["type"] == c.CONDITION_READY:
            if cond["status"] == "True":
                events.append(Event("Normal", "Ready", cond["message"]))
            elif cond["reason"] not in _QUIET_READY_REASONS:
                events.append(Event("Warning", cond["reason"], cond["message"]))
        elif cond["type"] == c.CONDITION_DEGRADED and cond["status"] == "True":
            events.append(Event("Warning", cond["reason"], cond["message"]))
        elif cond["type"] == c.CONDITION_OPTIONAL_RESOURCES and cond["status"] == "False":
            events.append(Event("Warning", cond["reason"], cond["message"]))
    unique: list[Event] = []
    for event in events:
        if event not in unique:
            unique.append(event)
    return unique


_NO_DEPLOYMENT = "the Deployment does not exist yet"
_SCALED_TO_ZERO = "scaled to zero replicas"


def _counts(rollout: Rollout) -> str:
    return f"{rollout.available}/{rollout.desired} replicas"
