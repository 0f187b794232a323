"""The PodDisruptionBudget: voluntary evictions (node drains) take one pod at a time.

Built only when the service is meant to run more than one replica; with one replica a
PDB would block drains forever. Pods that never became ready may always be evicted, so a
broken rollout does not hold a node hostage.
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
