"""Per-request results and the numbers computed from them. Pure: no I/O, no clocks.

Definitions follow SGLang's `bench_serving`:
- TTFT: request sent to first streamed chunk with text.
- ITL: gaps between consecutive streamed chunks with text, pooled over all requests.
- TPOT: per request `(e2e - ttft) / (output_tokens - 1)`, for requests with > 1 token.
- E2E: request sent to end of stream.
- Throughputs divide totals over successful requests by the benchmark duration.
- Percentiles are numpy's (linear interpolation); median is p50.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True)
class RequestResult:
    """What one request did. Times are seconds; `send_time` is since the benchmark start."""

    prompt_len: int
    output_len: int  # requested max_tokens
    success: bool
    output_tokens: int = 0  # usage.completion_tokens, else the number of text chunks
    ttft: float = 0.0
    itl: tuple[float, ...] = ()
    e2e: float = 0.0
    send_time: float = 0.0
    usage_reported: bool = False
    server_prompt_tokens: int | None = None
    cached_tokens: int | None = None
    error: str = ""
    text: str = ""

    @property
    def tpot(self) -> float | None:
        if self.output_tokens <= 1:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)

    @property
    def end_time(self) -> float:
        return self.send_time + self.e2e


@dataclass(frozen=True)
class LatencySummary:
    mean_ms: float
    median_ms: float
    p99_ms: float

    @classmethod
    def of(cls, seconds: Iterable[float]) -> LatencySummary | None:
        values = np.asarray(list(seconds), dtype=np.float64)
        if values.size == 0:
            return None
        return cls(
            mean_ms=float(values.mean() * 1000),
            median_ms=float(np.median(values) * 1000),
            p99_ms=float(np.percentile(values, 99) * 1000),
        )


def peak_concurrency(intervals: Iterable[tuple[float, float]]) -> int:
    """Most intervals open at once; one that ends when another starts does not overlap it."""
    events = []
    for start, end in intervals:
        events.append((start, 1))
        events.append((end, -1))
    events.sort()  # at equal times -1 sorts before +1
    peak = current = 0
    for _, delta in events:
        current += delta
        peak = max(peak, current)
    return peak


def _latency_keys(name: str, summary: LatencySummary | None) -> dict[str, float | None]:
    return {
        f"mean_{name}_ms": summary.mean_ms if summary else None,
        f"median_{name}_ms": summary.median_ms if summary else None,
        f"p99_{name}_ms": summary.p99_ms if summary else None,
    }


@dataclass(frozen=True)
class ServingMetrics:
    completed: int
    failed: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int
    request_throughput: float
    input_throughput: float
    output_throughput: float
    total_throughput: float
    ttft: LatencySummary | None
    tpot: LatencySummary | None
    itl: LatencySummary | None
    e2e: LatencySummary | None
    mean_concurrency: float  # SGLang's "Concurrency": sum of E2E over duration
    peak_concurrency: int  # most requests in flight at once, seen from the client
    output_len_mismatches: int  # successful requests whose output differs from max_tokens
    usage_missing: int  # successful requests whose stream had no usage chunk
    server_prompt_tokens: int | None  # sum of usage.prompt_tokens, when every request had it
    cached_tokens: int | None  # sum of usage.prompt_tokens_details.cached_tokens, when given

    def to_dict(self) -> dict[str, object]:
        flat = {k: v for k, v in asdict(self).items() if k not in ("ttft", "tpot", "itl", "e2e")}
        for name in ("ttft", "tpot", "itl"):
            flat.update(_latency_keys(name, getattr(self, name)))
        flat.update(_latency_keys("e2e_latency", self.e2e))
        return flat


def _sum_if_all(values: Sequence[int | None]) -> int | None:
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


def compute_metrics(results: Sequence[RequestResult], duration_s: float) -> ServingMetrics:
    if duration_s <= 0:
        raise ValueError(f"duration must be > 0, got {duration_s}")
    ok = [r for r in results if r.success]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    e2e = [r.e2e for r in ok]
    return ServingMetrics(
        completed=len(ok),
        failed=len(results) - len(ok),
        duration_s=duration_s,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        request_throughput=len(ok) / duration_s,
        input_throughput=total_in / duration_s,
        output_throughput=total_out / duration_s,
        total_throughput=(total_in + total_out) / duration_s,
        ttft=LatencySummary.of(r.ttft for r in ok),
        tpot=LatencySummary.of(t for r in ok if (t := r.tpot) is not None),
        itl=LatencySummary.of(gap for r in ok for gap in r.itl),
        e2e=LatencySummary.of(e2e),
        mean_concurrency=sum(e2e) / duration_s,
        peak_concurrency=peak_concurrency((r.send_time, r.end_time) for r in results),
        output_len_mismatches=sum(1 for r in ok if r.output_tokens != r.output_len),
        usage_missing=sum(1 for r in ok if not r.usage_reported),
        server_prompt_tokens=_sum_if_all([r.server_prompt_tokens for r in ok]),
        cached_tokens=_sum_if_all([r.cached_tokens for r in ok]),
    )


# --- the transformers peer ---------------------------------------------------------------


@dataclass(frozen=True)
class PeerBatch:
    """One static batch: its requests' lengths and when it finished, since the peer started."""

    prompt_lens: tuple[int, ...]
    output_lens: tuple[int, ...]  # what each request asked for
    generated_per_row: int  # what generate ran every row for: the batch's longest output
    end_s: float


