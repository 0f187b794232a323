"""The operator process killed mid-reconcile converges when it comes back; with the chart's
peering on, of two replicas only the one with the higher priority writes."""

from __future__ import annotations

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


@pytest.mark.skip(reason=(
    "Kopf peering does not settle on this tier: on the 2026-12-05 machine the pair never "
    "logged a pause within 60-120 s in the full suite (3 runs of 3), and one replica logged "
    "'Resuming operations after the pause. Conflicting operators with the same priority are "
    "gone' while the other logged nothing; HA with a Lease and a fencing check (issue #37) "
    "replaces this test"))
def test_of_two_peered_replicas_only_one_writes(kube: Kube, peered_pair, ns: str):
    kube.apply(isvc(ns, "chat"))
    wait_until("Ready under the peered pair", lambda: is_ready(kube.isvc(ns, "chat")),
               timeout=120, explain=lambda: "\n---\n".join(p.tail() for p in peered_pair))  # fmt: skip
    handled = [p for p in peered_pair if f"{ns}/chat" in p.output()]
    assert len(handled) == 1, [p.tail() for p in peered_pair]
    [standby] = [p for p in peered_pair if p not in handled]
    # the standby pauses once it has seen its peer's keepalive, which may come after the
    # service turned Ready: wait for it, with a deadline
    wait_until("the standby replica paused", lambda: "ausing" in standby.output(),
               timeout=60, explain=standby.tail)  # fmt: skip
    assert f"{ns}/chat" not in standby.output(), standby.tail()
