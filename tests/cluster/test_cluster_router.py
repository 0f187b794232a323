"""`spec.router`: the router's own discovery code, with the arguments of the router
Deployment the operator wrote and under its ServiceAccount's token, finds the runtime pods
in the EndpointSlices the real EndpointSlice controller writes for the workers Service."""

from __future__ import annotations

import asyncio
import time

from cluster_kit import (
    REPO,
    Kube,
    OperatorProcess,
    condition,
    service_account_token,
    token_kubeconfig,
    wait_until,
)

from sluice.runtime.cli import build_parser
from sluice.runtime.router.args import RouterArgs
from sluice.runtime.router.discovery import EndpointSliceDiscovery

SAMPLE = REPO / "samples" / "smollm2-routed.yaml"


def test_the_router_discovers_the_runtime_pods_from_real_endpointslices(
    kube: Kube, operator: OperatorProcess, ns: str, tmp_path
):
    kube.kubectl("apply", "-n", ns, "-f", str(SAMPLE))
    name = "smollm2-routed"
    isvc = wait_until(
        "Ready and RouterReady",
        lambda: (
            (obj := kube.isvc(ns, name))
            and (condition(obj, "Ready") or {}).get("status") == "True"
            and (condition(obj, "RouterReady") or {}).get("status") == "True"
            and obj
        ),
        timeout=120,
        explain=lambda: f"{kube.isvc(ns, name)}\n{operator.tail()}",
    )
    router = kube.get(f"/apis/apps/v1/namespaces/{ns}/deployments/{name}-router")
    pod_spec = router["spec"]["template"]["spec"]
    [container] = pod_spec["containers"]
    argv = [*container.get("command", []), *container.get("args", [])]
    assert argv[:2] == ["sluice", "router"], argv
    args = RouterArgs.from_cli_args(build_parser().parse_args(argv[1:]))
    token = service_account_token(kube, ns, pod_spec["serviceAccountName"])
    kubeconfig = token_kubeconfig(kube.plane, tmp_path / "router.kubeconfig", token)

    def runtime_urls() -> set[str]:
        pods = kube.pods(ns, isvc["status"]["selector"])
        return {f"http://{p['status']['podIP']}:30000" for p in pods
                if p["status"].get("podIP") and p["metadata"].get("deletionTimestamp") is None}  # fmt: skip

    async def scenario() -> tuple[set[str], set[str]]:
        found: set[str] = set()

        def on_change(urls: set[str]) -> None:
            found.clear()
            found.update(urls)

        discovery = EndpointSliceDiscovery(
            args.discover_namespace, args.discover_selector, args.discover_port_name,
            on_change, asyncio.get_running_loop(), str(kubeconfig),
        )  # fmt: skip
        discovery.start()
        try:
            first = await until(lambda: len(found) == 2 and found == runtime_urls(), found)
            kube.kubectl("scale", "sisvc", name, "-n", ns, "--replicas=3")
            second = await until(lambda: len(found) == 3 and found == runtime_urls(), found)
            return first, second
        finally:
            discovery.stop()

    async def until(probe, found, timeout: float = 60.0) -> set[str]:
        deadline = time.monotonic() + timeout
        while not probe():
            if time.monotonic() > deadline:
                raise AssertionError(f"discovery found {found}, the pods are {runtime_urls()}")
            await asyncio.sleep(0.1)
        return set(found)

    first, second = asyncio.run(scenario())
    assert len(first) == 2 and first < second and len(second) == 3
    assert all(url.startswith("http://10.244.") for url in second)  # kwok's pod IPs
