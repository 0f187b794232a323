"""Forwarding one request to a worker and its response back, unchanged.

`Forwarder.open` chooses a worker (the one a request is pinned to, see `responses.py`, else
by the policy), sends the request, and waits for the response headers and the first chunk
of the body. Anything that fails before that first chunk (a refused or reset connection,
a 503 from a starting or draining worker, a worker that dies while a non-streamed response
is being computed, no response headers within `--request-timeout`) takes the worker out and
the request is sent once more to another worker. After the first chunk the response is
committed to that worker.

`PassthroughResponse` then sends the worker's status, headers and body bytes as they arrive
(no buffering: each chunk read from the worker is written to the client at once). If the
client goes away, the upstream response is closed, which closes the connection to the
worker; the worker treats that as a client disconnect and aborts the request (its slot and
KV pages go back to the pool). If the worker fails mid-stream, an SSE stream gets an error
event in OpenAI's shape and ends; any other body just ends (the client sees it truncated).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import httpx

from sluice.runtime.constants import ROUTER_WORKER_HEADER
from sluice.runtime.router.metrics import RouterMetrics
from sluice.runtime.router.policies import (
    REASON_RESPONSE_AFFINITY,
    Decision,
    LeastLoad,
    Policy,
    choose_for_adapters,
    pinned,
)
from sluice.runtime.router.prefix_tree import Key
from sluice.runtime.router.workers import Worker, WorkerPool

logger = logging.getLogger("sluice.router")

MAX_ATTEMPTS = 2  # the first worker and one retry
HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
        "trailer", "transfer-encoding", "upgrade", "host", "content-length",
    }
)  # fmt: skip
RESPONSE_DROPPED = HOP_BY_HOP - {"content-length"} | {"date", "server"}


class RouterError(Exception):
    """The router answers the request itself, with this status and OpenAI-shaped body."""

    def __init__(self, status: int, message: str, code: str, reason: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.reason = reason  # sluice_router_failed_requests_total{reason}

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": str(self),
                "type": "server_error",
                "param": None,
                "code": self.code,
            }
        }


@dataclass(frozen=True)
class Outgoing:
    method: str
    path: str  # with the query string
    headers: list[tuple[bytes, bytes]]
    body: bytes


@dataclass
class Upstream:
    """A worker's response whose headers and first chunk have arrived."""

    worker: Worker
    response: httpx.Response
    first: bytes
    rest: AsyncIterator[bytes]
    received_at: float = 0.0  # perf_counter: the router had the client's request
    worker_time: float = 0.0  # seconds from sending to the worker to its first byte
    ended: bool = False  # the body was relayed to its end (set by PassthroughResponse)
    # P/D (`pd.py`): ends the prefill request paired with this decode response
    on_close: Callable[[Upstream], Awaitable[None]] | None = None
    _closed: bool = False

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.worker.in_flight -= 1
        try:
            await self.response.aclose()  # unread: the connection is closed, not pooled
        finally:
            if self.on_close is not None:
                await self.on_close(self)

    @property
    def is_event_stream(self) -> bool:
        return self.response.headers.get("content-type", "").startswith("text/event-stream")


class Unavailable(Exception):
    """A worker answered 503 (starting or draining): it is out, the request goes elsewhere."""


def forwarded_headers(raw: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in raw if k.lower().decode("latin-1") not in HOP_BY_HOP]


