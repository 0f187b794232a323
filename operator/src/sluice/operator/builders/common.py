"""Labels, names and small value helpers shared by the builders."""

from __future__ import annotations

from typing import Any

from .. import constants as c
from ..spec import InferenceServiceSpec


def _labels(app: str, component: str, name: str) -> dict[str, str]:
    return {
        c.LABEL_NAME: app,
        c.LABEL_INSTANCE: name,
        c.LABEL_COMPONENT: component,
        c.LABEL_PART_OF: c.PART_OF,
        c.LABEL_MANAGED_BY: c.MANAGER_LABEL_VALUE,
    }


def _pool(role: str | None) -> dict[str, str]:
    return {} if role is None else {c.LABEL_DISAGGREGATION_MODE: role}


def selector_labels(name: str, role: str | None = None) -> dict[str, str]:
    """The labels that select this service's runtime pods (immutable in a Deployment); with
    `role`, only those of its P/D pool."""
    return {c.LABEL_NAME: c.APP_NAME, c.LABEL_INSTANCE: name} | _pool(role)


def labels(name: str, role: str | None = None) -> dict[str, str]:
    """All labels a child object and its pods carry (a P/D pool's: its role too)."""
    return _labels(c.APP_NAME, c.COMPONENT, name) | _pool(role)


def router_selector_labels(name: str) -> dict[str, str]:
    """The labels that select this service's router pods (never its runtime pods)."""
    return {c.LABEL_NAME: c.ROUTER_APP_NAME, c.LABEL_INSTANCE: name}


def router_labels(name: str) -> dict[str, str]:
    """All labels the router's objects and pods carry."""
    return _labels(c.ROUTER_APP_NAME, c.ROUTER_COMPONENT, name)


def node_spread(selector: dict[str, str]) -> list[dict[str, Any]]:
    """Spread the pods `selector` picks (one version at a time) over nodes, as evenly as the
    nodes allow, never blocking scheduling."""
    return [
        {
            "maxSkew": 1,
            "topologyKey": c.TOPOLOGY_KEY_NODE,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": selector},
            "matchLabelKeys": [c.LABEL_POD_TEMPLATE_HASH],
        }
    ]


def selector_string(name: str) -> str:
    """The pod selector in `kubectl get -l` form (the scale subresource's `status.selector`)."""
    return ",".join(f"{key}={value}" for key, value in sorted(selector_labels(name).items()))


def object_meta(isvc: InferenceServiceSpec, name: str | None = None) -> dict[str, Any]:
    """Metadata of a child about the runtime pods (named `name`, default `runtime_name`:
    the service's, or in a pool's view the pool's)."""
    return {
        "name": name or isvc.runtime_name,
        "namespace": isvc.namespace,
        "labels": labels(isvc.name, isvc.role),
    }


def router_meta(isvc: InferenceServiceSpec) -> dict[str, Any]:
    """Metadata of the router's objects: `<name>-router`, the router's labels."""
    return {
        "name": isvc.router_name,
        "namespace": isvc.namespace,
        "labels": router_labels(isvc.name),
    }


def to_quantity(value: float) -> str:
    """A Kubernetes quantity for a metric target: 8 → "8", 0.8 → "800m"."""
    if float(value).is_integer():
        return str(int(value))
    return f"{max(1, round(value * 1000))}m"


def container_security_context() -> dict[str, Any]:
    """Non-root, read-only root filesystem, no privilege escalation, no capabilities."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def pod_security_context(run_as_user: int | None = c.RUN_AS_USER) -> dict[str, Any]:
    """Pod Security Standard `restricted`, non-root. `run_as_user` fixes the uid, gid and
    fsGroup (the runtime image's user); None leaves them to the platform (OpenShift's
    restricted-v2 assigns them from the namespace's range and refuses fixed ones)."""
    context: dict[str, Any] = {"runAsNonRoot": True}
    if run_as_user is not None:
        context |= {"runAsUser": run_as_user, "runAsGroup": run_as_user, "fsGroup": run_as_user}
    return context | {
        "fsGroupChangePolicy": "OnRootMismatch",  # no recursive chown of big model volumes
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def secret_env(name: str, secret: str, key: str) -> dict[str, Any]:
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}}
