"""An API emulator close to a real API server wherever the operator depends on one.

kmock 0.8's KubernetesEmulator stores objects and streams watch events but leaves out what
an API server adds. `SluiceEmulator` fills the gaps:

- metadata.uid, resourceVersion, generation (bumped on spec changes), creationTimestamp,
  and generateName (Kopf names its Events that way);
- the status subresource: writes to the object ignore `status`, writes to `/status`
  ignore everything else (a handler that writes status the wrong way loses it here too);
- optimistic concurrency: a patch carrying `metadata.resourceVersion` fails with 409 when
  the object has moved on; a DELETE's `preconditions.uid` must match;
- server-side apply with field managers, as structured-merge-diff does it
  (field_managers.py, typed by the Kubernetes OpenAPI and the CRDs' schemas):
  `metadata.managedFields`, list-maps merged and owned item by item by their keys
  (containers, env vars, ports, volumes...), conflicts (409) per field unless forced,
  shared ownership, and a field or list item released by its only manager is removed
  (a Deployment's `spec.replicas` is then defaulted again to 1); merge/JSON patches and
  the scale subresource record their manager (`fieldManager`, or the User-Agent's
  product) as the owner of what they changed (the same writes on a real kube-apiserver:
  tests/cluster/test_cluster_ssa_listmaps.py);
- the scale subresource (`kubectl scale`, the HPA) sets `.spec.replicas`;
- label selectors on lists and watches (`a=b`, `a!=b`, `a`, `!a`, comma-joined);
- no-op writes produce no watch event and keep the resourceVersion; `dryRun=All`
  answers with what an update would store and changes nothing;
- only declared resources are served (a removed CRD's resource answers 404);
- garbage collection that lags, as the real collector does: deleting an owner deletes its
  dependents (by ownerReferences uid) from a background task, and a dependent created for
  an owner that no longer exists is collected too. Tests can hold the collector
  (`gc_held`) to see the window a real cluster has.

Test controls: `faults` (fail matching requests), `muted` (drop watch events of a
resource, like a watch that missed them), `gc_held`, `denied` (RBAC: the operator's
requests for a resource, watches included, answer 403 Forbidden with the message a real
API server writes, and a SelfSubjectAccessReview says so; discovery stays allowed, as
`system:discovery` grants it).

Not emulated (covered elsewhere): schema validation and defaulting beyond the fields in
field_managers.DEFAULTS (operator_validators.py and kubernetes-validate in the tests),
admission, RBAC beyond `denied` (the recorded requests are checked against
`rbac.REQUIRED_PERMISSIONS`), the Deployment, ReplicaSet and HPA controllers (tests act
as them).
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import itertools
import secrets
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp.web
import attrs
import field_managers as fm
import jsonpatch
import kmock
from operator_testkit import load_crd

STATUS = "status"
fm.register_crd(load_crd())  # the InferenceService, typed by its schema as the server does


@attrs.define(kw_only=True)
class SluiceEmulator(kmock.KubernetesEmulator):
    """kmock's emulator with the API-server behaviours listed in the module docstring."""

    # every request served, as plain dicts (see `record`)
    log: list[dict[str, Any]] = attrs.field(factory=list, init=False)
    # injected failures: [method, path suffix, HTTP status, times left]
    faults: list[list[Any]] = attrs.field(factory=list, init=False)
    # plurals whose watch events are dropped
    muted: set[str] = attrs.field(factory=set, init=False)
    # (plural, verbs) the operator may not use (RBAC); an empty verb set denies every verb
    denied: dict[str, frozenset[str]] = attrs.field(factory=dict, init=False)
    # field ownership per object uid
    ownership: dict[str, fm.Ownership] = attrs.field(factory=dict, init=False)
    # owner uids whose dependents the collector has still to delete
    gc_pending: list[str] = attrs.field(factory=list, init=False)
    gc_held: bool = attrs.field(default=False, init=False)
    # what a dry-run write would have stored, by request (answered instead of the object)
    dry_runs: dict[int, dict[str, Any]] = attrs.field(factory=dict, init=False)
    _gc_wakeup: asyncio.Event | None = attrs.field(default=None, init=False)
    _gc_task: asyncio.Task[None] | None = attrs.field(default=None, init=False)

    _versions = itertools.count(1)
    _KEEP = 16  # requests kmock keeps for its own matching (more than are ever in flight)

    # -- the garbage collector --------------------------------------------------------------

    def start_gc(self) -> None:
        self._gc_wakeup = asyncio.Event()
        self._gc_task = asyncio.get_running_loop().create_task(self._collector())

    async def stop_gc(self) -> None:
        if self._gc_task is not None:
            self._gc_task.cancel()
            try:
                await self._gc_task
            except asyncio.CancelledError:
                pass

    def wake_gc(self) -> None:
        if self._gc_wakeup is not None:
            self._gc_wakeup.set()

    async def _collector(self) -> None:
        assert self._gc_wakeup is not None
        while True:
            await self._gc_wakeup.wait()
            self._gc_wakeup.clear()
            await asyncio.sleep(0)  # a real collector is never synchronous with the delete
            while self.gc_pending and not self.gc_held:
                owner_uid = self.gc_pending.pop(0)
                async with self._lock:
                    await self._collect(owner_uid)

    async def _collect(self, owner_uid: str) -> None:
        if owner_uid in self._live_uids():
            return  # an orphan check whose owner exists after all
        for (resource, namespace, name), obj in list(self._objects.items()):
            if obj.deleted:
                continue
            refs = obj.raw.get("metadata", {}).get("ownerReferences") or []
            if any(ref.get("uid") == owner_uid for ref in refs):
                await self._delete(resource, namespace, name)

    def _schedule_gc(self, owner_uid: str) -> None:
        self.gc_pending.append(owner_uid)
        self.wake_gc()

    # -- requests ----------------------------------------------------------------------------

    async def _handle(self, request: kmock.Request) -> Any:
        entry = record(request)
        self.log.append(entry)
        try:
            response = await self._respond(request)
        except kmock.KubernetesError as error:
            entry["status"] = error.status
            raise
        entry["status"] = getattr(response, "status", 200)
        return response

    async def _respond(self, request: kmock.Request) -> Any:
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
        if request.url.path.endswith("/selfsubjectaccessreviews"):
            return aiohttp.web.json_response(self._access_review(request), status=201)
        forbidden = self._forbidden(request)
        if forbidden is not None:
            raise kmock.KubernetesError(403, "Forbidden", forbidden)
        if request.resource is not None and request.action in (
            kmock.action.CREATE,
            kmock.action.UPDATE,
            kmock.action.DELETE,
        ):
            if request.resource not in self._get_resources():
                raise kmock.KubernetesError(
                    404, "NotFound", "the server could not find the resource"
                )
            async with self._lock:
                await self._mutate(request)
        # skip KubernetesEmulator._handle (its state changes are replaced by ours)
        return await kmock.RawHandler._handle(self, request)

    def _forbidden(self, request: kmock.Request) -> str | None:
        """The API server's RBAC message if the operator may not do this request."""
        resource = request.resource
        if resource is None or resource.plural not in self.denied:
            return None
        if not _header(request.headers, "User-Agent").startswith(OPERATOR_AGENTS):
            return None
        verb = rbac_verb(record(request), named=request.name is not None)
        verbs = self.denied[resource.plural]
        if verbs and verb not in verbs:
            return None
        where = f' in the namespace "{request.namespace}"' if request.namespace else ""
        group = resource.group or ""
        return (
            f"{resource.plural}{'.' + group if group else ''} is forbidden: User"
            f' "system:serviceaccount:sluice-system:sluice-operator" cannot {verb} resource'
            f' "{resource.plural}" in API group "{group}"{where}'
        )

    def _access_review(self, request: kmock.Request) -> dict[str, Any]:
        """A SelfSubjectAccessReview answered from `denied`, as RBAC would (every
        authenticated user may create one: `system:basic-user`)."""
        review = copy.deepcopy(request.data or {})
        attributes = (review.get("spec") or {}).get("resourceAttributes") or {}
        verbs = self.denied.get(attributes.get("resource", ""))
        denied = verbs is not None and (not verbs or attributes.get("verb") in verbs)
        review["status"] = {"allowed": not denied, **({"denied": True} if denied else {})}
        return review

    async def _mutate(self, request: kmock.Request) -> None:
        if request.action == kmock.action.CREATE:
            await self._create(
                request.resource, request.namespace, request.data, manager_of(request)
            )
        elif request.action == kmock.action.UPDATE and request.name is not None:
            await self._update(request)
        elif request.action == kmock.action.DELETE and request.name is not None:
            preconditions = (request.data or {}).get("preconditions") or {}
            await self._delete(
                request.resource, request.namespace, request.name, uid=preconditions.get("uid")
            )

    def _get_resources(self) -> list[Any]:
        """Only the declared resources are served (kmock also serves the resources of any
        object ever stored; a real API server stops serving a CRD's resource when it goes)."""
        return kmock.KubernetesScaffold._get_resources(self)

    async def _serve_update(self, request: kmock.Request) -> Any:
        if id(request) in self.dry_runs:
            return self.dry_runs.pop(id(request))
        return await super()._serve_update(request)

    async def _serve_list(self, request: kmock.Request) -> Any:
        listing = await super()._serve_list(request)
        selector = parse_selector(request.params.get("labelSelector", ""))
        listing["items"] = [item for item in listing["items"] if selected(item, selector)]
        return listing

    async def _serve_watch(self, request: kmock.Request) -> AsyncIterator[Any]:
        selector = parse_selector(request.params.get("labelSelector", ""))
        async for event in super()._serve_watch(request):
            if not isinstance(event, Mapping) or selected(event.get("object") or {}, selector):
                yield event

    def _live(self, key: tuple[Any, str | None, str]) -> Any:
        if key in self._objects and not self._objects[key].deleted:
            return self._objects[key]
        return None

    async def _emit(self, resource: Any, kind: str, raw: Mapping[str, Any]) -> None:
        if resource.plural in self.muted:
            return
        await self._buses[resource].put({"type": kind, "object": copy.deepcopy(dict(raw))})

    def _subresources(self, resource: Any) -> set[str]:
        return set(self._resources[resource].subresources) if resource in self._resources else set()

    def _owners_of(self, obj: Mapping[str, Any]) -> fm.Ownership:
        return self.ownership.setdefault(obj["metadata"]["uid"], fm.Ownership())

    def _stamp_managed_fields(
        self, obj: dict[str, Any], previous: Mapping[str, Any] | None = None
    ) -> None:
        """Write the ownership into metadata.managedFields; entries that did not change keep
        their time (so a write that changes nothing stays a no-op)."""
        entries = self._owners_of(obj).managed_fields(obj.get("apiVersion", ""), _now())
        before = {
            _entry_key(e): e
            for e in ((previous or {}).get("metadata") or {}).get("managedFields") or []
        }
        obj["metadata"]["managedFields"] = [before.get(_entry_key(e), e) for e in entries]

    async def _create(
        self,
        resource: Any,
        namespace: str | None,
        data: dict[str, Any],
        manager: str,
        *,
        applied: bool = False,
        force: bool = False,
    ) -> None:
        meta = data.setdefault("metadata", {})
        if namespace:
            meta["namespace"] = namespace
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + secrets.token_hex(3)
        key = (resource, meta.get("namespace"), meta["name"])
        if self._live(key) is not None:
            raise kmock.KubernetesError(409, "AlreadyExists", f"{meta['name']} already exists")
        subresources = self._subresources(resource)
        if STATUS in subresources:
            data.pop(STATUS, None)
        uid = str(uuid.uuid4())
        owners = self.ownership[uid] = fm.Ownership()
        if applied:
            obj = fm.apply(None, data, owners, manager, force=force)
        else:
            obj = fm.apply_defaults(copy.deepcopy(data))
            fm.update({}, obj, owners, manager)
        obj.setdefault("metadata", {}).update(
            name=meta["name"],
            uid=uid,
            resourceVersion=str(next(self._versions)),
            generation=1,
            creationTimestamp=_now(),
        )
        if meta.get("namespace"):
            obj["metadata"]["namespace"] = meta["namespace"]
        self._stamp_managed_fields(obj)
        if resource.plural == "customresourcedefinitions":
            fm.register_crd(obj)
        if key in self._objects:
            self._objects[key].create(obj)
        else:
            self._objects[key] = obj
        await self._emit(resource, "ADDED", obj)
        owner_uids = {ref.get("uid") for ref in obj["metadata"].get("ownerReferences") or []}
        if owner_uids and not owner_uids & self._live_uids():
            for owner_uid in owner_uids:  # the collector deletes orphans too
                self._schedule_gc(owner_uid)

    def _live_uids(self) -> set[str]:
        return {obj.raw["metadata"].get("uid") for obj in self._objects.values() if not obj.deleted}

    async def _update(self, request: kmock.Request) -> None:
        resource, key = request.resource, (request.resource, request.namespace, request.name)
        content_type = _header(request.headers, "Content-Type")
        current = self._live(key)
        data = request.data
        manager = manager_of(request)
        force = request.params.get("force") == "true"
        applying = "apply-patch" in content_type
        if current is None:
            if not applying:
                raise kmock.KubernetesObjectNotFoundError()
            await self._create(
                resource, request.namespace, data, manager, applied=True, force=force
            )
            return
        old = copy.deepcopy(current.raw)
        if isinstance(data, Mapping):
            _check_resource_version(old, data)
        subresources = self._subresources(resource)
        dry_run = request.params.get("dryRun") == "All"
        owners = self._owners_of(old)
        if dry_run:
            owners = copy.deepcopy(owners)
        subresource = request.subresource or ""
        if applying:
            config = {k: v for k, v in data.items() if k != STATUS}
            try:
                new = fm.apply(old, config, owners, manager, force=force)
            except fm.ApplyConflict as conflict:
                raise kmock.KubernetesError(409, "Conflict", str(conflict)) from conflict
        else:
            if isinstance(data, list):  # JSON patch
                new = jsonpatch.apply_patch(old, data)
                if STATUS in subresources and subresource != STATUS:
                    _keep_status(old, new)
            elif subresource == STATUS:
                new = merge_patch(old, {STATUS: data.get(STATUS)})
            elif subresource == "scale":  # a Scale object; specReplicasPath is .spec.replicas
                new = merge_patch(old, {"spec": {"replicas": data["spec"]["replicas"]}})
            else:
                patch = {k: v for k, v in data.items() if k != STATUS or STATUS not in subresources}
                new = merge_patch(old, patch)
            new["metadata"] = {**_server_metadata(old), **_client_metadata(new)}
            fm.update(old, new, owners, manager, subresource=subresource)
        new["metadata"]["resourceVersion"] = old["metadata"]["resourceVersion"]
        if dry_run:
            self.dry_runs[id(request)] = new  # nothing is stored, nothing is announced
            return
        self._stamp_managed_fields(new, previous=old)
        if new == old:
            return  # a no-op write: no event, same resourceVersion
        if _content(new) != _content(old):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        new["metadata"]["resourceVersion"] = str(next(self._versions))
        current.history.append(new)
        await self._emit(resource, "MODIFIED", new)
        if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
            await self._delete(resource, request.namespace, request.name)

    async def _delete(
        self, resource: Any, namespace: str | None, name: str, *, uid: str | None = None
    ) -> None:
        current = self._live((resource, namespace, name))
        if current is None:
            raise kmock.KubernetesObjectNotFoundError()
        raw = current.raw
        if uid is not None and raw["metadata"].get("uid") != uid:
            raise kmock.KubernetesError(
                409, "Conflict", f"Precondition failed: UID in precondition: {uid}"
            )
        if raw["metadata"].get("finalizers"):
            if not raw["metadata"].get("deletionTimestamp"):
                current.patch({"metadata": {"deletionTimestamp": _now()}})
                await self._emit(resource, "MODIFIED", current.raw)
            return
        current.delete()
        await self._emit(resource, "DELETED", raw)
        self._schedule_gc(raw["metadata"]["uid"])


