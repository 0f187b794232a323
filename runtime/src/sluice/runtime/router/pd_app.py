"""The router's HTTP front in P/D mode (`--pd-disaggregation`): `app.py`'s routes, with
the generation routes sent to a prefill/decode pair (`pd.py`).

- `POST /v1/completions`, `/v1/chat/completions`, `/generate`: to a prefill server and a
  decode server at once; the client gets the decode server's response.
- `/v1/responses` and its stored-response routes: 501 (a stored response lives on one
  server, and P/D splits a request over two; not built yet).
- `GET /v1/models`, `POST /tokenize`, `/detokenize`: to the least-loaded healthy decode server.
- `GET /health`: 200 while at least one prefill and one decode server are healthy, else
  503 naming the side that has none.
- `GET /workers`: both pools, each worker with its `role` (prefill, decode); a prefill
  server with its `bootstrap` address.
"""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from sluice.runtime.constants import RESPONSES_PATH
from sluice.runtime.disconnect import ClientGone, unless_disconnected
from sluice.runtime.router.app import (
    RouterApp,
    client_gone,
    error_response,
    outgoing_of,
    worker_info,
)
from sluice.runtime.router.keys import request_route
from sluice.runtime.router.metrics import RouterMetrics
from sluice.runtime.router.pd import PDForwarder
from sluice.runtime.router.proxy import Forwarder, PassthroughResponse, RouterError

ROLE_PREFILL = "prefill"
ROLE_DECODE = "decode"


def responses_unsupported() -> RouterError:
    return RouterError(
        501, "The Responses API is not supported behind a P/D router yet.",
        "not_implemented", "unsupported",
    )  # fmt: skip


class PDRouterApp(RouterApp):
    """`RouterApp` whose routed requests go to a pair; its own pool (for /v1/models,
    /tokenize) is the decode pool."""

    def __init__(self, pd: PDForwarder, forwarder: Forwarder, metrics: RouterMetrics) -> None:
        """`forwarder`: the decode pool's, for the routes one decode server answers."""
        super().__init__(pd.decode, pd.policy, forwarder, metrics)
        self.pd = pd

    async def routed(self, request: Request) -> Response:
        path = request.url.path
        if path == RESPONSES_PATH:
            return error_response(self.metrics, path, responses_unsupported())
        body = await request.body()
        received_at = time.perf_counter()
        route = request_route(path, body)
        adapters = self.pd.prefill.adapters_wanted(route.model, route.adapters)
        opening = self.pd.open(outgoing_of(request, body), route.key, received_at, adapters)
        try:
            upstream = await unless_disconnected(request, opening)
        except ClientGone:
            return client_gone(path)
        except RouterError as err:
            return error_response(self.metrics, path, err)
        pool = self.pd.pool_of(upstream.worker)
        return PassthroughResponse(upstream, self.metrics, pool)  # type: ignore[return-value]

    async def stored_response(self, request: Request) -> Response:
        return error_response(self.metrics, request.url.path, responses_unsupported())

    async def health(self, request: Request) -> Response:
        prefill, decode = len(self.pd.prefill.healthy()), len(self.pd.decode.healthy())
        missing = [role for role, n in ((ROLE_PREFILL, prefill), (ROLE_DECODE, decode)) if not n]
        status = "ok" if not missing else " and ".join(f"no healthy {r} server" for r in missing)
        body = {"status": status, "healthy_prefill": prefill, "healthy_decode": decode,
                "prefill": len(self.pd.prefill.workers), "decode": len(self.pd.decode.workers)}  # fmt: skip
        return JSONResponse(body, 503 if missing else 200)

    async def workers(self, request: Request) -> Response:
        prefill = [
            {**worker_info(w), "role": ROLE_PREFILL, "bootstrap": self.pd.bootstrap[w.url]}
            for w in self.pd.prefill.workers.values()
        ]
        decode = [{**worker_info(w), "role": ROLE_DECODE} for w in self.pd.decode.workers.values()]
        return JSONResponse(
            {"policy": self.policy.name, "decode_policy": "least-load", "workers": prefill + decode}
        )
