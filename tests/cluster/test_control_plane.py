"""The local control plane itself, as the components report it: real components on loopback
only, the pinned release, kwok's nodes, the scheduler's placement by GPUs and taints."""

from __future__ import annotations

import ipaddress
import json

import local_cluster
import psutil
from cluster_kit import REPO, Kube, condition, wait_until

LOOPBACK = ipaddress.ip_network("127.0.0.0/8")


def test_every_component_listens_on_loopback_only(control_plane: local_cluster.ControlPlane):
    pids = control_plane.pids()
    assert set(pids) == set(local_cluster.COMPONENTS)
    listeners = {}
    for name, pid in pids.items():
        process = psutil.Process(pid)
        sockets = [c for p in [process, *process.children(recursive=True)]
                   for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]  # fmt: skip
        listeners[name] = sorted({f"{c.laddr.ip}:{c.laddr.port}" for c in sockets})
        for sock in sockets:
            address = ipaddress.ip_address(sock.laddr.ip)
            assert address in LOOPBACK or address == ipaddress.ip_address("::1"), (
                f"{name} listens on {sock.laddr.ip}:{sock.laddr.port}"
            )
    # each serving component listens (etcd: client and peer; the adapter: API and writes)
    assert len(listeners["etcd"]) >= 2 and listeners["kube-apiserver"], listeners
    assert len(listeners["metrics-adapter"]) == 2, listeners


def pinned_release() -> str:
    """K8S_VERSION of tools/k8s/versions.env: the release the binaries are built from."""
    for line in (REPO / "tools" / "k8s" / "versions.env").read_text().splitlines():
        if line.startswith("K8S_VERSION="):
            return line.split("=", 1)[1].strip()
    raise AssertionError("no K8S_VERSION in tools/k8s/versions.env")


def test_the_api_server_reports_the_pinned_release(kube: Kube):
    # the server's own /version, and kubectl's view of the server and of itself
    server = kube.get("/version")
    assert server["gitVersion"] == pinned_release(), server
    assert (server["major"], server["minor"]) == ("1", pinned_release().split(".")[1])
    both = json.loads(kube.kubectl("version", "-o", "json").stdout)
    assert both["serverVersion"]["gitVersion"] == server["gitVersion"]
    # kubectl from PyPI is of the same release (a skewed one may mis-handle new fields)
    assert both["clientVersion"]["gitVersion"] == server["gitVersion"], both


def test_kwok_runs_the_four_fake_nodes(kube: Kube):
    """What kwok made of the bare Node objects the fixture posted (no status conditions,
    addresses, node info or leases): Ready nodes on 127.0.0.1 with a renewed lease each."""
    names = [node.name for node in local_cluster.DEFAULT_NODES]
    for name in names:
        node = kube.get(f"/api/v1/nodes/{name}")
        ready = condition(node, "Ready")
        assert ready and ready["status"] == "True", node["status"]
        assert {"type": "InternalIP", "address": "127.0.0.1"} in node["status"]["addresses"]
        assert "kwok" in node["status"]["nodeInfo"]["kubeletVersion"], node["status"]["nodeInfo"]
        lease = wait_until(
            f"node {name}'s lease", lambda n=name: kube.get(f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{n}")
        )  # fmt: skip
        # kwok holds each node's lease (under its own identity) and renews it, as a kubelet
        assert lease["spec"].get("holderIdentity") and lease["spec"].get("renewTime"), lease
        owners = lease["metadata"].get("ownerReferences") or []
        assert [(o["kind"], o["name"], o["uid"]) for o in owners] == [
            ("Node", name, node["metadata"]["uid"])
        ], lease["metadata"]


def _pod(ns: str, name: str, gpus: int, tolerate: bool) -> dict:
    spec: dict = {
        "containers": [
            {
                "name": "main",
                "image": "gpu-job:1",
                "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
            }
        ]
    }
    if tolerate:
        spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": spec}  # fmt: skip


def test_the_scheduler_places_by_the_gpu_nodes_allocatable_and_taints(kube: Kube, ns: str):
    """The scheduler's decisions, not the nodes' declared values: a pod asking for a GPU node's
    2 GPUs is bound to one; 3 GPUs fit no node; a GPU pod that does not tolerate the GPU taint
    fits none either."""
    kube.apply([_pod(ns, "two", 2, True), _pod(ns, "three", 3, True),
                _pod(ns, "untolerated", 1, False)])  # fmt: skip

    def scheduled(name: str) -> dict | None:
        return condition(kube.get(f"/api/v1/namespaces/{ns}/pods/{name}"), "PodScheduled")

    wait_until("pod two bound", lambda: (c := scheduled("two")) and c["status"] == "True",
                       timeout=120, explain=lambda: kube.events(ns))  # fmt: skip
    two = kube.get(f"/api/v1/namespaces/{ns}/pods/two")
    assert two["spec"]["nodeName"] in ("gpu-node-1", "gpu-node-2"), two["spec"]
    wait_until("pod two Running (kwok)",
               lambda: kube.get(f"/api/v1/namespaces/{ns}/pods/two")["status"]["phase"] == "Running")  # fmt: skip
    for name in ("three", "untolerated"):
        wait_until(
            f"pod {name} Unschedulable",
            lambda n=name: (c := scheduled(n)) and c.get("reason") == "Unschedulable" and c,
            timeout=60,
            explain=lambda: kube.events(ns),
        )
        assert not kube.get(f"/api/v1/namespaces/{ns}/pods/{name}")["spec"].get("nodeName")
    # the scheduler's words: every node lacks a third GPU; the CPU nodes lack any GPU, the GPU
    # nodes are tainted
    assert (
        "0/4 nodes are available: 4 Insufficient nvidia.com/gpu." in scheduled("three")["message"]
    )
    assert (
        "0/4 nodes are available: 2 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint"
        in scheduled("untolerated")["message"]
    )


def test_a_deployment_gets_running_ready_pods_on_fake_nodes(kube: Kube, ns: str):
    kube.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "echo", "namespace": ns},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "echo"}},
                "template": {
                    "metadata": {"labels": {"app": "echo"}},
                    "spec": {"containers": [{"name": "echo", "image": "echo:1"}]},
                },
            },
        }
    )
    kube.kubectl("rollout", "status", "-n", ns, "deployment/echo", "--timeout=60s", timeout=90)
    pods = kube.pods(ns, "app=echo")
    assert [p["status"]["phase"] for p in pods] == ["Running", "Running"]
    assert all(p["spec"]["nodeName"].startswith("cpu-node-") for p in pods)


def test_the_custom_metrics_api_serves_a_written_value(kube: Kube, ns: str):
    kube.plane.write_pod_metric(ns, "some-pod", "sluice_queue_requests", "7")
    value = kube.get(
        f"/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/some-pod/sluice_queue_requests"
    )
    # a MetricValueList with the one pod's value, as the HPA controller reads it
    assert value["kind"] == "MetricValueList", value
    [item] = value["items"]
    assert (item["describedObject"]["name"], item["value"]) == ("some-pod", "7")