def record(request: kmock.Request) -> dict[str, Any]:
    method = request.method
    return {
        "method": method.value if hasattr(method, "value") else str(method),
        "path": request.url.path,
        "params": dict(request.params),
        "content_type": _header(request.headers, "Content-Type"),
        "data": copy.deepcopy(request.data),
        "user_agent": _header(request.headers, "User-Agent"),
        "time": time.monotonic(),
        "status": None,  # the response's, once answered
    }


OPERATOR_AGENTS = ("sluice-operator", "kopf/")


def rbac_verb(entry: Mapping[str, Any], *, named: bool) -> str:
    """The RBAC verb of a recorded request (an apply is a patch)."""
    method = entry["method"]
    if method == "GET":
        if entry["params"].get("watch") == "true":
            return "watch"
        return "get" if named else "list"
    return {"POST": "create", "DELETE": "delete", "PUT": "update"}.get(method, "patch")


def manager_of(request: kmock.Request) -> str:
    """The field manager of a write: `fieldManager`, else the User-Agent's product name
    (what the API server does: `kubectl/v1.30.0 (...)` → `kubectl`)."""
    explicit = request.params.get("fieldManager")
    if explicit:
        return explicit
    agent = _header(request.headers, "User-Agent")
    return agent.split("/", 1)[0].strip() or "unknown"


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


