"""The InferencePool (`inference.networking.k8s.io/v1`, the Gateway API Inference
Extension) of the runtime pods: a Gateway whose HTTPRoute names it asks the endpoint
picker (EPP) which pod serves each request, and the EPP scrapes the pods' metrics under
vLLM's names (the runtime renders `--metrics-compat vllm` with a pool; args.py).

Rendered only where the CRD is installed (detected on every reconcile, never required).
The endpoint picker is not ours: `spec.inferencePool.endpointPickerRef` names its Service in
this namespace (default `<name>-epp`, what the extension's `inferencepool` Helm chart
calls it), port 9002, FailClose unless asked otherwise.
"""

from __future__ import annotations

from typing import Any

from sluice.runtime import constants as rc

from .. import constants as c
from ..spec import InferenceServiceSpec
from .common import object_meta, selector_labels


def build_inferencepool(isvc: InferenceServiceSpec) -> dict[str, Any]:
    pool = isvc.inference_pool
    return {
        "apiVersion": f"{c.INFERENCE_GROUP}/v1",
        "kind": "InferencePool",
        "metadata": object_meta(isvc),
        "spec": {
            "selector": {"matchLabels": selector_labels(isvc.name)},
            "targetPorts": [{"number": rc.DEFAULT_PORT}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": isvc.endpoint_picker_name,
                "port": {"number": pool.endpoint_picker_port},
                "failureMode": pool.failure_mode,
            },
        },
    }
