"""The PodDisruptionBudgets: voluntary evictions (node drains, consolidation) take one pod
at a time, of the runtime pods (`<name>`; with spec.disaggregation one per pool,
`<name>-prefill` and `<name>-decode`) and of the router pods (`<name>-router`, with
spec.router).

Always created. With `maxUnavailable: 1` it never blocks a drain (one pod may always go,
even of a one-replica service), but it stops a cluster autoscaler or a consolidation from
evicting several loaded GPU pods at once. Pods that never became ready may always be
evicted, so a broken rollout does not hold a node hostage. The router's is the same
budget for its pods: a drain never takes two router replicas at once, and when the last
one goes the model Service falls back to the runtime pods until a router pod serves again.
"""

from __future__ import annotations

from typing import Any

from ..spec import InferenceServiceSpec
from .common import object_meta, router_meta, router_selector_labels, selector_labels


def build_pdb(isvc: InferenceServiceSpec) -> dict[str, Any]:
    return _pdb(object_meta(isvc), selector_labels(isvc.name, isvc.role))


def build_router_pdb(isvc: InferenceServiceSpec) -> dict[str, Any]:
    """The router pods' budget (only with spec.router; deleted when it is turned off)."""
    return _pdb(router_meta(isvc), router_selector_labels(isvc.name))


def _pdb(metadata: dict[str, Any], selector: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata,
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
