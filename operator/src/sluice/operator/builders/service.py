"""The ClusterIP Service in front of the runtime pods: port 80 → the pods' `http` port."""

from __future__ import annotations

from typing import Any

from sluice.runtime import constants as rc

from .. import constants as c
from ..spec import InferenceServiceSpec
from .common import object_meta, selector_labels


def build_service(isvc: InferenceServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(isvc),
        "spec": {
            "type": "ClusterIP",
            "selector": selector_labels(isvc.name),
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
