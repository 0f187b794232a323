"""The operator process killed mid-reconcile converges when it comes back; with the chart's
peering on, of two replicas only the one with the higher priority writes."""

from __future__ import annotations

import ipaddress
import os
import signal
from typing import Any

import pytest
from cluster_kit import (
    CHART_DIR,
    OPERATOR_NS,
    RELEASE,
    Kube,
    OperatorProcess,
    is_ready,
    operator_process,
    wait_until,
)

SPEC = {
    "model": {"source": "bundled://smollm2-135m"},
    "resources": {"cpu": "500m", "memory": "1Gi"},
}


def isvc(ns: str, name: str) -> dict[str, Any]:
    return {"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceService",
            "metadata": {"name": name, "namespace": ns}, "spec": SPEC}  # fmt: skip


def test_an_operator_killed_mid_reconcile_converges_after_restart(
    kube: Kube, operator: OperatorProcess, ns: str
):
    names = [f"svc-{i}" for i in range(4)]
    kube.apply([isvc(ns, n) for n in names])
    # kill it as soon as it has written its first child: the others are in flight or queued
    wait_until("a first Deployment",
               lambda: kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments")["items"],
               timeout=60, interval=0.05, explain=operator.tail)  # fmt: skip
    os.killpg(operator.process.pid, signal.SIGKILL)
    operator.process.wait()
    done_before = sum(bool(is_ready(kube.isvc(ns, n))) for n in names)

    operator.start()
    for name in names:
        wait_until(f"{name} Ready after the restart", lambda n=name: is_ready(kube.isvc(ns, n)),
                   timeout=120, explain=operator.tail)  # fmt: skip
    assert done_before < len(names)  # the kill did land mid-way
    assert len(kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments")["items"]) == len(names)


@pytest.fixture
def peered_pair(kube: Kube, operator: OperatorProcess, tmp_path):
    """The chart upgraded to two peered replicas; both run here as processes with the
    Deployment's own command line, each with the IP kwok gave its pod as POD_IP."""
    import helm_python as helm

    config = helm.Config(kubeconfig_path=kube.plane.kubeconfig, namespace=OPERATOR_NS)
    chart = helm.Chart.load(CHART_DIR)
    operator.stop()
    pair: list[OperatorProcess] = []
    try:
        config.upgrade(chart, RELEASE, {"operator": {"replicas": 2, "peering": {"enabled": True}}},
                       namespace=OPERATOR_NS, timeout=120)  # fmt: skip
        selector = "app.kubernetes.io/component=operator"
        pods = wait_until(
            "two operator pods with IPs",
            lambda: (p := [x for x in kube.pods(OPERATOR_NS, selector)
                           if x["status"].get("podIP") and x["status"]["phase"] == "Running"
                           and not x["metadata"].get("deletionTimestamp")])
            and len(p) == 2 and p,
            timeout=90,
        )  # fmt: skip
        for index, pod in enumerate(pods):
            process = operator_process(kube, tmp_path / f"peer-{index}.log",
                                       {"POD_IP": pod["status"]["podIP"]})  # fmt: skip
            pair.append(process)
            process.start()
        yield pair
    finally:
        for process in pair:
            process.stop()
        config.upgrade(chart, RELEASE, {}, namespace=OPERATOR_NS, timeout=120)
        operator.start()


def _peers(kube: Kube) -> list[dict[str, Any]]:
    """The live peers of the chart's peering object as the API server holds it (Kopf writes
    each replica's priority and keepalive there)."""
    items = kube.get("/apis/kopf.dev/v1/clusterkopfpeerings")["items"]
    peering = next((p for p in items if p["metadata"]["name"] == RELEASE), None)
    return list((peering or {}).get("status", {}).values())


def _priority(process: OperatorProcess) -> int:
    """The chart's priority of a replica: its pod IP as a number (deployment.yaml)."""
    return int(ipaddress.ip_address(process.env["POD_IP"])) % 2**31


def test_of_two_peered_replicas_only_one_writes(kube: Kube, peered_pair, ns: str):
    # Kopf starts a replica paused until it has read the peering; the lower-priority one
    # then stays paused without a word, the higher one logs that it resumes. So the evidence
    # is the peering object itself: both replicas in it, with the priorities the chart gave.
    peers = wait_until("both replicas in the peering object",
                       lambda: (found := _peers(kube)) and len(found) == 2 and found,
                       timeout=120, explain=lambda: "\n---\n".join(p.tail() for p in peered_pair))  # fmt: skip
    assert sorted(p["priority"] for p in peers) == sorted(map(_priority, peered_pair))
    active = max(peered_pair, key=_priority)
    standby = min(peered_pair, key=_priority)
    wait_until("the higher-priority replica resumed", lambda: "Resuming operations" in active.output(),
               timeout=120, explain=active.tail)  # fmt: skip
    kube.apply(isvc(ns, "chat"))
    wait_until("Ready under the peered pair", lambda: is_ready(kube.isvc(ns, "chat")),
               timeout=120, explain=lambda: "\n---\n".join(p.tail() for p in peered_pair))  # fmt: skip
    assert f"{ns}/chat" in active.output(), active.tail()
    assert f"{ns}/chat" not in standby.output(), standby.tail()
