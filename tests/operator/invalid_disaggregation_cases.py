"""spec.disaggregation specs that must be rejected, by the CRD and by the operator alike
(part of INVALID_CASES: (id, metadata.name, spec, a fragment of the operator's message))."""

from __future__ import annotations

from typing import Any

BUNDLED = {"source": "bundled://smollm2-135m"}
ON = {"enabled": True}


def _pd(**fields: Any) -> dict[str, Any]:
    """A spec with disaggregation on, `fields` merged into spec.disaggregation unless they
    name other spec fields (`spec_` prefix)."""
    spec: dict[str, Any] = {"model": dict(BUNDLED), "disaggregation": dict(ON)}
    for key, value in fields.items():
        if key.startswith("spec_"):
            spec[key.removeprefix("spec_")] = value
        else:
            spec["disaggregation"][key] = value
    return spec


INVALID_DISAGGREGATION_CASES: list[tuple[str, str, dict[str, Any], str]] = [
    (
        "pd-tensor-parallel",
        "chat",
        _pd(spec_resources={"gpus": 2}),
        "spec.runtime.tensorParallelSize: tensor parallelism (2) is not built yet with"
        " spec.disaggregation",
    ),
    (
        "pd-pool-gpus",
        "chat",
        _pd(decode={"resources": {"gpus": 2}}),
        "spec.disaggregation.decode.resources.gpus: 2 GPUs would need tensor parallelism",
    ),
    (
        "pd-router-off",
        "chat",
        _pd(spec_router={"enabled": False}),
        "spec.router.enabled: must not be false with spec.disaggregation.enabled",
    ),
    (
        "pd-inference-pool",
        "chat",
        _pd(spec_inferencePool={"enabled": True}),
        "spec.inferencePool.enabled: an InferencePool is not built yet",
    ),
    (
        "pd-saturation",
        "chat",
        _pd(spec_autoscaling={"enabled": True, "policy": "saturation"}),
        "spec.autoscaling.policy: saturation is not built yet with spec.disaggregation",
    ),
    (
        "pd-pool-saturation",
        "chat",
        _pd(prefill={"autoscaling": {"policy": "saturation"}}),
        "spec.disaggregation.prefill.autoscaling.policy: must be one of hpa",
    ),
    (
        "pd-no-replicas",
        "chat",
        _pd(prefill={"replicas": 0}),
        "spec.disaggregation.prefill.replicas: must be >= 1",
    ),  # fmt: skip
    (
        "pd-name-too-long",
        "a" * 45,
        _pd(),
        "must be at most 44 characters with spec.disaggregation.enabled",
    ),
    (
        "pd-bootstrap-port-is-http",
        "chat",
        _pd(bootstrapPort=30000),
        "spec.disaggregation.bootstrapPort: 30000 is the pods' HTTP port",
    ),
    (
        "pd-bootstrap-port-range",
        "chat",
        _pd(bootstrapPort=70000),
        "spec.disaggregation.bootstrapPort: must be <= 65535",
    ),  # fmt: skip
    (
        "pd-metric-of-the-other-pool",
        "chat",
        _pd(prefill={"autoscaling": {"metrics": [{"type": "runningRequests", "target": 8}]}}),
        "spec.disaggregation.prefill.autoscaling.metrics[0].type: must be one of"
        " queuePromptTokens, queueDepth",
    ),
    (
        "pd-service-metric-in-a-pool",
        "chat",
        _pd(decode={"autoscaling": {"metrics": [{"type": "queueDepth", "target": 8}]}}),
        "spec.disaggregation.decode.autoscaling.metrics[0].type",
    ),
    (
        "pd-kv-target-above-one",
        "chat",
        _pd(decode={"autoscaling": {"metrics": [{"type": "kvTokenUsage", "target": 2}]}}),
        "spec.disaggregation.decode.autoscaling.metrics[0].target: must be <= 1.0",
    ),
    (
        "pd-pool-min-above-max",
        "chat",
        _pd(decode={"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}),
        "spec.disaggregation.decode.autoscaling.minReplicas: 5 is greater than maxReplicas (2)",
    ),
    (
        "pd-pool-shm",
        "chat",
        _pd(prefill={"resources": {"shmSize": "1Gi"}}),
        "spec.disaggregation.prefill.resources: unknown fields ['shmSize']",
    ),
    ("pd-unknown-field", "chat", _pd(pools=2), "spec.disaggregation: unknown fields ['pools']"),
    (
        "pd-pool-unknown-field",
        "chat",
        _pd(decode={"gpus": 1}),
        "spec.disaggregation.decode: unknown fields ['gpus']",
    ),  # fmt: skip
    (
        "pd-extra-args-mode",
        "chat",
        _pd(spec_runtime={"extraArgs": ["--disaggregation-mode=decode"]}),
        "--disaggregation-mode is set by the operator",
    ),
    (
        "pd-extra-args-bootstrap-abbreviated",
        "chat",
        {"model": dict(BUNDLED), "runtime": {"extraArgs": ["--disaggregation-b=9000"]}},
        "--disaggregation-b (read as --disaggregation-bootstrap-port) is set by the operator",
    ),
]
