"""A real Prometheus scraping the live runtime under load, on loopback.

Prometheus (Debian's package, installed by `scripts/install_prometheus.sh` when missing)
runs with its own config and storage in tmp_path, scrapes the runtime every second (with
the `namespace` and `pod` labels Kubernetes service discovery would add) and a stand-in
kube-state-metrics endpoint that reports the runtime's Deployment with no available
replica, and loads `monitoring/prometheus/alerts.yaml`. Then every PromQL expression of the
dashboard, the alerts and the prometheus-adapter rules is evaluated through the HTTP API,
placeholders substituted as Grafana and the adapter would: each parses, the dashboard's and
the adapter's return data, and the alert rules evaluate without error.
"""

from __future__ import annotations

import math
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from metrics_testkit import (
    ALERTS,
    MODEL,
    SATURATION,
    BackgroundLoad,
    Query,
    adapter_queries,
    alert_queries,
    alert_rules,
    dashboard_queries,
    dashboard_variable_queries,
    eventually,
    recording_queries,
    run_load,
    saturation_rules,
    substitute,
)
from server_process import free_port  # noqa: E402

from sluice.runtime import constants as C

pytestmark = pytest.mark.integration

NAMESPACE = "sluice-test"
DEPLOYMENT = MODEL
POD = f"{DEPLOYMENT}-5d8f7c9b6d-x2x4q"  # <deployment>-<pod-template-hash>-<suffix>
RATE_INTERVAL = "10s"  # Grafana's $__rate_interval for a 1 s scrape interval, with margin
START_TIMEOUT_S = 60

KUBE_STATE_METRICS = f"""\
# TYPE kube_deployment_labels gauge
kube_deployment_labels{{namespace="{NAMESPACE}",deployment="{DEPLOYMENT}",label_app_kubernetes_io_name="sluice-runtime"}} 1
# TYPE kube_deployment_spec_replicas gauge
kube_deployment_spec_replicas{{namespace="{NAMESPACE}",deployment="{DEPLOYMENT}"}} 1
# TYPE kube_deployment_status_replicas_available gauge
kube_deployment_status_replicas_available{{namespace="{NAMESPACE}",deployment="{DEPLOYMENT}"}} 0
"""


class _StaticMetrics(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = KUBE_STATE_METRICS.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def kube_state_metrics() -> Iterator[int]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StaticMetrics)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


@dataclass(frozen=True)
class Prometheus:
    url: str
    log: Path

    def query(self, expr: str, at: float | None = None) -> dict[str, Any]:
        """The /api/v1/query answer (status, data or error) for an instant query now, or at
        the Unix time `at` (answers at one `at` all see the same samples)."""
        params: dict[str, Any] = {"query": expr}
        if at is not None:
            params["time"] = at
        r = httpx.get(f"{self.url}/api/v1/query", params=params, timeout=30)
        return r.json()

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


