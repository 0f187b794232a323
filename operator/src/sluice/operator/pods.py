"""What is wrong with a service's pods, read from their status (pure).

The pods of the current ReplicaSet say what a Deployment's counters hide: a runtime that
crash-loops, an image that cannot be pulled, a container killed for memory, a pod no node
can take (no free `nvidia.com/gpu`, a missing PersistentVolumeClaim), a Secret that is not
there. Each becomes a `PodProblem`; the worst one, with how many pods share it, goes into
the Degraded condition (status.py).

A pod the scheduler cannot place yet is not a problem while it may be waiting for a new
node (a cluster-autoscaler or Karpenter scale-up takes minutes): for `grace_seconds` after
its PodScheduled=False condition's lastTransitionTime it is a `CapacityWait`, which makes
the service Progressing (reason WaitingForCapacity), not Degraded. Past the grace it is an
Unschedulable problem. The autoscalers' own signal (a `TriggeredScaleUp` or `Nominated`
Event on the pod) is not read: it lives in Events, not in the pod, and reading them would
cost a request per reconcile; the grace period stands in for it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

# waiting reasons that mean "this will not start by itself", worst first
WAITING_PROBLEMS = (
    "CreateContainerConfigError",  # a missing Secret or ConfigMap key
    "InvalidImageName",
    "ErrImagePull",
    "ImagePullBackOff",
    "CrashLoopBackOff",
    "CreateContainerError",
    "RunContainerError",
)
# how bad each reason is (lower is worse); reasons not listed rank after these
SEVERITY = {
    reason: rank
    for rank, reason in enumerate(
        (*WAITING_PROBLEMS[:4], "Unschedulable", "OOMKilled", *WAITING_PROBLEMS[4:], "Evicted")
    )
}


@dataclass(frozen=True)
class PodProblem:
    reason: str
    message: str
    pod: str

    @property
    def rank(self) -> int:
        return SEVERITY.get(self.reason, len(SEVERITY))


@dataclass(frozen=True)
class CapacityWait:
    """A pod no node fits yet, within the scheduling grace: it may be waiting for a new node."""

    pod: str
    message: str  # the scheduler's
    seconds_left: float  # until the grace ends and it is Unschedulable
    until: str  # when that is (RFC 3339; fixed, so the status does not change while waiting)


@dataclass(frozen=True)
class Grace:
    """How long an unschedulable pod may wait for capacity, as of `now` (0: not at all)."""

    now: datetime
    seconds: float


NO_GRACE = Grace(datetime.min.replace(tzinfo=timezone.utc), 0.0)


def parse_time(value: Any) -> datetime | None:
    """An RFC 3339 timestamp of the API server (e.g. 2026-01-01T00:00:00Z), or None."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)


def _unschedulable(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The pod's PodScheduled=False/Unschedulable condition, if it is live and has one."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return None
    status = pod.get("status") or {}
    if status.get("phase") == "Failed":
        return None
    for cond in status.get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            return cond
    return None


def capacity_wait(pod: Mapping[str, Any], grace: Grace) -> CapacityWait | None:
    """The pod is unschedulable since less than the grace period (by its condition's
    lastTransitionTime; a condition without one gets no grace)."""
    cond = _unschedulable(pod)
    if cond is None or grace.seconds <= 0:
        return None
    since = parse_time(cond.get("lastTransitionTime"))
    if since is None:
        return None
    left = grace.seconds - (grace.now - since).total_seconds()
    if left <= 0:
        return None
    name = (pod.get("metadata") or {}).get("name", "?")
    until = (since + timedelta(seconds=grace.seconds)).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return CapacityWait(name, cond.get("message") or "no node fits", left, until)


def capacity_waits(pods: Iterable[Mapping[str, Any]], grace: Grace) -> list[CapacityWait]:
    """The pods waiting for capacity, the first to run out of grace first."""
    waits = [w for pod in pods if (w := capacity_wait(pod, grace)) is not None]
    return sorted(waits, key=lambda w: (w.seconds_left, w.pod))


def pod_problem(pod: Mapping[str, Any], grace: Grace = NO_GRACE) -> PodProblem | None:
    """The worst problem of one pod, or None. Terminating pods have none (they drain), nor
    do pods waiting for capacity within the grace."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    name = meta.get("name", "?")
    status = pod.get("status") or {}
    if status.get("phase") == "Failed":
        reason = status.get("reason") or "Failed"
        return PodProblem(reason, status.get("message") or f"pod phase Failed ({reason})", name)
    unschedulable = _unschedulable(pod)
    if unschedulable is not None:
        if capacity_wait(pod, grace) is not None:
            return None
        return PodProblem("Unschedulable", unschedulable.get("message") or "no node fits", name)
    found = [
        problem
        for kind, key in (
            ("init container", "initContainerStatuses"),
            ("container", "containerStatuses"),
        )
        for container in status.get(key) or []
        if (problem := _container_problem(container, kind, name)) is not None
    ]
    return min(found, key=lambda p: p.rank) if found else None


def _container_problem(container: Mapping[str, Any], kind: str, pod: str) -> PodProblem | None:
    cname = container.get("name", "?")
    restarts = container.get("restartCount", 0)
    waiting = (container.get("state") or {}).get("waiting") or {}
    last = (container.get("lastState") or {}).get("terminated") or {}
    if waiting.get("reason") in WAITING_PROBLEMS:
        reason = waiting["reason"]
        detail = waiting.get("message") or ""
        if last.get("reason") == "OOMKilled":
            reason, detail = "OOMKilled", "killed for exceeding its memory limit; " + detail
        elif last:
            detail = _terminated(last) + ("; " + detail if detail else "")
        return PodProblem(reason, f"{kind} {cname}: {reason}: {detail} (restarts: {restarts})", pod)
    if last.get("reason") == "OOMKilled":
        message = f"{kind} {cname} was OOMKilled (memory limit too low; restarts: {restarts})"
        return PodProblem("OOMKilled", message, pod)
    return None


def _terminated(last: Mapping[str, Any]) -> str:
    parts = [f"last exit code {last.get('exitCode', '?')}"]
    if last.get("reason"):
        parts.append(f"({last['reason']})")
    if last.get("message"):
        parts.append(str(last["message"]).strip().splitlines()[-1][:300])
    return " ".join(parts)


def worst_problem(
    pods: Iterable[Mapping[str, Any]], grace: Grace = NO_GRACE
) -> tuple[PodProblem, int] | None:
    """The most severe problem among `pods` and how many pods have a problem."""
    problems = [p for pod in pods if (p := pod_problem(pod, grace)) is not None]
    if not problems:
        return None
    return min(problems, key=lambda p: (p.rank, p.pod)), len(problems)
