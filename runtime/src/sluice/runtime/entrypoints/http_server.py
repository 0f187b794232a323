"""The HTTP API's app: OpenAI's /v1 routes (completions, chat completions, the Responses
API with its stored responses), vLLM's /tokenize and /detokenize, the native /generate and
/abort_request, the LoRA routes, /health, /health/live and /server_info (each route in a serving module of its
own, over `serving_base`), the middleware in front of them, and the error handlers that
answer in OpenAI's shape.

`build_app(tm, args)` returns the FastAPI app.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from sluice.runtime.constants import (
    HEALTH_PATH,
    LIVE_PATH,
    METRICS_PATH,
    RESPONSES_PATH,
    SERVER_INFO_PATH,
)
from sluice.runtime.disconnect import ClientGone
from sluice.runtime.entrypoints import openapi_doc
from sluice.runtime.entrypoints.api_config import ApiConfig
from sluice.runtime.entrypoints.errors import ProtocolError, error_body
from sluice.runtime.entrypoints.http_guards import ApiKeyMiddleware, BodyLimitMiddleware
from sluice.runtime.entrypoints.lora_api import LoraAdapters
from sluice.runtime.entrypoints.responses_store import ResponseStore
from sluice.runtime.entrypoints.serving_admin import ServingAdmin
from sluice.runtime.entrypoints.serving_base import ServingContext, TokenizerManagerLike
from sluice.runtime.entrypoints.serving_chat import ServingChat
from sluice.runtime.entrypoints.serving_completions import ServingCompletions
from sluice.runtime.entrypoints.serving_generate import ServingGenerate
from sluice.runtime.entrypoints.serving_responses import ServingResponses
from sluice.runtime.entrypoints.serving_tokenize import ServingTokenize

logger = logging.getLogger("sluice.http")

OPEN_PATHS = frozenset({HEALTH_PATH, LIVE_PATH, METRICS_PATH})  # no API key: probes, scrapes


def build_app(
    tm: TokenizerManagerLike,
    flags: Any,
    metrics_handler: Callable[[], Awaitable[Response]] | None = None,
) -> FastAPI:
    """The FastAPI app over a TokenizerManager (or anything with its interface), for the
    server's parsed flags (`flags`: the app keeps `ApiConfig.of` them, and shows the rest,
    but the API key, on /server_info).

    `metrics_handler`: the coroutine serving GET /metrics (Prometheus text, no API key); a
    later issue supplies it. Without one there is no /metrics route.
    """
    args = ApiConfig.of(flags)
    shown = {k: v for k, v in dataclasses.asdict(flags).items() if k != "api_key"}
    ctx = ServingContext(tm, args, LoraAdapters(tm, args), shown)
    admin = ServingAdmin(ctx)
    responses = ServingResponses(
        ctx, ResponseStore(args.responses_store_size, args.responses_store_ttl)
    )
    tokenize = ServingTokenize(ctx)
    app = FastAPI(
        title="sluice", docs_url=None, redoc_url=None, openapi_url=openapi_doc.OPENAPI_PATH
    )
    openapi_doc.install(app, vocab_size=tm.vocab_size)
    app.add_api_route("/v1/models", admin.models, methods=["GET"])
    for path, handler in (
        ("/v1/completions", ServingCompletions(ctx).handle),
        ("/v1/chat/completions", ServingChat(ctx).handle),
        ("/generate", ServingGenerate(ctx).handle),
        (RESPONSES_PATH, responses.create),
        ("/tokenize", tokenize.tokenize),
        ("/detokenize", tokenize.detokenize),
        ("/abort_request", admin.abort_request),
        ("/v1/load_lora_adapter", ctx.lora.load),
        ("/v1/unload_lora_adapter", ctx.lora.unload),
    ):
        app.add_api_route(
            path, handler, methods=["POST"], openapi_extra=openapi_doc.request_body(path)
        )
    app.add_api_route(RESPONSES_PATH + "/{response_id}", responses.retrieve, methods=["GET"])
    app.add_api_route(RESPONSES_PATH + "/{response_id}", responses.delete, methods=["DELETE"])
    app.add_api_route(
        RESPONSES_PATH + "/{response_id}/input_items", responses.input_items, methods=["GET"]
    )
    app.add_api_route(RESPONSES_PATH + "/{response_id}/cancel", responses.cancel, methods=["POST"])
    app.add_api_route(HEALTH_PATH, admin.health, methods=["GET"])
    app.add_api_route(LIVE_PATH, admin.live, methods=["GET"])
    app.add_api_route(SERVER_INFO_PATH, admin.server_info, methods=["GET"])
    if metrics_handler is not None:
        app.add_api_route(METRICS_PATH, metrics_handler, methods=["GET"])
    _install_error_handlers(app)
    # the last added runs first: an unauthorized client never makes the server buffer a body
    app.add_middleware(BodyLimitMiddleware, limit=args.max_request_body_bytes)
    if args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=args.api_key, open_paths=OPEN_PATHS)
    return app


def _install_error_handlers(app: FastAPI) -> None:
    """Every error in OpenAI's shape; a client gone mid-request is logged and gets 499."""

    @app.exception_handler(ProtocolError)
    async def _refused(request: Request, exc: ProtocolError) -> Response:
        if exc.status < 500:
            logger.info(
                "request rejected path=%s status=%d why=%s", request.url.path, exc.status, exc
            )
        return JSONResponse(exc.body(), exc.status, headers=exc.headers)

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone) -> Response:
        logger.info("request aborted path=%s reason=client-gone", request.url.path)
        return Response(status_code=499)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        err = (exc.errors() or [{"loc": (), "msg": "invalid request"}])[0]
        loc = ".".join(str(part) for part in err["loc"])
        return JSONResponse(error_body(f"{loc}: {err['msg']}", code="invalid_value"), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        body = error_body(str(exc.detail), type=kind)
        return JSONResponse(body, exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error path=%s", request.url.path)
        body = error_body("Internal server error.", type="server_error", code="internal_error")
        return JSONResponse(body, 500)
