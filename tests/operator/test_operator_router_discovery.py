"""The router the operator renders, run against the API emulator: its own discovery
(`EndpointSliceDiscovery`, started with the rendered flags as `sluice router` parses them)
finds the runtime pods from the slices of the workers Service the operator renders, and
every request it sends is one its Role allows, in the Role's namespace."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from kopf_testkit import rbac_needs
from operator_testkit import IMAGE, isvc_object

from sluice.operator.builders import build_router_role, build_workers_service
from sluice.operator.builders.router import router_args, router_command
from sluice.operator.parsing import parse_spec
from sluice.runtime.cli import build_parser
from sluice.runtime.router.args import RouterArgs
from sluice.runtime.router.discovery import EndpointSliceDiscovery

NS = "routed"


def rendered(namespace: str = NS):
    obj = isvc_object("chat", namespace, router={"enabled": True})
    isvc = parse_spec("chat", namespace, obj["spec"], default_image=IMAGE)
    ns = build_parser().parse_args([*router_command()[1:], *router_args(isvc)])
    return isvc, RouterArgs.from_cli_args(ns)


def endpoint_slice(workers: dict, name: str, ready: dict[str, bool]) -> dict:
    """What the EndpointSlice controller writes for the workers Service: its
    kubernetes.io/service-name label, the Service port's name and the pods' port number."""
    [port] = workers["spec"]["ports"]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": workers["metadata"]["namespace"],
            "labels": {"kubernetes.io/service-name": workers["metadata"]["name"]},
        },
        "addressType": "IPv4",
        "ports": [{"name": port["name"], "port": port["port"], "protocol": "TCP"}],
        "endpoints": [{"addresses": [ip], "conditions": {"ready": ok}} for ip, ok in ready.items()],
    }


async def until(probe: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_the_rendered_router_discovers_the_workers_within_its_role(cluster, tmp_path):
    isvc, args = rendered()
    workers = build_workers_service(isvc)
    role = build_router_role(isvc)
    kubeconfig = str(cluster.write_kubeconfig(tmp_path / "config"))
    cluster.create(endpoint_slice(workers, "chat-workers-a", {"10.0.0.1": True,
                                                              "10.0.0.2": False}))  # fmt: skip
    # a slice of another Service in the namespace, and one of ours in another namespace
    other = {**workers, "metadata": {**workers["metadata"], "name": "other"}}
    cluster.create(endpoint_slice(other, "other-a", {"10.9.9.9": True}))
    elsewhere = build_workers_service(rendered("elsewhere")[0])
    cluster.create(endpoint_slice(elsewhere, "chat-workers-b", {"10.8.8.8": True}))
    seen = len(cluster.requests())

    async def scenario() -> set[str]:
        found: set[str] = set()

        def on_change(urls: set[str]) -> None:
            found.clear()
            found.update(urls)

        discovery = EndpointSliceDiscovery(
            args.discover_namespace, args.discover_selector, args.discover_port_name,
            on_change, asyncio.get_running_loop(), kubeconfig,
        )  # fmt: skip
        discovery.start()
        try:
            await until(lambda: found == {"http://10.0.0.1:30000"}, "the ready runtime pod")
            cluster.create(endpoint_slice(workers, "chat-workers-c", {"10.0.0.3": True}))
            await until(lambda: found == {"http://10.0.0.1:30000", "http://10.0.0.3:30000"},
                        "a new runtime pod from the watch")  # fmt: skip
            return set(found)
        finally:
            discovery.stop()
            # one more event wakes the watch thread, which then sees the stop and ends its
            # watch (an open watch would hold the emulator's shutdown until it times out)
            cluster.create(endpoint_slice(workers, "chat-workers-z", {"10.0.0.9": True}))
            discovery._thread.join(10)
            assert not discovery._thread.is_alive()

    assert asyncio.run(scenario()) == {"http://10.0.0.1:30000", "http://10.0.0.3:30000"}

    router_calls = [r for r in cluster.requests()[seen:] if "endpointslices" in r["path"]
                    and r["method"] == "GET"]  # fmt: skip
    assert router_calls
    allowed = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    for request in router_calls:
        assert request["path"].startswith(f"/apis/discovery.k8s.io/v1/namespaces/{NS}/")
        for need in rbac_needs(request):
            assert need in allowed, (need, request["path"])
