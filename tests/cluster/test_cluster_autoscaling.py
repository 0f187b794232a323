"""Autoscaling with the real HPA controller: it reads the scheduler metric through the custom
metrics API and scales the Deployment through /scale; the operator hands `spec.replicas`
over with server-side apply and never takes it back while the HPA owns it; turning
autoscaling off hands the count back to the InferenceService."""

from __future__ import annotations

from typing import Any

from cluster_kit import Kube, OperatorProcess, wait_until
from test_cluster_healing import create_ready

METRIC = "sluice_queue_requests"


def deployment(kube: Kube, ns: str) -> dict[str, Any]:
    return kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/chat")


def write_queue_depth(kube: Kube, ns: str, selector: str, value: str) -> None:
    for pod in kube.pods(ns, selector):
        kube.plane.write_pod_metric(ns, pod["metadata"]["name"], METRIC, value)


def test_the_hpa_scales_on_the_queue_metric_and_the_operator_hands_replicas_over(
    kube: Kube, operator: OperatorProcess, ns: str
):
    isvc = create_ready(
        kube, ns, "chat",
        autoscaling={"enabled": True, "minReplicas": 1, "maxReplicas": 3,
                     "metrics": [{"type": "queueDepth", "target": 8}]},
    )  # fmt: skip
    selector = isvc["status"]["selector"]
    hpa_path = f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/chat"
    hpa = kube.get(hpa_path)
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == METRIC

    # 20 waiting requests on the one pod, target 8 per pod: ceil(20 / 8) = 3 replicas
    write_queue_depth(kube, ns, selector, "20")
    # the HPA controller scales the Deployment first and writes its own status after
    wait_until(
        "the HPA to scale the Deployment to 3 and report it",
        lambda: deployment(kube, ns)["spec"]["replicas"] == 3
        and (kube.get(hpa_path).get("status") or {}).get("desiredReplicas") == 3,
        timeout=90,
        explain=lambda: f"{kube.get(hpa_path).get('status')}\n{operator.tail()}",
    )
    managers = {
        (m["manager"], m.get("subresource", ""))
        for m in deployment(kube, ns)["metadata"]["managedFields"]
        if "f:replicas" in (m.get("fieldsV1") or {}).get("f:spec", {})
    }
    assert managers == {("kube-controller-manager", "scale")}, managers

    # the operator re-applies the Deployment (a spec change) and leaves the count alone.
    # A write of the count by the operator could hide behind the HPA setting it back, so
    # the Deployment's generation counts the writes: the operator's apply is one (the new
    # args); a count it wrote and the HPA restored would be two more
    scaled = deployment(kube, ns)["metadata"]["generation"]
    kube.kubectl("patch", "sisvc", "chat", "-n", ns, "--type=merge",
                 "-p", '{"spec":{"runtime":{"maxRunningRequests":9}}}')  # fmt: skip
    generation = kube.isvc(ns, "chat")["metadata"]["generation"]
    wait_until(
        "the operator to apply the change",
        lambda: kube.isvc(ns, "chat")["status"].get("observedGeneration") == generation,
        timeout=60,
    )
    applied = deployment(kube, ns)
    assert applied["spec"]["replicas"] == 3
    assert applied["metadata"]["generation"] == scaled + 1, "the count was written meanwhile"
    # all three pods run on fake nodes; the status reports the HPA's choice
    wait_until("3 ready replicas", lambda: kube.isvc(ns, "chat")["status"].get("readyReplicas") == 3,
               timeout=90)  # fmt: skip
    assert kube.isvc(ns, "chat")["status"]["desiredReplicas"] == 3
    assert deployment(kube, ns)["metadata"]["generation"] == scaled + 1

    # autoscaling off: the HPA goes, the count stays, spec.replicas takes it
    kube.kubectl("patch", "sisvc", "chat", "-n", ns, "--type=merge",
                 "-p", '{"spec":{"autoscaling":{"enabled":false}}}')  # fmt: skip
    wait_until("the HPA removed", lambda: kube.get(hpa_path) is None, timeout=60,
               explain=operator.tail)  # fmt: skip
    wait_until(
        "spec.replicas = 3",
        lambda: kube.isvc(ns, "chat")["spec"].get("replicas") == 3,
        timeout=60,
        explain=lambda: f"{kube.isvc(ns, 'chat')}\n{operator.tail()}",
    )
    assert deployment(kube, ns)["spec"]["replicas"] == 3
    # and the operator owns the count again: `kubectl scale` moves the Deployment
    kube.kubectl("scale", "sisvc", "chat", "-n", ns, "--replicas=2")
    wait_until("the Deployment at 2", lambda: deployment(kube, ns)["spec"]["replicas"] == 2,
               timeout=60, explain=operator.tail)  # fmt: skip
