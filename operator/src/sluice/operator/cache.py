"""An informer-style cache of the objects the operator watches, so a reconcile reads no
API in the steady state.

Kopf's watches (handlers.py) feed `Cache.observe` with every event of the
InferenceServices, of the children (label `app.kubernetes.io/managed-by=sluice-operator`)
and of their ReplicaSets and pods. The reconcile's own API answers are written through
(`remember`, `drop`): what it applied, deleted or read. An entry is replaced only by a
newer resourceVersion (compared as the integers etcd hands out; an opaque one always
replaces), so a late watch event never rolls back a write the reconcile saw answered.

`observe` also says whether an event matters, i.e. whether it changes anything a
reconcile reads (`relevant_view`): the spec and metadata of every kind, and the status
only where the status is read: the Deployments (rollout), ReplicaSets and pods
(readiness and pod problems), and of an HPA only its AbleToScale / ScalingActive problem.
So the HPA's status writes (its metrics, every 15 s) and our own no-op echoes trigger
nothing.

`CachedApi` is the API as one reconcile sees it: reads from the cache, or, in a `fresh`
reconcile (the first of a key, the resync, a retry after a failure), from the API server
(refreshing the cache). A cache miss of a named object reads through. A watch that
missed an event (or a deletion before the watch started) is healed by the next fresh
reconcile, at the latest one resync period later.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from .conditions import hpa_problem
from .kube import HPAS, KubeApi, Resource
from .replicas import field_owners

Key = tuple[str, str, str]  # (kind, namespace, name)

# kinds whose status a reconcile reads as a whole
STATUS_READ = frozenset({"Deployment", "ReplicaSet", "Pod"})
IGNORED_METADATA = frozenset({"resourceVersion", "managedFields"})


def key_of(obj: Mapping[str, Any]) -> Key:
    meta = obj.get("metadata") or {}
    return str(obj.get("kind", "")), str(meta.get("namespace", "")), str(meta.get("name", ""))


def _version(obj: Mapping[str, Any]) -> int | None:
    raw = (obj.get("metadata") or {}).get("resourceVersion")
    return int(raw) if isinstance(raw, str) and raw.isdigit() else None


def relevant_view(obj: Mapping[str, Any]) -> dict[str, Any]:
    """What a reconcile reads of `obj`: a change outside it needs no reconcile."""
    kind = obj.get("kind")
    meta = obj.get("metadata") or {}
    view: dict[str, Any] = {k: v for k, v in obj.items() if k not in ("metadata", "status")}
    view["metadata"] = {k: v for k, v in meta.items() if k not in IGNORED_METADATA}
    if kind == "Deployment":  # who owns spec.replicas decides the hand-over (replicas.py)
        view["replicasOwners"] = sorted(field_owners(obj, "spec", "replicas"))
    if kind in STATUS_READ:
        view["status"] = obj.get("status")
    elif kind == HPAS.kind:
        view["problem"] = hpa_problem(obj)
    return view


class Cache:
    """Objects by (kind, namespace, name), newest resourceVersion wins."""

    def __init__(self) -> None:
        self._objects: dict[Key, dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self._objects)

    def observe(self, event_type: str | None, body: Mapping[str, Any]) -> bool:
        """Take a watch event in; True if it changes what a reconcile reads."""
        key = key_of(body)
        before = self._objects.get(key)
        if event_type == "DELETED":
            if before is not None and _same_uid(before, body):
                del self._objects[key]
                return True
            return before is None  # a deletion of something never seen: look anyway
        if not self.remember(body):
            return False  # older than what is known
        return before is None or relevant_view(before) != relevant_view(body)

    def remember(self, obj: Mapping[str, Any]) -> bool:
        """Store `obj` unless a newer version of it is known; True if stored."""
        key = key_of(obj)
        before = self._objects.get(key)
        if before is not None and _same_uid(before, obj):
            old, new = _version(before), _version(obj)
            if old is not None and new is not None and new < old:
                return False
        self._objects[key] = copy.deepcopy(dict(obj))
        return True

    def drop(self, kind: str, namespace: str, name: str) -> None:
        self._objects.pop((kind, namespace, name), None)

    def get(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        found = self._objects.get((kind, namespace, name))
        return copy.deepcopy(found) if found is not None else None

    def select(self, kind: str, namespace: str, labels: Mapping[str, str]) -> list[dict[str, Any]]:
        """Objects of `kind` in `namespace` whose labels include all of `labels`."""
        return [
            copy.deepcopy(obj)
            for (k, ns, _), obj in sorted(self._objects.items())
            if k == kind and ns == namespace and _has_labels(obj, labels)
        ]

    def replace(
        self,
        kind: str,
        namespace: str,
        labels: Mapping[str, str],
        items: list[dict[str, Any]],
    ) -> None:
        """A fresh listing: what it selects is exactly `items`."""
        for obj in self.select(kind, namespace, labels):
            self.drop(*key_of(obj))
        for item in items:
            self.remember({"kind": kind, **item})


def _same_uid(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    return (a.get("metadata") or {}).get("uid") == (b.get("metadata") or {}).get("uid")


def _has_labels(obj: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    have = (obj.get("metadata") or {}).get("labels") or {}
    return all(have.get(k) == v for k, v in labels.items())


class CachedApi:
    """The API for one reconcile: reads from the cache unless `fresh`, writes through."""

    def __init__(self, api: KubeApi, cache: Cache, *, fresh: bool) -> None:
        self.api = api
        self.cache = cache
        self.fresh = fresh

    async def get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        if not self.fresh:
            hit = self.cache.get(resource.kind, namespace, name)
            if hit is not None:
                return hit
        found = await self.api.get(resource, namespace, name)
        if found is None:
            self.cache.drop(resource.kind, namespace, name)
        else:
            self.cache.remember({"kind": resource.kind, **found})
        return found

    async def get_ours(
        self, resource: Resource, namespace: str, name: str
    ) -> dict[str, Any] | None:
        """An object that exists only as ours (labelled, so watched): from the cache
        without reading through, unless fresh."""
        if not self.fresh:
            return self.cache.get(resource.kind, namespace, name)
        return await self.get(resource, namespace, name)

    async def list(
        self, resource: Resource, namespace: str, label_selector: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        if not self.fresh:
            return self.cache.select(resource.kind, namespace, label_selector)
        items = await self.api.list(resource, namespace, label_selector)
        self.cache.replace(resource.kind, namespace, label_selector, items)
        return items

    async def apply(self, obj: Mapping[str, Any], **options: Any) -> dict[str, Any]:
        stored = await self.api.apply(obj, **options)
        if not options.get("dry_run"):
            self.cache.remember(stored)
        return stored

    async def delete(self, resource: Resource, namespace: str, name: str, *, uid: str) -> bool:
        gone = await self.api.delete(resource, namespace, name, uid=uid)
        self.cache.drop(resource.kind, namespace, name)
        return gone

    async def patch_status(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        *,
        resource_version: str,
    ) -> dict[str, Any]:
        stored = await self.api.patch_status(
            resource, namespace, name, status, resource_version=resource_version
        )
        if stored.get("metadata"):
            self.cache.remember({"kind": resource.kind, **stored})
        return stored

    async def scale(self, resource: Resource, namespace: str, name: str, replicas: int) -> None:
        await self.api.scale(resource, namespace, name, replicas)
        self.cache.drop(resource.kind, namespace, name)  # read it again

    async def create(self, resource: Resource, namespace: str, obj: Mapping[str, Any]) -> None:
        await self.api.create(resource, namespace, obj)

    async def serves(self, resource: Resource) -> bool:
        return await self.api.serves(resource)
