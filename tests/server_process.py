"""Start `python -m sluice.runtime serve` as a real subprocess for integration tests.

Launching, waiting for /health and stopping (SIGTERM, then SIGKILL to the session) are the
benchmark's `launched_server`; this adds what tests ask of a running server.
"""

from __future__ import annotations

import json
import shlex
import socket
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repo root: `benchmarks`
from sluice.runtime.testing.hold_gate import ARM, ENV_HOLD_DIR, HELD, PAUSE  # noqa: E402
from sluice.runtime.workload.server import launched_server, serve_command  # noqa: E402

START_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunningServer:
    url: str
    proc: Any  # subprocess.Popen
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


@dataclass(frozen=True)
class Hold:
    """The test side of the scheduler's hold gate (`sluice.runtime.testing.hold_gate`):
    freeze the live scheduler once a request has `n` output tokens, look, then release."""

    folder: Path

    def arm(self, tokens: int, requests: int = 1) -> None:
        """Freeze once `requests` live requests have `tokens` output tokens each."""
        (self.folder / ARM).write_text(f"{tokens} {requests}")

    def wait_held(self, timeout: float = 120.0) -> dict[str, Any]:
        """Wait for the hold; returns the scheduler stats it published when it froze."""
        deadline = time.monotonic() + timeout
        while not (self.folder / HELD).exists():
            if time.monotonic() > deadline:
                raise AssertionError(f"the scheduler did not reach the armed hold in {timeout}s")
            time.sleep(0.01)
        return json.loads((self.folder / HELD).read_text())

    def release(self) -> None:
        (self.folder / HELD).unlink()

    def pause(self) -> None:
        """Stop running ticks (requests are still taken in and stats published)."""
        (self.folder / PAUSE).touch()

    def resume(self) -> None:
        (self.folder / PAUSE).unlink(missing_ok=True)

    def disarm(self) -> None:
        """Resume, release a hold if one is in effect, and cancel one still armed."""
        for name in (PAUSE, HELD, ARM):
            (self.folder / name).unlink(missing_ok=True)


def hold_env(folder: Path) -> tuple[Hold, dict[str, str]]:
    folder.mkdir(parents=True, exist_ok=True)
    return Hold(folder), {ENV_HOLD_DIR: str(folder)}


def wait_for(
    check: Any, timeout: float = 30.0, every: float = 0.05, what: str = "", explain: Any = None
) -> Any:
    """`check()`'s first truthy result, polling until `timeout`; then an AssertionError that
    names `what` and adds `explain()` (the state a reader needs to see why)."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            waited = f"waiting for {what}: " if what else ""
            detail = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"{waited}condition still {result!r} after {timeout}s{detail}")
        time.sleep(every)


@contextmanager
def serve(
    model: Path | str, log: Path, *extra: str, api_key: str = "", env: dict[str, str] | None = None
) -> Iterator[RunningServer]:
    url = f"http://127.0.0.1:{free_port()}"
    flags = [*extra, "--device", "cpu", *(["--api-key", api_key] if api_key else [])]
    command = serve_command(str(model), url, shlex.join(flags))
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with launched_server(
        command, url, START_TIMEOUT_S, grace_s=30, log_path=log, env=env
    ) as server:
        yield RunningServer(url, server.process, log, headers)
