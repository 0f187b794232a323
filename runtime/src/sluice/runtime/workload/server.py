"""`--launch-server`: start `python -m sluice.runtime serve`, wait for /health, stop it.

The server runs in its own session (process group) so that the scheduler and detokenizer
processes it starts can be found for the memory reading and, if SIGTERM does not end them
within the grace period, killed with it.
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import httpx

from sluice.runtime import constants as C


@dataclass(frozen=True)
class LaunchedServer:
    process: subprocess.Popen[bytes]
    log_path: Path

    def peak_rss_mib(self) -> float | None:
        """Sum of the peak resident memory of every live process in the server's session."""
        return session_peak_rss_mib(self.process.pid)


def serve_command(model: str, base_url: str, extra_args: str) -> list[str]:
    parts = urlsplit(base_url)
    host = parts.hostname or C.DEFAULT_HOST
    port = parts.port or C.DEFAULT_PORT
    return [
        sys.executable,
        "-m",
        "sluice.runtime",
        "serve",
        C.FLAG_MODEL,
        model,
        C.FLAG_HOST,
        host,
        C.FLAG_PORT,
        str(port),
        *shlex.split(extra_args),
    ]


def _log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def ensure_port_free(base_url: str) -> None:
    """Refuse to launch onto a port another process listens on: the health check would find
    that server, and the benchmark would measure it instead of ours."""
    parts = urlsplit(base_url)
    host, port = parts.hostname or C.DEFAULT_HOST, parts.port or C.DEFAULT_PORT
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # as uvicorn binds: a closed connection in TIME_WAIT is no obstacle, a listener is
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            raise RuntimeError(
                f"{host}:{port} is already in use ({err.strerror}); another server is there. "
                "Pass a free port with --base-url."
            ) from err


def wait_healthy(server: LaunchedServer, base_url: str, timeout_s: float) -> None:
    url = base_url.rstrip("/") + C.HEALTH_PATH
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5.0) as client:
        while time.monotonic() < deadline:
            code = server.process.poll()
            if code is not None:
                raise RuntimeError(
                    f"server exited with code {code} before /health turned 200; "
                    f"log tail ({server.log_path}):\n{_log_tail(server.log_path)}"
                )
            try:
                if client.get(url).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    raise TimeoutError(f"/health not 200 after {timeout_s:.0f}s; log: {server.log_path}")


def stop(server: LaunchedServer, grace_s: float) -> None:
    """SIGTERM (the server drains), then SIGKILL to its whole session after `grace_s`."""
    proc = server.process
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # stragglers of the session we started
    except ProcessLookupError:
        pass
    proc.wait()


@contextmanager
def launched_server(
    command: list[str],
    base_url: str,
    timeout_s: float,
    grace_s: float = 60.0,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
) -> Iterator[LaunchedServer]:
    """Runs `command` (see `serve_command`) until the block ends; yields once /health is 200.
    The server's output goes to `log_path` (default: a new temporary file); `env` adds to
    (or overrides) this process's environment."""
    ensure_port_free(base_url)
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="sluice-bench-server-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    print(f"launching: {shlex.join(command)}\nserver log: {log_path}", flush=True)
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env={**os.environ, **env} if env else None,
        )
    server = LaunchedServer(proc, log_path)
    try:
        wait_healthy(server, base_url, timeout_s)
        yield server
    finally:
        stop(server, grace_s)


def session_peak_rss_mib(session_id: int) -> float | None:
    """Peak RSS (VmHWM) summed over the live processes of a session; None off Linux."""
    proc_root = Path("/proc")
    if not proc_root.is_dir():
        return None
    total_kib = 0
    for entry in proc_root.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            # fields after the parenthesised command: state ppid pgrp session ...
            fields = stat[stat.rindex(")") + 2 :].split()
            if int(fields[3]) != session_id:
                continue
            for line in (entry / "status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    total_kib += int(line.split()[1])
        except (OSError, ValueError, IndexError):
            continue
    return total_kib / 1024 if total_kib else None
