"""The router's fallback on a real control plane: with its router pod gone and unable to
come back (every node cordoned, the pod evicted through its PodDisruptionBudget, as a
drain does), the model Service `<name>` selects the runtime pods again, so its
EndpointSlices (written by the real EndpointSlice controller) list exactly the runtime
pods and clients of `<name>` still reach a backend; RouterReady says why. Once a node
takes pods again the new router pod serves and the Service goes back to it.

Also: the router's PodDisruptionBudget `<name>-router` exists, as the API server stored it,
and the disruption controller has taken it up (its status counts the router pod); the
router Deployment runs the chart's router image, not the runtime image."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from cluster_kit import REPO, Kube, OperatorProcess, condition, wait_until

SAMPLE = REPO / "samples" / "smollm2-routed.yaml"
NAME = "smollm2-routed"
RUNTIME_SELECTOR = f"app.kubernetes.io/name=sluice-runtime,app.kubernetes.io/instance={NAME}"
ROUTER_SELECTOR = f"app.kubernetes.io/name=sluice-router,app.kubernetes.io/instance={NAME}"
ROUTER_LABELS = {"app.kubernetes.io/name": "sluice-router", "app.kubernetes.io/instance": NAME}
CHART_ROUTER_IMAGE = "sluice-router:0.1.0"  # values.yaml router.image, the chart's appVersion
SWITCH_S = 60  # the Service moves within this (the operator's resync period is longer)


def slice_endpoints(kube: Kube, ns: str, service: str) -> dict[str, bool]:
    """Every address in the Service's EndpointSlices → whether it is ready."""
    slices = kube.get(
        f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
        f"?labelSelector=kubernetes.io/service-name={service}"
    )["items"]
    return {
        address: bool((endpoint.get("conditions") or {}).get("ready"))
        for item in slices
        for endpoint in item.get("endpoints") or []
        for address in endpoint["addresses"]
    }


def live_pod_ips(kube: Kube, ns: str, selector: str) -> set[str]:
    return {
        pod["status"]["podIP"]
        for pod in kube.pods(ns, selector)
        if pod["status"].get("podIP") and not pod["metadata"].get("deletionTimestamp")
    }


def ready_pod_ips(kube: Kube, ns: str, selector: str) -> set[str]:
    return {
        pod["status"]["podIP"]
        for pod in kube.pods(ns, selector)
        if pod["status"].get("podIP")
        and not pod["metadata"].get("deletionTimestamp")
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in pod["status"].get("conditions") or []
        )
    }


def lists_exactly(kube: Kube, ns: str, selector: str) -> set[str] | None:
    """The pods `selector` picks, if the model Service's slices list exactly them, ready."""
    pods = ready_pod_ips(kube, ns, selector)
    found = slice_endpoints(kube, ns, NAME)
    if pods and found == dict.fromkeys(pods, True):
        return pods
    return None


