"""Kopf wiring: login, the controller's lifetime, and watch events turned into queue keys.

Kopf watches; the controller (controller.py) reconciles. Every handler here only names
the InferenceService an event concerns and queues it, so a spec change, a deleted or
edited child, a pod that starts crash-looping and the periodic resync all run the same
reconcile, retried with back-off. The children and pods are watched through a server-side
label selector (`app.kubernetes.io/managed-by=sluice-operator`), so the operator does
not stream every pod of the cluster.

Kopf keeps no state on the InferenceService: no finalizer (deleting one never waits for
the operator; garbage collection removes the children), no progress annotations (no
change/create/update handlers), and the status is written by the reconcile alone.

High availability: one replica (the default), or several with leader election on a Lease
(leader.py): every replica watches and fills its queue, only the holder reconciles.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from collections.abc import Mapping
from typing import Any

import kopf

from . import constants as c
from .auth import login
from .cache import Cache
from .children import controller_of
from .controller import Controller
from .kube import KubeApi
from .leader import LeaderElection
from .optional import OPTIONAL_RESOURCES, OptionalApis
from .reconcile import Context
from .settings import Settings

ISVC = (c.GROUP, c.VERSION, c.PLURAL)
MANAGED = {c.LABEL_MANAGED_BY: c.MANAGER_LABEL_VALUE}
MANAGED_SELECTOR = f"{c.LABEL_MANAGED_BY}={c.MANAGER_LABEL_VALUE}"
# every kind the operator creates, and the pods (their status goes into Degraded)
REQUIRED_CHILD_KINDS = (
    ("apps", "v1", "deployments"),
    ("", "v1", "services"),
    ("autoscaling", "v2", "horizontalpodautoscalers"),
    ("policy", "v1", "poddisruptionbudgets"),
    ("networking.k8s.io", "v1", "networkpolicies"),
    ("", "v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "v1", "roles"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
)
# watched unless off or denied (optional.py)
OPTIONAL_CHILD_KINDS = tuple((r.group, r.version, r.plural) for r in OPTIONAL_RESOURCES)
CHILD_KINDS = (*REQUIRED_CHILD_KINDS, *OPTIONAL_CHILD_KINDS)
PODS = ("", "v1", "pods")
REPLICASETS = ("apps", "v1", "replicasets")  # the rollout's readiness (status.py)


def configure_kopf(kopf_settings: kopf.OperatorSettings) -> None:
    # Events are posted by the reconcile (Created, Deleted, condition transitions).
    kopf_settings.posting.loggers = False
    for kind in (*CHILD_KINDS, PODS, REPLICASETS):
        kopf_settings.watching.label_selectors[kind] = MANAGED_SELECTOR


@kopf.on.startup()
async def startup(
    settings: kopf.OperatorSettings, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    ours = memo.get("settings") or Settings.from_env(os.environ)
    memo["settings"] = ours
    api = KubeApi(timeout=ours.api_timeout_seconds)
    memo["api"] = api
    cache = memo["cache"] = Cache()
    ctx = Context.create(ours, api, cache)
    controller = memo["controller"] = Controller(ctx)
    configure_kopf(settings)
    identity = ours.identity or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"
    if ours.leader_election:  # the replicas told apart in the API server's audit log
        api.user_agent = f"{c.FIELD_MANAGER}/{identity}"
    api.use(login(logger=logger, settings=settings))
    for resource, why in (await ctx.optional.check_watch_access()).items():
        logger.warning(f"{resource.kind}s are not watched: {why}.")
    watch_optional_kinds(kopf.get_default_registry(), ctx.optional)
    if ours.leader_election:
        election = LeaderElection(
            api,
            namespace=ours.lease_namespace,
            name=ours.lease_name,
            identity=identity,
            timing=ours.lease_timing,
        )
        api.fence = election.check
        controller.elect(election)
    logger.info(
        f"Sluice operator starting: default image {ours.default_image}, pod monitors"
        f" {ours.pod_monitors}, resync every {ours.resync_seconds:g}s, {ours.workers} workers,"
        f" unschedulable pods wait {ours.scheduling_grace_seconds:g}s for capacity."
    )


@kopf.on.login()
async def authenticate(memo: kopf.Memo, **kwargs: Any) -> kopf.ConnectionInfo:
    info = login(memo=memo, **kwargs)
    memo["api"].use(info)
    controller: Controller = memo["controller"]
    if not controller.running:
        controller.start()  # workers need credentials: start them with the first login
    return info


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    controller: Controller | None = memo.get("controller")
    if controller is not None:
        await controller.stop()
    api: KubeApi | None = memo.get("api")
    if api is not None:
        await api.close()


@kopf.on.event(*ISVC)
async def inferenceservice_event(
    type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    memo["cache"].observe(type, dict(body))
    memo["controller"].on_inferenceservice_event(type, body)


async def child_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A child changed: reconcile its owner, unless nothing a reconcile reads changed (the
    HPA's metrics, our own no-op echoes: cache.relevant_view)."""
    if not memo["cache"].observe(type, dict(body)):
        return
    owner = controller_of(body)
    if owner is not None:
        memo["controller"].enqueue((body["metadata"]["namespace"], owner[0]))


