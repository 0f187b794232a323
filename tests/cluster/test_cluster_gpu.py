"""GPU accounting by the real scheduler: a service asking for more GPUs per replica than any
node has waits for capacity (Progressing, no Warning) for the operator's scheduling grace,
then is Degraded with the scheduler's own words in its status and a Warning Event; a node
with enough GPUs makes it Ready."""

from __future__ import annotations

from datetime import datetime

import local_cluster
import yaml
from cluster_kit import (
    REPO,
    SCHEDULING_GRACE_S,
    Kube,
    OperatorProcess,
    condition,
    is_ready,
    wait_until,
)


def test_too_many_gpus_is_unschedulable_until_a_big_enough_node_joins(
    kube: Kube, operator: OperatorProcess, ns: str
):
    sample = yaml.safe_load((REPO / "samples" / "llama-gpu.yaml").read_text())
    sample["metadata"]["namespace"] = ns
    sample["spec"]["replicas"] = 1
    sample["spec"]["resources"]["gpus"] = 4  # the GPU nodes have 2 each
    sample["spec"]["runtime"]["tensorParallelSize"] = 4
    kube.kubectl("create", "secret", "generic", "hf-token", "-n", ns,
                 "--from-literal=HF_TOKEN=hf_test")  # fmt: skip
    kube.apply(sample)
    name = sample["metadata"]["name"]

    waiting = wait_until(
        "Progressing: WaitingForCapacity",
        lambda: (
            (c := condition(kube.isvc(ns, name), "Progressing"))
            and c.get("reason") == "WaitingForCapacity"
            and c
        ),
        timeout=SCHEDULING_GRACE_S,
        explain=lambda: f"{kube.isvc(ns, name)}\n{operator.tail()}",
    )
    assert "Insufficient nvidia.com/gpu" in waiting["message"]

    degraded = wait_until(
        "Degraded: Unschedulable",
        lambda: (
            (c := condition(kube.isvc(ns, name), "Degraded"))
            and c.get("reason") == "Unschedulable"
            and c
        ),
        timeout=90,
        explain=lambda: f"{kube.isvc(ns, name)}\n{operator.tail()}",
    )
    pod = kube.pods(ns, kube.isvc(ns, name)["status"]["selector"])[0]
    assert pod["status"]["phase"] == "Pending"
    scheduled = next(c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled")
    assert scheduled["reason"] == "Unschedulable"
    # the scheduler's words, e.g. "0/4 nodes are available: 2 Insufficient nvidia.com/gpu, ..."
    assert "Insufficient nvidia.com/gpu" in scheduled["message"]
    assert scheduled["message"] in degraded["message"]
    assert kube.isvc(ns, name)["status"]["phase"] == "Degraded"
    [event] = wait_until("a Warning Event", lambda: operator_events(kube, ns, "Unschedulable"),
                         timeout=30, explain=lambda: kube.events(ns))  # fmt: skip
    assert event["type"] == "Warning" and event["involvedObject"]["name"] == name
    # no Warning while it could still get a node, however loaded the machine: the wait
    # lasted the grace (the two transitions' times, written by the operator), and every
    # Unschedulable Event came at or after the Degraded transition (one-second stamps)
    waited = parse_time(degraded["lastTransitionTime"]) - parse_time(waiting["lastTransitionTime"])
    assert waited >= SCHEDULING_GRACE_S - 1, waited
    for warning in operator_events(kube, ns, "Unschedulable"):
        stamp = warning.get("eventTime") or warning.get("firstTimestamp")
        assert parse_time(stamp) >= parse_time(degraded["lastTransitionTime"]), warning
    assert operator_events(kube, ns, "WaitingForCapacity") == []
    assert not is_ready(kube.isvc(ns, name))

    node = local_cluster.FakeNode("gpu-node-big", "10.244.5.0/24", cpu="32", memory="256Gi", gpus=4)
    kube.plane.add_node(node)
    try:
        wait_until("Ready on the 4-GPU node", lambda: is_ready(kube.isvc(ns, name)), timeout=90,
                   explain=lambda: f"{kube.isvc(ns, name)}\n{operator.tail()}")  # fmt: skip
        pod = kube.pods(ns, kube.isvc(ns, name)["status"]["selector"])[0]
        assert pod["spec"]["nodeName"] == "gpu-node-big"
        assert (condition(kube.isvc(ns, name), "Degraded") or {}).get("status") == "False"
    finally:
        kube.kubectl("delete", "inferenceservice", name, "-n", ns, "--wait=true", timeout=120)
        kube.kubectl("delete", "node", node.name)


def parse_time(stamp: str) -> float:
    """Seconds since the epoch of an RFC 3339 time (a condition's, an Event's)."""
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def operator_events(kube: Kube, ns: str, reason: str) -> list[dict]:
    """The Events about InferenceServices in `ns` with `reason`."""
    items = kube.get(f"/api/v1/namespaces/{ns}/events")["items"]
    return [e for e in items if e["reason"] == reason
            and e["involvedObject"].get("kind") == "InferenceService"]  # fmt: skip
