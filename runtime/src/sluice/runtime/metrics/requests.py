"""The API server's request metrics: counters by finish status, token counters, latency
histograms. Fed by the TokenizerManager's listener hooks, one call per update.

What each series counts:
- `sluice_requests_total{status}`: every request that ended, once. `stop` and `length` are
  the scheduler's finish reasons; `abort` is a request whose client went away (or whose
  handler was cancelled) before it finished; `error` is a request the server ended without
  completing it (an engine fault on its batch, the engine going down, the scheduler
  aborting it: KV pool exhausted, prompt too long for the context, ...); `timeout` one
  past `--request-timeout`; `rejected` one refused at once by the admission limit
  (`--max-queued-requests`, a 503). Other requests refused before they reach the
  scheduler (a 4xx) are not counted.
- `sluice_prompt_tokens_total` / `sluice_cached_tokens_total`: prompt tokens (and those
  served from the prefix cache) of each request, counted when its first token arrives.
- `sluice_generation_tokens_total`: tokens generated, counted as they arrive.
- `sluice_time_to_first_token_seconds`: request arrival at the TokenizerManager to its
  first token, once per request that produced one.
- `sluice_inter_token_latency_seconds`: once per token after the first; tokens that arrive
  together in one update share the gap since the previous update (`completion_tokens - 1`
  observations per request).
- `sluice_e2e_request_latency_seconds`: arrival to the end, once per request counted in
  `sluice_requests_total` (whatever its status).
- `sluice_queue_time_seconds`: arrival to the first time the scheduler admitted the request
  into a batch, measured by the scheduler and observed here from its stats messages.
- `sluice_disagg_transfer_seconds`: P/D decode server: from reserving a request's pages to
  the last of its prompt's KV written, once per transfer received (from the stats).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from sluice.runtime.constants import (
    DISAGG_TRANSFER_BUCKETS_SECONDS,
    E2E_BUCKETS_SECONDS,
    ITL_BUCKETS_SECONDS,
    LABEL_MODEL,
    LABEL_STATUS,
    METRIC_CACHED_TOKENS_TOTAL,
    METRIC_DISAGG_TRANSFER_SECONDS,
    METRIC_E2E_SECONDS,
    METRIC_GENERATION_TOKENS_TOTAL,
    METRIC_ITL_SECONDS,
    METRIC_PROMPT_TOKENS_TOTAL,
    METRIC_QUEUE_TIME_SECONDS,
    METRIC_REQUESTS_TOTAL,
    METRIC_TTFT_SECONDS,
    QUEUE_TIME_BUCKETS_SECONDS,
    REQUEST_STATUSES,
    TTFT_BUCKETS_SECONDS,
)

# finish kind -> status; any other finish kind is an error
FINISHED_STATUSES = {"stop": "stop", "length": "length", "timeout": "timeout"}


@dataclass
class _Timing:
    created: float  # monotonic, when the TokenizerManager accepted the request
    last_token_at: float | None = None
    completion_tokens: int = 0
    prompt_counted: bool = False


class RequestMetrics:
    def __init__(self, model: str, registry: CollectorRegistry) -> None:
        labels = [LABEL_MODEL]

        def counter(name: str, help: str) -> Any:
            return Counter(name, help, labels, registry=registry).labels(model)

        def histogram(name: str, help: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, help, labels, registry=registry, buckets=buckets).labels(model)

        requests = Counter(
            METRIC_REQUESTS_TOTAL,
            "Requests that ended, by status: stop, length, abort (client gone), error, timeout, "
            "rejected (admission limit).",
            [LABEL_MODEL, LABEL_STATUS],
            registry=registry,
        )
        # every status exists from the start, so rate() and alerts see a 0, not nothing
        self.requests = {s: requests.labels(model, s) for s in REQUEST_STATUSES}
        self.prompt_tokens = counter(METRIC_PROMPT_TOKENS_TOTAL, "Prompt tokens processed.")
        self.generation_tokens = counter(METRIC_GENERATION_TOKENS_TOTAL, "Tokens generated.")
        self.cached_tokens = counter(
            METRIC_CACHED_TOKENS_TOTAL, "Prompt tokens served from the prefix cache."
        )
        self.ttft = histogram(
            METRIC_TTFT_SECONDS, "Time from arrival to the first token.", TTFT_BUCKETS_SECONDS
        )
        self.itl = histogram(
            METRIC_ITL_SECONDS, "Time between consecutive tokens of a request.",
            ITL_BUCKETS_SECONDS,
        )  # fmt: skip
        self.e2e = histogram(
            METRIC_E2E_SECONDS,
            "Time from arrival to the end of a request.",
            E2E_BUCKETS_SECONDS,
        )
        self.queue_time = histogram(
            METRIC_QUEUE_TIME_SECONDS,
            "Time from arrival until the scheduler first admitted the request into a batch.",
            QUEUE_TIME_BUCKETS_SECONDS,
        )
        self.transfer_time = histogram(
            METRIC_DISAGG_TRANSFER_SECONDS,
            "P/D decode server: reservation to the prompt's KV received, per transfer.",
            DISAGG_TRANSFER_BUCKETS_SECONDS,
        )
        self._live: dict[str, _Timing] = {}

    @property
    def num_tracked(self) -> int:
        return len(self._live)

    def on_chunk(self, rid: str, chunk: Any, created: float, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        t = self._live.get(rid)
        if t is None:
            t = self._live[rid] = _Timing(created)
        n = len(chunk.token_ids)
        if n:
            if t.last_token_at is None:
                self.ttft.observe(max(0.0, now - t.created))
                for _ in range(n - 1):  # arrived together with the first
                    self.itl.observe(0.0)
            else:
                gap = max(0.0, now - t.last_token_at) / n
                for _ in range(n):
                    self.itl.observe(gap)
            t.last_token_at = now
            if not t.prompt_counted:
                t.prompt_counted = True
                self.prompt_tokens.inc(chunk.prompt_tokens)
                self.cached_tokens.inc(chunk.cached_tokens)
        if chunk.completion_tokens > t.completion_tokens:
            self.generation_tokens.inc(chunk.completion_tokens - t.completion_tokens)
            t.completion_tokens = chunk.completion_tokens
        if chunk.finished is not None:
            self._end(rid, FINISHED_STATUSES.get(chunk.finished.kind, "error"), now)

    def on_abort(self, rid: str, created: float, now: float | None = None) -> None:
        """The request's client went away before it finished."""
        now = time.monotonic() if now is None else now
        self._live.setdefault(rid, _Timing(created))
        self._end(rid, "abort", now)

    def on_reject(self, n: int) -> None:
        """`n` requests were refused at once by the admission limit."""
        self.requests["rejected"].inc(n)

    def on_queue_times(self, seconds: list[float]) -> None:
        for s in seconds:
            self.queue_time.observe(max(0.0, s))

    def on_transfer_times(self, seconds: list[float]) -> None:
        for s in seconds:
            self.transfer_time.observe(max(0.0, s))

    def _end(self, rid: str, status: str, now: float) -> None:
        t = self._live.pop(rid)
        self.requests[status].inc()
        self.e2e.observe(max(0.0, now - t.created))
