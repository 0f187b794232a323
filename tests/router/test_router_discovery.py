"""EndpointSlice discovery against the kmock API emulator: ready endpoints of the selected
slices join the pool, endpoints that turn not-ready or whose slice goes leave, static
workers stay. The slices are written over plain HTTP, like the EndpointSlice controller."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from types import SimpleNamespace

import httpx
import pytest
from k8s_emulator import Cluster

from sluice.runtime.router.discovery import EndpointSliceDiscovery, endpoint_urls
from sluice.runtime.router.workers import STATIC, BackoffPolicy, WorkerPool

NS = "models"
SELECTOR = "kubernetes.io/service-name=chat"
BASE = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"


def endpoint(ip: str, ready: bool | None = True) -> dict:
    ep: dict = {"addresses": [ip]}
    if ready is not None:
        ep["conditions"] = {"ready": ready}
    return ep


def slice_obj(name: str, endpoints: list[dict], service: str = "chat", ports=None) -> dict:
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "namespace": NS,
                     "labels": {"kubernetes.io/service-name": service}},
        "addressType": "IPv4",
        "ports": ports or [{"name": "http", "port": 30000, "protocol": "TCP"}],
        "endpoints": endpoints,
    }  # fmt: skip


@pytest.fixture
def cluster():
    c = Cluster()
    yield c
    c.close()


async def wait_for(probe: Callable[[], object], what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def test_ready_endpoints_join_and_others_leave(cluster, tmp_path):
    kubeconfig = str(cluster.kubeconfig(tmp_path / "kubeconfig"))

    async def scenario() -> None:
        pool = WorkerPool(1000, BackoffPolicy(0.1, 1))
        pool.add("http://static:1")
        discovery = EndpointSliceDiscovery(NS, SELECTOR, "http", pool.sync_discovered,
                                           asyncio.get_running_loop(), kubeconfig)  # fmt: skip

        def discovered() -> set[str]:
            return {u for u, w in pool.workers.items() if w.source != STATIC}

        async with httpx.AsyncClient(base_url=cluster.url) as api:
            r = await api.post(BASE, json=slice_obj("chat-a", [endpoint("10.0.0.1"),
                                                                endpoint("10.0.0.2")]))  # fmt: skip
            assert r.status_code < 300, r.text
            await api.post(BASE, json=slice_obj("chat-b", [endpoint("10.0.0.3"),
                                                           endpoint("10.0.0.4", ready=False)]))  # fmt: skip
            await api.post(BASE, json=slice_obj("other-a", [endpoint("10.9.9.9")], "other"))
            discovery.start()
            try:
                want = {"http://10.0.0.1:30000", "http://10.0.0.2:30000", "http://10.0.0.3:30000"}
                await wait_for(lambda: discovered() == want, "the listed ready endpoints")
                await wait_for(lambda: cluster.emulator.watches >= 1, "the watch")

                patch = {"endpoints": [endpoint("10.0.0.1"), endpoint("10.0.0.2", ready=False)]}
                headers = {"Content-Type": "application/merge-patch+json"}
                await api.patch(f"{BASE}/chat-a", json=patch, headers=headers)
                want -= {"http://10.0.0.2:30000"}
                await wait_for(lambda: discovered() == want, "a not-ready endpoint to leave")

                await api.post(BASE, json=slice_obj("chat-c", [endpoint("10.0.0.5", ready=None)]))
                want |= {"http://10.0.0.5:30000"}
                await wait_for(lambda: discovered() == want, "an endpoint of unknown readiness")

                await api.delete(f"{BASE}/chat-b")
                want -= {"http://10.0.0.3:30000"}
                await wait_for(lambda: discovered() == want, "a deleted slice's endpoints to leave")
                assert "http://static:1" in pool.workers  # discovery never removes static ones
            finally:
                discovery.stop()

    asyncio.run(scenario())


def model_slice(raw: dict) -> object:
    """The fields `endpoint_urls` reads, shaped like the client's V1EndpointSlice."""
    ports = [SimpleNamespace(**p) for p in raw["ports"]]
    eps = [
        SimpleNamespace(addresses=e["addresses"],
                        conditions=SimpleNamespace(**e["conditions"]) if "conditions" in e else None)
        for e in raw["endpoints"]
    ]  # fmt: skip
    return SimpleNamespace(ports=ports, endpoints=eps, address_type=raw["addressType"])


def test_the_named_port_is_used_and_ipv6_addresses_are_bracketed():
    ports = [{"name": "metrics", "port": 9090}, {"name": "http", "port": 30000}]
    raw = slice_obj("s", [endpoint("fd00::1")], ports=ports)
    raw["addressType"] = "IPv6"
    assert endpoint_urls(model_slice(raw), "http") == {"http://[fd00::1]:30000"}
    assert endpoint_urls(model_slice(raw), "grpc") == set()  # two ports, none named so
    one_port = slice_obj("s", [endpoint("10.1.1.1")], ports=[{"name": "web", "port": 8000}])
    assert endpoint_urls(model_slice(one_port), "http") == {"http://10.1.1.1:8000"}
