"""An hf:// model pinned on the real tier: the operator resolves the branch to its commit
(through the stand-in Hub API, fake_hub.py), and the pods the real Deployment and
ReplicaSet controllers make from the template download exactly that commit, before and
after the branch moves, an operator restart and a scale-up; a refresh asked on purpose
rolls the pods onto the new head."""

from __future__ import annotations

from typing import Any

from cluster_kit import Kube, OperatorProcess, is_ready, wait_until
from fake_hub import FakeHub

REPO = "acme/tiny-chat"


def service(ns: str, replicas: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "chat", "namespace": ns},
        "spec": {"model": {"source": f"hf://{REPO}", "storageSize": "2Gi"},
                 "resources": {"cpu": "500m", "memory": "1Gi"}, "replicas": replicas},
    }  # fmt: skip


def revisions_of_pods(kube: Kube, ns: str) -> set[str]:
    """The SLUICE_MODEL_REVISION of every live pod's download container."""
    found = set()
    for pod in kube.pods(ns, "app.kubernetes.io/instance=chat"):
        if pod["metadata"].get("deletionTimestamp"):
            continue
        for init in pod["spec"].get("initContainers", []):
            env = {e["name"]: e.get("value") for e in init.get("env", [])}
            if "SLUICE_MODEL_REVISION" in env:
                found.add(env["SLUICE_MODEL_REVISION"])
    return found


def running(kube: Kube, ns: str) -> int:
    return sum(
        1 for p in kube.pods(ns, "app.kubernetes.io/instance=chat")
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    )  # fmt: skip


def test_pods_download_the_commit_the_revision_resolved_to(
    kube: Kube, operator: OperatorProcess, hub: FakeHub, ns: str
):
    pinned = hub.sha(REPO)
    kube.apply(service(ns))
    wait_until("Ready", lambda: is_ready(kube.isvc(ns, "chat")), timeout=120, explain=operator.tail)
    assert kube.isvc(ns, "chat")["status"]["model"] == {
        "requested": f"{REPO}@main", "revision": pinned,
    }  # fmt: skip
    assert revisions_of_pods(kube, ns) == {pinned}

    # the branch moves; the operator restarts; the service scales up: same commit
    hub.push(REPO)
    operator.stop()
    operator.start()
    kube.apply(service(ns, replicas=3))
    wait_until("three pods running", lambda: running(kube, ns) == 3, timeout=120,
               explain=operator.tail)  # fmt: skip
    assert revisions_of_pods(kube, ns) == {pinned}
    assert kube.isvc(ns, "chat")["status"]["model"]["revision"] == pinned

    # a refresh on purpose rolls every pod onto the branch's new head
    kube.kubectl("annotate", "sisvc", "chat", "-n", ns, "sluice.dev/refresh-revision=1")
    head = hub.sha(REPO)
    wait_until(
        "every pod on the new head",
        lambda: revisions_of_pods(kube, ns) == {head} and running(kube, ns) == 3,
        timeout=120,
        explain=lambda: f"{revisions_of_pods(kube, ns)}\n{operator.tail()}",
    )
    assert kube.isvc(ns, "chat")["status"]["model"]["revision"] == head
