"""P/D disaggregation: one request sent to a prefill server and a decode server at once.

The prefill server computes the prompt and sends its KV pages to the decode server, which
generates the rest. Both get the client's request unchanged plus two headers: the prefill
server's bootstrap address (`host:port`, where the decode server fetches the KV from) and
a fresh random room (the transfer's id; choice j of an n > 1 request uses room + j). The
prefill server is chosen by the policy (its prefix cache is where the prompt's KV is), the
decode server by least load (`choose_for_adapters` on both sides for LoRA requests).

The decode server's response is the client's (`PassthroughResponse`, as without P/D). The
prefill server's answer (HTTP 200 and the first token) is read to its end and dropped. Until
the decode server's headers and first chunk arrive, the prefill request can still fail the
pair; the decode request is then closed (the decode server aborts it and frees its pages):
- a refused or reset connection, or a 503: the prefill server is taken out, and the pair is
  tried once more with another prefill server (a new room), else the router answers 502;
- any other status >= 400 (e.g. 400 for an invalid request): that response is the client's.
A decode server failing before its first chunk (connection, 503) is taken out and the pair
is tried once more with another decode server (a new room, so a new prefill request too),
else 502; its 4xx is the client's answer like any response. Once the decode response is
committed, a prefill failure is only logged. When the decode response closes before its end
(the client went away, the decode server failed mid-stream), the prefill request is closed
too; after its end, the prefill request is given `PREFILL_GRACE_S` to finish.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import httpx

from sluice.runtime.constants import DISAGG_BOOTSTRAP_HEADER, DISAGG_ROOM_HEADER
from sluice.runtime.router.metrics import RouterMetrics
from sluice.runtime.router.policies import Decision, LeastLoad, Policy, choose_for_adapters
from sluice.runtime.router.prefix_tree import Key
from sluice.runtime.router.proxy import (
    MAX_ATTEMPTS,
    Forwarder,
    Outgoing,
    RouterError,
    Unavailable,
    Upstream,
    error_reason,
)
from sluice.runtime.router.workers import Worker, WorkerPool

logger = logging.getLogger("sluice.router")

# rooms are drawn below this: room + j for the n choices of a request stays below 2**63
ROOM_END = 2**63 - 1000
PREFILL_GRACE_S = 30.0  # a prefill answer still open when its decode response has ended
PD_HEADERS = frozenset({DISAGG_BOOTSTRAP_HEADER.encode(), DISAGG_ROOM_HEADER.encode()})
SendFailure = (httpx.TransportError, Unavailable)


class _Failed(Exception):
    """One side of a pair failed before the decode server answered."""

    def __init__(self, pool: WorkerPool, worker: Worker, error: Exception) -> None:
        super().__init__(f"{worker.url}: {error_reason(error)}: {error}")
        self.pool, self.worker, self.error = pool, worker, error


def paired_request(req: Outgoing, bootstrap: str, room: int) -> Outgoing:
    """`req` with the pair's headers (any the client sent of that name are dropped)."""
    headers = [(k, v) for k, v in req.headers if k.lower() not in PD_HEADERS]
    headers += [
        (DISAGG_BOOTSTRAP_HEADER.encode(), bootstrap.encode()),
        (DISAGG_ROOM_HEADER.encode(), str(room).encode()),
    ]
    return Outgoing(req.method, req.path, headers, req.body)


