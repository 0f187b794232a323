"""Helpers for the router tests: a `Fleet` of real runtime servers and routers started as
processes, waiting on conditions, scraping /metrics."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
for path in (TESTS, REPO, Path(__file__).parent):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from server_process import free_port  # noqa: E402

from benchmarks.serving.router import router_command  # noqa: E402
from benchmarks.serving.server import launched_server, serve_command  # noqa: E402
from sluice.runtime import constants as C  # noqa: E402

# a pool big enough that nothing a test sends is evicted from the radix cache
WORKER_FLAGS = "--device cpu --max-total-tokens 32768 --torch-threads 1 --metrics-compat vllm"
ROUTER_FLAGS = ["--health-interval", "0.2", "--health-timeout", "2",
                "--retry-backoff-initial", "0.2", "--retry-backoff-max", "1"]  # fmt: skip
START_TIMEOUT_S = 300


def wait_until(probe: Any, what: str, timeout: float = 60.0, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {value!r}")
        time.sleep(interval)


@dataclass
class Fleet:
    """Runtime servers and routers run as processes until the fleet is closed."""

    model: Path
    logs: Path
    stack: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    workers: dict[str, Any] = field(default_factory=dict)  # url -> LaunchedServer

    def start_worker(self, url: str | None = None, extra: str = "") -> str:
        """`extra`: more `sluice serve` flags (one shell-quoted string)."""
        url = url or f"http://127.0.0.1:{free_port()}"
        log = self.logs / f"worker-{url.rsplit(':', 1)[1]}-{int(time.time() * 1000)}.log"
        flags = f"{WORKER_FLAGS} {extra}"
        cm = launched_server(serve_command(str(self.model), url, flags), url,
                             START_TIMEOUT_S, grace_s=20, log_path=log)  # fmt: skip
        self.workers[url] = self.stack.enter_context(cm)
        return url

    def kill_worker(self, url: str) -> None:
        """SIGKILL the worker's whole session (the server and its children)."""
        import os
        import signal

        proc = self.workers.pop(url).process
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)

    @contextlib.contextmanager
    def router(self, policy: str, workers: list[str], *extra: str) -> Iterator[str]:
        url = f"http://127.0.0.1:{free_port()}"
        command = router_command(url, workers, policy, [*ROUTER_FLAGS, *extra])
        log = self.logs / f"router-{policy}-{int(time.time() * 1000)}.log"
        with launched_server(command, url, 60, grace_s=10, log_path=log):
            wait_until(lambda: all_healthy(url, len(workers)), "every worker healthy")
            yield url

    def close(self) -> None:
        self.stack.close()


def all_healthy(router_url: str, n: int) -> bool:
    body = httpx.get(router_url + C.ROUTER_WORKERS_PATH, timeout=5).json()
    return sum(w["healthy"] for w in body["workers"]) == n


def worker_info(url: str) -> dict[str, Any]:
    return httpx.get(url + C.SERVER_INFO_PATH, timeout=10).json()


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + C.METRICS_PATH, timeout=10).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


