"""Start `python -m sluice.runtime serve` as a real subprocess for integration tests."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningServer:
    url: str
    proc: subprocess.Popen
    log: Path
    headers: dict[str, str]

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def info(self) -> dict[str, Any]:
        r = httpx.get(f"{self.url}/server_info", headers=self.headers, timeout=10)
        r.raise_for_status()
        return r.json()

    def wait_idle(self, timeout: float = 30.0) -> dict[str, Any]:
        """Wait until no request is in flight and the KV pool is all free (or cached);
        returns the last /server_info. The scheduler publishes stats about once a second."""
        deadline = time.monotonic() + timeout
        while True:
            info = self.info()
            stats = info.get("scheduler_stats", {})
            idle = info["inflight_requests"] == 0 and stats.get("running_requests") == 0
            # free_tokens counts evictable cached prefixes as free
            free = stats.get("free_tokens") == stats.get("max_total_tokens")
            if idle and stats.get("queue_requests") == 0 and free:
                return info
            if time.monotonic() > deadline:
                raise AssertionError(f"server not idle with a free pool: {info}")
            time.sleep(0.25)


@contextmanager
def serve(model: Path | str, log: Path, *extra: str, api_key: str = "") -> Iterator[RunningServer]:
    port = free_port()
    cmd = [sys.executable, "-m", "sluice.runtime", "serve", "--model", str(model),
           "--port", str(port), "--device", "cpu", *extra]  # fmt: skip
    if api_key:
        cmd += ["--api-key", api_key]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    srv = RunningServer(f"http://127.0.0.1:{port}", proc, log, headers)
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"server exited with {proc.returncode}:\n{srv.log_tail()}")
            if time.monotonic() > deadline:
                raise AssertionError(f"server not healthy after {START_TIMEOUT_S}s:\n{srv.log_tail()}")
            try:
                if httpx.get(f"{srv.url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        yield srv
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
