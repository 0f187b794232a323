"""A thin async Kubernetes API client for the operator's own calls.

Kopf has no public client for arbitrary requests, so the operator keeps this small one on
aiohttp (already a Kopf dependency). It authenticates with the same `kopf.ConnectionInfo`
the operator's login handler gives Kopf, so there is one source of credentials and no
dependency on the `kubernetes` package.

Writes are server-side apply (`application/apply-patch+yaml`, field manager
`sluice-operator`, force): the object we send is the whole desired state, and fields we
stopped sending are released (removed unless another manager owns them), without
read-modify-write races. The status is a merge patch with the resourceVersion it was
computed from (409 if the object moved on). Every call made here is listed in
`rbac.REQUIRED_PERMISSIONS`.

With leader election on, `fence` is called before every write (not before reads, the
Lease's own writes or access reviews): a replica that is not a fresh leader sends none.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import kopf

from . import constants as c


@dataclass(frozen=True)
class Resource:
    """An API resource: where its objects live in the URL space."""

    group: str
    version: str
    plural: str
    kind: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        path = f"{base}/namespaces/{namespace}/{self.plural}"
        if name is not None:
            path += f"/{name}"
        if subresource is not None:
            path += f"/{subresource}"
        return path


INFERENCESERVICES = Resource(c.GROUP, c.VERSION, c.PLURAL, c.KIND)
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
SERVICES = Resource("", "v1", "services", "Service")
HPAS = Resource("autoscaling", "v2", "horizontalpodautoscalers", "HorizontalPodAutoscaler")
PDBS = Resource("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
PODMONITORS = Resource("monitoring.coreos.com", "v1", "podmonitors", "PodMonitor")
NETWORKPOLICIES = Resource("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy")
SERVICEACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount")
ROLES = Resource("rbac.authorization.k8s.io", "v1", "roles", "Role")
ROLEBINDINGS = Resource("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding")
INFERENCEPOOLS = Resource(c.INFERENCE_GROUP, "v1", "inferencepools", "InferencePool")
REPLICASETS = Resource("apps", "v1", "replicasets", "ReplicaSet")
PODS = Resource("", "v1", "pods", "Pod")
EVENTS = Resource("", "v1", "events", "Event")
SECRETS = Resource("", "v1", "secrets", "Secret")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
CHILD_RESOURCES = (
    DEPLOYMENTS,
    SERVICES,
    HPAS,
    PDBS,
    PODMONITORS,
    NETWORKPOLICIES,
    SERVICEACCOUNTS,
    ROLES,
    ROLEBINDINGS,
    INFERENCEPOOLS,
)


def resource_of(obj: Mapping[str, Any]) -> Resource:
    for resource in (*CHILD_RESOURCES, INFERENCESERVICES):
        if resource.api_version == obj.get("apiVersion") and resource.kind == obj.get("kind"):
            return resource
    raise ValueError(f"unknown resource {obj.get('apiVersion')}/{obj.get('kind')}")


class ApiError(Exception):
    """A failed API call: HTTP status 0 means the server was not reached."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        self.status = status
        self.reason = reason
        self.message = message
        super().__init__(f"{status} {reason}: {message}")

    @property
    def transient(self) -> bool:
        """Worth retrying as is: server-side trouble, throttling, conflicts, no connection,
        expired credentials, a namespace or API that is going away. A 403 is not: it is
        reported (`forbidden`), and retried with back-off by the reconcile."""
        return self.status in (0, 401, 404, 408, 409, 429) or self.status >= 500

    @property
    def namespace_terminating(self) -> bool:
        """The namespace is being deleted (NamespaceLifecycle admission refuses new objects
        there with 403): final, the InferenceService goes with its namespace."""
        return self.status == 403 and "because it is being terminated" in self.message

    @property
    def forbidden(self) -> bool:
        """Denied: RBAC, an admission policy (Gatekeeper, Kyverno), a ResourceQuota."""
        return self.status == 403


