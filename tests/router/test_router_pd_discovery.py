"""P/D servers found on Kubernetes: `--discover-prefill-selector` and
`--discover-decode-selector` each watch one Service's EndpointSlices (the kmock API emulator
here), ready endpoints join their own pool, and a prefill endpoint's bootstrap address is
its address and its slice's port named `bootstrap`. The pods are fake servers (as in
test_router_pd_server.py), each on its own loopback address like a pod on its own IP."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from k8s_emulator import Cluster
from router_testkit import wait_until
from starlette.testclient import TestClient
from test_router_discovery import endpoint, model_slice, slice_obj
from test_router_pd_server import fake_server, serving

from sluice.runtime import constants as C
from sluice.runtime.cli import build_parser, main
from sluice.runtime.dataclass_cli import flags_of
from sluice.runtime.router.args import RouterArgs
from sluice.runtime.router.discovery import Endpoint, slice_endpoints
from sluice.runtime.router.pd_discovery import PrefillDiscovery
from sluice.runtime.router.server import Router
from sluice.runtime.router.workers import STATIC, BackoffPolicy, WorkerPool

NS = "models"  # slice_obj's namespace
BASE = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
PREFILL_SERVICE, DECODE_SERVICE = "chat-prefill", "chat-decode"
PREFILL_SELECTOR = f"kubernetes.io/service-name={PREFILL_SERVICE}"
DECODE_SELECTOR = f"kubernetes.io/service-name={DECODE_SERVICE}"
BOOTSTRAP_PORT = 9100
MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}
PD = ["router", C.FLAG_PD_DISAGGREGATION]


def parsed(argv: list[str]) -> RouterArgs:
    return RouterArgs.from_cli_args(build_parser(router_only=True).parse_args(argv))


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


# ---- the command line --------------------------------------------------------------------


def test_the_operators_p_d_command_line_parses_and_renders_back():
    argv = ["router", C.FLAG_HOST, "0.0.0.0", C.FLAG_PORT, str(C.ROUTER_DEFAULT_PORT),
            C.FLAG_PD_DISAGGREGATION,
            C.FLAG_DISCOVER_PREFILL_SELECTOR, "kubernetes.io/service-name=chat-prefill",
            C.FLAG_DISCOVER_DECODE_SELECTOR, "kubernetes.io/service-name=chat-decode",
            C.FLAG_DISCOVER_NAMESPACE, "ml", C.FLAG_DISCOVER_PORT_NAME, C.CONTAINER_PORT_NAME,
            C.FLAG_POLICY, "cache-aware", C.FLAG_DRAIN_TIMEOUT, "25"]  # fmt: skip
    args = parsed(argv)
    assert args.pd_disaggregation and args.discovery_enabled
    assert args.discover_prefill_selector == "kubernetes.io/service-name=chat-prefill"
    assert args.discover_decode_selector == "kubernetes.io/service-name=chat-decode"
    assert (args.discover_namespace, args.discover_port_name) == ("ml", "http")
    assert args.prefill == () and args.decode == () and args.discover_selector == ""
    assert parsed(["router", *flags_of(args)]) == args
    router = Router.build(args)  # every server comes from discovery: both pools start empty
    assert router.pool.workers == {} and router.prefill_pool is not None
    assert router.prefill_pool.workers == {}


def test_static_servers_and_discovery_mix_per_side():
    args = parsed([*PD, C.FLAG_PREFILL, "http://p:1", "9000",
                   C.FLAG_DISCOVER_PREFILL_SELECTOR, PREFILL_SELECTOR,
                   C.FLAG_DISCOVER_DECODE_SELECTOR, DECODE_SELECTOR])  # fmt: skip
    assert [s.bootstrap for s in args.prefill_servers] == ["p:9000"]
    assert args.decode == () and args.discover_decode_selector == DECODE_SELECTOR


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["router", "--worker-urls", "http://a:1", C.FLAG_DISCOVER_PREFILL_SELECTOR, "a=b"],
         "--discover-prefill-selector/--discover-decode-selector need --pd-disaggregation"),
        (["router", "--worker-urls", "http://a:1", C.FLAG_DISCOVER_DECODE_SELECTOR, "a=b"],
         "--discover-prefill-selector/--discover-decode-selector need --pd-disaggregation"),
        ([*PD, C.FLAG_DISCOVER_PREFILL_SELECTOR, "a=b"],
         "needs decode servers: give --decode or --discover-decode-selector"),
        ([*PD, C.FLAG_DISCOVER_DECODE_SELECTOR, "a=b"],
         "needs prefill servers: give --prefill or --discover-prefill-selector"),
        ([*PD, C.FLAG_DISCOVER_PREFILL_SELECTOR, "a=b", C.FLAG_DISCOVER_DECODE_SELECTOR, "c=d",
          C.FLAG_DISCOVER_SELECTOR, "e=f"],
         "use --discover-prefill-selector and --discover-decode-selector"),
        ([*PD, C.FLAG_DISCOVER_PREFILL_SELECTOR, "app!=x", C.FLAG_DISCOVER_DECODE_SELECTOR, "c=d"],
         "--discover-prefill-selector: 'app!=x' is not k=v (equality selectors only)"),
        ([*PD, C.FLAG_DISCOVER_PREFILL_SELECTOR, "a=b", C.FLAG_DISCOVER_DECODE_SELECTOR, "c"],
         "--discover-decode-selector: 'c' is not k=v (equality selectors only)"),
    ],
)  # fmt: skip
def test_misused_p_d_discovery_flags_exit_2_with_the_problem_named(argv, message, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


# ---- the prefill side's bootstrap addresses, without a cluster ---------------------------


def test_discovered_prefill_servers_bring_their_bootstrap_address_and_take_it_along():
    pool = WorkerPool(1000, BackoffPolicy(0.1, 1))
    pool.add("http://static:1")
    bootstrap = {"http://static:1": "static:9000"}
    feed = PrefillDiscovery(pool, bootstrap)
    a, b = "http://10.0.0.1:30000", "http://[fd00::2]:30000"
    ports = {"http": 30000, "bootstrap": BOOTSTRAP_PORT}
    feed({a: Endpoint(a, ports), b: Endpoint(b, ports),
          "http://static:1": Endpoint("http://static:1", ports)})  # fmt: skip
    assert set(pool.workers) == {"http://static:1", a, b}
    assert bootstrap == {"http://static:1": "static:9000",  # its flag's port stays
                         a: "10.0.0.1:9100", b: "[fd00::2]:9100"}  # fmt: skip

    feed({a: Endpoint(a, ports)})  # b is not ready any more
    assert set(pool.workers) == {"http://static:1", a}
    assert bootstrap == {"http://static:1": "static:9000", a: "10.0.0.1:9100"}
    assert pool.workers["http://static:1"].source == STATIC


def test_a_slice_without_a_bootstrap_port_gets_the_default_and_one_warning(caplog):
    pool = WorkerPool(1000, BackoffPolicy(0.1, 1))
    bootstrap: dict[str, str] = {}
    feed = PrefillDiscovery(pool, bootstrap)
    a, b = "http://10.0.0.1:30000", "http://10.0.0.2:30000"
    with caplog.at_level(logging.WARNING, logger="sluice.router.discovery"):
        feed({a: Endpoint(a, {"http": 30000})})
        feed({a: Endpoint(a, {"http": 30000}), b: Endpoint(b, {"http": 30000})})
    default = C.DISAGG_DEFAULT_BOOTSTRAP_PORT
    assert bootstrap == {a: f"10.0.0.1:{default}", b: f"10.0.0.2:{default}"}
    warnings = [r for r in caplog.records if "no port named 'bootstrap'" in r.getMessage()]
    assert len(warnings) == 1


def test_an_endpoint_carries_its_slices_named_ports():
    ports = [{"name": "http", "port": 30000}, {"name": "bootstrap", "port": BOOTSTRAP_PORT}]
    raw = slice_obj("s", [endpoint("10.0.0.1"), endpoint("10.0.0.2", ready=False)], ports=ports)
    assert slice_endpoints(model_slice(raw), "http") == {
        "http://10.0.0.1:30000": Endpoint(
            "http://10.0.0.1:30000", {"http": 30000, "bootstrap": BOOTSTRAP_PORT}
        )
    }


# ---- a P/D router watching two Services' EndpointSlices ----------------------------------


@dataclass
class DiscoveredPD:
    client: TestClient
    api: httpx.Client  # writes the slices, like the EndpointSlice controller
    prefill: str  # the fake prefill pod's URL (127.0.0.2)
    idle_prefill: str  # a ready prefill endpoint with no server behind it (127.0.0.3)
    decode: str  # the fake decode pod's URL (127.0.0.5)
    seen: list[dict[str, Any]]

    def workers(self) -> set[tuple[str, str, str | None]]:
        body = self.client.get(C.ROUTER_WORKERS_PATH).json()
        return {(w["url"], w["role"], w.get("bootstrap")) for w in body["workers"]}


def prefill_slice(http_port: int, ready: dict[str, bool]) -> dict:
    ports = [{"name": C.CONTAINER_PORT_NAME, "port": http_port, "protocol": "TCP"},
             {"name": C.DISAGG_BOOTSTRAP_PORT_NAME, "port": BOOTSTRAP_PORT, "protocol": "TCP"}]  # fmt: skip
    eps = [endpoint(ip, ok) for ip, ok in ready.items()]
    return slice_obj(f"{PREFILL_SERVICE}-a", eps, PREFILL_SERVICE, ports)


def decode_slice(http_port: int, ready: dict[str, bool]) -> dict:
    ports = [{"name": C.CONTAINER_PORT_NAME, "port": http_port, "protocol": "TCP"}]
    eps = [endpoint(ip, ok) for ip, ok in ready.items()]
    return slice_obj(f"{DECODE_SERVICE}-a", eps, DECODE_SERVICE, ports)


@pytest.fixture
def discovered_pd(tmp_path) -> Iterator[DiscoveredPD]:
    seen: list[dict[str, Any]] = []
    cluster = Cluster()
    with contextlib.ExitStack() as stack:
        stack.callback(cluster.close)
        prefill = stack.enter_context(serving(fake_server("prefill", seen), "127.0.0.2"))
        decode = stack.enter_context(serving(fake_server("decode", seen), "127.0.0.5"))
        api = stack.enter_context(httpx.Client(base_url=cluster.url))
        for raw in (
            prefill_slice(port_of(prefill),
                          {"127.0.0.2": True, "127.0.0.3": True, "127.0.0.4": False}),
            decode_slice(port_of(decode), {"127.0.0.5": True}),
            slice_obj("chat-workers-a", [endpoint("127.0.0.9")], "chat-workers"),  # neither side
        ):  # fmt: skip
            r = api.post(BASE, json=raw)
            assert r.status_code < 300, r.text
        args = RouterArgs(
            pd_disaggregation=True, discover_prefill_selector=PREFILL_SELECTOR,
            discover_decode_selector=DECODE_SELECTOR, discover_namespace=NS,
            kubeconfig=str(cluster.kubeconfig(tmp_path / "kubeconfig")),
            health_interval=0.2, retry_backoff_initial=0.2, retry_backoff_max=1.0,
        )  # fmt: skip
        args.validate()
        client = stack.enter_context(TestClient(Router.build(args).app))
        idle_prefill = f"http://127.0.0.3:{port_of(prefill)}"
        yield DiscoveredPD(client, api, prefill, idle_prefill, decode, seen)


def test_both_pools_fill_from_their_slices_and_a_request_gets_the_discovered_bootstrap(
    discovered_pd,
):
    pd = discovered_pd
    want = {(pd.prefill, "prefill", f"127.0.0.2:{BOOTSTRAP_PORT}"),
            (pd.idle_prefill, "prefill", f"127.0.0.3:{BOOTSTRAP_PORT}"),
            (pd.decode, "decode", None)}  # fmt: skip
    wait_until(lambda: pd.workers() == want, "the ready endpoints of both Services", timeout=15)
    wait_until(lambda: pd.client.get(C.HEALTH_PATH).status_code == 200, "a healthy pair")

    resp = pd.client.post("/v1/completions", json={"prompt": "p", "max_tokens": 2})
    assert resp.status_code == 200 and resp.headers[C.ROUTER_WORKER_HEADER] == pd.decode
    answer = resp.json()
    assert answer["role"] == "decode" and answer["bootstrap"] == f"127.0.0.2:{BOOTSTRAP_PORT}"
    wait_until(lambda: len(pd.seen) == 2, "the prefill request too", timeout=15)
    assert {(s["role"], s["bootstrap"], s["room"]) for s in pd.seen} == {
        (role, f"127.0.0.2:{BOOTSTRAP_PORT}", answer["room"]) for role in ("prefill", "decode")
    }


def test_a_prefill_endpoint_turning_not_ready_leaves_with_its_bootstrap_address(discovered_pd):
    pd = discovered_pd
    wait_until(lambda: pd.idle_prefill in {u for u, _, _ in pd.workers()}, "the idle pod")
    patch = {"endpoints": [endpoint("127.0.0.2"), endpoint("127.0.0.3", ready=False)]}
    assert pd.api.patch(f"{BASE}/{PREFILL_SERVICE}-a", json=patch, headers=MERGE_PATCH).is_success
    want = {(pd.prefill, "prefill", f"127.0.0.2:{BOOTSTRAP_PORT}"), (pd.decode, "decode", None)}
    wait_until(lambda: pd.workers() == want, "the not-ready prefill pod to leave", timeout=15)


def test_a_decode_endpoint_turning_not_ready_leaves_and_the_router_says_so(discovered_pd):
    pd = discovered_pd
    wait_until(lambda: pd.client.get(C.HEALTH_PATH).status_code == 200, "a healthy pair")
    patch = {"endpoints": [endpoint("127.0.0.5", ready=False)]}
    assert pd.api.patch(f"{BASE}/{DECODE_SERVICE}-a", json=patch, headers=MERGE_PATCH).is_success
    wait_until(lambda: {r for _, r, _ in pd.workers()} == {"prefill"}, "the decode pod to leave")
    health = pd.client.get(C.HEALTH_PATH)
    assert health.status_code == 503 and health.json()["status"] == "no healthy decode server"
    resp = pd.client.post("/v1/completions", json={"prompt": "p", "max_tokens": 2})
    assert resp.status_code == 503 and "No healthy decode server" in resp.text
