"""Adapter affinity: a request naming a LoRA adapter goes to a worker whose /v1/models lists
it (the policy choosing among several), else to the least-loaded worker; the decision is
counted with its own reason. Fake workers (httpx MockTransport) answer /health, /v1/models
in the runtime's shape (adapters carry `parent`) and the generation routes."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sluice.runtime import constants as C
from sluice.runtime.router.app import RouterApp, build_router_app
from sluice.runtime.router.health import HealthConfig, HealthMonitor
from sluice.runtime.router.keys import request_route
from sluice.runtime.router.metrics import RouterMetrics
from sluice.runtime.router.policies import (
    REASON_ADAPTER_AFFINITY,
    REASON_ADAPTER_FALLBACK,
    REASON_LEAST_LOAD,
    REASON_RESPONSE_AFFINITY,
    CacheAware,
    CacheAwareConfig,
    LeastLoad,
    RoundRobin,
    choose_for_adapters,
)
from sluice.runtime.router.prefix_tree import PrefixTree
from sluice.runtime.router.proxy import Forwarder
from sluice.runtime.router.workers import BackoffPolicy, Worker, WorkerPool

BASE = "tiny-base"
A, B, N = "http://worker-a:1", "http://worker-b:1", "http://worker-n:1"


def cards(*adapters: str) -> list[dict[str, Any]]:
    """/v1/models `data` as the runtime answers it (http_server.models + lora_api.cards)."""
    base = {"id": BASE, "object": "model", "root": "/models/tiny", "owned_by": "sluice"}
    return [base] + [{"id": a, "object": "model", "root": f"/adapters/{a}",
                      "owned_by": "sluice", "parent": BASE} for a in adapters]  # fmt: skip


def holding(url: str, *adapters: str, load: int = 0) -> Worker:
    w = Worker(url, PrefixTree(10_000), healthy=True, in_flight=load)
    w.set_models(cards(*adapters))
    return w


# ---- the choice ---------------------------------------------------------------------------


def test_an_adapter_request_goes_to_the_only_worker_holding_it_even_if_busier():
    ws = [holding(A, load=0), holding(B, "sql", load=5)]
    d = choose_for_adapters(LeastLoad(), LeastLoad(), ws, "k", frozenset({"sql"}))
    assert d.worker.url == B and d.reason == REASON_ADAPTER_AFFINITY


def test_among_several_holders_the_configured_policy_chooses():
    ws = [holding(A, "sql"), holding(B, "sql"), holding(N)]
    rr = RoundRobin()
    chosen = [choose_for_adapters(rr, LeastLoad(), ws, "", frozenset({"sql"})).worker.url
              for _ in range(4)]  # fmt: skip
    assert chosen == [A, B, A, B]
    ws[0].in_flight = 3
    d = choose_for_adapters(LeastLoad(), LeastLoad(), ws, "", frozenset({"sql"}))
    assert d.worker.url == B  # least-load among the holders, not N (idle, but without sql)


def test_cache_aware_keeps_its_prefix_match_among_the_holders():
    ws = [holding(A, "sql"), holding(B, "sql"), holding(N)]
    ca = CacheAware(CacheAwareConfig(cache_threshold=0.5))
    ws[1].tree.insert("SELECT * FROM users WHERE ")
    ws[2].tree.insert("SELECT * FROM users WHERE id = 1")  # longer, but N lacks the adapter
    d = choose_for_adapters(ca, LeastLoad(), ws, "SELECT * FROM users WHERE id = 2",
                            frozenset({"sql"}))  # fmt: skip
    assert d.worker.url == B and d.reason == REASON_ADAPTER_AFFINITY
    assert d.match_len == len("SELECT * FROM users WHERE ")


def test_when_no_worker_holds_the_adapter_the_least_loaded_gets_it():
    ws = [holding(A, "sql", load=2), holding(B, load=1), holding(N, load=4)]
    d = choose_for_adapters(RoundRobin(), LeastLoad(), ws, "", frozenset({"chat"}))
    assert d.worker.url == B and d.reason == REASON_ADAPTER_FALLBACK
    both = choose_for_adapters(RoundRobin(), LeastLoad(), ws, "", frozenset({"sql", "chat"}))
    assert both.reason == REASON_ADAPTER_FALLBACK  # a batch needs one worker with all of them


def test_a_request_without_adapters_is_the_policys_alone():
    ws = [holding(A, "sql"), holding(B)]
    d = choose_for_adapters(LeastLoad(), LeastLoad(), ws, "", frozenset())
    assert d.reason == REASON_LEAST_LOAD


def test_a_base_model_name_or_an_unread_fleet_asks_for_no_adapter():
    pool = WorkerPool(1000, BackoffPolicy(0.5, 15))
    w = pool.add(A)
    assert pool.adapters_wanted("sql", frozenset()) == frozenset()  # nothing read yet
    w.set_models(cards("sql"))
    assert pool.adapters_wanted(BASE, frozenset()) == frozenset()
    assert pool.adapters_wanted("/models/tiny", frozenset()) == frozenset()  # the base's root
    assert pool.adapters_wanted(None, frozenset()) == frozenset()
    assert pool.adapters_wanted("sql", frozenset()) == {"sql"}
    assert pool.adapters_wanted("gone", frozenset()) == {"gone"}
    assert pool.adapters_wanted(None, frozenset({"x"})) == {"x"}


def test_the_adapter_fields_come_from_the_one_parse_of_the_body():
    def route(path: str, obj: Any):
        return request_route(path, json.dumps(obj).encode())

    r = route(
        "/v1/chat/completions", {"model": "sql", "messages": [{"role": "user", "content": "q"}]}
    )
    assert r.model == "sql" and r.key == "<user>q" and r.adapters == frozenset()
    assert route("/v1/completions", {"model": 3, "prompt": "p"}).model is None
    assert route("/generate", {"text": "t", "lora_path": "sql"}).adapters == {"sql"}
    assert route("/generate", {"text": ["a", "b"], "lora_path": ["sql", None]}).adapters == {"sql"}
    assert route("/generate", {"text": "t", "lora_name": "chat"}).adapters == {"chat"}
    assert route("/generate", {"text": "t"}).adapters == frozenset()
    assert request_route("/generate", b"{not json").adapters == frozenset()


# ---- the models poll -------------------------------------------------------------------------


def test_the_health_check_reads_the_adapters_and_a_failed_read_keeps_them():
    answers: dict[str, Any] = {"models": httpx.Response(200, json={"data": cards("sql", "chat")})}

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == C.HEALTH_PATH:
            return httpx.Response(200)
        return answers["models"]

    pool = WorkerPool(1000, BackoffPolicy(0.5, 15))
    w = pool.add(A)

    async def check() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
            await HealthMonitor(pool, HealthConfig(1.0, 1.0, 3), client).check(w)

    asyncio.run(check())
    assert w.healthy and w.adapters == {"sql", "chat", "/adapters/sql", "/adapters/chat"}
    assert w.base_models == {BASE, "/models/tiny"}
    answers["models"] = httpx.Response(401, json={"error": {"message": "no key"}})
    asyncio.run(check())
    assert w.healthy and "sql" in w.adapters
    answers["models"] = httpx.Response(200, json={"data": cards("chat")})  # sql unloaded
    asyncio.run(check())
    assert w.adapters == {"chat", "/adapters/chat"}
    pool.mark_down(w, "test")
    assert w.adapters == frozenset()  # it may come back restarted, without them


# ---- through the router app ------------------------------------------------------------------


class Body(httpx.AsyncByteStream):
    """A body that arrives over the network, as the router reads a worker's (streamed)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aiter__(self):  # type: ignore[override]
        yield self.data


