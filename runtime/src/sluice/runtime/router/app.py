"""The router's HTTP front: OpenAI's routes and /generate forwarded to a worker, and the
router's own /health, /liveness, /metrics and /workers.

- `POST /v1/completions`, `/v1/chat/completions`, `/generate`, `/v1/responses`: routed by
  the policy (with adapter affinity for a request naming a LoRA adapter, see `policies.py`;
  a `/v1/responses` request with a `previous_response_id` goes to the worker holding that
  response, see `responses.py`).
- `GET`, `DELETE /v1/responses/{id}`, `GET /v1/responses/{id}/input_items`, `POST
  /v1/responses/{id}/cancel`: to the worker
  holding the response (response affinity, a routing decision); when none does, to the
  least-loaded healthy worker, which answers its 404.
- `GET /v1/models`, `POST /tokenize`, `/detokenize`: forwarded to the least-loaded healthy
  worker (not a routing decision).
- `GET /health`: 200 while at least one worker is healthy, else 503 (readiness).
- `GET /liveness`: 200 while the process serves (a router with no worker is still alive).
- `GET /metrics`: the router's Prometheus metrics (see `metrics.py`).
- `GET /workers`: the pool as JSON (url, source, healthy, in_flight, tree size, adapters, why down).

The client's `Authorization` header travels to the worker, so an API key is checked where it
is configured: on the workers.

P/D mode (`--pd-disaggregation`) serves the same routes with `pd_app.PDRouterApp`: the
generation routes go to a prefill/decode pair, the others to the decode servers.
"""

from __future__ import annotations

import logging
import time
from typing import Any, TypeVar

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sluice.runtime.constants import (
    HEALTH_PATH,
    METRICS_PATH,
    RESPONSES_PATH,
    ROUTER_LIVENESS_PATH,
    ROUTER_WORKERS_PATH,
    TOKENIZE_PATHS,
)
from sluice.runtime.disconnect import ClientGone, unless_disconnected
from sluice.runtime.router.keys import RequestRoute, request_route
from sluice.runtime.router.metrics import RouterMetrics
from sluice.runtime.router.policies import LeastLoad, Policy
from sluice.runtime.router.proxy import (
    Forwarder,
    Outgoing,
    PassthroughResponse,
    RouterError,
    Upstream,
    forwarded_headers,
)
from sluice.runtime.router.responses import ResponseAffinity
from sluice.runtime.router.workers import Worker, WorkerPool

logger = logging.getLogger("sluice.router")
T = TypeVar("T")
ROUTED_PATHS = ("/v1/completions", "/v1/chat/completions", "/generate", RESPONSES_PATH)
ANY_WORKER_PATHS = (("/v1/models", "GET"), *((p, "POST") for p in TOKENIZE_PATHS))


