"""An API emulator closer to a real API server, for the operator tests.

kmock 0.8's KubernetesEmulator stores objects and streams watch events but leaves out what
an API server adds. `SluiceEmulator` fills the gaps the operator depends on:

- metadata.uid, resourceVersion, generation (bumped on spec changes), creationTimestamp,
  and generateName (Kopf names its Events that way);
- the status subresource: writes to the object ignore `status`, writes to `/status`
  ignore everything else (a handler that writes status the wrong way loses it here too);
- server-side apply (`application/apply-patch+yaml`): creates missing objects and
  replaces the applier's content instead of merging (our operator is the only manager of
  its children, so this is what SSA does for it);
- the scale subresource (`kubectl scale`) sets `.spec.replicas`;
- no-op writes produce no watch event and keep the resourceVersion;
- garbage collection: deleting an owner deletes its dependents (by ownerReferences uid),
  and an object created for an owner that no longer exists is deleted at once.

Not emulated (covered elsewhere): schema validation and defaulting (operator_validators.py and
kubernetes-validate in the tests), admission, RBAC (the recorded requests are checked
against `rbac.REQUIRED_PERMISSIONS`), the Deployment controller (tests write Deployment
status themselves), field ownership conflicts between several managers.
"""

from __future__ import annotations

import copy
import datetime
import itertools
import secrets
import uuid
from collections.abc import Mapping
from typing import Any

import attrs
import jsonpatch
import kmock


