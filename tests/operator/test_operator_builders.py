"""Builders: given specs → exact child objects."""

from __future__ import annotations

import copy

import pytest
from operator_testkit import IMAGE

from sluice.operator.builders import (
    build_deployment,
    build_hpa,
    build_pdb,
    build_podmonitor,
    build_service,
)
from sluice.operator.builders.args import serve_args
from sluice.operator.builders.common import selector_string, to_quantity
from sluice.operator.builders.model import DOWNLOAD_SCRIPT
from sluice.operator.kube import HPAS, PDBS, PODMONITORS
from sluice.operator.reconcile import plan

LABELS = {
    "app.kubernetes.io/name": "sluice-runtime",
    "app.kubernetes.io/instance": "chat",
    "app.kubernetes.io/component": "inference",
    "app.kubernetes.io/part-of": "sluice",
    "app.kubernetes.io/managed-by": "sluice-operator",
}
SELECTOR = {"app.kubernetes.io/name": "sluice-runtime", "app.kubernetes.io/instance": "chat"}
META = {"name": "chat", "namespace": "default", "labels": LABELS}
SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
}


def probe(period: int, failures: int) -> dict:
    return {
        "httpGet": {"path": "/health", "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 5,
        "failureThreshold": failures,
    }


def test_cpu_bundled_deployment_is_exactly_this(make_spec):
    isvc = make_spec(resources={"cpu": "2", "memory": "2Gi"})

    assert build_deployment(isvc) == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": META,
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": SELECTOR},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "revisionHistoryLimit": 3,
            "progressDeadlineSeconds": 2400,
            "template": {
                "metadata": {
                    "labels": LABELS,
                    "annotations": {
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": "30000",
                        "prometheus.io/path": "/metrics",
                    },
                },
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 1000,
                        "runAsGroup": 1000,
                        "fsGroup": 1000,
                        "fsGroupChangePolicy": "OnRootMismatch",
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "terminationGracePeriodSeconds": 120,
                    "containers": [
                        {
                            "name": "runtime",
                            "image": IMAGE,
                            "command": ["sluice", "serve"],
                            "args": [
                                "--model",
                                "smollm2-135m",
                                "--served-model-name",
                                "SmolLM2-135M-Instruct",
                                "--host",
                                "0.0.0.0",
                                "--port",
                                "30000",
                                "--device",
                                "cpu",
                                "--tensor-parallel-size",
                                "1",
                            ],
                            "ports": [{"name": "http", "containerPort": 30000, "protocol": "TCP"}],
                            "env": [
                                {"name": "XDG_CACHE_HOME", "value": "/var/cache/sluice"},
                                {"name": "HF_HOME", "value": "/var/cache/sluice/huggingface"},
                            ],
                            "resources": {
                                "requests": {"cpu": "2", "memory": "2Gi"},
                                "limits": {"memory": "2Gi"},
                            },
                            "startupProbe": probe(10, 180),
                            "readinessProbe": probe(5, 3),
                            "livenessProbe": probe(10, 6),
                            "lifecycle": {"preStop": {"exec": {"command": ["sleep", "5"]}}},
                            "volumeMounts": [
                                {"name": "cache", "mountPath": "/var/cache/sluice"},
                                {"name": "tmp", "mountPath": "/tmp"},
                            ],
                            "securityContext": SECURITY,
                        }
                    ],
                    "volumes": [{"name": "cache", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


def test_gpu_hf_deployment_downloads_first_and_requests_gpus(make_spec):
    isvc = make_spec(
        model={
            "source": "hf://Qwen/Qwen2.5-14B-Instruct",
            "revision": "v2",
            "tokenSecretRef": {"name": "hf"},
            "storageSize": "40Gi",
        },
        resources={"gpus": 2, "memory": "64Gi"},
        runtime={"tensorParallelSize": 2, "dtype": "bfloat16"},
    )
    pod = build_deployment(isvc)["spec"]["template"]["spec"]
    container = pod["containers"][0]

    assert pod["initContainers"] == [
        {
            "name": "model-download",
            "image": IMAGE,
            "command": ["python", "-c", DOWNLOAD_SCRIPT],
            "env": [
                {"name": "SLUICE_MODEL_REPO", "value": "Qwen/Qwen2.5-14B-Instruct"},
                {"name": "SLUICE_MODEL_DIR", "value": "/models/hf"},
                {"name": "HF_HOME", "value": "/tmp/huggingface"},
                {"name": "SLUICE_MODEL_REVISION", "value": "v2"},
                {
                    "name": "HF_TOKEN",
                    "valueFrom": {"secretKeyRef": {"name": "hf", "key": "HF_TOKEN"}},
                },
            ],
            "volumeMounts": [
                {"name": "model", "mountPath": "/models"},
                {"name": "tmp", "mountPath": "/tmp"},
            ],
            "securityContext": SECURITY,
            "resources": {"requests": {"memory": "64Gi"}, "limits": {"memory": "64Gi"}},
        }
    ]
    assert container["resources"] == {
        "requests": {"memory": "64Gi", "nvidia.com/gpu": "2"},
        "limits": {"memory": "64Gi", "nvidia.com/gpu": "2"},
    }
    assert container["args"][:12] == [
        "--model",
        "/models/hf",
        "--served-model-name",
        "Qwen/Qwen2.5-14B-Instruct",
        "--host",
        "0.0.0.0",
        "--port",
        "30000",
        "--device",
        "cuda",
        "--tensor-parallel-size",
        "2",
    ]
    assert pod["volumes"] == [
        {"name": "cache", "emptyDir": {}},
        {"name": "tmp", "emptyDir": {}},
        {"name": "model", "emptyDir": {"sizeLimit": "40Gi"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
    ]
    assert container["volumeMounts"] == [
        {"name": "cache", "mountPath": "/var/cache/sluice"},
        {"name": "tmp", "mountPath": "/tmp"},
        {"name": "model", "mountPath": "/models", "readOnly": True},
        {"name": "dshm", "mountPath": "/dev/shm"},
    ]


def test_download_script_takes_its_arguments_from_the_environment():
    assert 'os.environ["SLUICE_MODEL_REPO"]' in DOWNLOAD_SCRIPT
    compile(DOWNLOAD_SCRIPT, "<download>", "exec")  # valid Python


def test_pvc_model_is_mounted_read_only(make_spec):
    isvc = make_spec(model={"source": "pvc://models/gguf/qwen.gguf"})
    pod = build_deployment(isvc)["spec"]["template"]["spec"]

    assert "initContainers" not in pod
    assert {
        "name": "model",
        "persistentVolumeClaim": {"claimName": "models", "readOnly": True},
    } in pod["volumes"]
    assert {"name": "model", "mountPath": "/models/pvc", "readOnly": True} in pod["containers"][0][
        "volumeMounts"
    ]
    assert pod["containers"][0]["args"][:4] == [
        "--model",
        "/models/pvc/gguf/qwen.gguf",
        "--served-model-name",
        "qwen",
    ]


def test_no_shm_volume_without_tensor_parallelism(make_spec):
    pod = build_deployment(make_spec(resources={"gpus": 1}))["spec"]["template"]["spec"]
    assert all(volume["name"] != "dshm" for volume in pod["volumes"])


def test_runtime_options_become_flags_in_order(make_spec):
    isvc = make_spec(
        runtime={
            "dtype": "float32",
            "pageSize": 16,
            "maxRunningRequests": 32,
            "chunkedPrefillSize": 2048,
            "schedulePolicy": "lpm",
            "memFractionStatic": 0.85,
            "attentionBackend": "torch",
            "overlapSchedule": False,
            "extraArgs": ["--max-total-tokens=4096"],
        }
    )

    assert serve_args(isvc, "smollm2-135m")[12:] == [
        "--dtype",
        "float32",
        "--page-size",
        "16",
        "--max-running-requests",
        "32",
        "--chunked-prefill-size",
        "2048",
        "--schedule-policy",
        "lpm",
        "--mem-fraction-static",
        "0.85",
        "--attention-backend",
        "torch",
        "--disable-overlap-schedule",
        "--max-total-tokens=4096",
    ]


def test_api_key_comes_from_a_secret_and_user_env_follows(make_spec):
    isvc = make_spec(
        runtime={"apiKeySecretRef": {"name": "keys"}},
        env=[{"name": "LOG_LEVEL", "value": "debug"}],
    )
    env = build_deployment(isvc)["spec"]["template"]["spec"]["containers"][0]["env"]

    assert env[2:] == [
        {
            "name": "SLUICE_API_KEY",
            "valueFrom": {"secretKeyRef": {"name": "keys", "key": "SLUICE_API_KEY"}},
        },
        {"name": "LOG_LEVEL", "value": "debug"},
    ]
    assert (
        "--api-key"
        not in build_deployment(isvc)["spec"]["template"]["spec"]["containers"][0]["args"]
    )


def test_scheduling_is_copied_to_the_pod(make_spec):
    scheduling = {
        "nodeSelector": {"gpu": "h100"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        "priorityClassName": "inference",
        "runtimeClassName": "nvidia",
    }
    pod = build_deployment(make_spec(scheduling=copy.deepcopy(scheduling)))["spec"]["template"][
        "spec"
    ]

    assert {key: pod[key] for key in scheduling} == scheduling


def test_built_objects_do_not_alias_the_spec(make_spec):
    isvc = make_spec(env=[{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}])
    first = build_deployment(isvc)
    first["spec"]["template"]["spec"]["containers"][0]["env"][-1]["valueFrom"]["fieldRef"][
        "fieldPath"
    ] = "x"

    assert build_deployment(isvc)["spec"]["template"]["spec"]["containers"][0]["env"][-1][
        "valueFrom"
    ] == {"fieldRef": {"fieldPath": "metadata.name"}}


def test_startup_probe_allows_the_startup_timeout(make_spec):
    container = build_deployment(make_spec(startupTimeoutSeconds=605))["spec"]["template"]["spec"][
        "containers"
    ][0]
    assert (
        container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"]
        >= 605
    )


def test_autoscaled_deployment_leaves_replicas_to_the_hpa(make_spec):
    isvc = make_spec(replicas=3, autoscaling={"enabled": True})
    assert "replicas" not in build_deployment(isvc)["spec"]


def test_service_is_exactly_this(make_spec):
    assert build_service(make_spec()) == {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": META,
        "spec": {
            "type": "ClusterIP",
            "selector": SELECTOR,
            "ports": [
                {
                    "name": "http",
                    "port": 80,
                    "targetPort": "http",
                    "protocol": "TCP",
                    "appProtocol": "http",
                }
            ],
        },
    }


def test_hpa_is_exactly_this(make_spec):
    isvc = make_spec(
        autoscaling={
            "enabled": True,
            "minReplicas": 2,
            "maxReplicas": 6,
            "metrics": [
                {"type": "queueDepth", "target": 4},
                {"type": "kvTokenUsage", "target": 0.8},
            ],
            "behavior": {
                "scaleDown": {
                    "stabilizationWindowSeconds": 600,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}],
                }
            },
        }
    )

    assert build_hpa(isvc) == {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": META,
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "chat"},
            "minReplicas": 2,
            "maxReplicas": 6,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "sluice_queue_requests"},
                        "target": {"type": "AverageValue", "averageValue": "4"},
                    },
                },
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": "sluice_kv_token_usage"},
                        "target": {"type": "AverageValue", "averageValue": "800m"},
                    },
                },
            ],
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0},
                "scaleDown": {
                    "stabilizationWindowSeconds": 600,
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": 120}],
                },
            },
        },
    }