async def pod_event(type: str | None, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A pod or ReplicaSet of a service changed: reconcile the service (its status)."""
    if not memo["cache"].observe(type, dict(body)):
        return
    instance = (body.get("metadata") or {}).get("labels", {}).get(c.LABEL_INSTANCE)
    if instance:
        memo["controller"].enqueue((body["metadata"]["namespace"], instance))


@kopf.on.event("apiextensions.k8s.io", "v1", "customresourcedefinitions")
async def crd_event(
    type: str | None, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any
) -> None:
    """A CRD came, went or changed: the cached discovery of optional APIs is stale. Ours
    (seen at start-up, in Kopf's first listing, and at every change) is checked against
    the schema this operator was built for."""
    memo["controller"].ctx.optional.forget_discovery()
    if type != "DELETED" and (body.get("metadata") or {}).get("name") == c.CRD_NAME:
        warning = crd_schema_warning(body)
        if warning is not None and memo.get("crd_warning") != warning:
            memo["crd_warning"] = warning
            logging.getLogger("sluice.operator").warning(warning)


def crd_schema_warning(crd: Mapping[str, Any]) -> str | None:
    """Why the served InferenceService CRD is older than this operator, if it is."""
    annotations = (crd.get("metadata") or {}).get("annotations") or {}
    raw = annotations.get(c.ANNOTATION_SCHEMA_VERSION)
    served = int(raw) if isinstance(raw, str) and raw.isdigit() else 0
    if served >= c.CRD_SCHEMA_VERSION:
        return None
    return (
        f"The served CRD {c.CRD_NAME} has schema version {raw or 'none'}, older than the"
        f" {c.CRD_SCHEMA_VERSION} this operator was built for: fields it knows may be"
        " dropped by the API server. Upgrade the CRD: kubectl apply --server-side"
        " --force-conflicts -f crds/inferenceservice.yaml"
    )


def watch_optional_kinds(registry: kopf.OperatorRegistry, optional: OptionalApis) -> None:
    """Watch the optional kinds that are neither off nor denied (Kopf's watcher stops the
    whole operator on a 403). Runs at start-up, before Kopf starts its watches; an
    operator started again in the same process (tests) re-decides."""
    handlers = registry._watching._handlers  # Kopf has no public way to remove a handler
    ids = {f"{resource.plural}-event" for resource in OPTIONAL_RESOURCES}
    handlers[:] = [handler for handler in handlers if handler.id not in ids]
    for resource in OPTIONAL_RESOURCES:
        if optional.watchable(resource):
            kind = (resource.group, resource.version, resource.plural)
            kopf.on.event(*kind, labels=MANAGED, id=f"{kind[2]}-event", registry=registry)(
                child_event
            )


for _kind in REQUIRED_CHILD_KINDS:
    kopf.on.event(*_kind, labels=MANAGED, id=f"{_kind[2]}-event")(child_event)
kopf.on.event(*PODS, labels=MANAGED, id="pods-event")(pod_event)
kopf.on.event(*REPLICASETS, labels=MANAGED, id="replicasets-event")(pod_event)
