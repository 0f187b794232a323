"""The Deployment that runs `sluice serve`.

Choices a reviewer should know about:
- `spec.replicas` is what the caller decides (replicas.py: the HPA owns it while
  autoscaling, handed over without a drop to the default of 1).
- Rolling updates follow `spec.rollout`; by default they surge one pod and never take a
  serving pod down first (maxSurge 1, maxUnavailable 0): zero downtime, at the cost of
  needing room for one extra pod (on a full GPU pool: maxSurge 0, maxUnavailable 1).
- Probes: startup and readiness on `/health` (503 while loading and draining), the
  startup probe allowing `startupTimeoutSeconds` (the runtime's own `--startup-timeout`
  is the same); liveness on `/health/live`, which fails only when the scheduler is hung.
- Draining: preStop sleeps a few seconds so Service endpoints drop the pod, then SIGTERM
  makes the runtime finish running requests within `--drain-timeout` = grace period −
  preStop − a margin to exit.
- Pods spread over nodes by default (one node's loss or drain takes few replicas); GPUs
  per pod = tensor-parallel size; tensor parallelism gets a memory-backed /dev/shm.
- Security: non-root (uid 1000 unless the platform assigns uids), read-only root
  filesystem (writable emptyDirs for /tmp and the cache), no service-account token, no
  service links in the environment.
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
    node_spread,
    object_meta,
    pod_security_context,
    secret_env,
    selector_labels,
)
from .model import model_mount

FROM_SPEC = -1  # build_deployment(replicas=...): spec.replicas, or none while autoscaling


def build_deployment(
    isvc: InferenceServiceSpec,
    *,
    replicas: int | None = FROM_SPEC,
    run_as_user: int | None = c.RUN_AS_USER,
) -> dict[str, Any]:
    """`replicas`: the count to apply, None to leave the field out (the HPA owns it)."""
    if replicas == FROM_SPEC:
        replicas = None if isvc.autoscaling.enabled else isvc.replicas
    spec: dict[str, Any] = {}
    if replicas is not None:
        spec["replicas"] = replicas
    spec |= {
        "selector": {"matchLabels": selector_labels(isvc.name, isvc.role)},
        "strategy": {
            "type": "RollingUpdate",
            "rollingUpdate": {
                "maxSurge": isvc.rollout.max_surge,
                "maxUnavailable": isvc.rollout.max_unavailable,
            },
        },
        "revisionHistoryLimit": 3,
        "progressDeadlineSeconds": isvc.startup_timeout_seconds
        + c.PROGRESS_DEADLINE_MARGIN_SECONDS,
        "template": {
            "metadata": pod_metadata(isvc),
            "spec": pod_spec(isvc, run_as_user=run_as_user),
        },
    }
    meta = object_meta(isvc)
    meta["annotations"] = {c.ANNOTATION_SPEC_REPLICAS: str(isvc.replicas)}
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}


def pod_metadata(isvc: InferenceServiceSpec) -> dict[str, Any]:
    """The operator's labels and scrape annotations, after the user's own."""
    return {
        "labels": {**isvc.pod.labels, **labels(isvc.name, isvc.role)},
        "annotations": {**isvc.pod.annotations, **scrape_annotations()},
    }


def scrape_annotations() -> dict[str, str]:
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(rc.DEFAULT_PORT),
        "prometheus.io/path": rc.METRICS_PATH,
    }


def resource_requirements(isvc: InferenceServiceSpec, *, runtime: bool) -> dict[str, Any]:
    """CPU is requested but not limited (no throttling); memory is requested and limited.
    The runtime container also asks for its GPUs (one per tensor-parallel rank) and for the
    disk an hf:// download fills (ephemeral storage: the emptyDir holding the weights)."""
    res = isvc.resources
    requests: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    if res.cpu:
        requests["cpu"] = res.cpu
    if res.memory:
        requests["memory"] = limits["memory"] = res.memory
    if runtime and res.gpus:
        requests[res.gpu_resource] = limits[res.gpu_resource] = str(res.gpus)
    if runtime and isvc.model.storage_size and isvc.model.source.scheme == "hf":
        if not isvc.model.cache_claim:
            requests["ephemeral-storage"] = isvc.model.storage_size
    result: dict[str, Any] = {}
    if requests:
        result["requests"] = requests
    if limits:
        result["limits"] = limits
    return result


