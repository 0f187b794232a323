"""The PodDisruptionBudget: voluntary evictions (node drains, consolidation) take one pod
at a time.

Always created. With `maxUnavailable: 1` it never blocks a drain (one pod may always go,
even of a one-replica service), but it stops a cluster autoscaler or a consolidation from
evicting several loaded GPU pods at once. Pods that never became ready may always be
evicted, so a broken rollout does not hold a node hostage.
"""

from __future__ import annotations

from typing import Any

from ..spec import InferenceServiceSpec
from .common import object_meta, selector_labels


def build_pdb(isvc: InferenceServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": object_meta(isvc),
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": selector_labels(isvc.name)},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }
