"""Small shared helpers for the operator tests: paths, the test image, sample objects.

The emulator is in operator_emulator.py, the cluster handle in operator_cluster.py, the
validators in operator_validators.py.
"""

from __future__ import annotations

import copy
import itertools
import pathlib
from typing import Any

import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
CRD_PATH = REPO / "crds" / "inferenceservice.yaml"
SAMPLES = sorted((REPO / "samples").glob("*.yaml"))

IMAGE = "registry.example/sluice-runtime:1.0"  # the operator's default image in tests


def isvc_object(name: str = "chat", namespace: str = "default", **spec: Any) -> dict[str, Any]:
    """An InferenceService object with the bundled model unless `model` is given."""
    body = {"model": {"source": "bundled://smollm2-135m"}} | spec
    return {
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": namespace},
        "spec": copy.deepcopy(body),
    }


def load_crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


# --- a matrix of valid specs ---------------------------------------------------------------
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


def merged(*parts: dict) -> dict:
    result: dict = {}
    for part in parts:
        for key, value in copy.deepcopy(part).items():
            if isinstance(value, dict) and isinstance(result.get(key), dict):
                result[key] = {**result[key], **value}
            else:
                result[key] = value
    return result


def _matrix() -> list[tuple[str, dict[str, Any]]]:
    cases = []
    for combo in itertools.product(SOURCES, COMPUTE, SCALING, EXTRAS):
        source, compute, scaling, extras = combo
        spec = merged(
            {"model": SOURCES[source]}, COMPUTE[compute], SCALING[scaling], EXTRAS[extras]
        )
        if "runtime" in COMPUTE[compute] and "runtime" in EXTRAS[extras]:
            spec["runtime"] = {**COMPUTE[compute]["runtime"], **EXTRAS[extras]["runtime"]}
        cases.append(("-".join(combo), spec))
    return cases


# specs the builders are tested with (Kubernetes schemas, the runtime's parser), by id
SPEC_MATRIX = _matrix()
