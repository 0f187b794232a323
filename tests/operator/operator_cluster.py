"""A handle on the emulated cluster for synchronous tests: the emulator runs on its own
event loop in a thread and is reached over HTTP, like kubectl would."""

from __future__ import annotations

import asyncio
import copy
import json
import pathlib
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import kmock
import yaml
from operator_emulator import SluiceEmulator
from operator_testkit import load_crd

T = TypeVar("T")


CORE_RESOURCES: dict[str, kmock.ResourceInfo] = {
    "v1/namespaces": kmock.ResourceInfo(
        kind="Namespace", namespaced=False, verbs={"get", "list", "watch"}
    ),
    "v1/secrets": kmock.ResourceInfo(
        kind="Secret", namespaced=True, verbs={"create", "get", "list", "watch"}
    ),
    "v1/events": kmock.ResourceInfo(
        kind="Event", namespaced=True, verbs={"create", "get", "list", "watch"}
    ),
    "v1/services": kmock.ResourceInfo(
        kind="Service",
        namespaced=True,
        verbs={"create", "get", "list", "watch", "patch", "delete"},
        subresources={"status"},
    ),
    "apps/v1/deployments": kmock.ResourceInfo(
        kind="Deployment",
        namespaced=True,
        verbs={"create", "get", "list", "watch", "patch", "delete"},
        subresources={"status", "scale"},
    ),
    "autoscaling/v2/horizontalpodautoscalers": kmock.ResourceInfo(
        kind="HorizontalPodAutoscaler",
        namespaced=True,
        verbs={"create", "get", "list", "watch", "patch", "delete"},
        subresources={"status"},
    ),
    "policy/v1/poddisruptionbudgets": kmock.ResourceInfo(
        kind="PodDisruptionBudget",
        namespaced=True,
        verbs={"create", "get", "list", "watch", "patch", "delete"},
        subresources={"status"},
    ),
    "v1/pods": kmock.ResourceInfo(
        kind="Pod",
        namespaced=True,
        verbs={"create", "get", "list", "watch", "patch", "delete"},
        subresources={"status"},
    ),
    "apps/v1/replicasets": kmock.ResourceInfo(
        kind="ReplicaSet",
        namespaced=True,
        verbs={"create", "get", "list", "watch", "patch", "delete"},
        subresources={"status", "scale"},
    ),
    "networking.k8s.io/v1/networkpolicies": kmock.ResourceInfo(
        kind="NetworkPolicy",
        namespaced=True,
        verbs={"create", "get", "list", "watch", "patch", "delete"},
    ),
    "v1/serviceaccounts": kmock.ResourceInfo(
        kind="ServiceAccount",
        namespaced=True,
        verbs={"create", "get", "list", "watch", "patch", "delete"},
    ),
    "rbac.authorization.k8s.io/v1/roles": kmock.ResourceInfo(
        kind="Role",
        namespaced=True,
        verbs={"create", "get", "list", "watch", "patch", "delete"},
    ),
    "rbac.authorization.k8s.io/v1/rolebindings": kmock.ResourceInfo(
        kind="RoleBinding",
        namespaced=True,
        verbs={"create", "get", "list", "watch", "patch", "delete"},
    ),
    "discovery.k8s.io/v1/endpointslices": kmock.ResourceInfo(
        kind="EndpointSlice",
        namespaced=True,
        verbs={"create", "get", "list", "watch", "patch", "delete"},
    ),
    "apiextensions.k8s.io/v1/customresourcedefinitions": kmock.ResourceInfo(
        kind="CustomResourceDefinition",
        namespaced=False,
        verbs={"create", "get", "list", "watch"},
    ),
}
PODMONITOR_RESOURCE = "monitoring.coreos.com/v1/podmonitors"
PODMONITOR_INFO = kmock.ResourceInfo(
    kind="PodMonitor",
    namespaced=True,
    verbs={"create", "get", "list", "watch", "patch", "delete"},
)
INFERENCEPOOL_RESOURCE = "inference.networking.k8s.io/v1/inferencepools"
INFERENCEPOOL_INFO = kmock.ResourceInfo(
    kind="InferencePool",
    namespaced=True,
    verbs={"create", "get", "list", "watch", "patch", "delete"},
)