class KubeApi:
    """Authenticated JSON requests; one aiohttp session per set of credentials."""

    def __init__(self, *, timeout: float = 30.0) -> None:
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._info: kopf.ConnectionInfo | None = None
        self._session: aiohttp.ClientSession | None = None
        self._old_sessions: list[aiohttp.ClientSession] = []
        self.fence: Callable[[], None] | None = None
        self.user_agent = c.FIELD_MANAGER

    def use(self, info: kopf.ConnectionInfo) -> None:
        """Switch to new credentials (called from the operator's login handler)."""
        if info != self._info:
            self._info = info
            if self._session is not None:
                self._old_sessions.append(self._session)
            self._session = None

    async def close(self) -> None:
        for session in [*self._old_sessions, self._session]:
            if session is not None:
                await session.close()
        self._old_sessions.clear()
        self._session = None

    async def get(self, resource: Resource, namespace: str, name: str) -> dict[str, Any] | None:
        """The object, or None if it does not exist."""
        try:
            return await self._request("GET", resource.path(namespace, name))
        except ApiError as error:
            if error.status == 404:
                return None
            raise

    async def list(
        self, resource: Resource, namespace: str, label_selector: Mapping[str, str]
    ) -> list[dict[str, Any]]:
        """Objects whose labels include all of `label_selector`."""
        selector = ",".join(f"{key}={value}" for key, value in sorted(label_selector.items()))
        listing = await self._request(
            "GET", resource.path(namespace), params={"labelSelector": selector}
        )
        items: list[dict[str, Any]] = listing.get("items") or []
        return items

    async def apply(
        self,
        obj: Mapping[str, Any],
        *,
        manager: str = c.FIELD_MANAGER,
        force: bool = True,
        dry_run: bool = False,
    ) -> dict[str, Any]:
        """Server-side apply `obj` as `manager`; returns the object as stored (with
        `dry_run`, as it would be stored: defaulted, nothing changed). Without `force`, a
        field another manager owns with another value is a 409 Conflict."""
        meta = obj["metadata"]
        params = {"fieldManager": manager, "force": "true" if force else "false"}
        if dry_run:
            params["dryRun"] = "All"
        return await self._request(
            "PATCH",
            resource_of(obj).path(meta["namespace"], meta["name"]),
            params=params,
            body=json.dumps(obj),
            content_type="application/apply-patch+yaml",
        )

    async def patch_status(
        self,
        resource: Resource,
        namespace: str,
        name: str,
        status: Mapping[str, Any],
        *,
        resource_version: str,
    ) -> dict[str, Any]:
        """Merge-patch the status, only if the object is still at `resource_version`."""
        return await self._request(
            "PATCH",
            resource.path(namespace, name, "status"),
            params={"fieldManager": c.FIELD_MANAGER},
            body=json.dumps({"metadata": {"resourceVersion": resource_version}, "status": status}),
            content_type="application/merge-patch+json",
        )

    async def scale(self, resource: Resource, namespace: str, name: str, replicas: int) -> None:
        """Set spec.replicas through the scale subresource (what `kubectl scale` does)."""
        await self._request(
            "PATCH",
            resource.path(namespace, name, "scale"),
            params={"fieldManager": c.FIELD_MANAGER},
            body=json.dumps({"spec": {"replicas": replicas}}),
            content_type="application/merge-patch+json",
        )

    async def create(
        self, resource: Resource, namespace: str, obj: Mapping[str, Any], *, fenced: bool = True
    ) -> None:
        await self._request(
            "POST",
            resource.path(namespace),
            params={"fieldManager": c.FIELD_MANAGER},
            body=json.dumps(obj),
            content_type="application/json",
            fenced=fenced,
        )

    async def delete(self, resource: Resource, namespace: str, name: str, *, uid: str) -> bool:
        """Delete the object only if it is still the one with `uid`; False if already gone."""
        options = {
            "apiVersion": "v1",
            "kind": "DeleteOptions",
            "propagationPolicy": "Background",
            "preconditions": {"uid": uid},
        }
        try:
            await self._request(
                "DELETE",
                resource.path(namespace, name),
                body=json.dumps(options),
                content_type="application/json",
            )
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return True

    async def create_lease(self, namespace: str, lease: Mapping[str, Any]) -> None:
        """Create the leader election Lease (not fenced: it is how a replica becomes leader)."""
        await self.create(LEASES, namespace, lease, fenced=False)

    async def update_lease(self, namespace: str, name: str, lease: Mapping[str, Any]) -> None:
        """Replace the Lease; its metadata.resourceVersion makes a lost race a 409."""
        await self._request(
            "PUT",
            LEASES.path(namespace, name),
            params={"fieldManager": c.FIELD_MANAGER},
            body=json.dumps(lease),
            content_type="application/json",
            fenced=False,
        )

    async def may(self, verb: str, resource: Resource, namespace: str = "") -> tuple[bool, str]:
        """Whether this identity may `verb` the resource (in `namespace`; "" for every
        namespace), as the API server's SelfSubjectAccessReview answers, and its reason."""
        attributes = {"verb": verb, "group": resource.group, "resource": resource.plural}
        if namespace:
            attributes["namespace"] = namespace
        review = await self._request(
            "POST",
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            body=json.dumps(
                {
                    "apiVersion": "authorization.k8s.io/v1",
                    "kind": "SelfSubjectAccessReview",
                    "spec": {"resourceAttributes": attributes},
                }
            ),
            content_type="application/json",
            fenced=False,
        )
        status = review.get("status") or {}
        return bool(status.get("allowed")), str(status.get("reason") or "")

    async def serves(self, resource: Resource) -> bool:
        """Whether the API server serves this resource (e.g. an optional CRD is installed)."""
        try:
            listing = await self._request("GET", f"/apis/{resource.group}/{resource.version}")
        except ApiError as error:
            if error.status == 404:
                return False
            raise
        return any(item.get("name") == resource.plural for item in listing.get("resources") or [])

    async def _request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: str | None = None,
        content_type: str | None = None,
        fenced: bool = True,
    ) -> dict[str, Any]:
        if self._info is None:
            raise ApiError(0, "NotLoggedIn", "no credentials yet")
        if fenced and method != "GET" and self.fence is not None:
            self.fence()
        session = self._ensure_session()
        headers = {"Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        url = self._info.server.rstrip("/") + path
        try:
            async with session.request(
                method, url, params=params, data=body, headers=headers
            ) as response:
                text = await response.text()
                if response.status >= 400:
                    raise _error_from(response.status, text)
                return json.loads(text) if text else {}
        except (aiohttp.ClientError, asyncio.TimeoutError) as error:
            raise ApiError(0, type(error).__name__, str(error) or "request failed") from error

    def _ensure_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            assert self._info is not None
            info = self._info
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=info.as_ssl_context()),
                headers={**info.as_http_headers(), "User-Agent": self.user_agent},
                timeout=self._timeout,
                trust_env=info.trust_env,
            )
        return self._session


def _error_from(status: int, text: str) -> ApiError:
    try:
        payload = json.loads(text)
    except ValueError:
        payload = {}
    if not isinstance(payload, dict):
        payload = {}
    return ApiError(
        status, str(payload.get("reason") or "Error"), str(payload.get("message") or text[:500])
    )
