"""One reconciliation: desired children → applied, unwanted children → deleted.

`plan` is pure (spec in, objects out). `apply_plan` does the API calls: it refuses to take
over an object of the same name that this InferenceService does not own, applies the
wanted children with server-side apply, and deletes the optional children it owns but no
longer wants (HPA when autoscaling is turned off, PDB when one replica remains, PodMonitor
when monitoring is turned off). API errors become Kopf's retry semantics: transient ones
a `kopf.TemporaryError` with a delay, others a `ReconcileError` (a `kopf.PermanentError`
with a reason for the status).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import kopf

from .builders import build_deployment, build_hpa, build_pdb, build_podmonitor, build_service
from .kube import DEPLOYMENTS, HPAS, PDBS, PODMONITORS, ApiError, KubeApi, Resource, resource_of
from .spec import InferenceServiceSpec


class ReconcileError(kopf.PermanentError):
    """A failure that retrying will not fix; `reason` goes into the Ready condition."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Plan:
    """Children to apply (in order) and optional child kinds that must not exist."""

    apply: tuple[dict[str, Any], ...]
    remove: tuple[Resource, ...]


def plan(isvc: InferenceServiceSpec, *, podmonitors: bool | None) -> Plan:
    """`podmonitors`: True to create one, False to remove ours, None to leave it alone
    (the PodMonitor API is not served, so there is nothing to create or delete)."""
    wanted: list[dict[str, Any]] = [build_deployment(isvc), build_service(isvc)]
    unwanted: list[Resource] = []
    for enabled, builder, resource in (
        (isvc.autoscaling.enabled, build_hpa, HPAS),
        (isvc.wants_pdb, build_pdb, PDBS),
        (podmonitors, build_podmonitor, PODMONITORS),
    ):
        if enabled:
            wanted.append(builder(isvc))
        elif enabled is not None:
            unwanted.append(resource)
    return Plan(apply=tuple(wanted), remove=tuple(unwanted))


def owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == owner_uid and ref.get("controller") for ref in refs)


async def apply_plan(
    api: KubeApi,
    the_plan: Plan,
    *,
    owner: Mapping[str, Any],
    namespace: str,
    name: str,
    retry_delay: float,
    logger: kopf.Logger,
) -> dict[str, Any]:
    """Apply the plan; return the Deployment as stored (for the status)."""
    children = [dict(child) for child in the_plan.apply]
    kopf.adopt(children, owner=owner)  # type: ignore[arg-type]
    owner_uid = owner["metadata"]["uid"]
    applied: dict[str, dict[str, Any]] = {}
    try:
        existing = {}
        for child in children:  # check every name before changing anything
            resource = resource_of(child)
            existing[resource.kind] = current = await api.get(resource, namespace, name)
            if current is not None and not owned_by(current, owner_uid):
                message = (
                    f"{resource.kind} {namespace}/{name} exists and is not owned by this"
                    " InferenceService; delete or rename it"
                )
                kopf.warn(owner, reason="NameConflict", message=message)  # type: ignore[arg-type]
                raise ReconcileError("NameConflict", message)
        for child in children:
            resource = resource_of(child)
            applied[resource.kind] = await api.apply(child)
            if existing[resource.kind] is None:
                _report(owner, logger, "Created", f"Created {resource.kind} {namespace}/{name}.")
        for resource in the_plan.remove:
            current = await api.get(resource, namespace, name)
            if current is not None and owned_by(current, owner_uid):
                uid = current["metadata"]["uid"]
                if await api.delete(resource, namespace, name, uid=uid):
                    _report(
                        owner,
                        logger,
                        "Deleted",
                        f"Deleted {resource.kind} {namespace}/{name}: no longer wanted.",
                    )
    except ApiError as error:
        failure = as_kopf_error(error, retry_delay)
        if isinstance(failure, ReconcileError):
            kopf.warn(owner, reason=failure.reason, message=str(failure))  # type: ignore[arg-type]
        raise failure from error
    return applied[DEPLOYMENTS.kind]


def _report(owner: Mapping[str, Any], logger: kopf.Logger, reason: str, message: str) -> None:
    logger.info(message)
    kopf.info(owner, reason=reason, message=message)  # type: ignore[arg-type]


def as_kopf_error(error: ApiError, retry_delay: float) -> Exception:
    if error.transient:
        return kopf.TemporaryError(f"Kubernetes API: {error}", delay=retry_delay)
    return ReconcileError("ApplyFailed", f"Kubernetes API rejected a child object: {error}")
