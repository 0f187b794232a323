"""The scheduler's gauges and counters, mirrored from its latest `SchedulerStats`.

The scheduler process publishes a `SchedulerStats` at least once a second and whenever
its queue, running set, retractions or KV usage change (see `scheduler/process.py`). This
collector keeps the latest one and turns it into Prometheus families at scrape time, so a
scrape always shows the newest numbers and costs nothing between scrapes.

Counters are cumulative in the scheduler; the mirror keeps their high-water mark, so a
value it shows never goes down (a stale or reordered message cannot make `rate()` see a
counter reset).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluice.runtime.constants import (
    LABEL_MODEL,
    METRIC_COMPUTED_PROMPT_TOKENS_TOTAL,
    METRIC_DISAGG_FAILED_TRANSFERS_TOTAL,
    METRIC_DISAGG_RECEIVED_TOKENS_TOTAL,
    METRIC_DISAGG_SENT_TOKENS_TOTAL,
    METRIC_DISAGG_WAITING_REQUESTS,
    METRIC_GENERATION_THROUGHPUT,
    METRIC_KV_TOKEN_USAGE,
    METRIC_MAX_TOTAL_TOKENS,
    METRIC_NEW_TOKEN_RATIO,
    METRIC_PREFIX_CACHE_HIT_RATIO,
    METRIC_QUEUE_PROMPT_TOKENS,
    METRIC_QUEUE_REQUESTS,
    METRIC_RETRACTED_TOKENS_TOTAL,
    METRIC_RETRACTIONS_TOTAL,
    METRIC_RUNNING_REQUESTS,
    METRIC_SWA_TOKEN_USAGE,
    METRIC_SWA_TOTAL_TOKENS,
)
from sluice.runtime.ipc.messages import SchedulerStats


@dataclass(frozen=True)
class MirroredMetric:
    name: str
    kind: str  # "gauge" | "counter"
    field: str  # the SchedulerStats field it mirrors
    help: str


SCHEDULER_METRICS = (
    MirroredMetric(METRIC_QUEUE_REQUESTS, "gauge", "queue_requests",
                   "Requests waiting to be scheduled (including retracted ones)."),
    MirroredMetric(METRIC_RUNNING_REQUESTS, "gauge", "running_requests",
                   "Requests in the running batch (decoding, or being prefilled in chunks)."),
    MirroredMetric(METRIC_KV_TOKEN_USAGE, "gauge", "kv_token_usage",
                   "Share of the KV pool held by running requests, 0..1 (evictable cached "
                   "prefixes count as free)."),
    MirroredMetric(METRIC_NEW_TOKEN_RATIO, "gauge", "new_token_ratio",
                   "Share of a running request's remaining max_new_tokens the scheduler "
                   "reserves KV for when admitting new requests."),
    MirroredMetric(METRIC_RETRACTIONS_TOTAL, "counter", "retractions_total",
                   "Requests retracted (KV released, re-queued) because the KV pool ran out."),
    MirroredMetric(METRIC_RETRACTED_TOKENS_TOTAL, "counter", "retracted_tokens_total",
                   "KV tokens released by retractions (recomputed when re-prefilled)."),
    MirroredMetric(METRIC_PREFIX_CACHE_HIT_RATIO, "gauge", "prefix_cache_hit_ratio",
                   "Share of admitted prompt tokens served from the radix prefix cache, "
                   "since start."),
    MirroredMetric(METRIC_GENERATION_THROUGHPUT, "gauge", "generation_throughput",
                   "Tokens generated per second over the scheduler's sliding window."),
    MirroredMetric(METRIC_MAX_TOTAL_TOKENS, "gauge", "max_total_tokens",
                   "Size of the KV pool in tokens."),
    MirroredMetric(METRIC_SWA_TOKEN_USAGE, "gauge", "swa_token_usage",
                   "Share of the sliding-window layers' own KV pool in use, 0..1 (windows "
                   "of running requests and of cached prefixes; 0 without that pool)."),
    MirroredMetric(METRIC_SWA_TOTAL_TOKENS, "gauge", "swa_total_tokens",
                   "Size of the sliding-window layers' own KV pool in tokens (0: none, "
                   "they share the KV pool)."),
    MirroredMetric(METRIC_COMPUTED_PROMPT_TOKENS_TOTAL, "counter", "computed_prompt_tokens_total",
                   "Prompt positions this server's forwards computed (cached ones are not; a "
                   "retracted request's re-prefill is). On a P/D decode server it stays 0."),
    MirroredMetric(METRIC_QUEUE_PROMPT_TOKENS, "gauge", "queue_prompt_tokens",
                   "Prompt tokens the waiting requests still need computed (what a prefill "
                   "pool scales on)."),
    MirroredMetric(METRIC_DISAGG_SENT_TOKENS_TOTAL, "counter", "disagg_sent_tokens_total",
                   "P/D prefill server: prompt positions whose KV was sent to a decode server."),
    MirroredMetric(METRIC_DISAGG_RECEIVED_TOKENS_TOTAL, "counter", "disagg_received_tokens_total",
                   "P/D decode server: prompt positions whose KV came from a prefill server."),
    MirroredMetric(METRIC_DISAGG_FAILED_TRANSFERS_TOTAL, "counter", "disagg_failed_transfers_total",
                   "P/D: KV transfers that failed (the request ended with an error, its pages freed)."),
    MirroredMetric(METRIC_DISAGG_WAITING_REQUESTS, "gauge", "disagg_waiting_requests",
                   "P/D decode server: requests waiting for pages to reserve or for their KV."),
)  # fmt: skip


class SchedulerMirror(Collector):
    """A prometheus-client collector over the latest `SchedulerStats`."""

    def __init__(self, model: str, initial: SchedulerStats | None = None) -> None:
        self.model = model
        self._stats = initial or SchedulerStats()
        self._high_water: dict[str, float] = {}
        self.update(self._stats)

    @property
    def stats(self) -> SchedulerStats:
        """The latest stats (other collectors read the same numbers)."""
        return self._stats

    def update(self, stats: SchedulerStats) -> None:
        self._stats = stats
        for m in SCHEDULER_METRICS:
            if m.kind == "counter":
                value = float(getattr(stats, m.field))
                self._high_water[m.name] = max(value, self._high_water.get(m.name, 0.0))

    def collect(self) -> Iterator[Metric]:
        for m in SCHEDULER_METRICS:
            if m.kind == "counter":
                counter = CounterMetricFamily(m.name, m.help, labels=[LABEL_MODEL])
                counter.add_metric([self.model], self._high_water[m.name])
                yield counter
            else:
                gauge = GaugeMetricFamily(m.name, m.help, labels=[LABEL_MODEL])
                gauge.add_metric([self.model], float(getattr(self._stats, m.field)))
                yield gauge

    def describe(self) -> Iterator[Metric]:
        return self.collect()