@attrs.define(kw_only=True)
class SluiceEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with the API-server behaviours listed in the module docstring."""

    # every request served, as plain dicts (see `record`)
    log: list[dict[str, Any]] = attrs.field(factory=list, init=False)
    # injected failures: [method, path suffix, HTTP status, times left]
    faults: list[list[Any]] = attrs.field(factory=list, init=False)

    _versions = itertools.count(1)
    _KEEP = 16  # requests kmock keeps for its own matching (more than are ever in flight)

    async def _handle(self, request: kmock.Request) -> Any:
        self.log.append(record(request))
        # kmock matches each request against all earlier ones (O(n) per request); keep the
        # tail only, or a test run slows down quadratically. Our own log keeps everything.
        del self._requests[: -self._KEEP]
        for fault in self.faults:
            method, suffix, status, left = fault
            if (
                left > 0
                and record(request)["method"] == method
                and request.url.path.endswith(suffix)
            ):
                fault[3] -= 1
                raise kmock.KubernetesError(status, "Injected", f"injected failure {status}")
        if request.resource is not None and request.action in (
            kmock.action.CREATE,
            kmock.action.UPDATE,
            kmock.action.DELETE,
        ):
            async with self._lock:
                await self._mutate(request)
        # skip KubernetesEmulator._handle (its state changes are replaced by ours)
        return await kmock.RawHandler._handle(self, request)

    async def _mutate(self, request: kmock.Request) -> None:
        if request.action == kmock.action.CREATE:
            await self._create(request.resource, request.namespace, request.data)
        elif request.action == kmock.action.UPDATE and request.name is not None:
            await self._update(request)
        elif request.action == kmock.action.DELETE and request.name is not None:
            await self._delete(request.resource, request.namespace, request.name)

    def _live(self, key: tuple[Any, str | None, str]) -> Any:
        if key in self._objects and not self._objects[key].deleted:
            return self._objects[key]
        return None

    async def _emit(self, resource: Any, kind: str, raw: Mapping[str, Any]) -> None:
        await self._buses[resource].put({"type": kind, "object": copy.deepcopy(dict(raw))})

    def _subresources(self, resource: Any) -> set[str]:
        return set(self._resources[resource].subresources) if resource in self._resources else set()

    async def _create(self, resource: Any, namespace: str | None, data: dict[str, Any]) -> None:
        meta = data.setdefault("metadata", {})
        if namespace:
            meta["namespace"] = namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)
        key = (resource, meta.get("namespace"), meta["name"])
        if self._live(key) is not None:
            raise kmock.KubernetesError(409, "AlreadyExists", f"{meta['name']} already exists")
        meta.update(
            uid=str(uuid.uuid4()),
            resourceVersion=str(next(self._versions)),
            generation=1,
            creationTimestamp=_now(),
        )
        if "status" in self._subresources(resource):
            data.pop("status", None)
        if key in self._objects:
            self._objects[key].create(data)
        else:
            self._objects[key] = data
        await self._emit(resource, "ADDED", data)
        owners = {ref.get("uid") for ref in meta.get("ownerReferences") or []}
        if owners and not owners & self._live_uids():
            await self._delete(resource, meta.get("namespace"), meta["name"])  # GC: owner is gone

    def _live_uids(self) -> set[str]:
        return {obj.raw["metadata"].get("uid") for obj in self._objects.values() if not obj.deleted}

    async def _update(self, request: kmock.Request) -> None:
        resource, key = request.resource, (request.resource, request.namespace, request.name)
        content_type = _header(request.headers, "Content-Type")
        current = self._live(key)
        data = request.data
        if current is None:
            if "apply-patch" not in content_type:
                raise kmock.KubernetesObjectNotFoundError()
            await self._create(resource, request.namespace, data)
            return
        old = copy.deepcopy(current.raw)
        subresources = self._subresources(resource)
        if isinstance(data, list):  # JSON patch
            new = jsonpatch.apply_patch(old, data)
        elif request.subresource == "status":
            new = merge_patch(old, {"status": data.get("status")})
        elif request.subresource == "scale":  # a Scale object; specReplicasPath is .spec.replicas
            new = merge_patch(old, {"spec": {"replicas": data["spec"]["replicas"]}})
        elif "apply-patch" in content_type:
            new = _server_side_apply(old, data, keep_status="status" in subresources)
        else:
            if "status" in subresources:
                data = {k: v for k, v in data.items() if k != "status"}
            new = merge_patch(old, data)
        if new == old:
            return  # a no-op write: no event, same resourceVersion
        if _content(new) != _content(old):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        new["metadata"]["resourceVersion"] = str(next(self._versions))
        current.history.append(new)
        await self._emit(resource, "MODIFIED", new)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            await self._delete(resource, request.namespace, request.name)

    async def _delete(self, resource: Any, namespace: str | None, name: str) -> None:
        current = self._live((resource, namespace, name))
        if current is None:
            raise kmock.KubernetesObjectNotFoundError()
        raw = current.raw
        if raw["metadata"].get("finalizers"):
            if not raw["metadata"].get("deletionTimestamp"):
                current.patch({"metadata": {"deletionTimestamp": _now()}})
                await self._emit(resource, "MODIFIED", current.raw)
            return
        current.delete()
        await self._emit(resource, "DELETED", raw)
        await self._collect_garbage(raw["metadata"]["uid"])

    async def _collect_garbage(self, owner_uid: str) -> None:
        for (resource, namespace, name), obj in list(self._objects.items()):
            if obj.deleted:
                continue
            refs = obj.raw.get("metadata", {}).get("ownerReferences") or []
            if any(ref.get("uid") == owner_uid for ref in refs):
                await self._delete(resource, namespace, name)


def record(request: kmock.Request) -> dict[str, Any]:
    method = request.method
    return {
        "method": method.value if hasattr(method, "value") else str(method),
        "path": request.url.path,
        "params": dict(request.params),
        "content_type": _header(request.headers, "Content-Type"),
        "data": copy.deepcopy(request.data),
        "user_agent": _header(request.headers, "User-Agent"),
    }


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge, null deletes, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _header(headers: Mapping[str, str], name: str) -> str:
    return next((v for k, v in headers.items() if k.lower() == name.lower()), "")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _content(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


def _server_side_apply(
    old: dict[str, Any], applied: Mapping[str, Any], *, keep_status: bool
) -> dict[str, Any]:
    """The applier's content replaces what it sent before; server metadata stays."""
    new = copy.deepcopy(dict(applied))
    meta = new.setdefault("metadata", {})
    for field in (
        "uid",
        "resourceVersion",
        "generation",
        "creationTimestamp",
        "deletionTimestamp",
        "finalizers",
    ):
        if field in old.get("metadata", {}):
            meta[field] = old["metadata"][field]
    if keep_status and "status" in old:
        new["status"] = old["status"]
    return new
