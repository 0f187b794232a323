"""Response affinity: which worker holds a stored response of the Responses API.

A worker keeps the responses it stored in its own memory, and names each one in the
`x-sluice-response-id` header of its answer to `POST /v1/responses` (JSON or SSE). The
router remembers, in a bounded map (least recently used ids forgotten beyond
`--response-affinity-size`), which worker that was. A request that names a stored response
(`POST /v1/responses` with `previous_response_id`, `GET`/`DELETE /v1/responses/{id}`) then
goes to that worker while it is healthy (`policies.pinned`).

When the map does not know the id (a restarted router, another router replica, an id
forgotten) or names a worker that is not healthy, the healthy workers are asked
`GET /v1/responses/{id}` at once, with the client's `Authorization` header, for at most
`--response-probe-timeout` seconds; the first to answer 200 holds it (and is remembered).
When none does, the request is routed as any other and the worker answers its own 404: a
worker that was lost took its stored responses with it.

A `DELETE` that succeeded forgets the id, and so does a 404 to a `GET`/`DELETE` from the
worker the map names (it no longer holds it, e.g. it restarted). Probes are not counted in
`sluice_router_requests_total` (like health probes).
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from urllib.parse import quote

import httpx

from sluice.runtime.constants import RESPONSE_ID_HEADER, RESPONSES_PATH
from sluice.runtime.router.workers import Worker, WorkerPool

logger = logging.getLogger("sluice.router")

DEFAULT_SIZE = 100_000
DEFAULT_PROBE_TIMEOUT_S = 1.0


def stored_response_path(response_id: str) -> str:
    """`/v1/responses/{id}`, the id quoted (it comes from the client: no `/` or `..` in it)."""
    return f"{RESPONSES_PATH}/{quote(response_id, safe='')}"


async def probe_holder(
    client: httpx.AsyncClient,
    workers: Sequence[Worker],
    response_id: str,
    authorization: str | None,
    timeout: float,
) -> Worker | None:
    """The first of `workers` to answer `GET /v1/responses/{id}` with 200 within `timeout`
    seconds (all asked at once; the others' requests are then cancelled), else None."""
    if not workers:
        return None
    path = stored_response_path(response_id)
    headers = {"authorization": authorization} if authorization else {}

    async def holds(worker: Worker) -> bool:
        request = client.build_request("GET", worker.url + path, headers=headers, timeout=timeout)
        try:
            response = await client.send(request, stream=True)
        except httpx.HTTPError as exc:
            logger.debug("response probe of %s failed: %r", worker.url, exc)
            return False
        await response.aclose()  # the body (the whole stored response) is not needed
        return response.status_code == 200

    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    asked = {asyncio.create_task(holds(w)): w for w in workers}
    pending: set[asyncio.Task[bool]] = set(asked)
    try:
        while pending:
            done, pending = await asyncio.wait(
                pending, timeout=max(0.0, deadline - loop.time()),
                return_when=asyncio.FIRST_COMPLETED,
            )  # fmt: skip
            if not done:
                return None  # timed out
            for task in done:
                if task.result():
                    return asked[task]
        return None
    finally:
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)


class ResponseAffinity:
    """The map from response id to worker URL, and finding the worker for an id."""

    def __init__(
        self, size: int = DEFAULT_SIZE, probe_timeout: float = DEFAULT_PROBE_TIMEOUT_S
    ) -> None:
        self.size = size
        self.probe_timeout = probe_timeout
        self._urls: OrderedDict[str, str] = OrderedDict()
        self._probing: dict[tuple[str, str | None], asyncio.Future[Worker | None]] = {}

    def __len__(self) -> int:
        return len(self._urls)

    def get(self, response_id: str) -> str | None:
        url = self._urls.get(response_id)
        if url is not None:
            self._urls.move_to_end(response_id)
        return url

    def remember(self, response_id: str, url: str) -> None:
        self._urls[response_id] = url
        self._urls.move_to_end(response_id)
        while len(self._urls) > self.size:
            self._urls.popitem(last=False)

    def forget(self, response_id: str) -> None:
        self._urls.pop(response_id, None)

    async def holder(
        self,
        response_id: str,
        pool: WorkerPool,
        client: httpx.AsyncClient,
        authorization: str | None,
    ) -> Worker | None:
        """The healthy worker holding `response_id`: the one the map names, else the one the
        probe finds (remembered); None when no healthy worker holds it."""
        url = self.get(response_id)
        worker = pool.workers.get(url) if url is not None else None
        if worker is not None and worker.healthy:
            return worker
        # requests naming the same unknown id at once (with the same credentials) share one
        # probe, shielded: a client that leaves does not cancel it for the others
        key = (response_id, authorization)
        probe = self._probing.get(key)
        if probe is None:
            probe = asyncio.ensure_future(
                probe_holder(client, pool.healthy(), response_id, authorization, self.probe_timeout)
            )
            self._probing[key] = probe
            probe.add_done_callback(lambda _: self._probing.pop(key, None))
        worker = await asyncio.shield(probe)
        if worker is not None:
            self.remember(response_id, worker.url)
        logger.debug("response %s: map had %s, probe found %s", response_id, url,
                     worker.url if worker else None)  # fmt: skip
        return worker

    def learn(
        self, method: str, response_id: str | None, worker: Worker, response: httpx.Response
    ) -> None:
        """Take in a worker's answer to a /v1/responses request (`response_id`: the stored
        response the request named, if any)."""
        stored = response.headers.get(RESPONSE_ID_HEADER)
        if stored and method == "POST":
            self.remember(stored, worker.url)
        if response_id is None or method not in ("GET", "DELETE"):
            return
        deleted = method == "DELETE" and response.status_code == 200
        stale = response.status_code == 404 and self._urls.get(response_id) == worker.url
        if deleted or stale:
            self.forget(response_id)
