"""Deleting an InferenceService on a real API server: the garbage collector removes every
child (background and foreground cascades); after an orphaning delete, a re-apply adopts
the orphans (the same objects, pods untouched) instead of reporting a name conflict."""

from __future__ import annotations

import pytest
from cluster_kit import Kube, OperatorProcess, condition, wait_until
from test_cluster_healing import create_ready

CHILDREN = (
    "/apis/apps/v1/namespaces/{ns}/deployments",
    "/apis/apps/v1/namespaces/{ns}/replicasets",
    "/api/v1/namespaces/{ns}/pods",
    "/api/v1/namespaces/{ns}/services",
    "/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
    "/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers",
)


def left(kube: Kube, ns: str) -> list[str]:
    return [
        f"{path.rsplit('/', 1)[-1]}/{item['metadata']['name']}"
        for path in CHILDREN
        for item in kube.get(path.format(ns=ns))["items"]
    ]


@pytest.mark.parametrize("cascade", ["background", "foreground"])
def test_kubectl_delete_collects_every_child(
    kube: Kube, operator: OperatorProcess, ns: str, cascade: str
):
    create_ready(kube, ns, "chat", autoscaling={"enabled": True, "minReplicas": 1,
                                                "maxReplicas": 2})  # fmt: skip
    assert len(left(kube, ns)) == 6  # Deployment, ReplicaSet, Pod, Service, PDB, HPA

    kube.kubectl("delete", "inferenceservice", "chat", "-n", ns, f"--cascade={cascade}",
                 timeout=120)  # fmt: skip

    wait_until("every child collected", lambda: not left(kube, ns), timeout=90,
               explain=lambda: str(left(kube, ns)))  # fmt: skip


def test_an_orphaning_delete_then_a_re_apply_adopts_the_orphans(
    kube: Kube, operator: OperatorProcess, ns: str
):
    create_ready(kube, ns, "chat")
    path = f"/apis/apps/v1/namespaces/{ns}/deployments/chat"
    deployment = kube.get(path)
    kube.kubectl("delete", "inferenceservice", "chat", "-n", ns, "--cascade=orphan")
    orphan = kube.get(path)
    assert orphan["metadata"]["uid"] == deployment["metadata"]["uid"]
    assert not orphan["metadata"].get("ownerReferences")  # the collector orphaned it

    kube.apply(
        {
            "apiVersion": "sluice.dev/v1alpha1",
            "kind": "InferenceService",
            "metadata": {"name": "chat", "namespace": ns},
            "spec": {"model": {"source": "bundled://smollm2-135m"},
                     "resources": {"cpu": "1", "memory": "2Gi"}},
        }
    )  # fmt: skip
    owner = kube.isvc(ns, "chat")["metadata"]["uid"]
    wait_until(
        "the re-applied service Ready on its adopted children",
        lambda: (condition(kube.isvc(ns, "chat"), "Ready") or {}).get("status") == "True",
        timeout=90,
        explain=lambda: f"{kube.isvc(ns, 'chat')}\n{operator.tail()}",
    )
    # the same objects (the pods kept running), now controlled by the new service
    for kind, child in (("deployments", "apps/v1"), ("services", "v1"),
                        ("poddisruptionbudgets", "policy/v1")):  # fmt: skip
        base = "/api/v1" if child == "v1" else f"/apis/{child}"
        obj = kube.get(f"{base}/namespaces/{ns}/{kind}/chat")
        [ref] = [r for r in obj["metadata"]["ownerReferences"] if r.get("controller")]
        assert ref["uid"] == owner, (kind, ref)
    assert kube.get(path)["metadata"]["uid"] == deployment["metadata"]["uid"]
    wait_until("an Adopted event", lambda: "Adopted" in kube.events(ns), timeout=30)
