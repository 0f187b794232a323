"""The Deployment that runs `sluice serve`.

Choices a reviewer should know about:
- `spec.replicas` is left out when autoscaling is on, so the HPA owns it (server-side
  apply then releases the field instead of fighting the HPA).
- Rolling updates surge one pod and never take a serving pod down first (maxSurge 1,
  maxUnavailable 0): zero downtime, at the cost of needing room for one extra pod.
- Startup probe: `startupTimeoutSeconds` of model loading before liveness applies.
  Readiness and liveness both use `/health`, which is 503 while loading and draining.
- Draining: preStop sleeps a few seconds so Service endpoints drop the pod, then SIGTERM
  makes the runtime finish running requests within `terminationGracePeriodSeconds`.
- Security: non-root uid 1000, read-only root filesystem (writable emptyDirs for /tmp and
  the cache), no service-account token, no service links in the environment.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from sluice.runtime import constants as rc

from .. import constants as c
from ..spec import InferenceServiceSpec
from .args import serve_args, serve_command
from .common import (
    container_security_context,
    labels,
    object_meta,
    pod_security_context,
    secret_env,
    selector_labels,
)
from .model import model_mount


def build_deployment(isvc: InferenceServiceSpec) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if not isvc.autoscaling.enabled:
        spec["replicas"] = isvc.replicas
    spec |= {
        "selector": {"matchLabels": selector_labels(isvc.name)},
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
        },
        "revisionHistoryLimit": 3,
        "progressDeadlineSeconds": isvc.startup_timeout_seconds
        + c.PROGRESS_DEADLINE_MARGIN_SECONDS,
        "template": {
            "metadata": {"labels": labels(isvc.name), "annotations": scrape_annotations()},
            "spec": pod_spec(isvc),
        },
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": object_meta(isvc),
        "spec": spec,
    }


def scrape_annotations() -> dict[str, str]:
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(rc.DEFAULT_PORT),
        "prometheus.io/path": rc.METRICS_PATH,
    }


def resource_requirements(isvc: InferenceServiceSpec, *, with_gpus: bool) -> dict[str, Any]:
    """CPU is requested but not limited (no throttling); memory is requested and limited."""
    res = isvc.resources
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if res.cpu:
        requests["cpu"] = res.cpu
    if res.memory:
        requests["memory"] = limits["memory"] = res.memory
    if with_gpus and res.gpus:
        requests[res.gpu_resource] = limits[res.gpu_resource] = str(res.gpus)
    result: dict[str, Any] = {}
    if requests:
        result["requests"] = requests
    if limits:
        result["limits"] = limits
    return result


def pod_spec(isvc: InferenceServiceSpec) -> dict[str, Any]:
    model = model_mount(isvc, resource_requirements(isvc, with_gpus=False))
    volumes: list[dict[str, Any]] = [
        {"name": c.VOLUME_CACHE, "emptyDir": {}},
        {"name": c.VOLUME_TMP, "emptyDir": {}},
        *model.volumes,
    ]
    mounts: list[dict[str, Any]] = [
        {"name": c.VOLUME_CACHE, "mountPath": c.CACHE_DIR},
        {"name": c.VOLUME_TMP, "mountPath": c.TMP_DIR},
        *model.mounts,
    ]
    if isvc.runtime.tensor_parallel_size > 1:  # NCCL / gloo exchange through shared memory
        volumes.append({"name": c.VOLUME_SHM, "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": c.VOLUME_SHM, "mountPath": c.SHM_DIR})

    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security_context(),
        "terminationGracePeriodSeconds": isvc.termination_grace_period_seconds,
    }
    if model.init_containers:
        pod["initContainers"] = list(model.init_containers)
    pod["containers"] = [runtime_container(isvc, model.model_argument, mounts)]
    pod["volumes"] = volumes
    pod |= scheduling_fields(isvc)
    return pod


def runtime_container(
    isvc: InferenceServiceSpec, model_argument: str, mounts: list[dict[str, Any]]
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": c.CONTAINER_NAME,
        "image": isvc.image,
        "command": serve_command(),
        "args": serve_args(isvc, model_argument),
        "ports": [
            {"name": rc.CONTAINER_PORT_NAME, "containerPort": rc.DEFAULT_PORT, "protocol": "TCP"}
        ],
        "env": runtime_env(isvc),
    }
    resources = resource_requirements(isvc, with_gpus=True)
    if resources:
        container["resources"] = resources
    container |= {
        "startupProbe": health_probe(
            period=c.STARTUP_PROBE_PERIOD_SECONDS,
            failures=math.ceil(isvc.startup_timeout_seconds / c.STARTUP_PROBE_PERIOD_SECONDS),
        ),
        "readinessProbe": health_probe(period=c.READINESS_PERIOD_SECONDS, failures=3),
        "livenessProbe": health_probe(
            period=c.LIVENESS_PERIOD_SECONDS, failures=c.LIVENESS_FAILURE_THRESHOLD
        ),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(c.PRESTOP_SLEEP_SECONDS)]}}},
        "volumeMounts": mounts,
        "securityContext": container_security_context(),
    }
    return container


def runtime_env(isvc: InferenceServiceSpec) -> list[dict[str, Any]]:
    """Operator-set variables first, so the user's `spec.env` may refer to them as $(NAME)."""
    env: list[dict[str, Any]] = [
        {"name": c.ENV_XDG_CACHE_HOME, "value": c.CACHE_DIR},
        {"name": c.ENV_HF_HOME, "value": f"{c.CACHE_DIR}/huggingface"},
    ]
    if isvc.runtime.api_key_secret:
        ref = isvc.runtime.api_key_secret
        env.append(secret_env(rc.ENV_API_KEY, ref.name, ref.key))
    return env + [copy.deepcopy(dict(item)) for item in isvc.env]


def health_probe(*, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": rc.HEALTH_PATH, "port": rc.CONTAINER_PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": c.PROBE_TIMEOUT_SECONDS,
        "failureThreshold": failures,
    }


def scheduling_fields(isvc: InferenceServiceSpec) -> dict[str, Any]:
    s = isvc.scheduling
    fields: dict[str, Any] = {}
    if s.node_selector:
        fields["nodeSelector"] = dict(s.node_selector)
    if s.tolerations:
        fields["tolerations"] = [copy.deepcopy(dict(t)) for t in s.tolerations]
    if s.affinity:
        fields["affinity"] = copy.deepcopy(dict(s.affinity))
    if s.priority_class_name:
        fields["priorityClassName"] = s.priority_class_name
    if s.runtime_class_name:
        fields["runtimeClassName"] = s.runtime_class_name
    return fields
