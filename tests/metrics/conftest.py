"""Fixtures for the metrics tests: one live runtime for the session, Prometheus' binaries.

The runtime serves a tiny random Llama with a 1024-token KV pool and 4 request slots, so a
handful of requests fills the batch, queues, and (with ignore_eos and outputs of a few
hundred tokens) forces retractions. `--init-new-token-ratio 0.05` lets the scheduler admit
requests whose combined outputs will not fit, which is what makes it retract later. Tests
that must see a state (four running, one queued) freeze the scheduler in it with the hold
gate (`runtime.hold`), so what they observe does not depend on the machine's speed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
for path in (TESTS, REPO):  # tests/tiny_model.py; benchmarks.serving (its server launcher)
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from metrics_testkit import KV_POOL_TOKENS, MODEL, REQUEST_SLOTS, generate  # noqa: E402
from server_process import Hold, free_port, hold_env  # noqa: E402
from tiny_model import make_tiny_llama  # noqa: E402

from benchmarks.serving.server import launched_server, serve_command  # noqa: E402

SERVER_ARGS = (
    f"--device cpu --max-total-tokens {KV_POOL_TOKENS} --max-running-requests {REQUEST_SLOTS} "
    "--init-new-token-ratio 0.05"
)
START_TIMEOUT_S = 300
INSTALL_PROMETHEUS = REPO / "scripts" / "install_prometheus.sh"


@dataclass(frozen=True)
class Runtime:
    url: str
    port: int
    log: Path
    hold: Hold

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


@pytest.fixture(scope="session")
def runtime(tmp_path_factory: pytest.TempPathFactory) -> Runtime:
    folder = tmp_path_factory.mktemp("metrics-runtime")
    model = make_tiny_llama(folder / MODEL)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = folder / "server.log"
    command = serve_command(str(model), url, SERVER_ARGS)
    hold, env = hold_env(folder / "hold")
    with launched_server(command, url, START_TIMEOUT_S, grace_s=30, log_path=log, env=env):
        generate(url, [1, 2, 3], max_new_tokens=2)  # first-request work out of the measured runs
        yield Runtime(url, port, log, hold)


@pytest.fixture(scope="session")
def scrape_history() -> list:
    """Every /metrics scrape the live tests took, in order (for the monotonicity check)."""
    return []


@dataclass(frozen=True)
class PrometheusTools:
    prometheus: str
    promtool: str


@pytest.fixture(scope="session")
def prometheus_tools() -> PrometheusTools:
    """`prometheus` and `promtool`, installed from Debian's `prometheus` package if missing."""
    if not (shutil.which("prometheus") and shutil.which("promtool")):
        done = subprocess.run(
            ["bash", str(INSTALL_PROMETHEUS)], capture_output=True, text=True, timeout=600
        )
        if done.returncode != 0:
            pytest.skip(
                "Prometheus is not installed and scripts/install_prometheus.sh failed "
                f"(exit {done.returncode}): {(done.stderr or done.stdout).strip()[-500:]}"
            )
    prometheus, promtool = shutil.which("prometheus"), shutil.which("promtool")
    if not (prometheus and promtool):
        pytest.skip("the prometheus package installed no prometheus/promtool on PATH")
    return PrometheusTools(prometheus, promtool)