def crd_resource_info(crd: Mapping[str, Any]) -> tuple[str, kmock.ResourceInfo]:
    names = crd["spec"]["names"]
    version = crd["spec"]["versions"][0]
    key = f"{crd['spec']['group']}/{version['name']}/{names['plural']}"
    return key, kmock.ResourceInfo(
        kind=names["kind"],
        singular=names["singular"],
        namespaced=crd["spec"]["scope"] == "Namespaced",
        shortnames=set(names.get("shortNames", [])),
        verbs={"create", "get", "list", "watch", "patch", "delete", "update"},
        subresources=set(version.get("subresources", {})),
    )


class Cluster:
    """The emulator served on a local port from a background event loop."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="kmock", daemon=True)
        self._thread.start()
        if not self._started.wait(10):
            raise RuntimeError("the API emulator did not start")

    def _run(self) -> None:
        self._loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        async with SluiceEmulator() as emulator, kmock.Server(emulator) as server:
            self.emulator = emulator
            self.url = str(server.url).rstrip("/")
            for key, info in CORE_RESOURCES.items():
                emulator.resources[key] = info
            key, info = crd_resource_info(load_crd())
            emulator.resources[key] = info
            emulator.start_gc()
            self._started.set()
            await self._stop.wait()
            await emulator.stop_gc()

    def close(self) -> None:
        assert self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)

    def on_loop(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the emulator's loop (its state is not thread-safe)."""

        async def call() -> T:
            return fn()

        return asyncio.run_coroutine_threadsafe(call(), self._loop).result(10)

    def declare(self, key: str, info: kmock.ResourceInfo) -> None:
        """Serve a custom resource, as installing its CRD does (the CRD object is created
        too: Kopf notices new resources through CRD events)."""
        self.on_loop(lambda: self.emulator.resources.__setitem__(key, info))
        code, result = self.request("POST", CRDS, _crd_for(key, info))
        assert code < 300, result

    def undeclare(self, key: str) -> None:
        self.on_loop(lambda: self.emulator.resources.__delitem__(key))
        code, result = self.request("DELETE", f"{CRDS}/{_crd_for(key, None)['metadata']['name']}")
        assert code < 300, result

    def fail(self, method: str, path_suffix: str, status: int, times: int = 1) -> None:
        """Make the next `times` matching requests fail with `status`, changing nothing."""
        self.on_loop(lambda: self.emulator.faults.append([method, path_suffix, status, times]))

    def deny(self, plural: str, *verbs: str) -> None:
        """RBAC: the operator may not use `verbs` (all verbs if none) on `plural`; its
        requests answer 403 Forbidden until `allow`."""
        self.on_loop(lambda: self.emulator.denied.__setitem__(plural, frozenset(verbs)))

    def allow(self, plural: str) -> None:
        self.on_loop(lambda: self.emulator.denied.pop(plural, None))

    def clear_faults(self) -> None:
        self.on_loop(self.emulator.faults.clear)

    def hold_gc(self) -> None:
        """Stop the garbage collector (deleted owners keep their dependents for now)."""
        self.on_loop(lambda: setattr(self.emulator, "gc_held", True))

    def release_gc(self) -> None:
        def release() -> None:
            self.emulator.gc_held = False
            self.emulator.wake_gc()

        self.on_loop(release)

    def mute(self, plural: str) -> None:
        """Drop watch events of `plural` (a watch that missed them) until `unmute`."""
        self.on_loop(lambda: self.emulator.muted.add(plural))

    def unmute(self, plural: str) -> None:
        self.on_loop(lambda: self.emulator.muted.discard(plural))

    def history(self, api_version: str, plural: str, namespace: str, name: str) -> list[Any]:
        """Every stored version of the object, oldest first (None marks a deletion)."""

        def versions() -> list[Any]:
            for (resource, ns, obj_name), obj in self.emulator.objects.items():
                if (
                    resource.plural == plural
                    and _api_version(resource) == api_version
                    and (ns, obj_name) == (namespace, name)
                ):
                    return [None if v is None else copy.deepcopy(v.raw) for v in obj.history]
            return []

        return self.on_loop(versions)

    def write_kubeconfig(self, path: pathlib.Path) -> pathlib.Path:
        path.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "kmock", "cluster": {"server": self.url}}],
                    "users": [{"name": "tester", "user": {"token": "test-token"}}],
                    "contexts": [
                        {"name": "kmock", "context": {"cluster": "kmock", "user": "tester"}}
                    ],
                    "current-context": "kmock",
                }
            )
        )
        return path

    # -- HTTP, like kubectl ---------------------------------------------------------------

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        *,
        params: Mapping[str, str] | None = None,
    ) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        query = ("?" + urllib.parse.urlencode(params)) if params else ""
        req = urllib.request.Request(
            self.url + path + query,
            data=data,
            method=method,
            headers={"Content-Type": content_type, "User-Agent": "kubectl/v1.30.0 (tests)"},
        )
        try:
            with urllib.request.urlopen(req, timeout=10) as response:
                return response.status, json.loads(response.read() or b"null")
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"null")

    def create(self, obj: Mapping[str, Any]) -> dict[str, Any]:
        api, plural = _api_path(obj["apiVersion"]), _PLURALS[obj["kind"]]
        code, result = self.request(
            "POST", f"{api}/namespaces/{obj['metadata']['namespace']}/{plural}", obj
        )
        assert code < 300, result
        return result

    def get(
        self, api_version: str, plural: str, namespace: str, name: str
    ) -> dict[str, Any] | None:
        code, result = self.request(
            "GET", f"{_api_path(api_version)}/namespaces/{namespace}/{plural}/{name}"
        )
        return result if code == 200 else None

    def patch(
        self,
        api_version: str,
        plural: str,
        namespace: str,
        name: str,
        patch: Any,
        *,
        subresource: str | None = None,
        field_manager: str | None = None,
        json_patch: bool = False,
    ) -> dict[str, Any]:
        """A merge patch (or, with `json_patch`, an RFC 6902 JSON patch), as `kubectl patch`
        or a controller (`field_manager`, e.g. the HPA's kube-controller-manager) sends."""
        path = f"{_api_path(api_version)}/namespaces/{namespace}/{plural}/{name}"
        if subresource:
            path += f"/{subresource}"
        content_type = (
            "application/json-patch+json" if json_patch else "application/merge-patch+json"
        )
        params = {"fieldManager": field_manager} if field_manager else None
        code, result = self.request("PATCH", path, patch, content_type, params=params)
        assert code < 300, result
        return result

    def delete(self, api_version: str, plural: str, namespace: str, name: str) -> None:
        code, result = self.request(
            "DELETE", f"{_api_path(api_version)}/namespaces/{namespace}/{plural}/{name}"
        )
        assert code < 300, result

    def list(self, api_version: str, plural: str, namespace: str) -> list[dict[str, Any]]:
        code, result = self.request(
            "GET", f"{_api_path(api_version)}/namespaces/{namespace}/{plural}"
        )
        assert code == 200, result
        return result["items"]

    def requests(self) -> list[dict[str, Any]]:
        """Every request served so far: method, path, params, content type, body, agent."""
        return self.on_loop(lambda: list(self.emulator.log))