class RouterApp:
    def __init__(
        self,
        pool: WorkerPool,
        policy: Policy,
        forwarder: Forwarder,
        metrics: RouterMetrics,
        affinity: ResponseAffinity | None = None,
    ) -> None:
        self.pool = pool
        self.policy = policy
        self.forwarder = forwarder
        self.metrics = metrics
        self.affinity = affinity if affinity is not None else ResponseAffinity()
        self._any_policy = LeastLoad()

    async def forward(
        self, request: Request, policy: Policy, routed: bool, response_id: str | None = None
    ) -> Response:
        """`routed`: read the body for the routing key (else least-load's choice, uncounted).
        `response_id`: the stored response the request names (GET/DELETE's path); a routed
        /v1/responses body's `previous_response_id` counts as one too."""
        body = await request.body()
        received_at = time.perf_counter()
        path = request.url.path
        # /tokenize names a model too: a LoRA adapter's tokenization goes where it is loaded
        route = request_route(path, body) if routed or path in TOKENIZE_PATHS else RequestRoute()
        response_id = response_id or route.previous_response_id
        adapters = self.pool.adapters_wanted(route.model, route.adapters)
        outgoing = outgoing_of(request, body)

        async def open_upstream() -> Upstream:
            pin = None
            if response_id is not None:
                auth = request.headers.get("authorization")
                holder = await self.affinity.holder(
                    response_id, self.pool, self.forwarder.client, auth
                )
                pin = holder.url if holder is not None else None
            return await self.forwarder.open(
                outgoing, policy, route.key, routed, received_at, adapters, pin
            )

        try:
            upstream = await unless_disconnected(request, open_upstream())
        except ClientGone:
            return client_gone(path)
        except RouterError as err:
            return error_response(self.metrics, path, err)
        if path == RESPONSES_PATH or response_id is not None:
            self.affinity.learn(request.method, response_id, upstream.worker, upstream.response)
        return PassthroughResponse(upstream, self.metrics, self.pool)  # type: ignore[return-value]

    async def routed(self, request: Request) -> Response:
        return await self.forward(request, self.policy, routed=True)

    async def stored_response(self, request: Request) -> Response:
        response_id = request.path_params["response_id"]
        return await self.forward(request, self._any_policy, routed=False, response_id=response_id)

    async def any_worker(self, request: Request) -> Response:
        return await self.forward(request, self._any_policy, routed=False)

    async def health(self, request: Request) -> Response:
        healthy = len(self.pool.healthy())
        body = {"status": "ok" if healthy else "no healthy worker", "healthy_workers": healthy,
                "workers": len(self.pool.workers)}  # fmt: skip
        return JSONResponse(body, 200 if healthy else 503)

    async def liveness(self, request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def metrics_route(self, request: Request) -> Response:
        payload, content_type = self.metrics.render()
        return Response(payload, media_type=content_type)

    async def workers(self, request: Request) -> Response:
        workers = [worker_info(w) for w in self.pool.workers.values()]
        return JSONResponse({"policy": self.policy.name, "workers": workers})


def worker_info(w: Worker) -> dict[str, Any]:
    """One worker as `GET /workers` lists it."""
    return {
        "url": w.url,
        "source": w.source,
        "healthy": w.healthy,
        "in_flight": w.in_flight,
        "tree_characters": w.tree.size,
        "adapters": sorted(w.adapters),
        "down_reason": None if w.healthy else w.down_reason,
    }


def outgoing_of(request: Request, body: bytes) -> Outgoing:
    """The client's request as it is sent on to a worker."""
    query = request.url.query
    return Outgoing(
        method=request.method,
        path=request.url.path + (f"?{query}" if query else ""),
        headers=forwarded_headers(request.headers.raw),
        body=body,
    )


def client_gone(path: str) -> Response:
    logger.info("request aborted path=%s reason=client-gone-before-response", path)
    return Response(status_code=499)


def error_response(metrics: RouterMetrics, path: str, err: RouterError) -> Response:
    """The router's own answer to a request it could not forward, counted and logged."""
    metrics.failed.labels(err.reason).inc()
    logger.warning("request failed path=%s status=%d why=%s", path, err.status, err)
    return JSONResponse(err.body(), err.status)


async def _not_found(request: Request, exc: Exception) -> Response:
    body = {"error": {"message": f"No route {request.method} {request.url.path} on the router.",
                      "type": "invalid_request_error", "param": None, "code": "not_found"}}  # fmt: skip
    return JSONResponse(body, 404)


async def _method_not_allowed(request: Request, exc: Exception) -> Response:
    body = {"error": {"message": f"{request.method} is not allowed on {request.url.path}.",
                      "type": "invalid_request_error", "param": None, "code": "method_not_allowed"}}  # fmt: skip
    return JSONResponse(body, 405)


def build_router_app(router: RouterApp, lifespan: Any = None) -> Starlette:
    routes = [Route(p, router.routed, methods=["POST"]) for p in ROUTED_PATHS]
    routes += [Route(p, router.any_worker, methods=[method]) for p, method in ANY_WORKER_PATHS]
    routes += [
        Route(RESPONSES_PATH + "/{response_id}", router.stored_response, methods=["GET", "DELETE"]),
        Route(
            RESPONSES_PATH + "/{response_id}/input_items", router.stored_response, methods=["GET"]
        ),
        Route(RESPONSES_PATH + "/{response_id}/cancel", router.stored_response, methods=["POST"]),
        Route(HEALTH_PATH, router.health, methods=["GET"]),
        Route(ROUTER_LIVENESS_PATH, router.liveness, methods=["GET"]),
        Route(METRICS_PATH, router.metrics_route, methods=["GET"]),
        Route(ROUTER_WORKERS_PATH, router.workers, methods=["GET"]),
    ]
    return Starlette(
        routes=routes,
        exception_handlers={404: _not_found, 405: _method_not_allowed},
        lifespan=lifespan,
    )
