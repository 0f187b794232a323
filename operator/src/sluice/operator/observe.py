"""Reading what the status needs beyond the applied children: the ReplicaSet that runs each
Deployment's current pod template (the runtime's, each P/D pool's, the router's), and that
ReplicaSet's pods.

The current ReplicaSet is the one the Deployment controls whose pod template is the
Deployment's (the controller adds only the `pod-template-hash` label): exact whatever the
revision numbers, and None while the controller has not created it yet.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from . import constants as c
from .builders.common import router_selector_labels, selector_labels
from .cache import CachedApi
from .conditions import RuntimePods
from .kube import DEPLOYMENTS, HPAS, PODS, REPLICASETS
from .spec import InferenceServiceSpec
from .status import RouterObserved

Children = Mapping[tuple[str, str], Mapping[str, Any]]  # the applied children, by (kind, name)


def _template_without_hash(template: Mapping[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(dict(template))
    labels = (result.get("metadata") or {}).get("labels")
    if isinstance(labels, dict):
        labels.pop(c.LABEL_POD_TEMPLATE_HASH, None)
    return result


def current_replica_set(
    deployment: Mapping[str, Any], replica_sets: Sequence[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    uid = (deployment.get("metadata") or {}).get("uid")
    wanted = _template_without_hash((deployment.get("spec") or {}).get("template") or {})
    for rs in replica_sets:
        refs = (rs.get("metadata") or {}).get("ownerReferences") or []
        if not any(ref.get("uid") == uid and ref.get("controller") for ref in refs):
            continue
        template = (rs.get("spec") or {}).get("template") or {}
        if _template_without_hash(template) == wanted:
            return rs
    return None


async def read_pods(
    api: CachedApi, deployment: Mapping[str, Any], selector: Mapping[str, str]
) -> tuple[Mapping[str, Any] | None, tuple[Mapping[str, Any], ...]]:
    """(current ReplicaSet, its pods) of a Deployment whose pods carry the labels
    `selector`; (None, ()) before the controller made it."""
    namespace = deployment["metadata"]["namespace"]
    replica_set = current_replica_set(deployment, await api.list(REPLICASETS, namespace, selector))
    if replica_set is None:
        return None, ()
    template_hash = ((replica_set.get("metadata") or {}).get("labels") or {}).get(
        c.LABEL_POD_TEMPLATE_HASH
    )
    if not template_hash:
        return replica_set, ()
    pods = await api.list(PODS, namespace, {**selector, c.LABEL_POD_TEMPLATE_HASH: template_hash})
    return replica_set, tuple(pods)


async def read_runtime_pods(
    api: CachedApi, view: InferenceServiceSpec, children: Children
) -> RuntimePods:
    """The runtime pods of `view` (the service, or one P/D pool's view of it: their
    Deployment is `view.runtime_name`)."""
    name = view.runtime_name
    deployment = children[(DEPLOYMENTS.kind, name)]
    replica_set, pods = await read_pods(api, deployment, selector_labels(view.name, view.role))
    return RuntimePods(
        deployment=deployment,
        replica_set=replica_set,
        pods=pods,
        hpa=children.get((HPAS.kind, name)),
        autoscaling=view.autoscaling.enabled,
        min_replicas=view.autoscaling.min_replicas,
        default_replicas=view.replicas,
    )


async def read_router_pods(
    api: CachedApi, isvc: InferenceServiceSpec, children: Children, routed: bool
) -> RouterObserved | None:
    """The router's pods (None without spec.router); `routed`: the model Service selects
    them."""
    if not isvc.router.enabled:
        return None
    router = children[(DEPLOYMENTS.kind, isvc.router_name)]
    replica_set, pods = await read_pods(api, router, router_selector_labels(isvc.name))
    return RouterObserved(
        deployment=router,
        replica_set=replica_set,
        pods=pods,
        replicas=isvc.router.replicas,
        routed=routed,
    )
