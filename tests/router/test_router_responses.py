"""Response affinity and the Responses API's routes through the router, against fake workers
(httpx MockTransport) that store responses in their own memory as the runtime does: the
worker a stored response is on gets every request naming it (learned from the
`x-sluice-response-id` header, else found by asking the workers), the fallback when none
holds it, the decisions counted, and /tokenize, /detokenize forwarded."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sluice.runtime import constants as C
from sluice.runtime.router.app import RouterApp, build_router_app
from sluice.runtime.router.metrics import RouterMetrics
from sluice.runtime.router.policies import RoundRobin
from sluice.runtime.router.proxy import Forwarder
from sluice.runtime.router.responses import ResponseAffinity, probe_holder
from sluice.runtime.router.workers import BackoffPolicy, WorkerPool

A, B = "http://worker-a:1", "http://worker-b:1"
CLIENT = "x-test-client"  # set on the test's requests: the router forwards it, probes lack it


class Body(httpx.AsyncByteStream):
    """A body that arrives over the network, as the router reads a worker's (streamed)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def __aiter__(self):  # type: ignore[override]
        yield self.data


def answer(obj: dict[str, Any], status: int = 200, **headers: str) -> httpx.Response:
    return httpx.Response(status, headers={"content-type": "application/json", **headers},
                          stream=Body(json.dumps(obj).encode()))  # fmt: skip


def not_found(response_id: str) -> httpx.Response:
    return answer({"error": {"message": f"Response with id '{response_id}' not found.",
                             "type": "invalid_request_error", "param": None,
                             "code": "response_not_found"}}, 404)  # fmt: skip


class ResponseWorkers:
    """Workers that keep the responses they create in their own memory (`stored`), name each
    in the response-id header, answer GET/DELETE of the ones they hold and 404 otherwise.
    `log`: (client|probe, worker, method, raw path, authorization) of every request."""

    def __init__(self) -> None:
        self.stored: dict[str, set[str]] = {A: set(), B: set()}
        self.log: list[tuple[str, str, str, str, str | None]] = []
        self.hang: set[str] = set()  # workers that never answer
        self._made = 0

    def client_requests(self) -> list[tuple[str, str, str]]:
        return [(w, m, p) for kind, w, m, p, _ in self.log if kind == "client"]

    def probes(self) -> list[tuple[str, str, str | None]]:
        return [(w, p, auth) for kind, w, _, p, auth in self.log if kind == "probe"]

    async def __call__(self, req: httpx.Request) -> httpx.Response:
        worker = f"http://{req.url.host}:{req.url.port}"
        path = req.url.raw_path.decode()
        kind = "client" if CLIENT in req.headers else "probe"
        self.log.append((kind, worker, req.method, path, req.headers.get("authorization")))
        if worker in self.hang:
            await asyncio.sleep(30)
        held = self.stored[worker]
        if path == C.RESPONSES_PATH:
            body = json.loads(req.content)
            previous = body.get("previous_response_id")
            if previous is not None and previous not in held:
                return not_found(previous)
            self._made += 1
            response_id = f"resp_{self._made}"
            held.add(response_id)
            content_type = "text/event-stream" if body.get("stream") else "application/json"
            return httpx.Response(
                200, headers={"content-type": content_type, C.RESPONSE_ID_HEADER: response_id},
                stream=Body(json.dumps({"id": response_id, "worker": worker}).encode()),
            )  # fmt: skip
        if path.startswith(C.RESPONSES_PATH + "/"):
            response_id, _, sub = path.removeprefix(C.RESPONSES_PATH + "/").partition("/")
            if response_id not in held:
                return not_found(response_id)
            if sub:  # input_items, cancel
                return answer({"id": response_id, "sub": sub, "worker": worker})
            if req.method == "DELETE":
                held.discard(response_id)
                return answer({"id": response_id, "object": "response", "deleted": True})
            return answer({"id": response_id, "object": "response", "worker": worker})
        if path in C.TOKENIZE_PATHS:
            return answer({"worker": worker, "path": path, "got": json.loads(req.content)})
        return not_found(path)


class Setup:
    def __init__(self, probe_timeout: float = 5.0) -> None:
        self.fake = ResponseWorkers()
        self.pool = WorkerPool(1000, BackoffPolicy(0.5, 15))
        for url in (A, B):
            self.pool.add(url).healthy = True
        self.metrics = RouterMetrics(self.pool, "round-robin")
        self.affinity = ResponseAffinity(100, probe_timeout)
        upstream = httpx.AsyncClient(transport=httpx.MockTransport(self.fake))
        forwarder = Forwarder(self.pool, upstream, self.metrics)
        self.app = build_router_app(
            RouterApp(self.pool, RoundRobin(), forwarder, self.metrics, self.affinity)
        )

    def call(self, method: str, path: str, body: Any = None, **headers: str) -> httpx.Response:
        async def go() -> httpx.Response:
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://router") as c:
                content = None if body is None else json.dumps(body).encode()
                return await c.request(method, path, content=content,
                                       headers={CLIENT: "1", **headers})  # fmt: skip

        return asyncio.run(go())

    def post(self, body: dict[str, Any], **headers: str) -> httpx.Response:
        return self.call("POST", C.RESPONSES_PATH, body, **headers)

    def decisions(self) -> dict[str, float]:
        text = self.metrics.render()[0].decode()
        return {
            s.labels["reason"]: s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == C.METRIC_ROUTER_DECISIONS_TOTAL and s.value
        }


