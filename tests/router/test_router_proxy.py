"""The router's forwarding against scripted workers (httpx MockTransport): what reaches the
client, which worker is tried, retries before the first byte, and the errors it answers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from sluice.runtime import constants as C
from sluice.runtime.router.app import RouterApp, build_router_app
from sluice.runtime.router.metrics import RouterMetrics
from sluice.runtime.router.policies import RoundRobin
from sluice.runtime.router.proxy import Forwarder
from sluice.runtime.router.workers import BackoffPolicy, WorkerPool

A, B = "http://worker-a:1", "http://worker-b:1"


class Stream(httpx.AsyncByteStream):
    """A body that arrives over the network (httpx reads `content=` bodies at once)."""

    def __init__(self, chunks: list[bytes], fail: bool = False) -> None:
        self.chunks = chunks
        self.fail = fail

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for c in self.chunks:
            yield c
        if self.fail:
            raise httpx.ReadError("worker died")


def FailingStream(chunks: list[bytes]) -> Stream:
    return Stream(chunks, fail=True)


def ok(body: bytes = b"ok", status: int = 200, headers=None) -> httpx.Response:
    return httpx.Response(status, stream=Stream([body]), headers=headers)


def router(handler: Callable[[httpx.Request], httpx.Response]):
    pool = WorkerPool(1000, BackoffPolicy(0.5, 15))
    for url in (A, B):
        pool.add(url).healthy = True
    metrics = RouterMetrics(pool, "round-robin")
    upstream = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    app = build_router_app(RouterApp(pool, RoundRobin(), Forwarder(pool, upstream, metrics), metrics))
    return app, pool, metrics


def samples(metrics: RouterMetrics) -> dict[tuple[str, tuple], float]:
    text = metrics.render()[0].decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def call(app, path="/v1/completions", body=None, headers=None) -> httpx.Response:
    content = json.dumps(body or {"prompt": "p"}).encode()

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as c:
            return await c.post(path, content=content, headers=headers or {})

    return asyncio.run(go())


def test_the_workers_response_and_headers_pass_through_with_the_worker_named():
    seen = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append((str(req.url), req.headers.get("authorization"), req.content))
        return ok(b'{"x": 1}', 201, {"content-type": "application/json", "x-extra": "kept"})

    app, _, _ = router(handler)
    resp = call(app, body={"prompt": "hello"}, headers={"Authorization": "Bearer k"})
    assert resp.status_code == 201 and resp.content == b'{"x": 1}'
    assert resp.headers["x-extra"] == "kept" and resp.headers[C.ROUTER_WORKER_HEADER] == A
    assert seen == [(A + "/v1/completions", "Bearer k", json.dumps({"prompt": "hello"}).encode())]


def test_a_refused_connection_is_retried_once_on_another_worker_and_takes_the_first_out():
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.host == "worker-a":
            raise httpx.ConnectError("refused")
        return ok()

    app, pool, metrics = router(handler)
    resp = call(app)
    assert resp.status_code == 200 and resp.headers[C.ROUTER_WORKER_HEADER] == B
    assert not pool.workers[A].healthy and pool.workers[A].down_reason == "request failed (connect)"
    s = samples(metrics)
    assert s[(C.METRIC_ROUTER_RETRIES_TOTAL, ())] == 1
    assert s[(C.METRIC_ROUTER_UPSTREAM_ERRORS_TOTAL, (("reason", "connect"), ("worker", A)))] == 1
    assert s[(C.METRIC_ROUTER_WORKER_HEALTHY, (("worker", A),))] == 0
    assert s[(C.METRIC_ROUTER_REQUESTS_TOTAL, (("worker", B),))] == 1


def test_a_draining_workers_503_is_retried_elsewhere():
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.host == "worker-a":
            return ok(b'{"error": {"code": "draining"}}', 503)
        return ok()

    app, pool, _ = router(handler)
    resp = call(app)
    assert resp.status_code == 200 and resp.content == b"ok"
    assert not pool.workers[A].healthy


def test_a_worker_dying_before_its_non_streamed_body_is_retried():
    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.host == "worker-a":
            return httpx.Response(200, stream=FailingStream([]))
        return ok(b"answer")

    app, _, _ = router(handler)
    assert call(app).content == b"answer"


def test_when_every_try_fails_the_router_answers_502_in_openais_shape():
    def handler(req: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    app, pool, metrics = router(handler)
    resp = call(app)
    assert resp.status_code == 502
    err = resp.json()["error"]
    assert err["type"] == "server_error" and err["code"] == "upstream_unavailable"
    assert worker_count(pool) == 0
    assert samples(metrics)[(C.METRIC_ROUTER_FAILED_REQUESTS_TOTAL, (("reason", "upstream"),))] == 1
    resp = call(app)  # nobody is healthy now
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "no_worker"


def worker_count(pool: WorkerPool) -> int:
    return len(pool.healthy())


def test_a_stream_that_breaks_after_its_first_byte_ends_with_an_error_event():
    def handler(req: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers={"content-type": "text/event-stream"},
                              stream=FailingStream([b'data: {"a": 1}\n\n']))  # fmt: skip

    app, pool, _ = router(handler)
    resp = call(app, body={"prompt": "p", "stream": True})
    assert resp.status_code == 200
    events = [e for e in resp.text.split("\n\n") if e]
    assert events[0] == 'data: {"a": 1}'
    assert json.loads(events[1].removeprefix("data: "))["error"]["code"] == "upstream_failed"
    assert not pool.workers[A].healthy  # not retried: bytes had reached the client


def test_in_flight_counts_return_to_zero():
    def handler(req: httpx.Request) -> httpx.Response:
        return ok()

    app, pool, metrics = router(handler)
    for _ in range(3):
        call(app)
    assert [w.in_flight for w in pool.workers.values()] == [0, 0]
    assert samples(metrics)[(C.METRIC_ROUTER_OVERHEAD_SECONDS + "_count", ())] == 3


@pytest.mark.parametrize(("method", "path", "status"), [("GET", "/nope", 404),
                                                         ("GET", "/v1/completions", 405)])  # fmt: skip
def test_unknown_routes_are_answered_by_the_router(method, path, status):
    app, _, _ = router(lambda req: ok())

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as c:
            return await c.request(method, path)

    resp = asyncio.run(go())
    assert resp.status_code == status and "error" in resp.json()