def pod_spec(isvc: InferenceServiceSpec, *, run_as_user: int | None) -> dict[str, Any]:
    model = model_mount(isvc, resource_requirements(isvc, runtime=False))
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
        size = (
            isvc.resources.shm_size or f"{isvc.runtime.tensor_parallel_size * c.SHM_GIB_PER_RANK}Gi"
        )
        volumes.append({"name": c.VOLUME_SHM, "emptyDir": {"medium": "Memory", "sizeLimit": size}})
        mounts.append({"name": c.VOLUME_SHM, "mountPath": c.SHM_DIR})

    pod: dict[str, Any] = {"automountServiceAccountToken": False, "enableServiceLinks": False}
    if isvc.pod.service_account_name:
        pod["serviceAccountName"] = isvc.pod.service_account_name
    if isvc.pod.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": name} for name in isvc.pod.image_pull_secrets]
    pod |= {
        "securityContext": pod_security_context(run_as_user),
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
        "ports": container_ports(isvc),
        "env": runtime_env(isvc),
    }
    resources = resource_requirements(isvc, runtime=True)
    if resources:
        container["resources"] = resources
    container |= {
        "startupProbe": http_probe(
            rc.HEALTH_PATH,
            period=c.STARTUP_PROBE_PERIOD_SECONDS,
            failures=math.ceil(isvc.startup_timeout_seconds / c.STARTUP_PROBE_PERIOD_SECONDS),
        ),
        "readinessProbe": http_probe(rc.HEALTH_PATH, period=c.READINESS_PERIOD_SECONDS, failures=3),
        "livenessProbe": http_probe(
            rc.LIVE_PATH, period=c.LIVENESS_PERIOD_SECONDS, failures=c.LIVENESS_FAILURE_THRESHOLD
        ),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(c.PRESTOP_SLEEP_SECONDS)]}}},
        "volumeMounts": mounts,
        "securityContext": container_security_context(),
    }
    return container


def container_ports(isvc: InferenceServiceSpec) -> list[dict[str, Any]]:
    """The HTTP port; a prefill pod's also the port decode pods fetch the KV from."""
    ports = [{"name": rc.CONTAINER_PORT_NAME, "containerPort": rc.DEFAULT_PORT, "protocol": "TCP"}]
    if isvc.role == c.ROLE_PREFILL:
        port = isvc.disaggregation.bootstrap_port
        ports.append(
            {"name": rc.DISAGG_BOOTSTRAP_PORT_NAME, "containerPort": port, "protocol": "TCP"}
        )
    return ports


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


def http_probe(path: str, *, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": rc.CONTAINER_PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": c.PROBE_TIMEOUT_SECONDS,
        "failureThreshold": failures,
    }


def default_topology_spread(isvc: InferenceServiceSpec) -> list[dict[str, Any]]:
    """Spread the pods of one version over nodes, as evenly as the nodes allow (never
    blocking scheduling: GPU nodes are scarce)."""
    return node_spread(selector_labels(isvc.name, isvc.role))


def scheduling_fields(isvc: InferenceServiceSpec) -> dict[str, Any]:
    s = isvc.scheduling
    fields: dict[str, Any] = {}
    if s.node_selector:
        fields["nodeSelector"] = dict(s.node_selector)
    if s.tolerations:
        fields["tolerations"] = [copy.deepcopy(dict(t)) for t in s.tolerations]
    if s.affinity:
        fields["affinity"] = copy.deepcopy(dict(s.affinity))
    if s.topology_spread_constraints is None:
        fields["topologySpreadConstraints"] = default_topology_spread(isvc)
    elif s.topology_spread_constraints:
        fields["topologySpreadConstraints"] = [
            copy.deepcopy(dict(t)) for t in s.topology_spread_constraints
        ]
    if s.priority_class_name:
        fields["priorityClassName"] = s.priority_class_name
    if s.runtime_class_name:
        fields["runtimeClassName"] = s.runtime_class_name
    return fields
