"""Prometheus metrics for the API server: `GET /metrics` shows the scheduler's gauges and
counters (mirrored from its `SchedulerStats` messages) and the server's request counters
and latency histograms, every series labelled with the served model name.

`MetricsCollector` is a TokenizerManager listener (`on_chunk`, `on_abort`, `on_stats`) and
owns the `/metrics` handler. Names come from `sluice.runtime.constants`; they are an
interface shared with the operator's HPA, the alerts and the dashboard in `monitoring/`.
`compat="vllm"` adds the same scheduler gauges under vLLM's names (`vllm_compat.py`).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    disable_created_metrics,
    generate_latest,
)

from sluice.runtime.ipc.messages import SchedulerStats
from sluice.runtime.metrics.lora import LoraMirror
from sluice.runtime.metrics.requests import RequestMetrics
from sluice.runtime.metrics.scheduler_mirror import SCHEDULER_METRICS, SchedulerMirror
from sluice.runtime.metrics.vllm_compat import COMPAT_FAMILIES, VllmCompatMirror

__all__ = ["MetricsCollector", "SCHEDULER_METRICS"]

logger = logging.getLogger("sluice.metrics")


class MetricsCollector:
    """All of one server's metrics, in a registry of its own.

    The listener hooks run inside the TokenizerManager's receive loop: a bug here must not
    stall every request, so they log and swallow their own errors.
    """

    def __init__(
        self,
        model: str,
        initial_stats: SchedulerStats | None = None,
        compat: str = "none",
        page_size: int = 1,
        lora: bool = False,
    ) -> None:
        if compat not in COMPAT_FAMILIES:
            raise ValueError(f"unknown metrics compat family {compat!r}")
        # no `*_created` series: they double the series count and nothing reads them
        disable_created_metrics()
        self.model = model
        self.registry = CollectorRegistry(auto_describe=True)
        self.scheduler = SchedulerMirror(model, initial_stats)
        self.registry.register(self.scheduler)
        if compat == "vllm":
            self.registry.register(VllmCompatMirror(self.scheduler, page_size))
        self.requests = RequestMetrics(model, self.registry)
        self.lora = LoraMirror(self.scheduler, self.registry) if lora else None
        if self.lora is not None:
            self.registry.register(self.lora)

    def attach(self, tm: Any) -> None:
        """Start listening to a TokenizerManager, from its latest scheduler stats on."""
        self.scheduler.update(tm.stats)
        tm.listeners.append(self)

    # --- TokenizerManager listener --------------------------------------------------------
    def on_stats(self, stats: SchedulerStats) -> None:
        try:
            self.scheduler.update(stats)
            self.requests.on_queue_times(stats.queue_times)
            self.requests.on_transfer_times(stats.disagg_transfer_seconds)
        except Exception:
            logger.exception("metrics: cannot record scheduler stats")

    def on_message(self, msg: object) -> None:
        if self.lora is not None:
            try:
                self.lora.on_message(msg)
            except Exception:
                logger.exception("metrics: cannot record a LoRA load")

    def on_chunk(self, rid: str, chunk: Any, state: Any) -> None:
        try:
            self.requests.on_chunk(rid, chunk, state.created)
        except Exception:
            logger.exception("metrics: cannot record an update of rid=%s", rid)

    def on_reject(self, n: int) -> None:
        try:
            self.requests.on_reject(n)
        except Exception:
            logger.exception("metrics: cannot record a rejection")

    def on_abort(self, rid: str, state: Any) -> None:
        try:
            self.requests.on_abort(rid, state.created)
        except Exception:
            logger.exception("metrics: cannot record the abort of rid=%s", rid)

    # --- exposition -----------------------------------------------------------------------
    def render(self) -> bytes:
        return generate_latest(self.registry)

    async def handler(self) -> Response:
        """GET /metrics: Prometheus text format."""
        return Response(self.render(), media_type=CONTENT_TYPE_LATEST)
