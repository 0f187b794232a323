"""The Prometheus Operator PodMonitor (created only when monitoring.coreos.com is served)."""

from __future__ import annotations

from typing import Any

from sluice.runtime import constants as rc

from ..spec import InferenceServiceSpec
from .common import object_meta, selector_labels

SCRAPE_INTERVAL = "15s"


def build_podmonitor(isvc: InferenceServiceSpec) -> dict[str, Any]:
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": object_meta(isvc),
        "spec": {
            "selector": {"matchLabels": selector_labels(isvc.name)},
            "podMetricsEndpoints": [
                {
                    "port": rc.CONTAINER_PORT_NAME,
                    "path": rc.METRICS_PATH,
                    "interval": SCRAPE_INTERVAL,
                }
            ],
        },
    }
