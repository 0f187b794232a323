"""The local control plane itself: real components, loopback only, fake nodes as declared."""

from __future__ import annotations

import ipaddress
import json

import local_cluster
import psutil
from cluster_kit import Kube

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


def test_kubectl_of_the_same_release_talks_to_the_api_server(kube: Kube):
    version = json.loads(kube.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == "v1.36.3"
    assert version["clientVersion"]["gitVersion"] == "v1.36.3"


def test_two_cpu_and_two_gpu_fake_nodes_are_ready(kube: Kube):
    nodes = kube.get("/api/v1/nodes")["items"]
    ready = {
        n["metadata"]["name"]: n["status"]["allocatable"]
        for n in nodes
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
    }
    assert {"cpu-node-1", "cpu-node-2", "gpu-node-1", "gpu-node-2"} <= set(ready)
    gpus = {name: alloc.get("nvidia.com/gpu") for name, alloc in ready.items()}
    assert gpus["gpu-node-1"] == gpus["gpu-node-2"] == "2"
    assert gpus["cpu-node-1"] is None and gpus["cpu-node-2"] is None


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
