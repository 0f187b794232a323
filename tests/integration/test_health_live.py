"""`/health/live` (the liveness probe) fails for a hung scheduler and only for one.

The hang is real and made by construction: the scheduler process is stopped with SIGSTOP
before a request is sent, so the request is certainly waiting on it, and SIGCONT lets it
run again. Readiness (`/health`) does not see a hang; liveness must.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import httpx
import pytest
from server_process import serve

from sluice.runtime import constants as C

pytestmark = pytest.mark.integration

HEARTBEAT_TIMEOUT_S = 2  # the bound under test; the scheduler beats at least once a second


def scheduler_pid(server_pid: int) -> int:
    """The scheduler is the child holding the model: the largest resident set."""
    out = subprocess.run(["pgrep", "-P", str(server_pid)], capture_output=True, text=True).stdout
    sizes = {}
    for pid in (int(p) for p in out.split()):
        with open(f"/proc/{pid}/statm") as f:
            sizes[pid] = int(f.read().split()[1])
    return max(sizes, key=sizes.get)


def live_status(url: str) -> int:
    return httpx.get(f"{url}{C.LIVE_PATH}", timeout=5).status_code


def wait_for_status(url: str, code: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (last := live_status(url)) != code:
        assert time.monotonic() < deadline, f"{C.LIVE_PATH} stayed {last}, expected {code}"
        time.sleep(0.2)


def test_liveness_fails_while_the_scheduler_hangs_and_recovers_when_it_runs(
    tiny_llama_path, tmp_path
):
    flags = (C.FLAG_SCHEDULER_HEARTBEAT_TIMEOUT, str(HEARTBEAT_TIMEOUT_S))
    with serve(tiny_llama_path, tmp_path / "server.log", *flags, api_key="k") as srv:
        assert live_status(srv.url) == 200  # idle: alive (and open without the API key)
        scheduler = scheduler_pid(srv.proc.pid)
        model = httpx.get(f"{srv.url}/v1/models", headers=srv.headers).json()["data"][0]["id"]
        body = {"model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 0}
        result: dict[str, httpx.Response] = {}

        os.kill(scheduler, signal.SIGSTOP)
        try:
            request = threading.Thread(
                target=lambda: result.update(
                    r=httpx.post(
                        f"{srv.url}/v1/completions", json=body, headers=srv.headers, timeout=120
                    )
                )
            )
            request.start()
            wait_for_status(srv.url, 503, timeout=60)
            assert httpx.get(f"{srv.url}{C.HEALTH_PATH}", timeout=5).status_code == 200
            assert srv.info()["inflight_requests"] == 1
        finally:
            os.kill(scheduler, signal.SIGCONT)

        wait_for_status(srv.url, 200, timeout=60)
        request.join(120)
        assert result["r"].status_code == 200, result["r"].text
        assert live_status(srv.url) == 200
