"""What is wrong with a service's pods, read from their status (pure).

The pods of the current ReplicaSet say what a Deployment's counters hide: a runtime that
crash-loops, an image that cannot be pulled, a container killed for memory, a pod no node
can take (no free `nvidia.com/gpu`, a missing PersistentVolumeClaim), a Secret that is not
there. Each becomes a `PodProblem`; the worst one, with how many pods share it, goes into
the Degraded condition (status.py).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
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


def pod_problem(pod: Mapping[str, Any]) -> PodProblem | None:
    """The worst problem of one pod, or None. Terminating pods have none (they drain)."""
    meta = pod.get("metadata") or {}
    if meta.get("deletionTimestamp"):
        return None
    name = meta.get("name", "?")
    status = pod.get("status") or {}
    if status.get("phase") == "Failed":
        reason = status.get("reason") or "Failed"
        return PodProblem(reason, status.get("message") or f"pod phase Failed ({reason})", name)
    for cond in status.get("conditions") or []:
        if (
            cond.get("type") == "PodScheduled"
            and cond.get("status") == "False"
            and cond.get("reason") == "Unschedulable"
        ):
            return PodProblem("Unschedulable", cond.get("message") or "no node fits", name)
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


def worst_problem(pods: Iterable[Mapping[str, Any]]) -> tuple[PodProblem, int] | None:
    """The most severe problem among `pods` and how many pods have a problem."""
    problems = [p for pod in pods if (p := pod_problem(pod)) is not None]
    if not problems:
        return None
    return min(problems, key=lambda p: (p.rank, p.pod)), len(problems)
