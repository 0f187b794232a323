"""LoRA metrics (`--enable-lora`): per adapter, its requests running and waiting (from the
scheduler's latest `SchedulerStats`, at scrape time), adapters loaded, the batch limit,
and a histogram of adapter load times (loads through `POST /v1/load_lora_adapter`)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluice.runtime.constants import (
    LABEL_LORA_ADAPTER,
    LABEL_MODEL,
    METRIC_LORA_ADAPTERS_LOADED,
    METRIC_LORA_LOAD_SECONDS,
    METRIC_LORA_MAX_ADAPTERS,
    METRIC_LORA_REQUESTS_RUNNING,
    METRIC_LORA_REQUESTS_WAITING,
)
from sluice.runtime.ipc.messages import LoraOpResult
from sluice.runtime.metrics.scheduler_mirror import SchedulerMirror

LOAD_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class LoraMirror(Collector):
    def __init__(self, mirror: SchedulerMirror, registry: CollectorRegistry) -> None:
        self.mirror = mirror
        self.load_seconds = Histogram(
            METRIC_LORA_LOAD_SECONDS, "Seconds to read and validate a LoRA adapter (run-time loads).",
            [LABEL_MODEL], registry=registry, buckets=LOAD_BUCKETS,
        ).labels(mirror.model)  # fmt: skip

    def on_message(self, msg: object) -> None:
        if isinstance(msg, LoraOpResult) and msg.ok and msg.load_seconds > 0:
            self.load_seconds.observe(msg.load_seconds)

    def collect(self) -> Iterator[Metric]:
        stats = self.mirror.stats
        model = self.mirror.model
        labels = [LABEL_MODEL, LABEL_LORA_ADAPTER]
        for name, help_text, counts in (
            (METRIC_LORA_REQUESTS_RUNNING, "Requests of each LoRA adapter in the running batch.",
             stats.lora_running),
            (METRIC_LORA_REQUESTS_WAITING, "Requests of each LoRA adapter waiting to be scheduled.",
             stats.lora_waiting),
        ):  # fmt: skip
            gauge = GaugeMetricFamily(name, help_text, labels=labels)
            for adapter, n in sorted(counts.items()):
                gauge.add_metric([model, adapter], float(n))
            yield gauge
        for name, help_text, value in (
            (METRIC_LORA_ADAPTERS_LOADED, "LoRA adapters loaded.", stats.lora_loaded),
            (METRIC_LORA_MAX_ADAPTERS, "Most distinct LoRA adapters in one batch (--max-loras).",
             stats.lora_max),
        ):  # fmt: skip
            gauge = GaugeMetricFamily(name, help_text, labels=[LABEL_MODEL])
            gauge.add_metric([model], float(value))
            yield gauge

    def describe(self) -> Iterator[Metric]:
        return self.collect()
