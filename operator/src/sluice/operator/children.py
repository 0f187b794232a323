"""The children of one InferenceService: which to apply, which to delete, and applying them.

`plan` is pure (spec in, objects out). `apply_children` does the API calls: it refuses to
take over an object of the same name that this InferenceService does not own, applies the
wanted children with server-side apply (skipping those already as rendered: drift.py), and deletes the optional children it owns but no
longer wants (HPA when autoscaling is off, PodMonitor when monitoring is off,
NetworkPolicy when the policy is off, the router's objects (its PodDisruptionBudget too)
when the router is off, the
InferencePool when the pool is off), and the runtime children of the other shape when
disaggregation is switched on or off. A child is known by its kind and name: the runtime's
are named after the InferenceService (with disaggregation each pool's `<name>-prefill` /
`<name>-decode`), the router's `<name>-router`, and the Service the router discovers the
runtime pods from `<name>-workers`.

Failures are typed for the reconcile: `ApiError` (transient or not) passes through,
except a 403 for an optional kind, which is `OptionalForbidden` (the reconcile goes on
without that kind); `Blocked` means "not now": a child of the same name belongs to someone else, or to a
previous InferenceService of this name that the garbage collector has not removed yet.
Both heal by themselves or by a human, never by a spec change, so they are retried.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import kopf

from . import constants as c
from .builders import (
    build_deployment,
    build_hpa,
    build_inferencepool,
    build_networkpolicy,
    build_pdb,
    build_podmonitor,
    build_pool_service,
    build_router_deployment,
    build_router_networkpolicy,
    build_router_pdb,
    build_router_podmonitor,
    build_router_role,
    build_router_role_binding,
    build_router_service_account,
    build_service,
    build_workers_service,
)
from .builders.deployment import FROM_SPEC
from .cache import CachedApi
from .drift import stamped, up_to_date
from .kube import (
    DEPLOYMENTS,
    HPAS,
    INFERENCEPOOLS,
    NETWORKPOLICIES,
    PDBS,
    PODMONITORS,
    ROLEBINDINGS,
    ROLES,
    SERVICEACCOUNTS,
    SERVICES,
    ApiError,
    Resource,
    resource_of,
)
from .optional import OPTIONAL_RESOURCES, OptionalForbidden
from .spec import InferenceServiceSpec

Key = tuple[str, str]  # (kind, name): which child
Make = Callable[[], dict[str, Any]]  # renders one child


def key_of(obj: Mapping[str, Any]) -> Key:
    return str(obj["kind"]), str(obj["metadata"]["name"])


@dataclass(frozen=True)
class Plan:
    """Children to apply (in order), optional children that must not exist, and the
    runtime children of the shape not in use (`retire`: disaggregation switched on or off),
    which must not exist either but are looked up in the watch cache only: they are ours,
    labelled and watched, and rarely there, so a resync need not read each of them."""

    apply: tuple[dict[str, Any], ...]
    remove: tuple[tuple[Resource, str], ...]
    retire: tuple[tuple[Resource, str], ...] = ()

    @property
    def unwanted(self) -> tuple[tuple[Resource, str], ...]:
        return (*self.remove, *self.retire)

    @property
    def keys(self) -> list[Key]:
        """Every child the plan applies or removes."""
        return [key_of(obj) for obj in self.apply] + [(r.kind, n) for r, n in self.unwanted]


def plan(
    isvc: InferenceServiceSpec,
    *,
    podmonitors: bool | None,
    inferencepools: bool | None = None,
    replicas: Mapping[str, int | None] | None = None,
    run_as_user: int | None = c.RUN_AS_USER,
    to_router: bool = False,
) -> Plan:
    """`podmonitors`: True to create one, False to remove ours, None to leave it alone
    (the PodMonitor API is not served, so there is nothing to create or delete);
    `inferencepools`: True where the InferencePool API is served (whether the spec wants
    one decides), None where it is not. `replicas`: the count of each runtime Deployment,
    by name (None: left to the HPA; see replicas.py; a Deployment not named: the spec's).
    `to_router`: the model Service selects the router pods (the reconcile says so once a
    router replica serves; always with disaggregation, whose pods serve only the router)."""
    counts = replicas or {}
    views = isvc.runtime_views  # the service, or its two P/D pools
    disaggregated = isvc.disaggregation.enabled
    wanted: list[dict[str, Any]] = [
        *(build_deployment(view, replicas=counts.get(view.runtime_name, FROM_SPEC),
                           run_as_user=run_as_user) for view in views),
        build_service(isvc, to_router=to_router and isvc.router.enabled),
        *(build_pool_service(view) for view in views if disaggregated),
        *(build_pdb(view) for view in views),
    ]  # fmt: skip
    routed = isvc.router.enabled
    name, router = isvc.name, isvc.router_name
    optional: list[tuple[bool | None, Make, Resource, str]] = [
        *((view.autoscaling.enabled, partial(build_hpa, view), HPAS, view.runtime_name)
          for view in views),
        (podmonitors, partial(build_podmonitor, isvc), PODMONITORS, name),
        (isvc.network_policy.enabled, partial(build_networkpolicy, isvc), NETWORKPOLICIES, name),
        (routed, partial(build_router_service_account, isvc), SERVICEACCOUNTS, router),
        (routed, partial(build_router_role, isvc), ROLES, router),
        (routed, partial(build_router_role_binding, isvc), ROLEBINDINGS, router),
        (routed and not disaggregated, partial(build_workers_service, isvc), SERVICES,
         isvc.workers_service_name),
        (routed, partial(build_router_deployment, isvc, run_as_user=run_as_user), DEPLOYMENTS,
         router),
        (routed, partial(build_router_pdb, isvc), PDBS, router),
        (None if podmonitors is None else podmonitors and routed,
         partial(build_router_podmonitor, isvc), PODMONITORS, router),
        (isvc.network_policy.enabled and routed, partial(build_router_networkpolicy, isvc),
         NETWORKPOLICIES, router),
        (None if inferencepools is None else isvc.inference_pool.enabled,
         partial(build_inferencepool, isvc), INFERENCEPOOLS, name),
    ]  # fmt: skip
    unwanted: list[tuple[Resource, str]] = []
    for enabled, make, resource, child in optional:
        if enabled:
            wanted.append(make())
        elif enabled is not None:
            unwanted.append((resource, child))
    return Plan(apply=tuple(wanted), remove=tuple(unwanted), retire=other_shape(isvc))


def other_shape(isvc: InferenceServiceSpec) -> tuple[tuple[Resource, str], ...]:
    """The runtime children of the shape the spec does not use, for switching
    disaggregation on (the service's Deployment, PDB and HPA go) or off (each pool's
    Deployment, Service, PDB and HPA go)."""
    if isvc.disaggregation.enabled:
        return ((DEPLOYMENTS, isvc.name), (PDBS, isvc.name), (HPAS, isvc.name))
    pools = [dataclasses.replace(isvc, role=role).runtime_name for role in c.ROLES]
    return tuple((kind, pool) for pool in pools for kind in (DEPLOYMENTS, SERVICES, PDBS, HPAS))


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


def adoptable(obj: Mapping[str, Any], owner_name: str) -> bool:
    """An orphan of this service: no controller, and the labels the operator gives the
    service's children (what an orphaning delete of the service leaves behind). It is
    adopted, as the Deployment controller adopts orphaned ReplicaSets: the next apply
    makes it ours again."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    return (
        controller_of(obj) is None
        and labels.get(c.LABEL_MANAGED_BY) == c.MANAGER_LABEL_VALUE
        and labels.get(c.LABEL_INSTANCE) == owner_name
    )