def test_pdb_is_exactly_this(make_spec):
    assert build_pdb(make_spec(replicas=2)) == {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": META,
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": SELECTOR},
            "unhealthyPodEvictionPolicy": "AlwaysAllow",
        },
    }


def test_podmonitor_is_exactly_this(make_spec):
    assert build_podmonitor(make_spec()) == {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": META,
        "spec": {
            "selector": {"matchLabels": SELECTOR},
            "podMetricsEndpoints": [{"port": "http", "path": "/metrics", "interval": "15s"}],
        },
    }


def test_selector_string_matches_the_selector_labels():
    assert (
        selector_string("chat")
        == "app.kubernetes.io/instance=chat,app.kubernetes.io/name=sluice-runtime"
    )


@pytest.mark.parametrize(
    ("value", "quantity"), [(8, "8"), (8.0, "8"), (0.8, "800m"), (2.5, "2500m"), (0.0001, "1m")]
)
def test_metric_targets_become_quantities(value, quantity):
    assert to_quantity(value) == quantity


@pytest.mark.parametrize(
    ("spec", "podmonitors", "kinds", "removed"),
    [
        ({}, None, ["Deployment", "Service"], [HPAS, PDBS]),
        ({"replicas": 2}, None, ["Deployment", "Service", "PodDisruptionBudget"], [HPAS]),
        (
            {"autoscaling": {"enabled": True}},
            None,
            ["Deployment", "Service", "HorizontalPodAutoscaler"],
            [PDBS],
        ),
        (
            {"autoscaling": {"enabled": True, "minReplicas": 2}},
            True,
            [
                "Deployment",
                "Service",
                "HorizontalPodAutoscaler",
                "PodDisruptionBudget",
                "PodMonitor",
            ],
            [],
        ),
        ({}, False, ["Deployment", "Service"], [HPAS, PDBS, PODMONITORS]),
    ],
    ids=["one-replica", "two-replicas", "autoscaled", "everything", "monitoring-off"],
)
def test_plan_names_the_children_to_apply_and_remove(make_spec, spec, podmonitors, kinds, removed):
    result = plan(make_spec(**spec), podmonitors=podmonitors)

    assert [obj["kind"] for obj in result.apply] == kinds
    assert list(result.remove) == removed
