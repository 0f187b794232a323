"""The operator process killed mid-reconcile converges when it comes back; with the chart's
leader election on, of two replicas only the holder of the Lease writes, and a leader
paused past its Lease writes nothing when it wakes up, counted by the API server's own
audit log."""

from __future__ import annotations

import json
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


ELECTION = {"enabled": True, "leaseDurationSeconds": 6, "renewDeadlineSeconds": 4,
            "retryPeriodSeconds": 1}  # fmt: skip
WRITES = {"create", "update", "patch", "delete", "deletecollection"}


@pytest.fixture
def elected_pair(kube: Kube, operator: OperatorProcess, tmp_path):
    """The chart upgraded to two replicas with leader election; both run here as processes
    with the Deployment's own command line and env, each named by its pod (the chart's
    SLUICE_IDENTITY comes from the pod's name). Each has its own cluster domain, as two
    operator versions in a rolling upgrade may disagree on what to write: a replica that
    reconciled a service another one converged would then have a write to send (the
    status' url), so a fenced one that sends nothing is seen to be fenced."""
    import helm_python as helm

    config = helm.Config(kubeconfig_path=kube.plane.kubeconfig, namespace=OPERATOR_NS)
    chart = helm.Chart.load(CHART_DIR)
    operator.stop()
    pair: list[OperatorProcess] = []
    try:
        config.upgrade(chart, RELEASE, {"operator": {"replicas": 2, "leaderElection": ELECTION}},
                       namespace=OPERATOR_NS, timeout=120)  # fmt: skip
        selector = "app.kubernetes.io/component=operator"
        pods = wait_until(
            "two operator pods",
            lambda: (p := [x for x in kube.pods(OPERATOR_NS, selector)
                           if x["status"]["phase"] == "Running"
                           and not x["metadata"].get("deletionTimestamp")])
            and len(p) == 2 and p,
            timeout=90,
        )  # fmt: skip
        for index, pod in enumerate(pods):
            process = operator_process(kube, tmp_path / f"replica-{index}.log",
                                       {"SLUICE_IDENTITY": pod["metadata"]["name"],
                                        "SLUICE_CLUSTER_DOMAIN": f"replica-{index}.local"})  # fmt: skip
            pair.append(process)
            process.start()
        yield pair
    finally:
        for process in pair:
            if process.process is not None and process.process.poll() is None:
                os.kill(process.process.pid, signal.SIGCONT)  # never leave one stopped
            process.stop()
        config.upgrade(chart, RELEASE, {}, namespace=OPERATOR_NS, timeout=120)
        operator.start()


def _holder(kube: Kube) -> str:
    lease = kube.get(f"/apis/coordination.k8s.io/v1/namespaces/{OPERATOR_NS}/leases/{RELEASE}")
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


class Audit:
    """The API server's audit log (local_cluster.AUDIT_POLICY) from a point on: what each
    operator replica sent, told apart by its User-Agent (sluice-operator/<identity>)."""

    def __init__(self, kube: Kube) -> None:
        self.path = kube.plane.audit_log
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def events(self) -> list[dict[str, Any]]:
        with open(self.path, "rb") as fh:
            fh.seek(self.offset)
            lines = fh.read().decode().splitlines()
        return [e for e in map(json.loads, lines) if e.get("stage") == "ResponseComplete"]

    def writes(self, identity: str) -> list[str]:
        """`verb resource/name` of every write (the Lease's own aside) by one replica."""
        return [
            f"{e['verb']} {e['objectRef'].get('resource')}/{e['objectRef'].get('name', '')}"
            for e in self.events()
            if e.get("userAgent") == f"sluice-operator/{identity}"
            and e["verb"] in WRITES
            and e["objectRef"].get("resource") != "leases"
        ]

    def lease_reads(self, identity: str) -> int:
        return sum(
            1 for e in self.events()
            if e.get("userAgent") == f"sluice-operator/{identity}"
            and e["verb"] == "get" and e["objectRef"].get("resource") == "leases"
        )  # fmt: skip


def test_only_the_lease_holder_writes_and_a_paused_leader_is_fenced(
    kube: Kube, elected_pair: list[OperatorProcess], ns: str
):
    replicas = {p.env["SLUICE_IDENTITY"]: p for p in elected_pair}
    explain = lambda: "\n---\n".join(p.tail() for p in elected_pair)  # noqa: E731
    holder = wait_until("a replica holding the Lease", lambda: (h := _holder(kube)) in replicas and h,
                        timeout=60, explain=explain)  # fmt: skip
    [standby] = [name for name in replicas if name != holder]

    # 1. the holder converges a service; the standby, which watches the same events and
    # queues them, sends the API server no write at all
    before = Audit(kube)
    kube.apply(isvc(ns, "chat"))
    wait_until("Ready under the elected pair", lambda: is_ready(kube.isvc(ns, "chat")),
               timeout=120, explain=explain)  # fmt: skip
    assert before.writes(holder), "the leader's writes are not in the audit log"
    assert before.writes(standby) == []

    # 2. the leader is paused past its Lease in the middle of its work (a batch of services
    # queued, the first one written). The standby takes over and converges the batch, and
    # services created while the old leader sleeps, which it has never seen
    batch = [f"svc-{i}" for i in range(12)]
    late = [f"late-{i}" for i in range(4)]
    leader = replicas[holder].process
    assert leader is not None
    kube.apply([isvc(ns, name) for name in batch])
    wait_until("the leader at work on the batch",
               lambda: kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/svc-0"),
               timeout=60, interval=0.02, explain=explain)  # fmt: skip
    os.kill(leader.pid, signal.SIGSTOP)
    try:
        wait_until("the standby holding the Lease", lambda: _holder(kube) == standby,
                   timeout=60, explain=explain)  # fmt: skip
        kube.apply([isvc(ns, name) for name in late])
        for name in batch + late:
            wait_until(f"{name} Ready under the new leader", lambda n=name: is_ready(kube.isvc(ns, n)),
                       timeout=120, explain=explain)  # fmt: skip
    finally:
        woken = Audit(kube)
        os.kill(leader.pid, signal.SIGCONT)

    # 3. woken up, the old leader is fenced: every write it starts is refused before it is
    # sent (its Lease is stale), and at its next try it finds the Lease taken and stays a
    # standby. A request it had checked and begun before the pause may still land (one per
    # worker at most: client-go has the same window; the API server has no fencing token);
    # a write about anything it learns after waking — the late services, a new one — never
    wait_until("the old leader back in the election (two Lease reads since it woke)",
               lambda: woken.lease_reads(holder) >= 2, timeout=60, explain=explain)  # fmt: skip
    kube.apply(isvc(ns, "third"))
    wait_until("Ready after the old leader woke", lambda: is_ready(kube.isvc(ns, "third")),
               timeout=120, explain=explain)  # fmt: skip
    after = woken.writes(holder)
    assert [w for w in after if w.rsplit("/", 1)[-1] in (*late, "third")] == [], after
    assert len(after) <= int(replicas[holder].env.get("SLUICE_WORKERS", "4")), after
    assert woken.writes(standby), "the new leader's writes are not in the audit log"
    assert _holder(kube) == standby and leader.poll() is None