def check_ownership(
    the_plan: Plan, existing: Mapping[Key, Mapping[str, Any] | None], owner: Mapping[str, Any]
) -> None:
    """Raise Blocked unless every existing object the plan applies is ours, or an orphan of
    ours to adopt (pure). An object of a kind the plan removes is only deleted if it is
    ours, so it blocks nothing."""
    meta = owner["metadata"]
    for kind, name in (key_of(child) for child in the_plan.apply):
        current = existing.get((kind, name))
        if current is None or owned_by(current, meta["uid"]) or adoptable(current, meta["name"]):
            continue
        where = f"{kind} {meta['namespace']}/{name}"
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

    objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    created: list[Key] = field(default_factory=list)
    deleted: list[Key] = field(default_factory=list)
    adopted: list[Key] = field(default_factory=list)


async def read_children(
    api: CachedApi, the_plan: Plan, namespace: str
) -> dict[Key, dict[str, Any] | None]:
    """The current object of every child the plan applies or removes. One to remove is
    only ever ours (labelled, so watched): unknown to the cache means absent (a retired
    one is read from the cache even when the reconcile is fresh). One to apply unknown to
    the cache is read (it may be someone else's, which the cache never sees)."""
    found: dict[Key, dict[str, Any] | None] = {}
    for obj in the_plan.apply:
        resource, name = resource_of(obj), key_of(obj)[1]
        with optional_denials(resource):
            found[(resource.kind, name)] = await api.get(resource, namespace, name)
    for resource, name in the_plan.remove:
        with optional_denials(resource):
            found[(resource.kind, name)] = await api.get_ours(resource, namespace, name)
    for resource, name in the_plan.retire:
        found[(resource.kind, name)] = api.cache.get(resource.kind, namespace, name)
    return found


class optional_denials:
    """Within: a 403 for an optional kind is raised as OptionalForbidden."""

    def __init__(self, resource: Resource) -> None:
        self.resource = resource

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        if isinstance(error, ApiError) and error.forbidden and self.resource in OPTIONAL_RESOURCES:
            raise OptionalForbidden(self.resource, error) from error


async def apply_children(
    api: CachedApi,
    the_plan: Plan,
    existing: Mapping[Key, Mapping[str, Any] | None],
    *,
    owner: Mapping[str, Any],
) -> Applied:
    """Apply the plan (ownership already checked against `existing`)."""
    meta = owner["metadata"]
    namespace, owner_uid = meta["namespace"], meta["uid"]
    children = [dict(child) for child in the_plan.apply]
    kopf.adopt(children, owner=owner)  # type: ignore[arg-type]
    result = Applied()
    for child in (stamped(child) for child in children):
        key = key_of(child)
        current = existing.get(key)
        if current is not None and owned_by(current, owner_uid) and up_to_date(child, current):
            result.objects[key] = dict(current)  # as rendered already: no write
            continue
        with optional_denials(resource_of(child)):
            result.objects[key] = await api.apply(child)
        if current is None:
            result.created.append(key)
        elif not owned_by(current, owner_uid):
            result.adopted.append(key)  # an orphan of ours (check_ownership let it through)
    for resource, name in the_plan.unwanted:
        current = existing.get((resource.kind, name))
        if current is not None and owned_by(current, owner_uid):
            uid = current["metadata"]["uid"]
            with optional_denials(resource):
                gone = await api.delete(resource, namespace, name, uid=uid)
            if gone:
                result.deleted.append((resource.kind, name))
    return result


def deployment_of(applied: Applied, name: str) -> dict[str, Any]:
    return applied.objects[(DEPLOYMENTS.kind, name)]
