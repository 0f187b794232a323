"""The model's ClusterIP Service `<name>`: port 80 → the pods' `http` port.

It selects the runtime pods, or the router pods when `to_router` (spec.router.enabled and
a router replica available: the reconcile decides, so turning the router on never leaves
the Service without endpoints). Both name their HTTP port `http`.
"""

from __future__ import annotations

from typing import Any

from sluice.runtime import constants as rc

from .. import constants as c
from ..spec import InferenceServiceSpec
from .common import object_meta, router_selector_labels, selector_labels


def build_service(isvc: InferenceServiceSpec, *, to_router: bool = False) -> dict[str, Any]:
    selector = router_selector_labels(isvc.name) if to_router else selector_labels(isvc.name)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(isvc),
        "spec": {
            "type": "ClusterIP",
            "selector": selector,
            "ports": [
                {
                    "name": c.SERVICE_PORT_NAME,
                    "port": c.SERVICE_PORT,
                    "targetPort": rc.CONTAINER_PORT_NAME,
                    "protocol": "TCP",
                    "appProtocol": "http",
                }
            ],
        },
    }


def service_url(isvc_name: str, namespace: str, cluster_domain: str) -> str:
    return f"http://{isvc_name}.{namespace}.svc.{cluster_domain}"
