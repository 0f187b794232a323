"""A P/D router built from its flags (`Router.build`) in front of two fake servers (small
Starlette apps served by uvicorn in threads): it probes both pools' /health, reports ready
once each side has a healthy server, and pairs a request with the bootstrap address from
`--prefill URL PORT`."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from typing import Any

import uvicorn
from router_testkit import wait_until
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from sluice.runtime import constants as C
from sluice.runtime.constants import METRIC_ROUTER_PD_PAIRS_TOTAL
from sluice.runtime.router.args import RouterArgs
from sluice.runtime.router.server import Router


def fake_server(role: str, seen: list[dict[str, Any]]) -> Starlette:
    """A server of `role` that is healthy, lists one model and answers completions with
    what it was told (the headers P/D adds)."""

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def models(request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [{"id": "m", "root": "m"}]})

    async def completions(request: Request) -> JSONResponse:
        told = {"role": role, "bootstrap": request.headers.get(C.DISAGG_BOOTSTRAP_HEADER),
                "room": request.headers.get(C.DISAGG_ROOM_HEADER)}  # fmt: skip
        seen.append(told)
        return JSONResponse(told)

    return Starlette(routes=[Route(C.HEALTH_PATH, health), Route("/v1/models", models),
                             Route("/v1/completions", completions, methods=["POST"])])  # fmt: skip


@contextlib.contextmanager
def serving(app: Starlette, host: str = "127.0.0.1") -> Iterator[str]:
    """`app` served on a free port of `host` (any 127.x.y.z: a pod's own address)."""
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: server.started, "the fake server to start", timeout=10)
        yield f"http://{host}:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


def test_a_p_d_router_probes_both_pools_and_pairs_a_request():
    seen: list[dict[str, Any]] = []
    with (
        serving(fake_server("prefill", seen)) as prefill,
        serving(fake_server("decode", seen)) as decode,
    ):
        args = RouterArgs(pd_disaggregation=True, prefill=(prefill, "9100"), decode=(decode,),
                          health_interval=0.2, retry_backoff_initial=0.2)  # fmt: skip
        args.validate()
        router = Router.build(args)
        with TestClient(router.app) as client:
            wait_until(lambda: client.get(C.HEALTH_PATH).status_code == 200, "both sides healthy")
            resp = client.post("/v1/completions", json={"prompt": "p", "max_tokens": 2})
            assert resp.status_code == 200 and resp.headers[C.ROUTER_WORKER_HEADER] == decode
            answer = resp.json()
            assert answer["role"] == "decode" and answer["bootstrap"] == "127.0.0.1:9100"
            wait_until(lambda: len(seen) == 2, "the prefill request too")
            assert {s["room"] for s in seen} == {answer["room"]}
            workers = client.get(C.ROUTER_WORKERS_PATH).json()["workers"]
            assert [(w["url"], w["role"], w["healthy"]) for w in workers] == [
                (prefill, "prefill", True), (decode, "decode", True)]  # fmt: skip
            metrics = client.get(C.METRICS_PATH).text
            assert f'{C.METRIC_ROUTER_WORKER_HEALTHY}{{worker="{prefill}"}} 1.0' in metrics
            assert f'{C.METRIC_ROUTER_WORKER_HEALTHY}{{worker="{decode}"}} 1.0' in metrics
            assert (
                f'{METRIC_ROUTER_PD_PAIRS_TOTAL}{{decode="{decode}",prefill="{prefill}"}} 1.0'
                in metrics
            )