@dataclass(frozen=True)
class PeerMetrics:
    completed: int
    batch_size: int
    duration_s: float
    total_input_tokens: int
    total_output_tokens: int  # tokens the requests asked for
    generated_tokens: int  # tokens generate computed, padding rows past their length included
    request_throughput: float
    output_throughput: float
    total_throughput: float
    e2e: LatencySummary | None

    def to_dict(self) -> dict[str, object]:
        flat = {k: v for k, v in asdict(self).items() if k != "e2e"}
        flat.update(_latency_keys("e2e_latency", self.e2e))
        return flat


def compute_peer_metrics(batches: Sequence[PeerBatch], batch_size: int) -> PeerMetrics:
    """All requests arrive at t=0: a request's E2E is the end of its batch, which includes
    the time it waited for the batches before it."""
    if not batches:
        raise ValueError("the peer ran no batch")
    duration = max(b.end_s for b in batches)
    n = sum(len(b.output_lens) for b in batches)
    total_in = sum(sum(b.prompt_lens) for b in batches)
    total_out = sum(sum(b.output_lens) for b in batches)
    return PeerMetrics(
        completed=n,
        batch_size=batch_size,
        duration_s=duration,
        total_input_tokens=total_in,
        total_output_tokens=total_out,
        generated_tokens=sum(b.generated_per_row * len(b.output_lens) for b in batches),
        request_throughput=n / duration,
        output_throughput=total_out / duration,
        total_throughput=(total_in + total_out) / duration,
        e2e=LatencySummary.of(b.end_s for b in batches for _ in b.output_lens),
    )


def plan_batches(num_requests: int, batch_size: int) -> list[range]:
    """Consecutive batches in arrival order, the last one possibly smaller."""
    if batch_size < 1:
        raise ValueError(f"batch size must be >= 1, got {batch_size}")
    return [range(i, min(i + batch_size, num_requests)) for i in range(0, num_requests, batch_size)]


def compare(sluice: ServingMetrics, peer: PeerMetrics) -> dict[str, float | None]:
    """Sluice over peer: output throughput (higher is better), mean E2E (lower is better)."""
    mean_e2e = None
    if sluice.e2e and peer.e2e and peer.e2e.mean_ms > 0:
        mean_e2e = sluice.e2e.mean_ms / peer.e2e.mean_ms
    throughput = None
    if peer.output_throughput > 0:
        throughput = sluice.output_throughput / peer.output_throughput
    return {
        "output_throughput_sluice_over_peer": throughput,
        "mean_e2e_sluice_over_peer": mean_e2e,
    }


def strict_json(value: Any) -> Any:
    """`value` as strict JSON allows: infinities (a request rate of inf) become 'inf'."""
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {k: strict_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(v) for v in value]
    return value
