"""Every object the builders produce, for a matrix of specs, is valid Kubernetes 1.30
(kubernetes-validate, strict: unknown fields are errors)."""

from __future__ import annotations

import copy
import itertools

import kubernetes_validate
import pytest
from operator_validators import k8s_validate

from sluice.operator.children import plan

SOURCES = {
    "bundled": {"source": "bundled://smollm2-135m"},
    "hf": {
        "source": "hf://meta-llama/Llama-3.1-8B-Instruct",
        "tokenSecretRef": {"name": "hf"},
        "storageSize": "40Gi",
    },
    "pvc": {"source": "pvc://models/gguf/qwen2-0.5b.gguf"},
}
COMPUTE = {
    "cpu": {"resources": {"cpu": "2", "memory": "4Gi"}},
    "gpu": {
        "resources": {"gpus": 1, "memory": "32Gi"},
        "runtime": {"dtype": "bfloat16", "memFractionStatic": 0.85},
    },
    "tp4": {
        "resources": {"gpus": 4, "gpuResource": "amd.com/gpu"},
        "runtime": {"tensorParallelSize": 4},
    },
}
SCALING = {
    "fixed": {"replicas": 3},
    "autoscaled": {
        "autoscaling": {
            "enabled": True,
            "minReplicas": 2,
            "maxReplicas": 8,
            "metrics": [
                {"type": "queueDepth", "target": 4},
                {"type": "kvTokenUsage", "target": 0.75},
            ],
            "behavior": {
                "scaleUp": {
                    "policies": [{"type": "Percent", "value": 100, "periodSeconds": 30}],
                    "selectPolicy": "Max",
                }
            },
        }
    },
}
EXTRAS = {
    "plain": {},
    "scheduled": {
        "scheduling": {
            "nodeSelector": {"nvidia.com/gpu.product": "H100-SXM"},
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
            ],
            "affinity": {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 100,
                            "podAffinityTerm": {
                                "topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {"matchLabels": {"app": "x"}},
                            },
                        }
                    ]
                }
            },
            "priorityClassName": "inference-high",
            "runtimeClassName": "nvidia",
        },
        "env": [
            {"name": "LOG_LEVEL", "value": "debug"},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
        "runtime": {
            "apiKeySecretRef": {"name": "api-keys"},
            "extraArgs": ["--max-total-tokens=8192"],
        },
    },
}
MATRIX = list(itertools.product(SOURCES, COMPUTE, SCALING, EXTRAS))


def merged(*parts: dict) -> dict:
    result: dict = {}
    for part in parts:
        for key, value in copy.deepcopy(part).items():
            if isinstance(value, dict) and isinstance(result.get(key), dict):
                result[key] = {**result[key], **value}
            else:
                result[key] = value
    return result


@pytest.mark.parametrize("combo", MATRIX, ids=["-".join(combo) for combo in MATRIX])
def test_every_child_is_valid_kubernetes(make_spec, combo):
    source, compute, scaling, extras = combo
    spec = merged({"model": SOURCES[source]}, COMPUTE[compute], SCALING[scaling], EXTRAS[extras])
    if "runtime" in COMPUTE[compute] and "runtime" in EXTRAS[extras]:
        spec["runtime"] = {**COMPUTE[compute]["runtime"], **EXTRAS[extras]["runtime"]}
    children = plan(make_spec(**spec), podmonitors=True).apply

    assert {obj["kind"] for obj in children} >= {
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "PodMonitor",
    }
    for obj in children:
        if obj["kind"] == "PodMonitor":
            continue  # not a built-in kind: no schema in kubernetes-validate (its shape is unit-tested)
        k8s_validate(obj)


def test_the_validation_is_strict_enough_to_fail(make_spec):
    deployment = plan(make_spec(), podmonitors=None).apply[0]
    deployment["spec"]["template"]["spec"]["containers"][0]["startupProbe"]["httpGet"]["port"] = {
        "name": "http"
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(deployment)

    deployment = plan(make_spec(), podmonitors=None).apply[0]
    deployment["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGets"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        k8s_validate(deployment)


def test_every_new_pod_option_is_valid_kubernetes(make_spec):
    isvc = make_spec(
        model={"source": "hf://org/m-GGUF", "files": ["m-q4.gguf"], "cache": {"claimName": "hub"}},
        resources={"gpus": 2, "shmSize": "4Gi", "memory": "64Gi"},
        serviceAccountName="inference",
        imagePullSecrets=[{"name": "regcred"}],
        podMetadata={"labels": {"team": "ml"}, "annotations": {"example.com/owner": "ml"}},
        networkPolicy={"enabled": True, "allowedNamespaces": ["apps"]},
        scheduling={
            "topologySpreadConstraints": [
                {
                    "maxSkew": 1,
                    "topologyKey": "topology.kubernetes.io/zone",
                    "whenUnsatisfiable": "DoNotSchedule",
                    "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "chat"}},
                }
            ]
        },
        autoscaling={"enabled": True, "minReplicas": 2},
    )
    children = plan(isvc, podmonitors=None, run_as_user=None).apply
    assert {obj["kind"] for obj in children} == {
        "Deployment", "Service", "PodDisruptionBudget", "HorizontalPodAutoscaler", "NetworkPolicy",
    }  # fmt: skip
    for obj in children:
        k8s_validate(obj)