def worker_of(resp: httpx.Response) -> str:
    return resp.headers[C.ROUTER_WORKER_HEADER]


def test_the_header_teaches_the_router_where_a_response_is_for_post_get_and_delete():
    s = Setup()
    first = s.post({"input": "Hi"})
    assert first.status_code == 200 and worker_of(first) == A  # round-robin starts at A
    rid = first.headers[C.RESPONSE_ID_HEADER]
    assert s.affinity.get(rid) == A

    # round-robin alone would send every other one to B, which does not hold it
    follow_ups = [s.post({"input": f"next {i}", "previous_response_id": rid}) for i in range(3)]
    assert [(r.status_code, worker_of(r)) for r in follow_ups] == [(200, A)] * 3
    got = [s.call("GET", f"{C.RESPONSES_PATH}/{rid}") for _ in range(2)]
    assert [(r.status_code, r.json()["worker"]) for r in got] == [(200, A)] * 2
    deleted = s.call("DELETE", f"{C.RESPONSES_PATH}/{rid}")
    assert deleted.status_code == 200 and worker_of(deleted) == A
    assert s.fake.probes() == []  # the map answered every time
    assert s.affinity.get(rid) is None  # the delete forgot it
    assert s.fake.client_requests() == [(A, "POST", C.RESPONSES_PATH)] * 4 + [
        (A, "GET", f"{C.RESPONSES_PATH}/{rid}")] * 2 + [(A, "DELETE", f"{C.RESPONSES_PATH}/{rid}")]  # fmt: skip
    assert s.decisions() == {"round_robin": 1.0, "response_affinity": 6.0}

    gone = s.call("GET", f"{C.RESPONSES_PATH}/{rid}")  # nobody holds it now: asked, then a 404
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "response_not_found"
    assert sorted(w for w, _, _ in s.fake.probes()) == [A, B]
    assert s.decisions() == {"round_robin": 1.0, "response_affinity": 6.0}  # not a decision


def test_cancel_and_input_items_go_to_the_worker_holding_the_response():
    s = Setup()
    rid = s.post({"input": "Hi", "background": True}).headers[C.RESPONSE_ID_HEADER]
    for _ in range(2):  # round-robin alone would send one of each to B
        cancel = s.call("POST", f"{C.RESPONSES_PATH}/{rid}/cancel")
        items = s.call("GET", f"{C.RESPONSES_PATH}/{rid}/input_items")
        assert (cancel.json()["sub"], worker_of(cancel)) == ("cancel", A)
        assert (items.json()["sub"], worker_of(items)) == ("input_items", A)
    assert s.fake.probes() == []


def test_a_streamed_responses_header_is_learned_too():
    s = Setup()
    s.post({"input": "warm"})  # to A: round-robin's next is B
    streamed = s.post({"input": "Hi", "stream": True})
    assert worker_of(streamed) == B
    assert streamed.headers["content-type"].startswith("text/event-stream")
    rid = streamed.headers[C.RESPONSE_ID_HEADER]
    nxt = s.post({"input": "more", "previous_response_id": rid})  # round-robin's next: A
    assert nxt.status_code == 200 and worker_of(nxt) == B
    assert s.fake.probes() == []


def test_a_response_the_map_does_not_know_is_found_by_asking_the_workers():
    s = Setup()  # a fresh router: its map is empty, B already holds two responses
    s.fake.stored[B] |= {"resp_old", "resp_other"}
    auth = {"Authorization": "Bearer k"}
    first = s.post({"input": "x", "previous_response_id": "resp_old"}, **auth)
    assert first.status_code == 200 and worker_of(first) == B  # round-robin alone: A
    assert sorted(s.fake.probes()) == [
        (A, f"{C.RESPONSES_PATH}/resp_old", "Bearer k"),
        (B, f"{C.RESPONSES_PATH}/resp_old", "Bearer k"),
    ]
    assert s.affinity.get("resp_old") == B
    again = s.post({"input": "y", "previous_response_id": "resp_old"}, **auth)
    assert worker_of(again) == B and len(s.fake.probes()) == 2  # remembered: not asked again

    got = s.call("GET", f"{C.RESPONSES_PATH}/resp_other")  # a GET is found the same way
    assert got.status_code == 200 and got.json()["worker"] == B
    assert [(w, m) for w, m, _ in s.fake.client_requests()] == [
        (B, "POST"),
        (B, "POST"),
        (B, "GET"),
    ]
    assert s.decisions() == {"response_affinity": 3.0}


