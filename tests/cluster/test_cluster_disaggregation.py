"""spec.disaggregation on the real control plane: the operator's two pool Deployments run
(kwok makes their pods ready), the EndpointSlice controller publishes each pool's Service
with the ports the router discovers (the prefill pool's `bootstrap` among them), the
router runs with the P/D flags its own parser accepts, the real HPA controller scales the
prefill pool on the queued prompt tokens it reads through the custom metrics API, the
status reports both pools, and switching disaggregation off brings the one runtime
Deployment back and removes every P/D child."""

from __future__ import annotations

from typing import Any

from cluster_kit import Kube, OperatorProcess, condition, is_ready, wait_until

from sluice.runtime.cli import build_parser
from sluice.runtime.router.args import RouterArgs
from sluice.runtime.server_args import ServerArgs

NAME = "pd"
POOLS = ("prefill", "decode")
SPEC: dict[str, Any] = {
    "model": {"source": "bundled://smollm2-135m"},
    "resources": {"cpu": "1", "memory": "2Gi"},
    "disaggregation": {
        "enabled": True,
        "prefill": {"autoscaling": {"enabled": True, "minReplicas": 1, "maxReplicas": 2,
                                    "metrics": [{"type": "queuePromptTokens", "target": 1000}]}},
        "decode": {"replicas": 2, "resources": {"memory": "3Gi"}},
    },
}  # fmt: skip
ISVC = {"apiVersion": "sluice.dev/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": NAME}, "spec": SPEC}  # fmt: skip


def get(kube: Kube, ns: str, kind: str, name: str) -> dict[str, Any] | None:
    group = {"deployments": "apis/apps/v1", "services": "api/v1",
             "horizontalpodautoscalers": "apis/autoscaling/v2",
             "poddisruptionbudgets": "apis/policy/v1"}[kind]  # fmt: skip
    return kube.get(f"/{group}/namespaces/{ns}/{kind}/{name}")


def argv(deployment: dict[str, Any]) -> list[str]:
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return [*container["command"], *container["args"]]


