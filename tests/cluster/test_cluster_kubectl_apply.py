"""`kubectl apply -f samples/smollm2-cpu.yaml` against a real API server, with the operator
running as its own process: children, pods on fake nodes, status and printer columns."""

from __future__ import annotations

from cluster_kit import REPO, Kube, OperatorProcess, condition, is_ready, wait_until

SAMPLE = REPO / "samples" / "smollm2-cpu.yaml"


def test_kubectl_apply_of_the_cpu_sample_makes_a_ready_service(
    kube: Kube, operator: OperatorProcess, ns: str
):
    out = kube.kubectl("apply", "-n", ns, "-f", str(SAMPLE)).stdout
    assert "inferenceservice.sluice.dev/smollm2 created" in out

    isvc = wait_until(
        "InferenceService smollm2 Ready",
        # Ready can come a moment before the counts: it reads the ReplicaSet, the counts are
        # the Deployment's, and the controller manager updates the Deployment's status after
        lambda: (
            (obj := kube.isvc(ns, "smollm2"))
            and is_ready(obj)
            and obj["status"].get("readyReplicas") == 1
            and obj
        ),
        timeout=90,
        explain=lambda: f"{kube.isvc(ns, 'smollm2')}\n{operator.tail()}",
    )
    status = isvc["status"]
    assert status["phase"] == "Ready"
    assert (status["replicas"], status["readyReplicas"], status["desiredReplicas"]) == (1, 1, 1)
    assert status["observedGeneration"] == isvc["metadata"]["generation"]
    assert status["url"] == f"http://smollm2.{ns}.svc.cluster.local"
    assert condition(isvc, "Available")["status"] == "True"
    assert condition(isvc, "Degraded")["status"] == "False"

    # the children, owned by the InferenceService (controller reference)
    uid = isvc["metadata"]["uid"]
    for path in (
        f"/apis/apps/v1/namespaces/{ns}/deployments/smollm2",
        f"/api/v1/namespaces/{ns}/services/smollm2",
        f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/smollm2",
    ):
        child = kube.get(path)
        assert child is not None, path
        owners = child["metadata"]["ownerReferences"]
        assert [(o["uid"], o.get("controller")) for o in owners] == [(uid, True)], path
    # no autoscaling asked: no HPA
    assert (
        kube.get(f"/apis/autoscaling/v2/namespaces/{ns}/horizontalpodautoscalers/smollm2") is None
    )

    # the pod was scheduled by the real scheduler onto a CPU node and is Running
    pods = kube.pods(ns, isvc["status"]["selector"])
    assert len(pods) == 1
    assert pods[0]["status"]["phase"] == "Running"
    assert pods[0]["spec"]["nodeName"].startswith("cpu-node-")

    # the printer columns, as `kubectl get inferenceservices` prints them
    table = kube.kubectl("get", "inferenceservices", "-n", ns).stdout.splitlines()
    assert table[0].split() == ["NAME", "MODEL", "READY", "DESIRED", "URL", "PHASE", "AGE"]
    row = table[1].split()
    assert row[:6] == ["smollm2", "bundled://smollm2-135m", "1", "1", status["url"], "Ready"]
    wide = kube.kubectl("get", "sisvc", "-n", ns, "-o", "wide").stdout.splitlines()
    assert wide[0].split() == ["NAME", "MODEL", "READY", "DESIRED", "URL", "PHASE", "SERVED-AS",
                               "GPUS", "AGE"]  # fmt: skip
    assert wide[1].split()[6:8] == ["SmolLM2-135M-Instruct", "0"]
    assert not operator.errors(), "\n".join(operator.errors())
