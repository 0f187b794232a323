"""P/D mode's pairing against scripted prefill and decode servers (httpx MockTransport):
both get the client's request with the bootstrap address and one room, the client gets the
decode server's response, and each failure before the decode server answers is handled
(the prefill's own error passed on, a retry on another server, 502) with the other
request closed. Nothing is left open: a client that goes away closes both requests."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import httpx
from test_router_proxy import samples

from sluice.runtime import constants as C
from sluice.runtime.constants import METRIC_ROUTER_PD_PAIRS_TOTAL
from sluice.runtime.router.app import build_router_app
from sluice.runtime.router.args import parse_prefill
from sluice.runtime.router.metrics import RouterMetrics
from sluice.runtime.router.pd import ROOM_END, PDForwarder
from sluice.runtime.router.pd_app import PDRouterApp
from sluice.runtime.router.policies import CacheAware, CacheAwareConfig
from sluice.runtime.router.proxy import Forwarder
from sluice.runtime.router.workers import BackoffPolicy, WorkerPool

P1, P2 = "http://prefill-1:30000", "http://prefill-2:30000"
D1, D2 = "http://decode-1:30000", "http://decode-2:30000"
PREFILL_FLAGS = (P1, "9000", P2)  # --prefill P1 9000 --prefill P2
PREFILL_ERROR = {"error": {"message": "prompt too long", "type": "invalid_request_error",
                           "param": None, "code": None}}  # fmt: skip


class Seen(NamedTuple):
    server: str
    path: str
    body: bytes
    bootstrap: str | None
    room: int
    authorization: str | None


class Body(httpx.AsyncByteStream):
    """A body arriving over the network; `hold`: it stays open after its chunks until
    closed. One closed before its end is recorded in `closed`."""

    def __init__(self, server: str, chunks: list[bytes], closed: list[str], hold: Any = None):
        self.server, self.chunks, self.closed, self.hold = server, chunks, closed, hold
        self.ended = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            yield chunk
        if self.hold is not None:
            await self.hold()
        self.ended = True

    async def aclose(self) -> None:
        if not self.ended:
            self.closed.append(self.server)


@dataclass
class FakePD:
    """Prefill servers "send the KV" of the room they are given (set its event) and answer
    their first token; decode servers wait for their room's KV, then answer (an SSE stream
    when the request asks for one). `script[server]` makes one misbehave: connect (refuses
    connections), unavailable (503), invalid (400), hold (its body stays open), slow (a
    prefill server that never gets to send the KV), stall (a decode server that never
    answers), fail-late (a prefill server whose body
    breaks once a decode server has answered)."""

    script: dict[str, str] = field(default_factory=dict)
    seen: list[Seen] = field(default_factory=list)
    closed: list[str] = field(default_factory=list)  # requests closed before their end
    kv: dict[int, asyncio.Event] = field(default_factory=dict)
    decode_answered: asyncio.Event = field(default_factory=asyncio.Event)

    def rooms(self, server: str) -> list[int]:
        return [s.room for s in self.seen if s.server == server]

    async def __call__(self, req: httpx.Request) -> httpx.Response:
        server = f"http://{req.url.host}:{req.url.port}"
        if C.DISAGG_ROOM_HEADER not in req.headers:  # /v1/models, /tokenize
            return self.json(server, {"from": server, "path": req.url.path}, 200)
        room = int(req.headers[C.DISAGG_ROOM_HEADER])
        self.seen.append(Seen(server, req.url.path, req.content, req.headers.get(
            C.DISAGG_BOOTSTRAP_HEADER), room, req.headers.get("authorization")))  # fmt: skip
        how = self.script.get(server, "")
        if how == "connect":
            raise httpx.ConnectError("connection refused")
        if how == "unavailable":
            return self.json(server, {"error": {"code": "draining"}}, 503)
        if how == "invalid":
            return self.json(server, PREFILL_ERROR, 400)
        kv = self.kv.setdefault(room, asyncio.Event())
        stream = json.loads(req.content).get("stream", False)
        if server.startswith("http://prefill"):
            if how == "slow":
                await self.until_closed(server, forever())
            kv.set()
            answer = json.dumps({"from": server, "room": room}).encode()
            hold = {"hold": forever, "fail-late": self.fail_after_decode}.get(how)
            return self.answer(server, answer, stream, hold)
        await self.until_closed(server, kv.wait())
        if how == "stall":
            await self.until_closed(server, forever())
        self.decode_answered.set()
        answer = json.dumps({"from": server, "room": room}).encode()
        return self.answer(server, answer, stream, forever if how == "hold" else None)

    def answer(self, server: str, data: bytes, stream: bool, hold: Any) -> httpx.Response:
        if not stream:
            return httpx.Response(200, headers={"content-type": "application/json"},
                                  stream=Body(server, [data], self.closed, hold))  # fmt: skip
        chunks = [b"data: " + data + b"\n\n", b"data: [DONE]\n\n"]
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              stream=Body(server, chunks, self.closed, hold))  # fmt: skip

    def json(self, server: str, obj: dict[str, Any], status: int) -> httpx.Response:
        data = json.dumps(obj).encode()
        return httpx.Response(status, headers={"content-type": "application/json"},
                              stream=Body(server, [data], self.closed))  # fmt: skip

    async def until_closed(self, server: str, waiting: Any) -> None:
        """Wait for `waiting`; a request closed meanwhile is recorded."""
        try:
            await waiting
        except asyncio.CancelledError:
            self.closed.append(server)
            raise

    async def fail_after_decode(self) -> None:
        await self.decode_answered.wait()
        raise httpx.ReadError("prefill server died")


async def forever() -> None:
    await asyncio.Event().wait()


@dataclass
class PDRouter:
    app: Any
    prefill: WorkerPool
    decode: WorkerPool
    metrics: RouterMetrics

    def worker(self, url: str) -> Any:
        return (self.prefill.workers | self.decode.workers)[url]

    def in_flight(self) -> list[int]:
        return [
            w.in_flight for w in [*self.prefill.workers.values(), *self.decode.workers.values()]
        ]


def pd_router(cluster: FakePD, prefill: tuple[str, ...] = (P1, P2),
              decode: tuple[str, ...] = (D1, D2), request_timeout: float = 0.0) -> PDRouter:  # fmt: skip
    backoff = BackoffPolicy(0.5, 15)
    prefill_pool, decode_pool = WorkerPool(1000, backoff), WorkerPool(1000, backoff)
    for pool, urls in ((prefill_pool, prefill), (decode_pool, decode)):
        for url in urls:
            pool.add(url).healthy = True
    metrics = RouterMetrics(decode_pool, "cache-aware", [prefill_pool])
    client = httpx.AsyncClient(transport=httpx.MockTransport(cluster))
    forwarder = Forwarder(decode_pool, client, metrics, request_timeout)
    bootstrap = {s.url: s.bootstrap for s in parse_prefill(PREFILL_FLAGS)}
    policy = CacheAware(CacheAwareConfig())
    pd = PDForwarder(prefill_pool, decode_pool, bootstrap, forwarder, policy, metrics)
    app = build_router_app(PDRouterApp(pd, forwarder, metrics))
    return PDRouter(app, prefill_pool, decode_pool, metrics)


async def post(router: PDRouter, body: dict[str, Any], path: str = "/v1/completions",
               method: str = "POST", **headers: str) -> httpx.Response:  # fmt: skip
    transport = httpx.ASGITransport(app=router.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
        return await client.request(method, path, content=json.dumps(body), headers=headers)


async def eventually(condition: Callable[[], Any], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def test_both_servers_get_the_request_with_the_prefill_bootstrap_address_and_one_room():
    async def scenario() -> None:
        cluster = FakePD()
        router = pd_router(cluster, prefill=(P1,), decode=(D1,))
        body = {"prompt": "Once upon a time", "max_tokens": 8}
        spoofed = {C.DISAGG_BOOTSTRAP_HEADER: "evil:1", C.DISAGG_ROOM_HEADER: "7"}
        first = await post(router, body, authorization="Bearer k", **spoofed)
        second = await post(router, body)
        assert first.status_code == 200 and first.headers[C.ROUTER_WORKER_HEADER] == D1
        [p] = [s for s in cluster.seen[:2] if s.server == P1]
        [d] = [s for s in cluster.seen[:2] if s.server == D1]
        sent = json.dumps(body).encode()
        expected = ("/v1/completions", sent, "prefill-1:9000", "Bearer k")  # not the spoofed
        assert (p.path, p.body, p.bootstrap, p.authorization) == expected
        assert (d.path, d.body, d.bootstrap, d.authorization) == expected
        assert p.room == d.room and 0 <= p.room < ROOM_END
        assert first.json() == {"from": D1, "room": p.room}
        assert cluster.rooms(P1) == cluster.rooms(D1) and second.json()["room"] != p.room
        await eventually(lambda: router.in_flight() == [0, 0], "in-flight counts back to 0")
        s = samples(router.metrics)
        assert s[(METRIC_ROUTER_PD_PAIRS_TOTAL, (("decode", D1), ("prefill", P1)))] == 2
        assert s[(C.METRIC_ROUTER_REQUESTS_TOTAL, (("worker", P1),))] == 2

    asyncio.run(scenario())


def test_a_streamed_answer_is_the_decode_servers_sse_stream():
    async def scenario() -> None:
        cluster = FakePD()
        router = pd_router(cluster)
        resp = await post(router, {"prompt": "p", "stream": True})
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        events = [e for e in resp.text.split("\n\n") if e]
        assert json.loads(events[0].removeprefix("data: "))["from"] == D1
        assert events[1:] == ["data: [DONE]"]  # nothing of the prefill server's stream

    asyncio.run(scenario())


def test_the_prefill_servers_400_reaches_the_client_and_the_decode_request_is_closed():
    async def scenario() -> None:
        cluster = FakePD(script={P1: "invalid"})
        router = pd_router(cluster, prefill=(P1,))
        resp = await post(router, {"prompt": "p" * 10})
        assert resp.status_code == 400 and resp.json() == PREFILL_ERROR
        assert resp.headers[C.ROUTER_WORKER_HEADER] == P1
        assert cluster.closed == [D1]
        assert router.worker(P1).healthy  # refusing a request is no failure of the server
        assert router.in_flight() == [0, 0, 0]

    asyncio.run(scenario())


def test_a_prefill_server_that_refuses_connections_is_taken_out_and_the_other_one_tried():
    async def scenario() -> None:
        cluster = FakePD(script={P1: "connect"})
        router = pd_router(cluster)
        resp = await post(router, {"prompt": "p"})
        assert resp.status_code == 200 and resp.json()["from"] in (D1, D2)
        assert cluster.closed == [D1]  # the first pair's decode request
        assert cluster.rooms(P1)[0] != cluster.rooms(P2)[0]  # a fresh room for the retry
        assert resp.json()["room"] == cluster.rooms(P2)[0]
        assert not router.worker(P1).healthy
        assert router.worker(P1).down_reason == "request failed (connect)"
        assert samples(router.metrics)[(C.METRIC_ROUTER_RETRIES_TOTAL, ())] == 1
        await eventually(lambda: router.in_flight() == [0, 0, 0, 0], "in-flight counts at 0")

    asyncio.run(scenario())


def test_a_draining_prefill_servers_503_is_retried_on_the_other_one():
    async def scenario() -> None:
        router = pd_router(FakePD(script={P1: "unavailable"}))
        resp = await post(router, {"prompt": "p"})
        assert resp.status_code == 200
        assert router.worker(P1).down_reason == "request failed (unavailable)"

    asyncio.run(scenario())


def test_with_no_other_prefill_server_the_router_answers_502_in_openais_shape():
    async def scenario() -> None:
        cluster = FakePD(script={P1: "connect"})
        router = pd_router(cluster, prefill=(P1,))
        resp = await post(router, {"prompt": "p"})
        assert resp.status_code == 502
        err = resp.json()["error"]
        assert err["type"] == "server_error" and err["code"] == "upstream_unavailable"
        assert cluster.closed == [D1]
        failed = (C.METRIC_ROUTER_FAILED_REQUESTS_TOTAL, (("reason", "upstream"),))
        assert samples(router.metrics)[failed] == 1
        resp = await post(router, {"prompt": "p"})  # no healthy prefill server now
        assert resp.status_code == 503 and resp.json()["error"]["code"] == "no_worker"
        assert "prefill" in resp.json()["error"]["message"]

    asyncio.run(scenario())


def test_a_decode_server_that_is_down_gets_the_pair_retried_on_another_decode_server():
    async def scenario() -> None:
        cluster = FakePD(script={D1: "connect"})
        router = pd_router(cluster, prefill=(P1,))
        resp = await post(router, {"prompt": "p"})
        assert resp.status_code == 200 and resp.json()["from"] == D2
        assert [s.server for s in cluster.seen if s.server != P1] == [D1, D2]
        first_room, second_room = cluster.rooms(P1)  # the prefill request is sent again
        assert first_room != second_room and cluster.rooms(D2) == [second_room]
        assert not router.worker(D1).healthy and router.worker(P1).healthy
        assert samples(router.metrics)[(C.METRIC_ROUTER_RETRIES_TOTAL, ())] == 1
        await eventually(lambda: router.in_flight() == [0, 0, 0], "in-flight counts at 0")

    asyncio.run(scenario())


def test_a_decode_server_silent_past_the_request_timeout_is_closed_and_the_pair_retried():
    async def scenario() -> None:
        cluster = FakePD(script={D1: "stall"})
        router = pd_router(cluster, prefill=(P1,), request_timeout=0.2)
        resp = await post(router, {"prompt": "p"})
        assert resp.status_code == 200 and resp.json()["from"] == D2
        assert cluster.closed == [D1]
        assert router.worker(D1).down_reason == "request failed (timeout)"

    asyncio.run(scenario())


def test_with_every_decode_server_down_the_router_answers_502():
    async def scenario() -> None:
        router = pd_router(FakePD(script={D1: "unavailable", D2: "connect"}), prefill=(P1,))
        resp = await post(router, {"prompt": "p"})
        assert resp.status_code == 502 and resp.json()["error"]["code"] == "upstream_unavailable"
        assert router.decode.healthy() == [] and router.worker(P1).healthy

    asyncio.run(scenario())


def test_a_decode_servers_400_is_passed_on_as_it_is_and_the_prefill_request_closed():
    async def scenario() -> None:
        cluster = FakePD(script={D1: "invalid", P1: "slow"})
        router = pd_router(cluster, prefill=(P1,), decode=(D1,))
        resp = await post(router, {"prompt": "p"})
        assert resp.status_code == 400 and resp.json() == PREFILL_ERROR
        assert resp.headers[C.ROUTER_WORKER_HEADER] == D1 and router.worker(D1).healthy
        await eventually(lambda: cluster.closed == [P1], "the prefill request closed")

    asyncio.run(scenario())


def test_a_prefill_failure_after_the_decode_server_answered_is_only_counted():
    async def scenario() -> None:
        router = pd_router(FakePD(script={P1: "fail-late"}), prefill=(P1,), decode=(D1,))
        resp = await post(router, {"prompt": "p"})
        assert resp.status_code == 200 and resp.json()["from"] == D1
        errors = (C.METRIC_ROUTER_UPSTREAM_ERRORS_TOTAL, (("reason", "read"), ("worker", P1)))
        await eventually(lambda: samples(router.metrics).get(errors) == 1, "the error counted")
        assert router.worker(P1).healthy
        assert router.in_flight() == [0, 0]

    asyncio.run(scenario())


async def leaving_client(app: Any, body: dict[str, Any], leave: Callable[[list], bool]) -> list:
    """Call `app` (ASGI) as a client that goes away once `leave(messages it got)` holds;
    the messages it got."""
    messages: list[dict[str, Any]] = []
    request = [{"type": "http.request", "body": json.dumps(body).encode(), "more_body": False}]

    async def receive() -> dict[str, Any]:
        if request:
            return request.pop()
        await eventually(lambda: leave(messages), "the moment to leave")
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/completions",
             "raw_path": b"/v1/completions", "query_string": b"", "root_path": "",
             "headers": [(b"host", b"router"), (b"content-type", b"application/json")],
             "client": ("127.0.0.1", 1), "server": ("router", 80)}  # fmt: skip
    await asyncio.wait_for(app(scope, receive, send), 10)
    return messages


def test_a_client_that_goes_away_mid_stream_closes_both_requests():
    async def scenario() -> None:
        cluster = FakePD(script={P1: "hold", D1: "hold"})
        router = pd_router(cluster, prefill=(P1,), decode=(D1,))
        body = {"prompt": "p", "stream": True}
        messages = await leaving_client(router.app, body, lambda got: len(got) >= 2)
        assert messages[0]["status"] == 200
        assert json.loads(messages[1]["body"].removeprefix(b"data: "))["from"] == D1
        assert sorted(cluster.closed) == [D1, P1]
        assert router.in_flight() == [0, 0]
        assert router.worker(P1).healthy and router.worker(D1).healthy

    asyncio.run(scenario())


def test_a_client_that_goes_away_before_the_answer_closes_both_requests():
    async def scenario() -> None:
        cluster = FakePD(script={P1: "slow"})  # the decode server waits for its KV
        router = pd_router(cluster, prefill=(P1,), decode=(D1,))
        messages = await leaving_client(
            router.app, {"prompt": "p"}, lambda _: len(cluster.seen) == 2
        )
        assert messages[0]["status"] == 499  # the router's mark of a request the client left
        assert sorted(cluster.closed) == [D1, P1]
        assert router.in_flight() == [0, 0]

    asyncio.run(scenario())


def test_the_prefill_server_is_chosen_by_prefix_and_the_decode_server_by_load():
    async def scenario() -> None:
        cluster = FakePD()
        router = pd_router(cluster)
        long_prompt = "You are a helpful assistant. " * 20
        answers = [await post(router, {"prompt": long_prompt + q}) for q in "abcd"]
        prefills = [s.server for s in cluster.seen if s.server.startswith("http://prefill")]
        assert len(set(prefills)) == 1  # the shared prefix keeps its prefill server
        assert [a.json()["from"] for a in answers] == [D1, D2, D1, D2]  # idle: in turn

    asyncio.run(scenario())


def test_the_responses_api_is_refused_in_p_d_mode():
    async def scenario() -> None:
        router = pd_router(FakePD())
        created = await post(router, {"input": "hi"}, path=C.RESPONSES_PATH)
        stored = await post(router, {}, path=C.RESPONSES_PATH + "/resp_1", method="GET")
        for resp in (created, stored):
            assert resp.status_code == 501
            assert "not supported behind a P/D router" in resp.json()["error"]["message"]
        failed = (C.METRIC_ROUTER_FAILED_REQUESTS_TOTAL, (("reason", "unsupported"),))
        assert samples(router.metrics)[failed] == 2

    asyncio.run(scenario())


def test_models_and_tokenize_go_to_a_decode_server_without_a_pair():
    async def scenario() -> None:
        cluster = FakePD()
        router = pd_router(cluster)
        models = await post(router, {}, path="/v1/models", method="GET")
        tokens = await post(router, {"prompt": "p"}, path="/tokenize")
        assert models.json() == {"from": D1, "path": "/v1/models"}
        assert tokens.json()["from"] in (D1, D2) and cluster.seen == []  # no room: no pair

    asyncio.run(scenario())


def test_health_needs_a_healthy_prefill_and_a_healthy_decode_server():
    async def scenario() -> None:
        router = pd_router(FakePD(), prefill=(P1,), decode=(D1,))
        ok = await post(router, {}, path=C.HEALTH_PATH, method="GET")
        assert ok.status_code == 200 and ok.json()["status"] == "ok"
        router.decode.mark_down(router.worker(D1), "test")
        no_decode = await post(router, {}, path=C.HEALTH_PATH, method="GET")
        assert no_decode.status_code == 503
        assert no_decode.json()["status"] == "no healthy decode server"
        router.prefill.mark_down(router.worker(P1), "test")
        neither = await post(router, {}, path=C.HEALTH_PATH, method="GET")
        assert neither.json()["status"] == "no healthy prefill server and no healthy decode server"
        router.decode.mark_up(router.worker(D1))
        no_prefill = await post(router, {}, path=C.HEALTH_PATH, method="GET")
        assert (no_prefill.status_code, no_prefill.json()["status"]) == (
            503,
            "no healthy prefill server",
        )

    asyncio.run(scenario())


def test_workers_lists_both_pools_with_their_role():
    async def scenario() -> None:
        router = pd_router(FakePD(), prefill=(P1, P2), decode=(D1,))
        router.prefill.mark_down(router.worker(P2), "test")
        listed = (await post(router, {}, path=C.ROUTER_WORKERS_PATH, method="GET")).json()
        roles = [(w["url"], w["role"], w["healthy"], w.get("bootstrap")) for w in listed["workers"]]
        assert roles == [(P1, "prefill", True, "prefill-1:9000"),
                         (P2, "prefill", False, "prefill-2:8998"), (D1, "decode", True, None)]  # fmt: skip
        assert listed["policy"] == "cache-aware" and listed["workers"][1]["down_reason"] == "test"

    asyncio.run(scenario())