_PLURALS = {
    "InferenceService": "inferenceservices",
    "Deployment": "deployments",
    "Service": "services",
    "HorizontalPodAutoscaler": "horizontalpodautoscalers",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "PodMonitor": "podmonitors",
    "Pod": "pods",
    "ReplicaSet": "replicasets",
    "NetworkPolicy": "networkpolicies",
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "EndpointSlice": "endpointslices",
    "InferencePool": "inferencepools",
    "Secret": "secrets",
}


CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


def _crd_for(key: str, info: kmock.ResourceInfo | None) -> dict[str, Any]:
    group, version, plural = key.split("/")
    names: dict[str, Any] = {"plural": plural}
    if info is not None:
        names["kind"] = info.kind
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "names": names,
            "scope": "Namespaced",
            "versions": [{"name": version, "served": True, "storage": True}],
        },
    }


def _api_version(resource: Any) -> str:
    return f"{resource.group}/{resource.version}" if resource.group else resource.version


def _api_path(api_version: str) -> str:
    return f"/apis/{api_version}" if "/" in api_version else f"/api/{api_version}"


def wait_for(probe: Callable[[], T], *, timeout: float = 20.0, what: str = "condition") -> T:
    """Poll `probe` until it returns something truthy; fail with the last value."""
    deadline = time.monotonic() + timeout
    value = probe()
    while not value:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {value!r}")
        time.sleep(0.05)
        value = probe()
    return value
