"""The router Deployment: `sluice router` in front of the runtime pods (spec.router).

- It finds the runtime pods itself: `--discover-selector kubernetes.io/service-name=
  <name>-workers` watches the EndpointSlices of the workers Service (workers.py), ready
  endpoints on the port named `http` join, others leave. With spec.disaggregation it runs
  `--pd-disaggregation` and watches the two pools' Services instead (`--discover-prefill-
  selector ...=<name>-prefill`, `--discover-decode-selector ...=<name>-decode`), pairing
  a prefill and a decode pod per request. Its ServiceAccount may read EndpointSlices in
  this namespace and nothing else (router_rbac.py); the token is mounted (the
  `kubernetes` client's in-cluster config reads it).
- Probes: readiness on `/health` (200 while at least one runtime pod is healthy, so a
  router that cannot route takes no traffic), liveness on `/liveness` (the process serves).
- Draining like the runtime: a preStop pause so the Service's endpoints drop the pod, then
  SIGTERM; `--drain-timeout` = grace period − preStop − exit margin, the same budget as
  the runtime pods', because the requests it holds open are theirs.
- Rolling updates surge one pod and never take a serving router down first; replicas spread
  over nodes; non-root, read-only root filesystem (a writable /tmp), scrape annotations.
- No GPU, no node selector or tolerations of the runtime pods: it belongs on CPU nodes.
- Its own image (`spec.router.image`, else the operator's SLUICE_ROUTER_IMAGE: the
  Dockerfile's `router` target, without torch); the runtime pods' imagePullSecrets apply
  to it too (both images usually live in the same registry).
- A PodDisruptionBudget `<name>-router` (pdb.py): drains evict one router pod at a time.
  When none is left the model Service falls back to the runtime pods (reconcile.py), so
  the service stays reachable through `<name>` while its router is gone.
"""

from __future__ import annotations

from typing import Any

from sluice.runtime import constants as rc

from .. import constants as c
from ..spec import InferenceServiceSpec
from .common import (
    container_security_context,
    node_spread,
    pod_security_context,
    router_labels,
    router_meta,
    router_selector_labels,
)


def router_command() -> list[str]:
    return list(rc.ROUTER_COMMAND)


def router_args(isvc: InferenceServiceSpec) -> list[str]:
    return [
        rc.FLAG_HOST, c.BIND_HOST,
        rc.FLAG_PORT, str(rc.ROUTER_DEFAULT_PORT),
        rc.FLAG_POLICY, isvc.router.policy,
        *_discovery(isvc),
        rc.FLAG_DISCOVER_NAMESPACE, isvc.namespace,
        rc.FLAG_DISCOVER_PORT_NAME, rc.CONTAINER_PORT_NAME,
        rc.FLAG_DRAIN_TIMEOUT, str(isvc.drain_timeout_seconds),
    ]  # fmt: skip


def _discovery(isvc: InferenceServiceSpec) -> list[str]:
    """Which Services' EndpointSlices hold the servers: the workers', or the P/D pools'."""
    if not isvc.disaggregation.enabled:
        return [rc.FLAG_DISCOVER_SELECTOR, _slices_of(isvc.workers_service_name)]
    prefill, decode = (view.runtime_name for view in isvc.runtime_views)
    return [
        rc.FLAG_PD_DISAGGREGATION,
        rc.FLAG_DISCOVER_PREFILL_SELECTOR, _slices_of(prefill),
        rc.FLAG_DISCOVER_DECODE_SELECTOR, _slices_of(decode),
    ]  # fmt: skip


def _slices_of(service: str) -> str:
    """The label selector of a Service's EndpointSlices."""
    return f"{c.LABEL_SERVICE_NAME}={service}"


def router_scrape_annotations() -> dict[str, str]:
    return {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(rc.ROUTER_DEFAULT_PORT),
        "prometheus.io/path": rc.METRICS_PATH,
    }


def build_router_deployment(
    isvc: InferenceServiceSpec, *, run_as_user: int | None = c.RUN_AS_USER
) -> dict[str, Any]:
    selector = router_selector_labels(isvc.name)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": router_meta(isvc),
        "spec": {
            "replicas": isvc.router.replicas,
            "selector": {"matchLabels": selector},
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
            },
            "revisionHistoryLimit": 3,
            "template": {
                "metadata": {
                    "labels": router_labels(isvc.name),
                    "annotations": router_scrape_annotations(),
                },
                "spec": _pod_spec(isvc, run_as_user),
            },
        },
    }


def _pod_spec(isvc: InferenceServiceSpec, run_as_user: int | None) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "serviceAccountName": isvc.router_name,
        "automountServiceAccountToken": True,  # discovery reads EndpointSlices with it
        "enableServiceLinks": False,
    }
    if isvc.pod.image_pull_secrets:  # the same registry as the runtime image, as a rule
        pod["imagePullSecrets"] = [{"name": name} for name in isvc.pod.image_pull_secrets]
    return pod | {
        "securityContext": pod_security_context(run_as_user),
        "terminationGracePeriodSeconds": isvc.termination_grace_period_seconds,
        "containers": [_container(isvc)],
        "volumes": [{"name": c.VOLUME_TMP, "emptyDir": {}}],
        "topologySpreadConstraints": node_spread(router_selector_labels(isvc.name)),
    }


def _container(isvc: InferenceServiceSpec) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": c.ROUTER_CONTAINER_NAME,
        "image": isvc.router.image,
        "command": router_command(),
        "args": router_args(isvc),
        "ports": [
            {
                "name": rc.CONTAINER_PORT_NAME,
                "containerPort": rc.ROUTER_DEFAULT_PORT,
                "protocol": "TCP",
            }
        ],
    }
    resources = _resources(isvc)
    if resources:
        container["resources"] = resources
    return container | {
        "readinessProbe": _probe(rc.HEALTH_PATH, c.READINESS_PERIOD_SECONDS, 3),
        "livenessProbe": _probe(
            rc.ROUTER_LIVENESS_PATH, c.LIVENESS_PERIOD_SECONDS, c.ROUTER_LIVENESS_FAILURE_THRESHOLD
        ),
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(c.PRESTOP_SLEEP_SECONDS)]}}},
        "volumeMounts": [{"name": c.VOLUME_TMP, "mountPath": c.TMP_DIR}],
        "securityContext": container_security_context(),
    }


def _resources(isvc: InferenceServiceSpec) -> dict[str, Any]:
    """CPU requested, not limited (no throttling in the request path); memory both."""
    router = isvc.router
    result: dict[str, Any] = {}
    if router.cpu or router.memory:
        result["requests"] = {
            key: value for key, value in (("cpu", router.cpu), ("memory", router.memory)) if value
        }
    if router.memory:
        result["limits"] = {"memory": router.memory}
    return result


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": rc.CONTAINER_PORT_NAME},
        "periodSeconds": period,
        "timeoutSeconds": c.PROBE_TIMEOUT_SECONDS,
        "failureThreshold": failures,
    }
