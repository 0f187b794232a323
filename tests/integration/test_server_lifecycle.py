"""What Kubernetes relies on: a dead child takes the server down; SIGTERM drains."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import httpx
import pytest
from server_process import serve

pytestmark = pytest.mark.integration


def child_pids(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def scheduler_pid(server_pid: int) -> int:
    """The scheduler is the child holding the model: the largest resident set."""
    sizes = {}
    for pid in child_pids(server_pid):
        with open(f"/proc/{pid}/statm") as f:
            sizes[pid] = int(f.read().split()[1])
    return max(sizes, key=sizes.get)


def test_a_dead_scheduler_takes_the_server_down_with_a_clear_log_line(tiny_llama_path, tmp_path):
    with serve(tiny_llama_path, tmp_path / "server.log") as srv:
        os.kill(scheduler_pid(srv.proc.pid), signal.SIGKILL)
        code = srv.proc.wait(timeout=20)
        assert code != 0
        assert "scheduler process exited with code -9" in srv.log_tail(200)


def test_sigterm_drains_running_requests_and_turns_health_to_503(tiny_llama_path, tmp_path):
    body = {"model": "x", "prompt": "Once upon a time", "max_tokens": 400, "ignore_eos": True,
            "temperature": 0, "stream": True}  # fmt: skip
    with serve(tiny_llama_path, tmp_path / "server.log", "--drain-timeout", "60") as srv:
        body["model"] = httpx.get(f"{srv.url}/v1/models").json()["data"][0]["id"]
        chunks: list[str] = []
        started = threading.Event()

        def stream() -> None:
            with httpx.stream("POST", f"{srv.url}/v1/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    if line.startswith("data: "):
                        chunks.append(line)
                        started.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert started.wait(60)
        srv.proc.send_signal(signal.SIGTERM)
        # poll rather than sleep: the 400-token request must still be running when we look
        deadline = time.monotonic() + 10
        while httpx.get(f"{srv.url}/health", timeout=5).status_code != 503:
            assert time.monotonic() < deadline, "/health never turned 503 after SIGTERM"
            time.sleep(0.01)
        late = httpx.post(f"{srv.url}/v1/completions", json={**body, "stream": False}, timeout=10)
        assert late.status_code == 503
        reader.join(120)
        assert chunks[-1] == "data: [DONE]"
        assert any('"finish_reason":"length"' in c for c in chunks)
        assert srv.proc.wait(timeout=30) == 0