@pytest.fixture(scope="module")
def prometheus(
    prometheus_tools, runtime, kube_state_metrics, tmp_path_factory
) -> Iterator[Prometheus]:
    folder = tmp_path_factory.mktemp("prometheus")
    config = {
        # scraped 4x a second: the burst's states (4 running, 1 queued) last a few hundred
        # decode steps, under a second on the CPU fast path, and must not fall between scrapes
        "global": {
            "scrape_interval": "250ms", "evaluation_interval": "1s", "scrape_timeout": "250ms",
        },
        "rule_files": [str(ALERTS), str(SATURATION)],
        "scrape_configs": [
            {
                "job_name": "sluice",
                "metrics_path": C.METRICS_PATH,
                "static_configs": [
                    {
                        "targets": [f"127.0.0.1:{runtime.port}"],
                        "labels": {"namespace": NAMESPACE, "pod": POD},
                    }
                ],
            },
            {
                "job_name": "kube-state-metrics",
                "honor_labels": True,
                "static_configs": [{"targets": [f"127.0.0.1:{kube_state_metrics}"]}],
            },
        ],
    }
    (folder / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = folder / "prometheus.log"
    command = [
        prometheus_tools.prometheus,
        f"--config.file={folder / 'prometheus.yml'}",
        f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--log.level=warn",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    prom = Prometheus(f"http://127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"prometheus exited with {proc.returncode}:\n{prom.log_tail()}")
            try:
                if httpx.get(f"{prom.url}/-/ready", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"prometheus not ready after {START_TIMEOUT_S}s:\n{prom.log_tail()}")
            time.sleep(0.2)
        yield prom
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def burst_request(i: int) -> dict[str, Any]:
    # sent 5 at once: 4 x (5 + 400) tokens against a 1024-token pool fill the batch, queue
    # the fifth and force retractions
    return {"input_ids": [20 + i, 21, 22, 23, 24], "max_new_tokens": 400, "ignore_eos": True}


def steady_request(n: int) -> dict[str, Any]:
    return {"input_ids": [40 + n % 300, 41, 42, 43], "max_new_tokens": 100, "ignore_eos": True}


@pytest.fixture(scope="module")
def burst_seen(prometheus, runtime) -> dict[str, float]:
    """A burst that fills the batch, queues and retracts, with Prometheus made to see it:
    the scheduler is frozen in the full state (4 running, 1 queued, most of the pool in use)
    until Prometheus has scraped that state, then let go to finish (and retract)."""
    sel = f'{{namespace="{NAMESPACE}",pod="{POD}"}}'
    # Prometheus scrapes the idle runtime before the burst, so the burst's retractions are
    # an increase it sees
    eventually(lambda: _value(prometheus.query(f"up{sel}")) == 1, timeout=30)
    eventually(lambda: _value(prometheus.query(f"sluice_retractions_total{sel}")) >= 0, timeout=30)

    def full() -> dict[str, float] | None:
        now = {
            name: _value(prometheus.query(f"{name}{sel}"))
            for name in (
                "sluice_running_requests",
                "sluice_queue_requests",
                "sluice_kv_token_usage",
            )
        }
        held = (
            now["sluice_running_requests"] == 4
            and now["sluice_queue_requests"] >= 1
            # prompts and all but the newest token of each output (its KV comes next forward)
            and now["sluice_kv_token_usage"] >= 4 * (5 + 199) / 1024
        )
        return now if held else None  # an earlier scrape of the run, until Prometheus has this

    runtime.hold.pause()  # until all five are queued: one admission pass takes them
    runtime.hold.arm(200, 4)
    sender = threading.Thread(
        target=lambda: run_load(runtime.url, [burst_request(i) for i in range(5)], poll_s=0.2)
    )
    sender.start()
    try:
        eventually(lambda: _value(prometheus.query(f"sluice_queue_requests{sel}")) == 5, 30)
        runtime.hold.resume()
        runtime.hold.wait_held()
        seen = eventually(full, timeout=30)
    finally:
        runtime.hold.disarm()
        sender.join(300)
    eventually(lambda: _value(prometheus.query(f"sluice_retractions_total{sel}")) > 0, timeout=30)
    return seen


PEAK_RECORDS = ("sluice:pod_kv_token_usage:max1m", "sluice:pod_queue_requests:max1m")
UNSATURATED_FILTERS = ("sluice:pod_unsaturated_kv_token_usage:max1m", "sluice:pod_unsaturated_queue_requests:max1m")


@pytest.fixture(scope="module")
def evaluated(prometheus, runtime, burst_seen) -> dict[str, Any]:
    """Every query's answer, evaluated while the runtime is under load, after a burst that
    retracted, with Prometheus holding a few seconds of samples."""
    queries = (
        dashboard_queries() + dashboard_variable_queries() + alert_queries() + adapter_queries()
        + recording_queries()
    )
    sel = f'{{namespace="{NAMESPACE}",pod="{POD}"}}'
    # the saturation rules run every 15 s: wait for their first evaluation
    eventually(lambda: not math.isnan(_value(prometheus.query(C.SATURATION_RECORDED_METRIC))), timeout=60)
    with BackgroundLoad(runtime.url, steady_request, concurrency=3) as load:
        eventually(lambda: load.done >= 3, timeout=120)
        eventually(
            lambda: (
                _value(prometheus.query(f"count_over_time(sluice_running_requests{sel}[1m])")) >= 5
            ),
            timeout=30,
        )
        at = time.time()  # every answer at one instant: they agree with each other
        answers = {
            q.source: (q, expr, prometheus.query(expr, at))
            for q in queries
            for expr in [substitute(q, NAMESPACE, MODEL, POD, RATE_INTERVAL)]
        }
        for name in PEAK_RECORDS:  # the recorded peaks the filter rules read, at the same instant
            answers[f"recorded {name}"] = (Query(name, name, "recorded"), name, prometheus.query(name, at))
        load_errors = list(load.errors)
    assert not load_errors, load_errors
    return answers


def _value(answer: dict[str, Any]) -> float:
    result = answer.get("data", {}).get("result", [])
    return float(result[0]["value"][1]) if result else math.nan


def _results(answer: dict[str, Any]) -> list[dict[str, Any]]:
    data = answer["data"]
    if data["resultType"] == "scalar":
        return [{"value": data["result"]}]
    return data["result"]


def test_every_expression_parses_and_evaluates(evaluated):
    failed = {
        source: (expr, answer.get("error"))
        for source, (_, expr, answer) in evaluated.items()
        if answer.get("status") != "success"
    }
    assert not failed, failed
    assert len(evaluated) == (
        len(dashboard_queries()) + 2 + len(alert_queries()) + 12 + len(recording_queries())
        + len(PEAK_RECORDS)
    )


def test_dashboard_and_adapter_queries_return_data(evaluated):
    empty = [
        f"{source}: {expr}"
        for source, (q, expr, answer) in evaluated.items()
        if q.kind in ("dashboard", "variable", "adapter", "adapter-external", "recording")
        and not any(source.endswith(name) for name in UNSATURATED_FILTERS)
        and not _results(answer)
    ]
    assert not empty, "\n".join(empty)


def test_the_unsaturated_filters_keep_the_pod_exactly_when_it_is_unsaturated(evaluated):
    """The filter rules have no series for a saturated pod (the burst's queue of 5 can still
    be inside the 1m window): each has the pod iff both its peaks, at the same instant, are
    below the thresholds."""
    from sluice.runtime.sim.plan.saturation import SaturationConfig

    def peak(record: str) -> float:
        (series,) = _results(evaluated[f"recorded {record}"][2])
        assert series["metric"]["pod"] == POD
        return float(series["value"][1])

    cfg = SaturationConfig()
    kv, queue = (peak(name) for name in PEAK_RECORDS)
    unsaturated = kv < cfg.kv_threshold and queue < cfg.queue_threshold
    for name in UNSATURATED_FILTERS:
        pods = [r["metric"]["pod"] for r in _results(evaluated[f"recording rule {name}"][2])]
        assert pods == ([POD] if unsaturated else []), (name, kv, queue)


def test_adapter_queries_give_one_value_per_pod(evaluated):
    for source, (q, _, answer) in evaluated.items():
        if q.kind != "adapter" or "metricsQuery" not in source:
            continue
        (series,) = _results(answer)
        assert series["metric"] == {"pod": POD}, source
        value = float(series["value"][1])
        assert 0 <= value, source
        if q.metric == C.HPA_METRIC_KV_TOKEN_USAGE:
            assert value <= 1


def test_the_saturation_metric_is_one_count_for_the_runtimes_service(evaluated):
    (q, _, answer) = next(v for s, v in evaluated.items() if s.startswith("adapter-external metricsQuery"))
    (series,) = _results(answer)
    assert series["metric"] == {"namespace": NAMESPACE, C.SATURATION_SERVICE_LABEL: DEPLOYMENT}
    assert float(series["value"][1]) in (1.0, 2.0)  # one pod: hold, or one more when saturated


def test_load_shows_in_the_core_panels(prometheus, burst_seen, evaluated):
    sel = f'namespace="{NAMESPACE}",model="{MODEL}"'
    # the burst's full state, scraped while the scheduler was frozen in it (`burst_seen`);
    # windows of 10m keep it in range however long the rest of the module took
    assert burst_seen["sluice_kv_token_usage"] > 0.5
    assert _value(prometheus.query(f"max_over_time(sluice_running_requests{{{sel}}}[10m])")) >= 4
    assert _value(prometheus.query(f"max_over_time(sluice_queue_requests{{{sel}}}[10m])")) >= 1
    assert _value(prometheus.query(f"max_over_time(sluice_kv_token_usage{{{sel}}}[10m])")) > 0.5
    assert _value(prometheus.query(f"increase(sluice_retractions_total{{{sel}}}[10m])")) > 0
    assert (
        _value(
            prometheus.query(
                f"max_over_time(sluice_generation_throughput_tokens_per_second{{{sel}}}[10m])"
            )
        )
        > 0
    )
    p99 = _value(
        prometheus.query(
            f"histogram_quantile(0.99, sum by (le) (increase(sluice_time_to_first_token_seconds_bucket{{{sel}}}[10m])))"
        )
    )
    assert 0 < p99 < 80


def test_alert_rules_load_and_evaluate_without_error(prometheus, evaluated):
    def evaluated_rules() -> list[dict[str, Any]]:
        groups = httpx.get(f"{prometheus.url}/api/v1/rules", timeout=10).json()["data"]["groups"]
        found = [r for g in groups for r in g["rules"]]
        return found if found and all(r["health"] != "unknown" for r in found) else []

    found = eventually(evaluated_rules, timeout=60)
    assert {r["name"] for r in found if r["type"] == "alerting"} == {r["alert"] for r in alert_rules()}
    assert {r["name"] for r in found if r["type"] == "recording"} == {r["record"] for r in saturation_rules()}
    unhealthy = {r["name"]: r.get("lastError") for r in found if r["health"] != "ok"}
    assert not unhealthy, unhealthy


def test_no_ready_replicas_alert_matches_the_runtimes_deployment(prometheus, evaluated):
    def pending() -> list[dict[str, Any]]:
        alerts = httpx.get(f"{prometheus.url}/api/v1/alerts", timeout=10).json()["data"]["alerts"]
        return [a for a in alerts if a["labels"]["alertname"] == "SluiceNoReadyReplicas"]

    (alert,) = eventually(pending, timeout=30)
    assert alert["state"] == "pending"  # `for: 5m` has not passed
    assert alert["labels"]["deployment"] == DEPLOYMENT
    assert alert["labels"]["namespace"] == NAMESPACE