Selector = list[tuple[str, str, str | None]]  # (op, key, value): "=", "!=", "exists", "!"


def parse_selector(text: str) -> Selector:
    terms: Selector = []
    for term in (t.strip() for t in text.split(",") if t.strip()):
        if "!=" in term:
            key, value = term.split("!=", 1)
            terms.append(("!=", key.strip(), value.strip()))
        elif "=" in term:
            key, value = term.replace("==", "=").split("=", 1)
            terms.append(("=", key.strip(), value.strip()))
        elif term.startswith("!"):
            terms.append(("!", term[1:].strip(), None))
        else:
            terms.append(("exists", term, None))
    return terms


def selected(obj: Mapping[str, Any], selector: Selector) -> bool:
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for op, key, value in selector:
        if op == "=" and labels.get(key) != value:
            return False
        if op == "!=" and labels.get(key) == value:
            return False
        if op == "exists" and key not in labels:
            return False
        if op == "!" and key in labels:
            return False
    return True


def _check_resource_version(current: Mapping[str, Any], patch: Mapping[str, Any]) -> None:
    wanted = (patch.get("metadata") or {}).get("resourceVersion")
    if wanted is not None and wanted != current["metadata"]["resourceVersion"]:
        raise kmock.KubernetesError(
            409,
            "Conflict",
            "the object has been modified; please apply your changes to the latest version"
            " and try again",
        )


def _entry_key(entry: Mapping[str, Any]) -> str:
    return repr(sorted((k, repr(v)) for k, v in entry.items() if k != "time"))


def _server_metadata(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {k: v for k, v in meta.items() if k in fm.SERVER_METADATA}


def _client_metadata(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {k: v for k, v in meta.items() if k not in fm.SERVER_METADATA}


def _keep_status(old: Mapping[str, Any], new: dict[str, Any]) -> None:
    if STATUS in old:
        new[STATUS] = copy.deepcopy(old[STATUS])
    else:
        new.pop(STATUS, None)


def _header(headers: Mapping[str, str], name: str) -> str:
    return next((v for k, v in headers.items() if k.lower() == name.lower()), "")


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _content(obj: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in ("metadata", STATUS)}
