"""The Prometheus Operator PodMonitor (created only when monitoring.coreos.com is served)."""

from __future__ import annotations

from typing import Any

from sluice.runtime import constants as rc

from ..spec import InferenceServiceSpec
from .common import object_meta, router_meta, router_selector_labels, selector_labels

SCRAPE_INTERVAL = "15s"


def build_podmonitor(isvc: InferenceServiceSpec) -> dict[str, Any]:
    return _monitor(object_meta(isvc), selector_labels(isvc.name))


def build_router_podmonitor(isvc: InferenceServiceSpec) -> dict[str, Any]:
    """The router's own metrics (sluice_router_*), from its pods' `http` port."""
    return _monitor(router_meta(isvc), router_selector_labels(isvc.name))


def _monitor(meta: dict[str, Any], pods: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta,
        "spec": {
            "selector": {"matchLabels": pods},
            "podMetricsEndpoints": [
                {
                    "port": rc.CONTAINER_PORT_NAME,
                    "path": rc.METRICS_PATH,
                    "interval": SCRAPE_INTERVAL,
                }
            ],
        },
    }
