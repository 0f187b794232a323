"""The workers Service `<name>-workers`: the runtime pods, for the router to find.

The router does not send through it: it watches its EndpointSlices (label
`kubernetes.io/service-name=<name>-workers`, set by the EndpointSlice controller) and
connects to each ready pod's `http` port itself. Headless (no cluster IP, no kube-proxy
rules), since nothing connects to the Service's address.
"""

from __future__ import annotations

from typing import Any

from sluice.runtime import constants as rc

from ..spec import InferenceServiceSpec
from .common import object_meta, selector_labels


def build_workers_service(isvc: InferenceServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": object_meta(isvc, isvc.workers_service_name),
        "spec": {
            "type": "ClusterIP",
            "clusterIP": "None",
            "selector": selector_labels(isvc.name),
            "ports": [
                {
                    "name": rc.CONTAINER_PORT_NAME,
                    "port": rc.DEFAULT_PORT,
                    "targetPort": rc.CONTAINER_PORT_NAME,
                    "protocol": "TCP",
                    "appProtocol": "http",
                }
            ],
        },
    }
