"""The optional NetworkPolicy: who may reach the runtime pods' HTTP port.

Ingress is allowed from the service's own namespace, from the namespaces listed in
`spec.networkPolicy.allowedNamespaces` (API clients) and from the monitoring namespace
(Prometheus scraping /metrics). A NetworkPolicy works on ports, not paths: the API and
/metrics share the port, so the monitoring namespace can reach the API too; protect the
API with `runtime.apiKeySecretRef`. Everything else is denied ingress (with
spec.disaggregation, but for the decode pods' KV fetches from the prefill pods).
"""

from __future__ import annotations

from typing import Any

from sluice.runtime import constants as rc

from .. import constants as c
from ..spec import InferenceServiceSpec
from .common import object_meta, router_meta, router_selector_labels, selector_labels


def _namespaces(names: list[str]) -> list[dict[str, Any]]:
    return [
        {"namespaceSelector": {"matchLabels": {c.LABEL_NAMESPACE_NAME: name}}} for name in names
    ]


def build_networkpolicy(isvc: InferenceServiceSpec) -> dict[str, Any]:
    """With spec.disaggregation it selects both pools' pods, and admits the decode pods to
    the prefill pods' `bootstrap` port (where they fetch the KV)."""
    policy = _policy(isvc, object_meta(isvc), selector_labels(isvc.name))
    if isvc.disaggregation.enabled:
        decode = {"podSelector": {"matchLabels": selector_labels(isvc.name, c.ROLE_DECODE)}}
        port = {"protocol": "TCP", "port": rc.DISAGG_BOOTSTRAP_PORT_NAME}
        policy["spec"]["ingress"].append({"from": [decode], "ports": [port]})
    return policy


def build_router_networkpolicy(isvc: InferenceServiceSpec) -> dict[str, Any]:
    """The same ingress rules for the router pods (`<name>-router`): clients reach the API
    through them, Prometheus scrapes their /metrics."""
    return _policy(isvc, router_meta(isvc), router_selector_labels(isvc.name))


def _policy(
    isvc: InferenceServiceSpec, meta: dict[str, Any], pods: dict[str, str]
) -> dict[str, Any]:
    policy = isvc.network_policy
    port = [{"protocol": "TCP", "port": rc.CONTAINER_PORT_NAME}]
    clients = [isvc.namespace, *(n for n in policy.allowed_namespaces if n != isvc.namespace)]
    ingress: list[dict[str, Any]] = [{"from": _namespaces(clients), "ports": port}]
    if policy.monitoring_namespace and policy.monitoring_namespace not in clients:
        ingress.append({"from": _namespaces([policy.monitoring_namespace]), "ports": port})
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta,
        "spec": {
            "podSelector": {"matchLabels": pods},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
