"""Deleting an InferenceService on a real API server: the garbage collector removes every
child (background and foreground cascades); an orphaning delete followed by a re-apply is
reported on the new object, not left stuck silently."""

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


def test_an_orphaning_delete_then_a_re_apply_is_reported(
    kube: Kube, operator: OperatorProcess, ns: str
):
    create_ready(kube, ns, "chat")
    deployment = kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/chat")
    kube.kubectl("delete", "inferenceservice", "chat", "-n", ns, "--cascade=orphan")
    orphan = kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/chat")
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
    ready = wait_until(
        "the re-applied service to report the orphaned children",
        lambda: (
            (c := condition(kube.isvc(ns, "chat"), "Ready"))
            and c.get("reason") == "NameConflict"
            and c
        ),
        timeout=60,
        explain=lambda: f"{kube.isvc(ns, 'chat')}\n{operator.tail()}",
    )
    assert ready["status"] == "False"
    assert "is not owned by this InferenceService" in ready["message"]
    assert kube.isvc(ns, "chat")["status"]["phase"] == "Failed"
    wait_until("a NameConflict event", lambda: "NameConflict" in kube.events(ns), timeout=30)
    # the orphan is untouched; deleting it lets the service converge
    still = kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/chat")
    assert still["metadata"]["uid"] == deployment["metadata"]["uid"]
    kube.kubectl("delete", "deployment,service,pdb", "chat", "-n", ns)
    wait_until(
        "Ready after the orphans are gone",
        lambda: (condition(kube.isvc(ns, "chat"), "Ready") or {}).get("status") == "True",
        timeout=90,
        explain=lambda: f"{kube.isvc(ns, 'chat')}\n{operator.tail()}",
    )
