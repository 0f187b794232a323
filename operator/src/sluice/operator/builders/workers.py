"""The Services the router finds its servers from: `<name>-workers` (the runtime pods) or,
with spec.disaggregation, one per pool: `<name>-prefill` and `<name>-decode`.

The router does not send through them: it watches their EndpointSlices (label
`kubernetes.io/service-name=<service>`, set by the EndpointSlice controller) and
connects to each ready pod's `http` port itself; a prefill pod's KV bootstrap port is the
EndpointSlice port named `bootstrap`, which the router hands to the decode pod. Headless
(no cluster IP, no kube-proxy rules), since nothing connects to the Services' addresses.
"""

from __future__ import annotations

from typing import Any

from sluice.runtime import constants as rc

from .. import constants as c
from ..spec import InferenceServiceSpec
from .common import object_meta, selector_labels


def build_workers_service(isvc: InferenceServiceSpec) -> dict[str, Any]:
    return _headless(object_meta(isvc, isvc.workers_service_name), selector_labels(isvc.name),
                     [_port(rc.CONTAINER_PORT_NAME, rc.DEFAULT_PORT, "http")])  # fmt: skip


def build_pool_service(pool: InferenceServiceSpec) -> dict[str, Any]:
    """`pool`: a pool's view of the spec (`InferenceServiceSpec.for_pool`)."""
    ports = [_port(rc.CONTAINER_PORT_NAME, rc.DEFAULT_PORT, "http")]
    if pool.role == c.ROLE_PREFILL:
        port = pool.disaggregation.bootstrap_port
        ports.append(_port(rc.DISAGG_BOOTSTRAP_PORT_NAME, port, None))
    return _headless(object_meta(pool), selector_labels(pool.name, pool.role), ports)


def _port(name: str, number: int, app_protocol: str | None) -> dict[str, Any]:
    port = {"name": name, "port": number, "targetPort": name, "protocol": "TCP"}
    return port | ({"appProtocol": app_protocol} if app_protocol else {})


def _headless(
    meta: dict[str, Any], selector: dict[str, str], ports: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {"type": "ClusterIP", "clusterIP": "None", "selector": selector, "ports": ports},
    }