class PDForwarder:
    def __init__(
        self,
        prefill: WorkerPool,
        decode: WorkerPool,
        bootstrap: dict[str, str],
        sender: Forwarder,
        policy: Policy,
        metrics: RouterMetrics,
    ) -> None:
        """`bootstrap`: each prefill server's URL -> its bootstrap `host:port`.
        `sender`: sends one request to one worker (its `send`; its client is the router's)."""
        self.prefill = prefill
        self.decode = decode
        self.bootstrap = bootstrap
        self.sender = sender
        self.policy = policy
        self.metrics = metrics
        self._least_load = LeastLoad()
        self._background: set[asyncio.Task[None]] = set()

    def pool_of(self, worker: Worker) -> WorkerPool:
        return self.prefill if self.prefill.workers.get(worker.url) is worker else self.decode

    async def open(
        self, req: Outgoing, key: Key, received_at: float, adapters: frozenset[str]
    ) -> Upstream:
        """The client's answer: the decode server's response, or the prefill server's when it
        refused the request (see the module docstring); raises `RouterError`."""
        failed: set[str] = set()
        last_error = ""
        for attempt in range(MAX_ATTEMPTS):
            prefill = self._choose(self.prefill, self.policy, failed, key, adapters)
            decode = self._choose(self.decode, self._least_load, failed, key, adapters)
            if prefill is None or decode is None:
                if attempt == 0:
                    side = "prefill" if prefill is None else "decode"
                    raise RouterError(503, f"No healthy {side} server to route to.",
                                      "no_worker", "no_worker")  # fmt: skip
                break
            self.metrics.on_decision(prefill)
            self.metrics.on_pair(prefill.worker, decode.worker)
            if attempt:
                self.metrics.retries.inc()
            try:
                upstream = await self._pair(prefill.worker, decode.worker, req)
            except _Failed as failure:
                reason = error_reason(failure.error)
                last_error = str(failure)
                self.metrics.on_upstream_error(failure.worker, reason)
                failure.pool.mark_down(failure.worker, f"request failed ({reason})")
                failed.add(failure.worker.url)
                continue
            upstream.received_at = received_at
            return upstream
        raise RouterError(
            502, f"Every prefill/decode pair tried failed before answering; last: {last_error}",
            "upstream_unavailable", "upstream",
        )  # fmt: skip

    def _choose(
        self,
        pool: WorkerPool,
        policy: Policy,
        failed: set[str],
        key: Key,
        adapters: frozenset[str],
    ) -> Decision | None:
        candidates = [w for w in pool.healthy() if w.url not in failed]
        if not candidates:
            return None
        return choose_for_adapters(policy, self._least_load, candidates, key, adapters)

    async def _pair(self, prefill: Worker, decode: Worker, req: Outgoing) -> Upstream:
        room = secrets.randbelow(ROOM_END)
        paired = paired_request(req, self.bootstrap[prefill.url], room)
        logger.debug("pair prefill=%s decode=%s room=%d", prefill.url, decode.url, room)
        prefill_task = asyncio.create_task(self._prefill(prefill, paired))
        decode_task = asyncio.create_task(self.sender.send(decode, paired))
        try:
            await asyncio.wait({prefill_task, decode_task}, return_when=asyncio.FIRST_COMPLETED)
            if prefill_task.done() and not _answered(decode_task):
                try:
                    refusal = prefill_task.result()
                except SendFailure as exc:
                    raise _Failed(self.prefill, prefill, exc) from exc
                if refusal is not None:
                    logger.info("prefill refused url=%s status=%d", prefill.url,
                                refusal.response.status_code)  # fmt: skip
                    await _discard(decode_task)
                    return refusal
            try:
                upstream = await decode_task
            except SendFailure as exc:
                raise _Failed(self.decode, decode, exc) from exc
            if upstream.response.status_code >= 400:  # refused: the prefill half is of no use
                await _discard(prefill_task)
                return upstream
        except BaseException:
            await _discard(decode_task)
            await _discard(prefill_task)
            raise
        upstream.on_close = _closer(prefill_task)
        task = asyncio.create_task(self._follow(prefill_task, prefill))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return upstream

    async def _prefill(self, worker: Worker, req: Outgoing) -> Upstream | None:
        """The prefill server's response when it refused the request (status >= 400), else
        None once its answer was read to the end and dropped."""
        upstream = await self.sender.send(worker, req)
        if upstream.response.status_code >= 400:
            return upstream
        try:
            async for _ in upstream.rest:
                pass
        finally:
            await upstream.aclose()
        return None

    async def _follow(self, prefill_task: asyncio.Task[Upstream | None], worker: Worker) -> None:
        """Log how the prefill request ended, once the decode response is the client's."""
        await asyncio.wait({prefill_task})
        if prefill_task.cancelled():
            return
        error = prefill_task.exception()
        if error is not None:
            logger.warning("prefill failed after the decode answered url=%s error=%r",
                           worker.url, error)  # fmt: skip
            if isinstance(error, SendFailure):
                self.metrics.on_upstream_error(worker, error_reason(error))
            return
        refusal = prefill_task.result()
        if refusal is not None:
            logger.warning("prefill refused after the decode answered url=%s status=%d",
                           worker.url, refusal.response.status_code)  # fmt: skip
            await refusal.aclose()


def _answered(task: asyncio.Task[Any]) -> bool:
    return task.done() and not task.cancelled() and task.exception() is None


async def _discard(task: asyncio.Task[Any]) -> None:
    """Cancel a send (its connection is closed) or close the response it opened."""
    task.cancel()
    await asyncio.wait({task})
    if _answered(task) and isinstance(task.result(), Upstream):
        await task.result().aclose()


def _closer(prefill_task: asyncio.Task[Upstream | None]) -> Callable[[Upstream], Awaitable[None]]:
    """The decode response's `on_close`: a response closed before its end (the client
    went away, the decode server failed) closes the prefill request too."""

    async def on_close(decode: Upstream) -> None:
        if prefill_task.done():
            return
        if decode.ended:
            asyncio.get_running_loop().call_later(PREFILL_GRACE_S, prefill_task.cancel)
            return
        prefill_task.cancel()
        await asyncio.wait({prefill_task})

    return on_close
