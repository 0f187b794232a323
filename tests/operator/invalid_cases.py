"""InferenceService specs that must be rejected, by the CRD and by the operator alike.

Each case: (id, metadata.name, spec, a fragment of the operator's problem message).
"""

from __future__ import annotations

from typing import Any

from invalid_disaggregation_cases import INVALID_DISAGGREGATION_CASES

BUNDLED = {"source": "bundled://smollm2-135m"}


def _spec(**fields: Any) -> dict[str, Any]:
    return {"model": dict(BUNDLED)} | fields


INVALID_CASES: list[tuple[str, str, dict[str, Any], str]] = [
    ("model-missing", "chat", {"replicas": 1}, "spec.model: is required"),
    (
        "source-unknown-scheme",
        "chat",
        {"model": {"source": "s3://bucket/llama"}},
        "spec.model.source",
    ),
    ("source-hf-without-org", "chat", {"model": {"source": "hf://llama"}}, "spec.model.source"),
    (
        "source-bundled-unknown",
        "chat",
        {"model": {"source": "bundled://llama-70b"}},
        "spec.model.source",
    ),
    (
        "source-pvc-dotdot",
        "chat",
        {"model": {"source": "pvc://models/../etc"}},
        "spec.model.source",
    ),
    (
        "revision-on-pvc",
        "chat",
        {"model": {"source": "pvc://models/llama", "revision": "main"}},
        "spec.model.revision: is only valid for hf://",
    ),
    (
        "token-on-bundled",
        "chat",
        {"model": {**BUNDLED, "tokenSecretRef": {"name": "hf"}}},
        "spec.model.tokenSecretRef: is only valid for hf://",
    ),
    (
        "rollout-both-zero",
        "chat",
        _spec(rollout={"maxSurge": 0, "maxUnavailable": "0%"}),
        "spec.rollout: maxSurge and maxUnavailable must not both be 0",
    ),
    ("rollout-surge-negative", "chat", _spec(rollout={"maxSurge": -1}), "spec.rollout.maxSurge"),
    (
        "rollout-percent-too-big",
        "chat",
        _spec(rollout={"maxUnavailable": "101%"}),
        "spec.rollout.maxUnavailable",
    ),
    ("rollout-digits-as-string", "chat", _spec(rollout={"maxSurge": "2"}), "spec.rollout.maxSurge"),
    ("replicas-negative", "chat", _spec(replicas=-1), "spec.replicas: must be >= 0"),
    ("replicas-string", "chat", _spec(replicas="2"), "spec.replicas: must be an integer"),
    ("replicas-too-many", "chat", _spec(replicas=513), "spec.replicas: must be <= 512"),
    (
        "tp-differs-from-gpus",
        "chat",
        _spec(resources={"gpus": 4}, runtime={"tensorParallelSize": 2}),
        "must equal spec.resources.gpus (4)",
    ),
    (
        "shm-size-without-tp",
        "chat",
        _spec(resources={"gpus": 1, "shmSize": "2Gi"}),
        "spec.resources.shmSize: is only used with tensorParallelSize > 1",
    ),
    (
        "tp-too-large",
        "chat",
        _spec(runtime={"tensorParallelSize": 32}),
        "spec.runtime.tensorParallelSize: must be <= 16",
    ),
    ("gpus-too-many", "chat", _spec(resources={"gpus": 17}), "spec.resources.gpus: must be <= 16"),
    (
        "flashinfer-on-cpu",
        "chat",
        _spec(runtime={"attentionBackend": "flashinfer"}),
        "flashinfer needs spec.resources.gpus > 0",
    ),
    (
        "mem-fraction-one",
        "chat",
        _spec(resources={"gpus": 1}, runtime={"memFractionStatic": 1.0}),
        "must be < 1",
    ),
    (
        "schedule-policy-unknown",
        "chat",
        _spec(runtime={"schedulePolicy": "sjf"}),
        "spec.runtime.schedulePolicy",
    ),
    ("dtype-unknown", "chat", _spec(runtime={"dtype": "int8"}), "spec.runtime.dtype"),
    (
        "extra-args-port",
        "chat",
        _spec(runtime={"extraArgs": ["--port=8080"]}),
        "--port is set by the operator",
    ),
    (
        "extra-args-model",
        "chat",
        _spec(runtime={"extraArgs": ["--model", "x"]}),
        "--model is set by the operator",
    ),
    (
        "extra-args-abbreviated-port",
        "chat",
        _spec(runtime={"extraArgs": ["--por=8081"]}),
        "--por (read as --port) is set by the operator",
    ),
    (
        "extra-args-abbreviated-host",
        "chat",
        _spec(runtime={"extraArgs": ["--hos=0.0.0.0"]}),
        "--hos (read as --host) is set by the operator",
    ),
    (
        "extra-args-abbreviated-device",
        "chat",
        _spec(runtime={"extraArgs": ["--devic", "cuda"]}),
        "--devic (read as --device) is set by the operator",
    ),
    (
        "extra-args-drain-timeout",
        "chat",
        _spec(runtime={"extraArgs": ["--drain-timeout=1"]}),
        "--drain-timeout is set by the operator",
    ),
    (
        "extra-args-end-of-options",
        "chat",
        _spec(runtime={"extraArgs": ["--", "x"]}),
        "is set by the operator",
    ),
    (
        "autoscaling-min-above-max",
        "chat",
        _spec(autoscaling={"enabled": True, "minReplicas": 5, "maxReplicas": 2}),
        "is greater than maxReplicas",
    ),
    (
        "autoscaling-duplicate-metric",
        "chat",
        _spec(
            autoscaling={
                "metrics": [
                    {"type": "queueDepth", "target": 4},
                    {"type": "queueDepth", "target": 8},
                ]
            }
        ),
        "queueDepth is listed twice",
    ),
    (
        "autoscaling-kv-usage-above-one",
        "chat",
        _spec(autoscaling={"metrics": [{"type": "kvTokenUsage", "target": 1.5}]}),
        "must be <= 1.0",
    ),
    (
        "autoscaling-unknown-metric",
        "chat",
        _spec(autoscaling={"metrics": [{"type": "gpuUtilization", "target": 0.5}]}),
        "spec.autoscaling.metrics[0].type",
    ),
    (
        "autoscaling-unknown-policy",
        "chat",
        _spec(autoscaling={"enabled": True, "policy": "predictive"}),
        "spec.autoscaling.policy",
    ),
    (
        "autoscaling-no-metrics",
        "chat",
        _spec(autoscaling={"metrics": []}),
        "must name at least one metric",
    ),
    (
        "autoscaling-bad-policy",
        "chat",
        _spec(
            autoscaling={
                "behavior": {
                    "scaleUp": {"policies": [{"type": "Nodes", "value": 1, "periodSeconds": 60}]}
                }
            }
        ),
        "policies[0].type",
    ),
    (
        "env-reserved",
        "chat",
        _spec(env=[{"name": "HF_TOKEN", "value": "x"}]),
        "HF_TOKEN is set by the operator",
    ),
    (
        "env-reserved-for-the-download",
        "chat",
        _spec(env=[{"name": "SLUICE_MODEL_REPO", "value": "evil/model"}]),
        "SLUICE_MODEL_REPO is set by the operator",
    ),
    (
        "env-value-and-value-from",
        "chat",
        _spec(
            env=[
                {
                    "name": "A",
                    "value": "1",
                    "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                }
            ]
        ),
        "set value or valueFrom, not both",
    ),
    (
        "env-duplicate",
        "chat",
        _spec(env=[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}]),
        "A is listed twice",
    ),
    ("name-starts-with-digit", "1chat", _spec(), "metadata.name"),
    ("name-too-long", "a" * 53, _spec(), "metadata.name"),
    ("unknown-field", "chat", _spec(replica=3), "spec: unknown fields ['replica']"),
    ("cpu-not-a-quantity", "chat", _spec(resources={"cpu": "two"}), "spec.resources.cpu"),
    (
        "gpu-resource-not-qualified",
        "chat",
        _spec(resources={"gpus": 1, "gpuResource": "gpu"}),
        "spec.resources.gpuResource",
    ),
    (
        "toleration-exists-with-value",
        "chat",
        _spec(scheduling={"tolerations": [{"key": "gpu", "operator": "Exists", "value": "yes"}]}),
        "must be empty when operator is Exists",
    ),
    (
        "startup-timeout-too-short",
        "chat",
        _spec(startupTimeoutSeconds=10),
        "spec.startupTimeoutSeconds: must be >= 60",
    ),
    (
        "grace-shorter-than-prestop-and-drain",
        "chat",
        _spec(terminationGracePeriodSeconds=12),
        "spec.terminationGracePeriodSeconds: must be >= 15",
    ),
    (
        "files-on-pvc",
        "chat",
        {"model": {"source": "pvc://models/llama", "files": ["*.safetensors"]}},
        "spec.model.files: is only valid for hf://",
    ),
    (
        "cache-on-bundled",
        "chat",
        {"model": {**BUNDLED, "cache": {"claimName": "hub"}}},
        "spec.model.cache: is only valid for hf://",
    ),
    (
        "pod-label-reserved",
        "chat",
        _spec(podMetadata={"labels": {"app.kubernetes.io/instance": "other"}}),
        "app.kubernetes.io/instance is set by the operator",
    ),
    (
        "image-pull-secret-without-name",
        "chat",
        _spec(imagePullSecrets=[{}]),
        "spec.imagePullSecrets[0].name: is required",
    ),
    (
        "network-policy-bad-namespace",
        "chat",
        _spec(networkPolicy={"enabled": True, "allowedNamespaces": ["Team_A"]}),
        "spec.networkPolicy.allowedNamespaces[0]",
    ),
    (
        "router-policy-unknown",
        "chat",
        _spec(router={"enabled": True, "policy": "fastest"}),
        "spec.router.policy",
    ),
    (
        "router-no-replicas",
        "chat",
        _spec(router={"enabled": True, "replicas": 0}),
        "spec.router.replicas",
    ),  # fmt: skip
    (
        "router-unknown-field",
        "chat",
        _spec(router={"enabled": True, "workers": 2}),
        "spec.router",
    ),  # fmt: skip
    (
        "router-bad-cpu",
        "chat",
        _spec(router={"enabled": True, "resources": {"cpu": "lots"}}),
        "spec.router.resources.cpu",
    ),  # fmt: skip
    (
        "router-name-too-long",
        "a" * 46,
        _spec(router={"enabled": True}),
        "must be at most 45 characters with spec.router.enabled",
    ),
    (
        "inference-pool-failure-mode-unknown",
        "chat",
        _spec(inferencePool={"enabled": True, "endpointPickerRef": {"failureMode": "Retry"}}),
        "spec.inferencePool.endpointPickerRef.failureMode",
    ),
    (
        "inference-pool-epp-bad-name",
        "chat",
        _spec(inferencePool={"enabled": True, "endpointPickerRef": {"name": "EPP_1"}}),
        "spec.inferencePool.endpointPickerRef.name",
    ),
    (
        "inference-pool-metrics-compat-in-extra-args",
        "chat",
        _spec(inferencePool={"enabled": True}, runtime={"extraArgs": ["--metrics-compat=none"]}),
        "--metrics-compat is set by the operator while spec.inferencePool.enabled",
    ),
]
INVALID_CASES += INVALID_DISAGGREGATION_CASES