class Forwarder:
    def __init__(
        self,
        pool: WorkerPool,
        client: httpx.AsyncClient,
        metrics: RouterMetrics,
        request_timeout: float = 0.0,
    ) -> None:
        self.pool = pool
        self.client = client
        self.metrics = metrics
        self.request_timeout = request_timeout or None
        self._adapter_fallback = LeastLoad()

    async def open(
        self,
        req: Outgoing,
        policy: Policy,
        key: Key,
        count: bool = True,
        received_at: float | None = None,
        adapters: frozenset[str] = frozenset(),
        pin: str | None = None,
    ) -> Upstream:
        """`count`: record the routing decision (generation routes) or not (/v1/models);
        a response-affinity decision is always recorded.
        `received_at`: `time.perf_counter()` when the router had the request's body.
        `adapters`: the LoRA adapters the request needs (adapter affinity, `policies.py`).
        `pin`: the URL of the worker holding the stored response the request names; it
        gets the request while it is a candidate (a retry goes by the policy: the worker
        it reaches answers 404 for a response it does not hold)."""
        received_at = time.perf_counter() if received_at is None else received_at
        tried: set[str] = set()
        last_error = ""
        for attempt in range(MAX_ATTEMPTS):
            candidates = [w for w in self.pool.healthy() if w.url not in tried]
            if not candidates:
                break
            decision: Decision = pinned(candidates, pin) or choose_for_adapters(
                policy, self._adapter_fallback, candidates, key, adapters
            )
            if count or decision.reason == REASON_RESPONSE_AFFINITY:
                self.metrics.on_decision(decision)
            if attempt:
                self.metrics.retries.inc()
            worker = decision.worker
            tried.add(worker.url)
            try:
                upstream = await self.send(worker, req)
                upstream.received_at = received_at
                return upstream
            except (httpx.TransportError, Unavailable) as exc:
                reason = error_reason(exc)
                last_error = f"{worker.url}: {reason}: {exc}"
                self.metrics.on_upstream_error(worker, reason)
                self.pool.mark_down(worker, f"request failed ({reason})")
        if not tried:
            raise RouterError(503, "No healthy worker to route to.", "no_worker", "no_worker")
        raise RouterError(
            502, f"Every worker tried failed before answering; last: {last_error}",
            "upstream_unavailable", "upstream",
        )  # fmt: skip

    async def send(self, worker: Worker, req: Outgoing) -> Upstream:
        """`req` to `worker`, counted in its in-flight requests until the `Upstream` closes;
        raises `httpx.TransportError` (a `--request-timeout` past: `httpx.ReadTimeout`) or
        `Unavailable` when it fails before the first chunk of the body."""
        worker.in_flight += 1
        self.metrics.on_sent(worker)
        request = self.client.build_request(
            req.method, worker.url + req.path, headers=req.headers, content=req.body
        )
        response: httpx.Response | None = None
        sent_at = time.perf_counter()
        try:
            send = self.client.send(request, stream=True)
            try:
                response = await asyncio.wait_for(send, self.request_timeout)
            except TimeoutError as exc:
                raise httpx.ReadTimeout("no response headers within --request-timeout") from exc
            if response.status_code == 503:
                body = (await response.aread())[:200].decode(errors="replace")
                raise Unavailable(f"HTTP 503 {body}")
            rest = response.aiter_raw()
            first = await anext(rest, b"")
            return Upstream(
                worker, response, first, rest, worker_time=time.perf_counter() - sent_at
            )
        except BaseException:
            worker.in_flight -= 1
            if response is not None:
                await response.aclose()
            raise


def error_reason(exc: Exception) -> str:
    if isinstance(exc, Unavailable):
        return "unavailable"
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "connect"
    return "read"


class PassthroughResponse:
    """ASGI response streaming an `Upstream` to the client (see the module docstring)."""

    def __init__(self, upstream: Upstream, metrics: RouterMetrics, pool: WorkerPool) -> None:
        self.upstream = upstream
        self.metrics = metrics
        self.pool = pool

    def _headers(self) -> list[tuple[bytes, bytes]]:
        headers = [
            (k, v)
            for k, v in self.upstream.response.headers.raw
            if k.lower().decode("latin-1") not in RESPONSE_DROPPED
        ]
        headers.append((ROUTER_WORKER_HEADER.encode(), self.upstream.worker.url.encode()))
        return headers

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        up = self.upstream
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": up.response.status_code,
                    "headers": self._headers(),
                }
            )
            async with anyio.create_task_group() as tg:

                async def stream() -> None:
                    try:
                        await self._stream(send)
                    except OSError:  # the client went away mid-send
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                while (await receive())["type"] != "http.disconnect":
                    pass
                tg.cancel_scope.cancel()  # the client is gone: stop, close upstream
        finally:
            await up.aclose()

    async def _stream(self, send: Any) -> None:
        up = self.upstream
        if up.first:
            await send({"type": "http.response.body", "body": up.first, "more_body": True})
        self.metrics.overhead.observe(
            max(0.0, time.perf_counter() - up.received_at - up.worker_time)
        )
        try:
            async for chunk in up.rest:
                if chunk:
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
            up.ended = True
        except httpx.TransportError as exc:
            logger.warning("worker failed mid-response url=%s error=%r", up.worker.url, exc)
            self.metrics.failed.labels("mid_stream").inc()
            self.metrics.on_upstream_error(up.worker, "read")
            self.pool.mark_down(up.worker, "failed mid-response")
            if up.is_event_stream:
                error = RouterError(502, f"The worker failed mid-stream: {exc!r}", "upstream_failed",
                                    "mid_stream")  # fmt: skip
                event = f"data: {json.dumps(error.body())}\n\n".encode()
                await send({"type": "http.response.body", "body": event, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
