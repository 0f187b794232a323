"""Optional APIs: the PodMonitor (Prometheus Operator) and the InferencePool (Gateway API
Inference Extension). Neither is ever required: a service is reconciled without them.

For one reconcile each is in one state:

  USED        served, and the operator may use it: created where wanted, ours deleted
              where no longer wanted
  NOT_SERVED  the API server does not serve it (its CRDs are not installed)
  OFF         the settings say the operator has no access (`SLUICE_POD_MONITORS=off`,
              `SLUICE_INFERENCE_POOLS=off`; the chart sets them with `rbac.podMonitors` /
              `rbac.inferencePools` false): never read, written or watched
  FORBIDDEN   the API server answered 403 (RBAC without `off`, an admission policy, a
              quota): left alone in that namespace until the denial is `retry_seconds` old;
              or, asked at start-up (a SelfSubjectAccessReview per verb), the operator may
              not list or watch the kind: never watched nor touched until a restart
              (a watch Kopf is refused would stop the whole operator)

Discovery answers are cached for `retry_seconds` (the resync period) and dropped at once
when a CustomResourceDefinition changes (handlers.py), so installing the Prometheus
Operator is noticed at the next reconcile without a discovery request per reconcile.
The `OptionalResourcesAvailable` condition (status.py) reports the states.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from . import constants as c
from .kube import INFERENCEPOOLS, PODMONITORS, ApiError, KubeApi, Resource
from .settings import Settings

USED, NOT_SERVED, OFF, FORBIDDEN = "Used", "NotServed", "Off", "Forbidden"
OPTIONAL_RESOURCES = (PODMONITORS, INFERENCEPOOLS)


class OptionalForbidden(Exception):
    """The API server denied a request for an optional kind: go on without it."""

    def __init__(self, resource: Resource, error: ApiError) -> None:
        super().__init__(str(error))
        self.resource = resource
        self.message = error.message


@dataclass(frozen=True)
class OptionalState:
    """One optional kind as one reconcile found it."""

    kind: str
    state: str
    message: str = ""

    @property
    def text(self) -> str:
        detail = {
            USED: "in use",
            NOT_SERVED: "API not served",
            OFF: "turned off (no access)",
            FORBIDDEN: f"forbidden: {self.message}",
        }[self.state]
        return f"{self.kind}: {detail}"


class OptionalApis:
    """Which optional kinds a reconcile may use; shared by all reconciles."""

    def __init__(
        self,
        api: KubeApi,
        settings: Settings,
        *,
        retry_seconds: float | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._api = api
        self._settings = settings
        self._ttl = settings.resync_seconds if retry_seconds is None else retry_seconds
        self._now = now
        self._served: dict[Resource, tuple[bool, float]] = {}
        self._denied: dict[tuple[Resource, str], tuple[str, float]] = {}
        self._unwatched: dict[Resource, str] = {}

    def off(self, resource: Resource) -> bool:
        mode = (
            self._settings.pod_monitors
            if resource == PODMONITORS
            else self._settings.inference_pools
        )
        return mode == "off"

    async def state(self, resource: Resource, namespace: str) -> OptionalState:
        if self.off(resource):
            return OptionalState(resource.kind, OFF)
        if resource in self._unwatched:
            return OptionalState(resource.kind, FORBIDDEN, self._unwatched[resource])
        denied = self._denied.get((resource, namespace))
        if denied is not None:
            if denied[1] > self._now():
                return OptionalState(resource.kind, FORBIDDEN, denied[0])
            del self._denied[(resource, namespace)]
        if not await self.serves(resource):
            return OptionalState(resource.kind, NOT_SERVED)
        return OptionalState(resource.kind, USED)

    def watchable(self, resource: Resource) -> bool:
        """Whether Kopf watches this kind: not off, and not denied at start-up."""
        return not self.off(resource) and resource not in self._unwatched

    async def check_watch_access(self) -> dict[Resource, str]:
        """Ask the API server (SelfSubjectAccessReview) whether this identity may list and
        watch each optional kind that is not off, where the operator watches (every
        namespace, or each namespace of its list). A kind it may not is never watched
        and is reported FORBIDDEN with the verb; returns those kinds and why."""
        where = self._settings.namespaces or ("",)
        for resource in OPTIONAL_RESOURCES:
            if self.off(resource):
                continue
            for verb in ("list", "watch"):
                for namespace in where:
                    allowed, reason = await self._api.may(verb, resource, namespace)
                    if not allowed and resource not in self._unwatched:
                        scope = f"in namespace {namespace}" if namespace else "cluster-wide"
                        self._unwatched[resource] = (
                            f"may not {verb} {resource.plural}.{resource.group} {scope}"
                            f" ({reason or 'no RBAC rule grants it'}); not watched"
                        )
        return dict(self._unwatched)

    def deny(self, resource: Resource, namespace: str, message: str) -> OptionalState:
        self._denied[(resource, namespace)] = (message, self._now() + self._ttl)
        return OptionalState(resource.kind, FORBIDDEN, message)

    async def serves(self, resource: Resource) -> bool:
        cached = self._served.get(resource)
        if cached is not None and cached[1] > self._now():
            return cached[0]
        served = await self._api.serves(resource)
        self._served[resource] = (served, self._now() + self._ttl)
        return served

    def forget_discovery(self) -> None:
        """A CRD changed: ask the API server again next time."""
        self._served.clear()


def optional_condition(states: tuple[OptionalState, ...]) -> tuple[bool, str, str]:
    """(status, reason, message) of the OptionalResourcesAvailable condition."""
    message = "; ".join(state.text for state in states)
    if any(state.state == FORBIDDEN for state in states):
        return False, c.REASON_FORBIDDEN, message
    return True, "AsExpected", message
