"""The router's Prometheus metrics (names in `sluice.runtime.constants`).

- `sluice_router_requests_total{worker}`: requests sent to each worker (a retried request
  counts once per worker it was sent to; the probes asking which worker holds a stored
  response, `responses.py`, do not count).
- `sluice_router_routing_decisions_total{policy,reason}`: one per routed request; reasons
  in `policies.REASONS`.
- `sluice_router_prefix_match_characters`: histogram of the prefix (characters, or token
  ids for token prompts) the chosen worker's tree held, cache-aware decisions only.
- `sluice_router_retries_total`: requests sent to a second worker after the first failed
  before its first byte.
- `sluice_router_upstream_errors_total{worker,reason}`: failed sends (connect, read,
  unavailable: a 503 from a starting or draining worker, timeout).
- `sluice_router_failed_requests_total{reason}`: requests the router answered itself with
  an error (no_worker: none healthy; upstream: every try failed; mid_stream: the worker
  failed after the response had started; unsupported: a route P/D mode does not serve).
- `sluice_router_pd_pairs_total{prefill,decode}`: P/D mode, requests sent to each pair of
  a prefill and a decode server (a retried request counts once per pair tried). The
  decisions counter above counts the prefill side's choice (the policy's); the decode
  side is always the least-loaded decode server.
- `sluice_router_overhead_seconds`: histogram of what the router adds to a request's time
  to first byte on its own clock: from the request (body read) to the first byte written to
  the client, less the time the worker took from the request sent to its first byte (so
  routing, forwarding, failed tries and the relay of the first chunk count; the network
  hop to the worker does not).
- gauges per worker, from the pool (P/D: both pools) at scrape time: `sluice_router_worker_healthy` (1/0),
  `sluice_router_worker_in_flight_requests`, `sluice_router_tree_characters`.

A worker that leaves the pool loses its series (discovered pods come and go; their URLs
must not pile up as label values).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sluice.runtime.constants import (
    LABEL_POLICY,
    LABEL_REASON,
    LABEL_WORKER,
    METRIC_ROUTER_DECISIONS_TOTAL,
    METRIC_ROUTER_FAILED_REQUESTS_TOTAL,
    METRIC_ROUTER_OVERHEAD_SECONDS,
    METRIC_ROUTER_PD_PAIRS_TOTAL,
    METRIC_ROUTER_PREFIX_MATCH_CHARACTERS,
    METRIC_ROUTER_REQUESTS_TOTAL,
    METRIC_ROUTER_RETRIES_TOTAL,
    METRIC_ROUTER_TREE_CHARACTERS,
    METRIC_ROUTER_UPSTREAM_ERRORS_TOTAL,
    METRIC_ROUTER_WORKER_HEALTHY,
    METRIC_ROUTER_WORKER_IN_FLIGHT,
    ROUTER_OVERHEAD_BUCKETS_SECONDS,
    ROUTER_PREFIX_MATCH_BUCKETS,
)
from sluice.runtime.router.policies import REASONS, Decision
from sluice.runtime.router.workers import Worker, WorkerPool

FAILURE_REASONS = ("no_worker", "upstream", "mid_stream", "unsupported")
LABEL_PREFILL = "prefill"
LABEL_DECODE = "decode"


class _PoolGauges(Collector):
    def __init__(self, pools: Sequence[WorkerPool]) -> None:
        self.pools = pools

    def collect(self) -> Iterator[Metric]:
        label = [LABEL_WORKER]
        healthy = GaugeMetricFamily(
            METRIC_ROUTER_WORKER_HEALTHY, "1 while the worker is routable, else 0.", labels=label
        )
        in_flight = GaugeMetricFamily(
            METRIC_ROUTER_WORKER_IN_FLIGHT, "Requests the router has open on the worker.",
            labels=label,
        )  # fmt: skip
        tree = GaugeMetricFamily(
            METRIC_ROUTER_TREE_CHARACTERS,
            "Size of the worker's approximate prefix tree (characters or token ids).",
            labels=label,
        )
        for w in [w for pool in self.pools for w in pool.workers.values()]:
            healthy.add_metric([w.url], 1.0 if w.healthy else 0.0)
            in_flight.add_metric([w.url], float(w.in_flight))
            tree.add_metric([w.url], float(w.tree.size))
        yield from (healthy, in_flight, tree)

    def describe(self) -> Iterator[Metric]:
        return self.collect()


class RouterMetrics:
    def __init__(
        self, pool: WorkerPool, policy: str, other_pools: Sequence[WorkerPool] = ()
    ) -> None:
        """`other_pools`: P/D mode's second pool (`pool` holds the decode servers)."""
        disable_created_metrics()
        self.policy = policy
        self.registry = CollectorRegistry(auto_describe=True)
        pools = (pool, *other_pools)
        self.registry.register(_PoolGauges(pools))
        r = self.registry
        self.requests = Counter(
            METRIC_ROUTER_REQUESTS_TOTAL, "Requests sent to each worker.", [LABEL_WORKER],
            registry=r,
        )  # fmt: skip
        self.decisions = Counter(
            METRIC_ROUTER_DECISIONS_TOTAL, "Routing decisions by policy and reason.",
            [LABEL_POLICY, LABEL_REASON], registry=r,
        )  # fmt: skip
        for reason in REASONS:  # every reason exists from the start: rate() sees a 0
            self.decisions.labels(policy, reason)
        self.prefix_match = Histogram(
            METRIC_ROUTER_PREFIX_MATCH_CHARACTERS,
            "Prefix of the routing key the chosen worker's tree held (cache-aware).",
            buckets=ROUTER_PREFIX_MATCH_BUCKETS, registry=r,
        )  # fmt: skip
        self.retries = Counter(
            METRIC_ROUTER_RETRIES_TOTAL,
            "Requests resent to another worker after failing before their first byte.",
            registry=r,
        )
        self.upstream_errors = Counter(
            METRIC_ROUTER_UPSTREAM_ERRORS_TOTAL, "Failed sends to a worker, by reason.",
            [LABEL_WORKER, LABEL_REASON], registry=r,
        )  # fmt: skip
        self.failed = Counter(
            METRIC_ROUTER_FAILED_REQUESTS_TOTAL,
            "Requests the router answered with an error itself, by reason.",
            [LABEL_REASON], registry=r,
        )  # fmt: skip
        self.overhead = Histogram(
            METRIC_ROUTER_OVERHEAD_SECONDS,
            "Router's own share of a request's time to first byte.",
            buckets=ROUTER_OVERHEAD_BUCKETS_SECONDS, registry=r,
        )  # fmt: skip
        self.pd_pairs = Counter(
            METRIC_ROUTER_PD_PAIRS_TOTAL, "P/D: requests sent to each prefill/decode pair.",
            [LABEL_PREFILL, LABEL_DECODE], registry=r,
        )  # fmt: skip
        for reason in FAILURE_REASONS:
            self.failed.labels(reason)
        for each in pools:
            each.on_removed.append(self.forget)

    def on_decision(self, decision: Decision) -> None:
        self.decisions.labels(self.policy, decision.reason).inc()
        if decision.match_len is not None:
            self.prefix_match.observe(decision.match_len)

    def on_sent(self, worker: Worker) -> None:
        self.requests.labels(worker.url).inc()

    def on_upstream_error(self, worker: Worker, reason: str) -> None:
        self.upstream_errors.labels(worker.url, reason).inc()

    def on_pair(self, prefill: Worker, decode: Worker) -> None:
        self.pd_pairs.labels(prefill.url, decode.url).inc()

    def forget(self, worker: Worker) -> None:
        for counter in (self.requests, self.upstream_errors, self.pd_pairs):
            for labels in list(counter._metrics):  # prometheus_client keeps children here
                if worker.url in labels:
                    counter.remove(*labels)

    def render(self) -> tuple[bytes, str]:
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
