"""InferenceService status from its children.

`Observed` is what the reconcile read (the Deployment, the ReplicaSet of its current pod
template and that ReplicaSet's pods, the HPA, and a failure to apply the spec, if any;
with spec.disaggregation the same of each pool). From it (one pure function per condition
in conditions.py; a disaggregated service's pools combined by pool_status.py):

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
               selects the runtime pods directly, so Ready does not wait for the router
               (with spec.disaggregation it does: the Service always selects the router,
               and Ready needs a router replica available).

`phase` is derived from the conditions, worst first: Failed (the spec cannot be applied),
Degraded, Ready, Progressing, Pending. `compute_status` builds the whole status;
`transition_events` says which changes deserve an Event.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import constants as c
from .builders.common import selector_string
from .builders.service import service_url
from .conditions import Condition, RuntimePods, pods_state, read_rollout
from .optional import OptionalState, optional_condition
from .pods import NO_GRACE, Grace, capacity_waits, parse_time, worst_problem
from .pool_status import combine_pools, pools_status
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
    # spec.disaggregation: each pool's pods, by role (`deployment` and its fields are unused)
    pools: Mapping[str, RuntimePods] = field(default_factory=dict)

    @property
    def runtime_pods(self) -> RuntimePods:
        """The service's one Deployment of runtime pods (without disaggregation)."""
        return RuntimePods(
            deployment=self.deployment,
            replica_set=self.replica_set,
            pods=self.pods,
            hpa=self.hpa,
            autoscaling=self.autoscaling,
            min_replicas=self.min_replicas,
            default_replicas=self.default_replicas,
        )


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


def router_down(router: RouterObserved | None) -> Condition | None:
    """Why no router replica is available (a disaggregated service's Ready needs one: its
    requests reach the pools only through the router), or None while one is."""
    if router is None:
        return Condition(c.CONDITION_ROUTER_READY, False, "RouterStarting", "no router yet")
    if int((router.deployment.get("status") or {}).get("availableReplicas") or 0) > 0:
        return None
    return router_ready_condition(router)


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


# --- the whole status -------------------------------------------------------------------------


def scheduling_grace(now: str, seconds: float) -> Grace:
    """The grace an unschedulable pod gets, as of `now` (an RFC 3339 time)."""
    at = parse_time(now)
    return Grace(at, seconds) if at is not None and seconds > 0 else NO_GRACE


def capacity_recheck(observed: Observed, *, now: str, grace_seconds: float) -> float | None:
    """Seconds until the first pod waiting for capacity runs out of grace (when the status
    must be computed again, though nothing may have changed), or None."""
    pods = observed.pods + tuple(p for pool in observed.pools.values() for p in pool.pods)
    waits = capacity_waits(pods, scheduling_grace(now, grace_seconds))
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
    grace = scheduling_grace(now, scheduling_grace_seconds)
    pools = {role: pods_state(pods, grace) for role, pods in observed.pools.items()}
    state = (
        combine_pools(pools, router_down=router_down(observed.router))
        if pools
        else pods_state(observed.runtime_pods, grace)
    )
    failure = observed.failure
    ready = (
        Condition(c.CONDITION_READY, False, failure.reason, failure.message)
        if failure is not None
        else state.ready
    )
    phase = derive_phase(failure, ready, state.progressing, state.degraded)
    conditions = [ready, state.available, state.progressing, state.degraded]
    if observed.router is not None and observed.failure is None:
        conditions.append(router_ready_condition(observed.router))
    if observed.optional:
        conditions.append(
            Condition(c.CONDITION_OPTIONAL_RESOURCES, *optional_condition(observed.optional))
        )
    status: dict[str, Any] = {
        "phase": phase,
        "conditions": _with_times(conditions, previous, now, observed.generation),
        "replicas": state.replicas,
        "readyReplicas": state.ready_replicas,
        "desiredReplicas": state.desired_replicas,
        "url": service_url(observed.name, observed.namespace, cluster_domain)
        if observed.deployment or pools
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
        "disaggregation": pools_status(pools)
        if pools
        else previous.get("disaggregation")
        if failure
        else None,
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


# reasons of Ready=False that are the normal course of a rollout (the Router ones: a
# disaggregated service waiting for its router, pool_status.py)
_QUIET_READY_REASONS = frozenset(
    {"DeploymentNotFound", "DeploymentCreated", "DeploymentUpdated", "RollingOut",
     "ReplicasStarting", "ScalingDown", "ScaledToZero", "WaitingForGarbageCollection",
     "WaitingForCapacity", "RouterStarting", "RouterReplicasStarting"}
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
