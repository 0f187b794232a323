"""Small shared helpers for the operator tests: paths, the test image, sample objects.

The emulator is in operator_emulator.py, the cluster handle in operator_cluster.py, the
validators in operator_validators.py.
"""

from __future__ import annotations

import copy
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
