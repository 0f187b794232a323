"""`--router-policy`: the benchmark through `sluice router`.

With `--launch-server`, `launched_fleet` starts `--num-workers` runtime servers on the
ports after `--base-url`'s and a router on `--base-url`'s port, waits until the router
sees every worker healthy, and stops them all at the end. Without it, `--base-url` is a
router that is already running.

`measure_overhead` gives the router's added latency per request: a short streamed request
is sent through the router and straight to the worker the router chose (named by its
`x-sluice-worker` header; every second pair the direct one first, to the worker the router
chose last), one after the other with nothing else running, both after the prompt is in
every worker's cache, so the two differ only by the router's hop; the pairs' differences of
TTFT and E2E are summarized.
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx
import numpy as np

from benchmarks.serving import client
from benchmarks.serving.dataset import BenchRequest
from benchmarks.serving.server import launched_server, serve_command
from sluice.runtime import constants as C


def worker_urls(base_url: str, n: int) -> list[str]:
    parts = urlsplit(base_url)
    host, port = parts.hostname or C.DEFAULT_HOST, parts.port or C.DEFAULT_PORT
    return [f"http://{host}:{port + 1 + i}" for i in range(n)]


def router_command(base_url: str, workers: list[str], policy: str, extra: list[str]) -> list[str]:
    parts = urlsplit(base_url)
    return [
        sys.executable, "-m", "sluice.runtime", "router",
        C.FLAG_HOST, parts.hostname or C.DEFAULT_HOST,
        C.FLAG_PORT, str(parts.port or C.ROUTER_DEFAULT_PORT),
        C.FLAG_POLICY, policy, C.FLAG_WORKER_URLS, *workers, *extra,
    ]  # fmt: skip


def wait_all_healthy(base_url: str, n: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        try:
            last = httpx.get(base_url.rstrip("/") + C.ROUTER_WORKERS_PATH, timeout=5).json()
            if sum(w["healthy"] for w in last["workers"]) == n:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise TimeoutError(f"router did not see {n} healthy workers: {last}")


@contextlib.contextmanager
def launched_fleet(
    model: str,
    base_url: str,
    num_workers: int,
    policy: str,
    server_args: str,
    router_args: list[str],
    timeout_s: float,
) -> Iterator[list[str]]:
    """Workers and a router, up until the block ends; yields the worker URLs."""
    urls = worker_urls(base_url, num_workers)
    with contextlib.ExitStack() as stack:
        for url in urls:
            stack.enter_context(launched_server(serve_command(model, url, server_args), url,
                                                timeout_s))  # fmt: skip
        command = router_command(base_url, urls, policy, router_args)
        stack.enter_context(launched_server(command, base_url, timeout_s, grace_s=10))
        wait_all_healthy(base_url, num_workers, timeout_s)
        yield urls


def router_worker_urls(base_url: str) -> list[str]:
    body = httpx.get(base_url.rstrip("/") + C.ROUTER_WORKERS_PATH, timeout=10).json()
    return [w["url"] for w in body["workers"] if w["healthy"]]


def router_counts(base_url: str) -> dict[str, dict[str, float]]:
    """Requests per worker, decisions per reason, and the router's own overhead (p50/p99
    interpolated in its histogram's buckets, like PromQL's histogram_quantile), from the
    router's /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(base_url.rstrip("/") + C.METRICS_PATH, timeout=10).text
    out: dict[str, dict[str, float]] = {"requests": {}, "decisions": {}, "overhead_ms": {}}
    buckets: list[tuple[float, float]] = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == C.METRIC_ROUTER_REQUESTS_TOTAL:
                out["requests"][s.labels[C.LABEL_WORKER]] = s.value
            elif s.name == C.METRIC_ROUTER_DECISIONS_TOTAL and s.value:
                out["decisions"][s.labels[C.LABEL_REASON]] = s.value
            elif s.name == C.METRIC_ROUTER_OVERHEAD_SECONDS + "_bucket":
                buckets.append((float(s.labels["le"]), s.value))
    if buckets and buckets[-1][1] > 0:
        for q in (0.5, 0.99):
            out["overhead_ms"][f"p{int(q * 100)}"] = histogram_quantile(q, buckets) * 1000
        out["overhead_ms"]["requests"] = buckets[-1][1]
    return out


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile over cumulative (upper bound, count) buckets: linear
    within the bucket the rank falls in; the +Inf bucket answers its lower bound."""
    buckets = sorted(buckets)
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for upper, count in buckets:
        if count >= rank:
            if upper == float("inf"):
                return lower
            return lower + (upper - lower) * (rank - below) / max(count - below, 1e-12)
        lower, below = upper, count
    return lower


@dataclass(frozen=True)
class Overhead:
    probes: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    e2e_p50_ms: float
    e2e_p99_ms: float


def _timed_stream(
    http: httpx.Client, url: str, config: client.LoadConfig, request: BenchRequest
) -> tuple[float, float, str]:
    """(TTFT, E2E, the serving worker's URL) of one streamed completion."""
    payload = client.build_payload(config, request.prompt, request.output_len)
    start = time.perf_counter()
    reader = client.StreamReader(start)
    with http.stream("POST", url + client.COMPLETIONS_PATH, json=payload,
                     headers=config.headers) as resp:  # fmt: skip
        resp.raise_for_status()
        worker = resp.headers.get(C.ROUTER_WORKER_HEADER, "")
        for line in resp.iter_lines():
            reader.feed(line, time.perf_counter())
            if reader.finished:
                break
    end = time.perf_counter()
    if reader.error or reader.ttft is None:
        raise RuntimeError(f"overhead probe failed: {reader.error or 'no text'}")
    return reader.ttft, end - start, worker


def measure_overhead(
    router_url: str, workers: list[str], config: client.LoadConfig, request: BenchRequest, n: int
) -> Overhead:
    router_url = router_url.rstrip("/")
    ttft, e2e = [], []
    with httpx.Client(timeout=httpx.Timeout(None, connect=30)) as http:
        for w in workers:  # the prompt is cached everywhere before the clock starts
            _timed_stream(http, w, config, request)
        chosen = _timed_stream(http, router_url, config, request)[2]
        for i in range(n):
            if i % 2:  # every second pair the other way round, so drift cancels
                d_ttft, d_e2e, _ = _timed_stream(http, chosen, config, request)
                r_ttft, r_e2e, chosen = _timed_stream(http, router_url, config, request)
            else:
                r_ttft, r_e2e, chosen = _timed_stream(http, router_url, config, request)
                d_ttft, d_e2e, _ = _timed_stream(http, chosen, config, request)
            ttft.append(r_ttft - d_ttft)
            e2e.append(r_e2e - d_e2e)
    ms = np.asarray(ttft) * 1000, np.asarray(e2e) * 1000
    return Overhead(
        probes=n,
        ttft_p50_ms=float(np.percentile(ms[0], 50)),
        ttft_p99_ms=float(np.percentile(ms[0], 99)),
        e2e_p50_ms=float(np.percentile(ms[1], 50)),
        e2e_p99_ms=float(np.percentile(ms[1], 99)),
    )