class FakeWorkers:
    """Each worker answers /health, its /v1/models, and generation routes with its own URL;
    the bodies it received are recorded."""

    def __init__(self, adapters: dict[str, list[str]]) -> None:
        self.adapters = adapters
        self.received: list[tuple[str, bytes]] = []

    def __call__(self, req: httpx.Request) -> httpx.Response:
        host = f"http://{req.url.host}:{req.url.port}"
        if req.url.path == C.HEALTH_PATH:
            return httpx.Response(200)
        if req.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": cards(*self.adapters[host])})
        self.received.append((host, req.content))
        return httpx.Response(200, headers={"content-type": "application/json"},
                              stream=Body(json.dumps({"worker": host}).encode()))  # fmt: skip


def decisions(metrics: RouterMetrics) -> dict[str, float]:
    text = metrics.render()[0].decode()
    return {
        s.labels["reason"]: s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == C.METRIC_ROUTER_DECISIONS_TOTAL
    }


def test_through_the_router_adapter_requests_follow_the_workers_models():
    fake = FakeWorkers({A: ["sql"], B: ["sql", "chat"], N: []})
    pool = WorkerPool(1000, BackoffPolicy(0.5, 15))
    for url in (A, B, N):
        pool.add(url)
    metrics = RouterMetrics(pool, "round-robin")

    async def go() -> list[str]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(fake)) as upstream:
            monitor = HealthMonitor(pool, HealthConfig(1.0, 1.0, 3), upstream)

            async def probe_all() -> None:
                for w in list(pool.workers.values()):
                    await monitor.check(w)

            app = build_router_app(
                RouterApp(pool, RoundRobin(), Forwarder(pool, upstream, metrics), metrics)
            )
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://router") as c:

                async def send(path: str, body: dict[str, Any]) -> str:
                    resp = await c.post(path, content=json.dumps(body).encode())
                    assert resp.status_code == 200
                    assert resp.headers[C.ROUTER_WORKER_HEADER] == resp.json()["worker"]
                    return resp.json()["worker"]

                await probe_all()
                chat = {"messages": [{"role": "user", "content": "hi"}]}
                got = [await send("/v1/chat/completions", {"model": "chat", **chat})
                       for _ in range(3)]  # fmt: skip
                got += [await send("/v1/completions", {"model": "sql", "prompt": "p"})
                        for _ in range(2)]  # fmt: skip
                got.append(await send("/generate", {"text": "t", "lora_path": "/adapters/chat"}))
                got += [await send("/v1/completions", {"model": BASE, "prompt": "p"})
                        for _ in range(3)]  # fmt: skip
                workers = (await c.get(C.ROUTER_WORKERS_PATH)).json()["workers"]
                assert {w["url"]: "chat" in w["adapters"] for w in workers} == {
                    A: False, B: True, N: False}  # fmt: skip
                fake.adapters[B] = ["sql"]  # chat unloaded from B, loaded on N
                fake.adapters[N] = ["chat"]
                await probe_all()
                got.append(await send("/v1/completions", {"model": "chat", "prompt": "p"}))
                fake.adapters[N] = []
                await probe_all()
                got.append(await send("/v1/completions", {"model": "chat", "prompt": "p"}))
                return got

    got = asyncio.run(go())
    assert got[:3] == [B, B, B]  # chat only on B
    assert sorted(got[3:5]) == [A, B]  # sql on A and B: round-robin among them
    assert got[5] == B  # /generate's lora_path by the adapter's folder
    assert set(got[6:9]) == {A, B, N}  # the base model: round-robin over all
    assert got[9] == N  # follows the adapter to its new worker
    assert got[10] in (A, B, N)  # nobody has it: least-load (all idle), the worker answers
    assert decisions(metrics) == {
        "round_robin": 3.0, "random": 0.0, "least_load": 0.0, "prefix_match": 0.0,
        "no_match": 0.0, "imbalance": 0.0, REASON_ADAPTER_AFFINITY: 7.0,
        REASON_ADAPTER_FALLBACK: 1.0, REASON_RESPONSE_AFFINITY: 0.0,
    }  # fmt: skip
    assert (
        fake.received[0][1]
        == json.dumps({"model": "chat", "messages": [{"role": "user", "content": "hi"}]}).encode()
    )  # unchanged
