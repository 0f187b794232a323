"""The autoscaling/v2 HPA that scales the Deployment of runtime pods (with
spec.disaggregation, one per pool whose autoscaling is on: `<name>-prefill` on the prompt
tokens waiting, `queuePromptTokens` = `sluice_queue_prompt_tokens`, and `<name>-decode` on
the requests it decodes, `runningRequests` = `sluice_running_requests`, by default).

`policy: hpa` scales on the runtime's per-pod scheduler metrics: `queueDepth` is
`sluice_queue_requests` (requests waiting per pod) and `kvTokenUsage` is
`sluice_kv_token_usage` (0..1 of the KV pool in use), both read as Pods metrics through
prometheus-adapter with an AverageValue target.

`policy: saturation` scales on the replica count the saturation recording rule computes
for this service (monitoring/prometheus/saturation.yaml), an External metric selected by
the `inferenceservice` label, with an AverageValue target of 1: the HPA then sets that
count (`ceil(value / 1)`), within its tolerance, stabilization windows and policies.
"""

from __future__ import annotations

from typing import Any

from sluice.runtime import constants as rc

from .. import constants as c
from ..spec import InferenceServiceSpec, ScalingRules
from .common import object_meta, to_quantity


def build_hpa(isvc: InferenceServiceSpec) -> dict[str, Any]:
    scaling = isvc.autoscaling
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": object_meta(isvc),
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": isvc.runtime_name,
            },
            "minReplicas": scaling.min_replicas,
            "maxReplicas": scaling.max_replicas,
            "metrics": _metrics(isvc),
            "behavior": {
                "scaleUp": _rules(scaling.scale_up),
                "scaleDown": _rules(scaling.scale_down),
            },
        },
    }


def _metrics(isvc: InferenceServiceSpec) -> list[dict[str, Any]]:
    scaling = isvc.autoscaling
    if scaling.policy == c.POLICY_SATURATION:
        return [
            {
                "type": "External",
                "external": {
                    "metric": {
                        "name": rc.HPA_METRIC_SATURATION,
                        "selector": {"matchLabels": {rc.SATURATION_SERVICE_LABEL: isvc.name}},
                    },
                    "target": {"type": "AverageValue", "averageValue": "1"},
                },
            }
        ]
    return [
        {
            "type": "Pods",
            "pods": {
                "metric": {"name": metric.metric_name},
                "target": {"type": "AverageValue", "averageValue": to_quantity(metric.target)},
            },
        }
        for metric in scaling.metrics
    ]


def _rules(rules: ScalingRules) -> dict[str, Any]:
    result: dict[str, Any] = {"stabilizationWindowSeconds": rules.stabilization_window_seconds}
    if rules.select_policy:
        result["selectPolicy"] = rules.select_policy
    if rules.policies:
        result["policies"] = [
            {"type": p.type, "value": p.value, "periodSeconds": p.period_seconds}
            for p in rules.policies
        ]
    return result
