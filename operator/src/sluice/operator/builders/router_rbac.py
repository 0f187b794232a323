"""The router's identity: a ServiceAccount, and a Role and RoleBinding that let it read the
EndpointSlices of its namespace (`get`, `list`, `watch`; nothing else, nowhere else).

Kubernetes lets the operator create this Role only because it holds the same permissions
itself (RBAC's escalation check), which is why the operator's own table lists them.
"""

from __future__ import annotations

from typing import Any

from ..spec import InferenceServiceSpec
from .common import router_meta

RBAC_API = "rbac.authorization.k8s.io"
ENDPOINT_SLICE_RULE = {
    "apiGroups": ["discovery.k8s.io"],
    "resources": ["endpointslices"],
    "verbs": ["get", "list", "watch"],
}


def build_router_service_account(isvc: InferenceServiceSpec) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": router_meta(isvc)}


def build_router_role(isvc: InferenceServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": f"{RBAC_API}/v1",
        "kind": "Role",
        "metadata": router_meta(isvc),
        "rules": [dict(ENDPOINT_SLICE_RULE)],
    }


def build_router_role_binding(isvc: InferenceServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": f"{RBAC_API}/v1",
        "kind": "RoleBinding",
        "metadata": router_meta(isvc),
        "roleRef": {"apiGroup": RBAC_API, "kind": "Role", "name": isvc.router_name},
        "subjects": [
            {"kind": "ServiceAccount", "name": isvc.router_name, "namespace": isvc.namespace}
        ],
    }
