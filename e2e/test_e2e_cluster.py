"""End to end on a real cluster: install the chart, serve the CPU SmolLM2 sample, talk to
it through its Service, and watch the scheduler's queue-depth metric rise under load.

Run explicitly (the normal test run collects only tests/):

    KUBECONFIG=~/.kube/config .venv/bin/python -m pytest e2e -v
    e2e/kind.sh                     # creates a kind cluster, builds and loads the images

The images must be pullable by the cluster (kind: `kind load docker-image`); name them with
SLUICE_E2E_OPERATOR_IMAGE, SLUICE_E2E_RUNTIME_IMAGE and SLUICE_E2E_ROUTER_IMAGE (defaults: sluice-operator:e2e,
sluice-router:e2e and
sluice-runtime:e2e-cpu, what e2e/kind.sh builds). Everything happens in a fresh namespace
(the operator watches only it) that is deleted afterwards; the CRD stays installed.
Without a reachable cluster every test here skips and says why.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.integration, pytest.mark.timeout(1800)]

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "sluice"
SAMPLE = REPO / "samples" / "smollm2-cpu.yaml"
SERVICE = "smollm2"  # metadata.name in the sample
OPERATOR_IMAGE = os.environ.get("SLUICE_E2E_OPERATOR_IMAGE", "sluice-operator:e2e")
RUNTIME_IMAGE = os.environ.get("SLUICE_E2E_RUNTIME_IMAGE", "sluice-runtime:e2e-cpu")
ROUTER_IMAGE = os.environ.get("SLUICE_E2E_ROUTER_IMAGE", "sluice-router:e2e")
READY_TIMEOUT_S = int(os.environ.get("SLUICE_E2E_READY_TIMEOUT", "900"))
QUEUE_METRIC = "sluice_queue_requests"


def cluster_problem() -> str | None:
    """Why no cluster can be used, or None when one answers."""
    if shutil.which("kubectl") is None:
        return "kubectl is not installed"
    kubeconfig = os.environ.get("KUBECONFIG") or str(Path.home() / ".kube" / "config")
    if not any(Path(p).is_file() for p in kubeconfig.split(os.pathsep) if p):
        return f"no cluster: KUBECONFIG is not set and {kubeconfig} does not exist"
    done = subprocess.run(
        ["kubectl", "version", "--request-timeout=5s", "-o", "json"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines() or [f"kubectl version exited {done.returncode}"]
        return f"no reachable cluster: {lines[-1]}"
    return None


def kubectl(*args: str, check: bool = True, timeout: float = 120) -> str:
    done = subprocess.run(["kubectl", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed:\n{done.stderr}")
    return done.stdout


def diagnostics(namespace: str) -> str:
    """What a person would look at when the test fails."""
    out = []
    for args in (
        ["get", "inferenceservices,deployments,pods,services,events", "-o", "wide"],
        ["describe", "inferenceservice", SERVICE],
        ["describe", "pods"],
        ["logs", "-l", "app.kubernetes.io/component=operator", "--tail=100"],
        ["logs", "-l", f"app.kubernetes.io/instance={SERVICE}", "--tail=100", "--all-containers"],
    ):
        out.append(f"$ kubectl -n {namespace} {' '.join(args)}")
        out.append(kubectl("-n", namespace, *args, check=False, timeout=60))
    text = "\n".join(out)
    if "OOMKilled" in text:
        text = (
            "The runtime container was OOMKilled: raise spec.resources.memory in "
            f"{SAMPLE.relative_to(REPO)}.\n" + text
        )
    return text


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def split_image(image: str) -> dict[str, str]:
    repository, _, tag = image.rpartition(":")
    if not repository or "/" in tag:
        return {"repository": image, "tag": "latest"}
    return {"repository": repository, "tag": tag}


@pytest.fixture(scope="module")
def namespace() -> Iterator[str]:
    problem = cluster_problem()
    if problem:
        pytest.skip(problem)
    name = f"sluice-e2e-{uuid.uuid4().hex[:6]}"
    kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def release(namespace: str) -> Iterator[str]:
    """The chart installed in `namespace`, its operator watching only that namespace."""
    import helm_python as helm

    values = {
        "operator": {
            "image": {**split_image(OPERATOR_IMAGE), "pullPolicy": "IfNotPresent"},
            "watchNamespaces": [namespace],
            "verbose": True,
        },
        "runtime": {"image": split_image(RUNTIME_IMAGE)},
        "router": {"image": split_image(ROUTER_IMAGE)},
        "rbac": {"podMonitors": True},
    }
    name = namespace  # release names are per namespace; this keeps ClusterRoles apart too
    config = helm.Config(namespace=namespace)
    try:
        config.install(CHART, name, values, namespace=namespace, wait="watcher", timeout=300)
    except helm.HelmError as error:
        pytest.fail(f"helm install failed: {error}\n{diagnostics(namespace)}")
    try:
        yield name
    finally:
        config.uninstall(name, ignore_not_found=True, wait="watcher", timeout=120)
        config.close()


@pytest.fixture(scope="module")
def service_url(namespace: str, release: str) -> Iterator[str]:
    """The sample InferenceService, Ready, reachable through `kubectl port-forward`."""
    kubectl("-n", namespace, "apply", "-f", str(SAMPLE))
    done = subprocess.run(
        ["kubectl", "-n", namespace, "wait", f"inferenceservice/{SERVICE}",
         "--for=condition=Ready", f"--timeout={READY_TIMEOUT_S}s"],
        capture_output=True, text=True, timeout=READY_TIMEOUT_S + 60,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(f"{SERVICE} never became Ready: {done.stderr}\n{diagnostics(namespace)}")
    port = free_port()
    forward = subprocess.Popen(
        ["kubectl", "-n", namespace, "port-forward", f"svc/{SERVICE}", f"{port}:80"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        line = forward.stdout.readline() if forward.stdout else ""
        assert "Forwarding from" in line, f"port-forward did not start: {line}"
        # keep draining its output so it never blocks on a full pipe
        threading.Thread(target=forward.stdout.read, daemon=True).start()
        yield f"http://127.0.0.1:{port}"
    finally:
        forward.terminate()
        forward.wait(timeout=10)
        kubectl("-n", namespace, "delete", "-f", str(SAMPLE), "--wait=false", check=False)


def served_model(client, url: str) -> str:
    models = client.get(f"{url}/v1/models").json()["data"]
    assert len(models) == 1, models
    return models[0]["id"]


def test_status_reports_the_service_url(namespace: str, service_url: str):
    status = kubectl("-n", namespace, "get", "inferenceservice", SERVICE, "-o",
                     "jsonpath={.status.phase} {.status.readyReplicas} {.status.url}")  # fmt: skip
    phase, ready, url = status.split()
    assert (phase, ready) == ("Ready", "1")
    assert url.startswith(f"http://{SERVICE}.{namespace}.svc")


def test_chat_completion_through_the_service(service_url: str):
    import httpx

    with httpx.Client(timeout=120) as client:
        model = served_model(client, service_url)
        response = client.post(
            f"{service_url}/v1/chat/completions",
            json={
                "model": model,
                "messages": [{"role": "user", "content": "What is the capital of France?"}],
                "max_tokens": 16,
                "temperature": 0,
            },
        )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["choices"][0]["message"]["content"].strip()
    assert body["usage"]["completion_tokens"] > 0


def queue_depth(client, url: str) -> float:
    text = client.get(f"{url}/metrics").text
    values = re.findall(rf"^{QUEUE_METRIC}(?:{{[^}}]*}})? ([0-9.eE+-]+)$", text, flags=re.M)
    assert values, f"{QUEUE_METRIC} missing from /metrics"
    return sum(float(v) for v in values)


def test_queue_depth_rises_under_load(service_url: str):
    """More concurrent requests than the sample's 16 request slots: some must wait, and
    the scheduler's queue-depth gauge (what the HPA scales on) shows them."""
    import httpx

    concurrency, seen = 48, []
    with httpx.Client(timeout=300, limits=httpx.Limits(max_connections=concurrency + 4)) as client:
        model = served_model(client, service_url)
        assert queue_depth(client, service_url) == 0

        def ask(i: int) -> int:
            return client.post(
                f"{service_url}/v1/chat/completions",
                json={
                    "model": model,
                    "messages": [{"role": "user", "content": f"Count to {i + 20}."}],
                    "max_tokens": 96,
                    "temperature": 0,
                    "ignore_eos": True,
                },
            ).status_code

        with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
            futures = [pool.submit(ask, i) for i in range(concurrency)]
            deadline = time.monotonic() + 240
            while not all(f.done() for f in futures) and time.monotonic() < deadline:
                seen.append(queue_depth(client, service_url))
                time.sleep(0.2)
            codes = [f.result() for f in futures]
        assert codes == [200] * concurrency
        assert max(seen, default=0) > 0, f"queue depth never rose: {seen}"
        time.sleep(2)  # the scheduler publishes its stats at least once a second
        assert queue_depth(client, service_url) == 0


def test_custom_metrics_api_serves_queue_depth(namespace: str, service_url: str):
    """Only where prometheus-adapter with the chart's rules is installed (docs/deploy.md)."""
    resources = kubectl("get", "--raw", "/apis/custom.metrics.k8s.io/v1beta1", check=False)
    if f"pods/{QUEUE_METRIC}" not in resources:
        pytest.skip("custom.metrics.k8s.io does not serve sluice_queue_requests (no adapter)")
    path = f"/apis/custom.metrics.k8s.io/v1beta1/namespaces/{namespace}/pods/*/{QUEUE_METRIC}"
    deadline = time.monotonic() + 180  # scrape interval + adapter relist
    while time.monotonic() < deadline:
        if '"items":[{' in kubectl("get", "--raw", path, check=False).replace(" ", ""):
            return
        time.sleep(10)
    pytest.fail(f"no {QUEUE_METRIC} for the pods of {namespace} after 3 minutes")