class Cordon:
    """Cordons every node (`kubectl cordon`: no new pod is scheduled on it) and uncordons
    them; the fixture uncordons whatever is still cordoned at the end, whatever happened."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.nodes: list[str] = []

    def all_nodes(self) -> None:
        for node in self.kube.get("/api/v1/nodes")["items"]:
            self.nodes.append(node["metadata"]["name"])
            self.kube.kubectl("cordon", self.nodes[-1])

    def undo(self, check: bool = True) -> None:
        while self.nodes:
            self.kube.kubectl("uncordon", self.nodes.pop(), check=check)


@pytest.fixture
def cordon(kube: Kube) -> Iterator[Cordon]:
    nodes = Cordon(kube)
    yield nodes
    nodes.undo(check=False)


def test_with_its_router_pod_gone_the_service_falls_back_to_the_runtime_pods(
    kube: Kube, operator: OperatorProcess, ns: str, cordon: Cordon
):
    kube.kubectl("apply", "-n", ns, "-f", str(SAMPLE))

    def explain() -> str:
        return (
            f"status: {(kube.isvc(ns, NAME) or {}).get('status')}\n"
            f"slices: {slice_endpoints(kube, ns, NAME)}\n"
            f"runtime pods: {ready_pod_ips(kube, ns, RUNTIME_SELECTOR)}, router pods:"
            f" {[(p['metadata']['name'], p['status']) for p in kube.pods(ns, ROUTER_SELECTOR)]}\n"
            f"{operator.tail()}"
        )

    def conditions() -> tuple[dict[str, Any], dict[str, Any]]:
        obj = kube.isvc(ns, NAME)
        return condition(obj, "Ready") or {}, condition(obj, "RouterReady") or {}

    wait_until(
        "Ready and RouterReady",
        lambda: [c.get("status") for c in conditions()] == ["True", "True"],
        timeout=120,
        explain=explain,
    )
    [router_ip] = wait_until(
        "the model Service's EndpointSlices list the router pod, and only it",
        lambda: lists_exactly(kube, ns, ROUTER_SELECTOR),
        timeout=60,
        explain=explain,
    )
    runtime_ips = ready_pod_ips(kube, ns, RUNTIME_SELECTOR)
    assert len(runtime_ips) == 2 and router_ip not in runtime_ips

    # the router runs its own image (the chart's SLUICE_ROUTER_IMAGE), not the runtime's
    router = kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{NAME}-router")
    runtime = kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{NAME}")
    [container] = router["spec"]["template"]["spec"]["containers"]
    assert container["image"] == operator.env["SLUICE_ROUTER_IMAGE"] == CHART_ROUTER_IMAGE
    runtime_image = runtime["spec"]["template"]["spec"]["containers"][0]["image"]
    assert runtime_image == operator.env["SLUICE_DEFAULT_IMAGE"] != CHART_ROUTER_IMAGE

    # the router's budget, as the API server stored it, taken up by the disruption controller
    pdb_path = f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/{NAME}-router"
    pdb = wait_until(
        "the disruption controller counts the router pod in its budget",
        lambda: (
            (found := kube.get(pdb_path))
            and (found.get("status") or {}).get("observedGeneration")
            == found["metadata"]["generation"]
            and found["status"].get("expectedPods") == 1
            and found["status"].get("disruptionsAllowed") == 1
            and found
        ),
        timeout=60,
        explain=lambda: f"{kube.try_request('GET', pdb_path)}",
    )
    assert pdb["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": ROUTER_LABELS},
        "unhealthyPodEvictionPolicy": "AlwaysAllow",
    }
    [owner] = pdb["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["controller"]) == ("InferenceService", NAME, True)
    assert pdb["status"]["currentHealthy"] == 1

    # no node takes pods any more; the router pod is evicted, as `kubectl drain` does it,
    # through the Eviction API (the budget allows one router pod to go)
    cordon.all_nodes()
    [pod] = [p["metadata"]["name"] for p in kube.pods(ns, ROUTER_SELECTOR)]
    kube.request(
        "POST", f"/api/v1/namespaces/{ns}/pods/{pod}/eviction",
        {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": ns}},
    )  # fmt: skip

    # the watched router Deployment's availability drives the switch, not the resync
    assert float(operator.env.get("SLUICE_RESYNC_SECONDS", "300")) > SWITCH_S
    fallback = wait_until(
        "the model Service's EndpointSlices list exactly the runtime pods",
        lambda: lists_exactly(kube, ns, RUNTIME_SELECTOR),
        timeout=SWITCH_S,
        explain=explain,
    )
    assert fallback == runtime_ips
    ready, router_ready = wait_until(
        "RouterReady=False: the new router pod cannot be scheduled",
        lambda: (c := conditions())[1].get("reason") == "Unschedulable" and c,
        timeout=60,
        explain=explain,
    )
    assert router_ready["status"] == "False"
    assert router_ready["message"].startswith(f"router pod {NAME}-router-")
    assert "unschedulable" in router_ready["message"]  # the scheduler's own words
    assert ready["status"] == "True"  # the service itself still serves, through <name>
    status = kube.isvc(ns, NAME)["status"]
    assert status["router"]["routing"] is False
    assert live_pod_ips(kube, ns, ROUTER_SELECTOR) == set()  # the new router pod has no IP
    assert slice_endpoints(kube, ns, NAME) == dict.fromkeys(runtime_ips, True)

    # nodes take pods again: the new router pod starts and the Service goes back to it
    cordon.undo()
    [new_router_ip] = wait_until(
        "the model Service's EndpointSlices list the new router pod, and only it",
        lambda: lists_exactly(kube, ns, ROUTER_SELECTOR),
        timeout=90,
        explain=explain,
    )
    assert new_router_ip not in runtime_ips
    wait_until(
        "RouterReady=True again",
        lambda: [c.get("status") for c in conditions()] == ["True", "True"],
        timeout=60,
        explain=explain,
    )
    assert kube.isvc(ns, NAME)["status"]["router"]["routing"] is True
