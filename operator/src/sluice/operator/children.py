"""The children of one InferenceService: which to apply, which to delete, and applying them.

`plan` is pure (spec in, objects out). `apply_children` does the API calls: it refuses to
take over an object of the same name that this InferenceService does not own, applies the
wanted children with server-side apply, and deletes the optional children it owns but no
longer wants (HPA when autoscaling is off, PodMonitor when monitoring is off,
NetworkPolicy when the policy is off).

Failures are typed for the reconcile: `ApiError` (transient or not) passes through;
`Blocked` means "not now": a child of the same name belongs to someone else, or to a
previous InferenceService of this name that the garbage collector has not removed yet.
Both heal by themselves or by a human, never by a spec change, so they are retried.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import kopf

from . import constants as c
from .builders import (
    build_deployment,
    build_hpa,
    build_networkpolicy,
    build_pdb,
    build_podmonitor,
    build_service,
)
from .builders.deployment import FROM_SPEC
from .kube import DEPLOYMENTS, HPAS, NETWORKPOLICIES, PODMONITORS, KubeApi, Resource, resource_of
from .spec import InferenceServiceSpec


@dataclass(frozen=True)
class Plan:
    """Children to apply (in order) and optional child kinds that must not exist."""

    apply: tuple[dict[str, Any], ...]
    remove: tuple[Resource, ...]


def plan(
    isvc: InferenceServiceSpec,
    *,
    podmonitors: bool | None,
    replicas: int | None = FROM_SPEC,
    run_as_user: int | None = c.RUN_AS_USER,
) -> Plan:
    """`podmonitors`: True to create one, False to remove ours, None to leave it alone
    (the PodMonitor API is not served, so there is nothing to create or delete).
    `replicas`: the Deployment's count (None: left to the HPA; see replicas.py)."""
    wanted: list[dict[str, Any]] = [
        build_deployment(isvc, replicas=replicas, run_as_user=run_as_user),
        build_service(isvc),
        build_pdb(isvc),
    ]
    unwanted: list[Resource] = []
    for enabled, builder, resource in (
        (isvc.autoscaling.enabled, build_hpa, HPAS),
        (podmonitors, build_podmonitor, PODMONITORS),
        (isvc.network_policy.enabled, build_networkpolicy, NETWORKPOLICIES),
    ):
        if enabled:
            wanted.append(builder(isvc))
        elif enabled is not None:
            unwanted.append(resource)
    return Plan(apply=tuple(wanted), remove=tuple(unwanted))


class Blocked(Exception):
    """A child cannot be applied now; `reason` and the message go into the status."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def controller_of(child: Mapping[str, Any]) -> tuple[str, str] | None:
    """(name, uid) of the InferenceService that controls `child`, if any."""
    for ref in (child.get("metadata") or {}).get("ownerReferences") or []:
        if (
            ref.get("controller")
            and ref.get("kind") == c.KIND
            and ref.get("apiVersion", "").startswith(f"{c.GROUP}/")
        ):
            return ref["name"], ref["uid"]
    return None


def owned_by(obj: Mapping[str, Any], owner_uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(ref.get("uid") == owner_uid and ref.get("controller") for ref in refs)


def check_ownership(
    the_plan: Plan, existing: Mapping[str, Mapping[str, Any] | None], owner: Mapping[str, Any]
) -> None:
    """Raise Blocked unless every existing object the plan applies is ours (pure). An
    object of a kind the plan removes is only deleted if it is ours, so it blocks nothing."""
    meta = owner["metadata"]
    for kind in (resource_of(child).kind for child in the_plan.apply):
        current = existing.get(kind)
        if current is None or owned_by(current, meta["uid"]):
            continue
        where = f"{kind} {meta['namespace']}/{meta['name']}"
        ref = controller_of(current)
        if ref is not None and ref[0] == meta["name"]:
            raise Blocked(
                c.REASON_WAITING_FOR_GC,
                f"{where} still belongs to a deleted InferenceService of the same name;"
                " waiting for the garbage collector to remove it",
            )
        raise Blocked(
            c.REASON_NAME_CONFLICT,
            f"{where} exists and is not owned by this InferenceService; delete or rename it",
        )


@dataclass
class Applied:
    """What one apply did: the children as stored, and what was created or deleted."""

    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # by kind
    created: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)


async def read_children(
    api: KubeApi, the_plan: Plan, namespace: str, name: str
) -> dict[str, dict[str, Any] | None]:
    """The current object of every kind the plan applies or removes, by kind."""
    kinds = [resource_of(child) for child in the_plan.apply] + list(the_plan.remove)
    return {resource.kind: await api.get(resource, namespace, name) for resource in kinds}


async def apply_children(
    api: KubeApi,
    the_plan: Plan,
    existing: Mapping[str, Mapping[str, Any] | None],
    *,
    owner: Mapping[str, Any],
) -> Applied:
    """Apply the plan (ownership already checked against `existing`)."""
    meta = owner["metadata"]
    namespace, name, owner_uid = meta["namespace"], meta["name"], meta["uid"]
    children = [dict(child) for child in the_plan.apply]
    kopf.adopt(children, owner=owner)  # type: ignore[arg-type]
    result = Applied()
    for child in children:
        resource = resource_of(child)
        result.objects[resource.kind] = await api.apply(child)
        if existing.get(resource.kind) is None:
            result.created.append(resource.kind)
    for resource in the_plan.remove:
        current = existing.get(resource.kind)
        if current is not None and owned_by(current, owner_uid):
            uid = current["metadata"]["uid"]
            if await api.delete(resource, namespace, name, uid=uid):
                result.deleted.append(resource.kind)
    return result


def deployment_of(applied: Applied) -> dict[str, Any]:
    return applied.objects[DEPLOYMENTS.kind]