def pool_pods(kube: Kube, ns: str, role: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/instance={NAME},sluice.dev/disaggregation-mode={role}"
    return [p for p in kube.pods(ns, selector) if not p["metadata"].get("deletionTimestamp")]


def pools_ready(kube: Kube, ns: str, prefill: int, decode: int) -> dict[str, Any] | None:
    obj = kube.isvc(ns, NAME)
    pools = ((obj or {}).get("status") or {}).get("disaggregation") or {}
    counts = {role: (pools.get(role) or {}).get("readyReplicas") for role in POOLS}
    if is_ready(obj) and counts == {"prefill": prefill, "decode": decode}:
        return obj
    return None


def endpoint_ports(kube: Kube, ns: str, service: str) -> dict[str, int]:
    """The ports the EndpointSlice controller published for `service`'s ready pods."""
    slices = kube.get(f"/apis/discovery.k8s.io/v1/namespaces/{ns}/endpointslices"
                      f"?labelSelector=kubernetes.io/service-name%3D{service}")["items"]  # fmt: skip
    ready = [e for s in slices for e in s.get("endpoints") or []
             if (e.get("conditions") or {}).get("ready")]  # fmt: skip
    if not ready:
        return {}
    return {p["name"]: p["port"] for s in slices for p in s.get("ports") or []}


def test_a_disaggregated_service_runs_two_pools_behind_the_router_and_switches_back(
    kube: Kube, operator: OperatorProcess, ns: str
):
    kube.apply(ISVC, "-n", ns)
    explain = lambda: f"{kube.isvc(ns, NAME)}\n{operator.tail()}"  # noqa: E731
    wait_until("Ready with 1 prefill and 2 decode pods", lambda: pools_ready(kube, ns, 1, 2),
               timeout=120, explain=explain)  # fmt: skip
    assert get(kube, ns, "deployments", NAME) is None

    # each pool runs `sluice serve` in its mode, as the runtime's own parser reads it
    for role in POOLS:
        deployment = get(kube, ns, "deployments", f"{NAME}-{role}")
        assert deployment is not None
        served = ServerArgs.from_cli_args(build_parser().parse_args(argv(deployment)[1:]))
        assert served.disaggregation_mode == role
        assert get(kube, ns, "poddisruptionbudgets", f"{NAME}-{role}") is not None
    prefill = get(kube, ns, "deployments", f"{NAME}-prefill")
    assert ServerArgs.from_cli_args(
        build_parser().parse_args(argv(prefill)[1:])
    ).disaggregation_bootstrap_port == 8998  # fmt: skip
    decode_limits = get(kube, ns, "deployments", f"{NAME}-decode")["spec"]["template"]["spec"][
        "containers"
    ][0]["resources"]["limits"]
    assert decode_limits == {"memory": "3Gi"}

    # the EndpointSlices the router reads: http on both pools, bootstrap on the prefill one
    ports = wait_until(f"{NAME}-prefill's EndpointSlices",
                       lambda: endpoint_ports(kube, ns, f"{NAME}-prefill"), timeout=60)  # fmt: skip
    assert ports == {"http": 30000, "bootstrap": 8998}
    ports = wait_until(f"{NAME}-decode's EndpointSlices",
                       lambda: endpoint_ports(kube, ns, f"{NAME}-decode"), timeout=60)  # fmt: skip
    assert ports == {"http": 30000}

    # the router pairs them: the model Service selects it, its flags parse
    router = get(kube, ns, "deployments", f"{NAME}-router")
    args = RouterArgs.from_cli_args(build_parser().parse_args(argv(router)[1:]))
    args.validate()
    assert args.pd_disaggregation and args.discover_namespace == ns
    assert args.discover_prefill_selector == f"kubernetes.io/service-name={NAME}-prefill"
    assert args.discover_decode_selector == f"kubernetes.io/service-name={NAME}-decode"
    service = get(kube, ns, "services", NAME)
    assert service["spec"]["selector"]["app.kubernetes.io/name"] == "sluice-router"
    assert (condition(kube.isvc(ns, NAME), "RouterReady") or {}).get("status") == "True"

    # the prefill pool's HPA scales it on the prompt tokens waiting per pod: 1500 on the one
    # pod, target 1000, ceil(1.5) = 2 pods; the decode pool has no HPA (its autoscaling is off)
    hpa = get(kube, ns, "horizontalpodautoscalers", f"{NAME}-prefill")
    assert hpa["spec"]["scaleTargetRef"]["name"] == f"{NAME}-prefill"
    assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == "sluice_queue_prompt_tokens"
    assert get(kube, ns, "horizontalpodautoscalers", f"{NAME}-decode") is None
    [pod] = pool_pods(kube, ns, "prefill")
    kube.plane.write_pod_metric(ns, pod["metadata"]["name"], "sluice_queue_prompt_tokens", "1500")
    wait_until("the HPA to scale the prefill pool to 2, both Ready",
               lambda: pools_ready(kube, ns, 2, 2), timeout=120,
               explain=lambda: f"{get(kube, ns, 'horizontalpodautoscalers', f'{NAME}-prefill')}"
                               f"\n{explain()}")  # fmt: skip
    status = kube.isvc(ns, NAME)["status"]
    assert status["disaggregation"]["prefill"] == {
        "replicas": 2, "readyReplicas": 2, "desiredReplicas": 2}  # fmt: skip
    assert (status["readyReplicas"], status["desiredReplicas"]) == (4, 4)

    # switched off: the one runtime Deployment comes, every P/D child goes
    kube.kubectl("patch", "sisvc", NAME, "-n", ns, "--type=merge",
                 "-p", '{"spec":{"disaggregation":{"enabled":false}}}')  # fmt: skip
    gone = [("deployments", f"{NAME}-{role}") for role in POOLS] + [
        ("services", f"{NAME}-prefill"), ("services", f"{NAME}-decode"),
        ("poddisruptionbudgets", f"{NAME}-prefill"), ("poddisruptionbudgets", f"{NAME}-decode"),
        ("horizontalpodautoscalers", f"{NAME}-prefill"), ("deployments", f"{NAME}-router"),
    ]  # fmt: skip
    for kind, name in gone:
        wait_until(f"{kind}/{name} deleted", lambda k=kind, n=name: get(kube, ns, k, n) is None,
                   timeout=60, explain=explain)  # fmt: skip
    back = wait_until(
        "the runtime Deployment Ready",
        lambda: (obj := kube.isvc(ns, NAME)) and is_ready(obj)
        and obj["status"].get("disaggregation") is None
        and obj["status"].get("observedGeneration") == obj["metadata"]["generation"] and obj,
        timeout=120, explain=explain,
    )  # fmt: skip
    assert back["status"]["readyReplicas"] == 1
    runtime = get(kube, ns, "deployments", NAME)
    assert "--disaggregation-mode" not in argv(runtime)
    assert get(kube, ns, "services", NAME)["spec"]["selector"]["app.kubernetes.io/name"] == (
        "sluice-runtime"
    )