def test_when_no_worker_holds_it_the_policy_routes_and_the_worker_answers_404():
    s = Setup()
    resp = s.post({"input": "x", "previous_response_id": "resp_lost"})
    assert resp.status_code == 404 and "resp_lost" in resp.json()["error"]["message"]
    assert worker_of(resp) == A  # round-robin's first
    assert sorted(w for w, _, _ in s.fake.probes()) == [A, B]
    assert s.affinity.get("resp_lost") is None
    assert s.decisions() == {"round_robin": 1.0}
    nxt = s.post({"input": "x", "previous_response_id": "resp_lost"})
    assert worker_of(nxt) == B and nxt.status_code == 404  # still the policy's
    deleted = s.call("DELETE", f"{C.RESPONSES_PATH}/resp_lost")
    assert deleted.status_code == 404 and worker_of(deleted) in (A, B)


def test_a_mapped_worker_that_is_down_falls_through_to_the_probe_and_its_responses_are_gone():
    s = Setup()
    rid = s.post({"input": "Hi"}).headers[C.RESPONSE_ID_HEADER]  # stored on A
    s.pool.mark_down(s.pool.workers[A], "test")
    resp = s.post({"input": "more", "previous_response_id": rid})
    assert resp.status_code == 404 and worker_of(resp) == B
    assert s.fake.probes() == [(B, f"{C.RESPONSES_PATH}/{rid}", None)]  # only the healthy one
    assert s.decisions() == {"round_robin": 2.0}


def test_a_stale_entry_is_forgotten_when_its_worker_answers_404():
    s = Setup()
    rid = s.post({"input": "Hi"}).headers[C.RESPONSE_ID_HEADER]
    s.fake.stored[A].clear()  # A restarted on the same URL: its memory is gone
    resp = s.call("GET", f"{C.RESPONSES_PATH}/{rid}")
    assert resp.status_code == 404 and worker_of(resp) == A
    assert s.affinity.get(rid) is None


def test_the_probe_quotes_the_id_it_was_given():
    s = Setup()
    resp = s.post({"input": "x", "previous_response_id": "../../generate"})
    assert resp.status_code == 404
    assert {p for _, p, _ in s.fake.probes()} == {f"{C.RESPONSES_PATH}/..%2F..%2Fgenerate"}


def test_the_probe_takes_the_first_holder_and_gives_up_after_its_timeout():
    fake = ResponseWorkers()
    pool = WorkerPool(1000, BackoffPolicy(0.5, 15))
    for url in (A, B):
        pool.add(url).healthy = True
    fake.stored[B].add("resp_1")
    fake.hang.add(A)

    async def find(response_id: str) -> tuple[str | None, float]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(fake)) as client:
            start = time.perf_counter()
            found = await probe_holder(client, pool.healthy(), response_id, None, 0.3)
            return (found.url if found else None), time.perf_counter() - start

    found, took = asyncio.run(find("resp_1"))
    assert found == B and took < 0.25  # A, which never answers, was not waited for
    found, took = asyncio.run(find("resp_2"))
    assert found is None and 0.25 < took < 5


def test_the_map_forgets_the_least_recently_used_beyond_its_size():
    affinity = ResponseAffinity(size=2)
    affinity.remember("r1", A)
    affinity.remember("r2", B)
    assert affinity.get("r1") == A  # r2 is now the least recently used
    affinity.remember("r3", B)
    assert (affinity.get("r1"), affinity.get("r2"), affinity.get("r3")) == (A, None, B)
    assert len(affinity) == 2


def test_tokenize_and_detokenize_go_to_the_least_loaded_worker_uncounted():
    s = Setup()
    s.pool.workers[A].in_flight = 5
    tok = s.call("POST", "/tokenize", {"prompt": "hello"})
    detok = s.call("POST", "/detokenize", {"tokens": [1, 2]})
    assert tok.json() == {"worker": B, "path": "/tokenize", "got": {"prompt": "hello"}}
    assert detok.json() == {"worker": B, "path": "/detokenize", "got": {"tokens": [1, 2]}}
    assert s.fake.client_requests() == [(B, "POST", "/tokenize"), (B, "POST", "/detokenize")]
    assert s.decisions() == {}


def test_requests_naming_the_same_unknown_id_at_once_share_one_probe():
    s = Setup()
    rid = s.post({"input": "Hi"}).headers[C.RESPONSE_ID_HEADER]  # held by A
    s.affinity.forget(rid)  # as a fresh router

    async def three() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=s.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as c:
            return await asyncio.gather(*(
                c.get(f"{C.RESPONSES_PATH}/{rid}", headers={CLIENT: "1"}) for _ in range(3)
            ))  # fmt: skip

    got = asyncio.run(three())
    assert [(r.status_code, r.json()["worker"]) for r in got] == [(200, A)] * 3
    assert sorted(w for w, _, _ in s.fake.probes()) == [A, B]  # one probe: each worker once


def test_tokenize_for_an_adapter_goes_to_a_worker_that_has_it():
    s = Setup()
    for url in (A, B):
        s.pool.workers[url].base_models = {"base"}
    s.pool.workers[B].adapters = {"my-lora"}
    s.pool.workers[B].in_flight = 5  # least-load alone would pick A
    tok = s.call("POST", "/tokenize", {"model": "my-lora", "prompt": "hello"})
    assert tok.json()["worker"] == B
    assert s.decisions() == {}  # not a routing decision
