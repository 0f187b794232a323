"""The HTTP API: OpenAI's /v1 routes, the native /generate, /health and /server_info.

`build_app(tm, args)` returns the FastAPI app. Handlers are thin: parse and validate the
body (`openai_protocol`), tokenize, start one `tm.generate` per choice, then either collect
the chunks into one response or stream them as server-sent events (`data: {...}` lines,
ending with `data: [DONE]`).

A client that goes away aborts its requests: a streaming response listens for the
disconnect and closes its generators; a non-streaming handler races the generation against
`http.disconnect`. Closing a `tm.generate` iterator sends the scheduler an abort.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from sluice.runtime import constants as C
from sluice.runtime.entrypoints import openai_protocol as P
from sluice.runtime.entrypoints import openai_responses as R
from sluice.runtime.entrypoints.streaming import (
    SSE_DONE,
    ChatEvents,
    ChoiceStreams,
    Chunk,
    ClientGone,
    Collected,
    CompletionEvents,
    EventFormat,
    GenerateEvents,
    SSEResponse,
    as_protocol_error,
    sse_event,
    unless_disconnected,
)
from sluice.runtime.ipc.messages import SamplingParams
from sluice.runtime.server_args import ServerArgs

logger = logging.getLogger("sluice.http")

OPEN_PATHS = frozenset({C.HEALTH_PATH, C.LIVE_PATH, C.METRICS_PATH})  # no API key: probes, scrapes
T = TypeVar("T")


class _Server:
    def __init__(self, tm: Any, args: ServerArgs) -> None:
        self.tm = tm
        self.args = args
        self.created = int(time.time())

    # --- steps every generation route takes -------------------------------------------------
    async def parse(self, request: Request, model: type[T]) -> T:
        try:
            data = json.loads(await request.body())
        except (ValueError, UnicodeDecodeError) as exc:
            raise P.ProtocolError(f"Malformed JSON body: {exc}", code="invalid_json") from exc
        if not isinstance(data, dict):
            raise P.ProtocolError("The request body must be a JSON object.", code="invalid_json")
        try:
            req = model.model_validate(data)  # type: ignore[attr-defined]
        except ValidationError as exc:
            raise P.from_validation_error(exc) from exc
        req.check()
        if req.ignored_fields:
            logger.debug("ignored request fields %s", ",".join(req.ignored_fields))
        if self.tm.draining:
            raise P.ProtocolError(
                "The server is shutting down.", status=503, type="server_error", code="draining"
            )
        return req

    def check_model(self, model: str | None) -> str:
        if model not in (None, self.tm.served_model_name, self.args.model):
            raise P.model_not_found(model or "")
        return model or self.tm.served_model_name

    def encode(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        if isinstance(prompt, str):
            return self.tm.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        P.check_token_ids(prompt, len(self.tm.tokenizer))
        return prompt

    def token_strings(self, ids: list[int]) -> list[str]:
        return [self.tm.tokenizer.decode([t]) for t in ids]

    async def start(
        self, ids: list[int], params: SamplingParams, n: int, rid: str
    ) -> ChoiceStreams:
        """Start n requests (seeds derived per choice). The generators run to their first
        wait before this returns, so an up-front rejection (ValueError, raised before the
        TokenizerManager's first await) is a 400 even for a stream."""
        per_choice = P.per_choice_params(params, n, random.getrandbits(63))
        rids = [rid] if n == 1 else [f"{rid}-{i}" for i in range(n)]
        streams = ChoiceStreams(
            [self.tm.generate(ids, p, r) for p, r in zip(per_choice, rids, strict=True)]
        )
        await asyncio.sleep(0)
        if streams.first_error is not None:
            await streams.aclose()
            raise as_protocol_error(streams.first_error)
        return streams

    async def collect(
        self, request: Request, streams: ChoiceStreams, n: int, abort_is_error: bool = True
    ) -> list[Collected]:
        """Every choice's output; all are aborted if the client goes away first."""

        async def run() -> list[Collected]:
            choices = [Collected() for _ in range(n)]
            try:
                async for index, chunk in streams:
                    choices[index].add(chunk)
            except Exception as exc:
                raise as_protocol_error(exc) from exc
            finally:
                await streams.aclose()
            return choices

        choices = await unless_disconnected(request, run())
        for c in choices:
            if c.last is None or c.last.finished is None:  # ended without a finish: lost
                raise self.aborted(c.last)
            if abort_is_error and c.last.finished.kind == "abort":
                raise self.aborted(c.last)
        return choices

    def aborted(self, chunk: Chunk) -> P.ProtocolError:
        reason = chunk.finished if chunk is not None else None
        message = (reason.message if reason else "") or "The request was aborted by the server."
        status = 503 if self.tm.draining else 500
        return P.ProtocolError(message, status=status, type="server_error", code="request_aborted")

    async def events(
        self,
        streams: ChoiceStreams,
        fmt: EventFormat,
        n: int,
        include_usage: bool,
        abort_is_error: bool,
    ) -> AsyncIterator[str]:
        """The SSE body: `fmt`'s events per chunk, then usage if asked, then [DONE]. An
        abort or failure becomes an error event in OpenAI's shape."""
        finals: dict[int, Chunk] = {}
        try:
            for event in fmt.prelude():
                yield event
            async for index, chunk in streams:
                if abort_is_error and chunk.finished is not None and chunk.finished.kind == "abort":
                    yield sse_event(self.aborted(chunk).body())
                    break
                for event in fmt.on_chunk(index, chunk):
                    yield event
                if chunk.finished is not None:
                    finals[index] = chunk
            else:
                if include_usage and len(finals) == n:
                    yield fmt.usage(R.usage_of([finals[i] for i in range(n)]))
        except Exception as exc:
            yield sse_event(as_protocol_error(exc).body())
        finally:
            await streams.aclose()
        yield SSE_DONE

    # --- routes ---------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        req = await self.parse(request, P.CompletionRequest)
        model = self.check_model(req.model)
        ids = self.encode(req.prompt)
        params = P.to_sampling_params(req, len(ids), self.tm.context_len)
        echo = ""
        if req.echo:
            echo = req.prompt if isinstance(req.prompt, str) else self.tm.tokenizer.decode(ids)
        rid = f"cmpl-{uuid.uuid4().hex}"
        streams = await self.start(ids, params, req.n, rid)
        if req.stream:
            fmt = CompletionEvents(rid, model, req.n, req.logprobs, echo, self.token_strings)
            return SSEResponse(self.events(streams, fmt, req.n, req.include_usage, True))
        collected = await self.collect(request, streams, req.n)
        choices = []
        for i, c in enumerate(collected):
            lp = None
            if req.logprobs is not None:
                tokens = self.token_strings(c.token_ids)
                lp = R.completion_logprobs(tokens, c.logprobs, req.logprobs, len(echo))
            choices.append(
                R.CompletionChoice(
                    index=i,
                    text=echo + c.text,
                    logprobs=lp,
                    finish_reason=P.finish_reason(c.last.finished),
                    stop_reason=P.stop_reason(c.last.finished),
                )
            )
        usage = R.usage_of([c.last for c in collected])
        body = R.CompletionResponse(id=rid, model=model, choices=choices, usage=usage)
        return JSONResponse(body.model_dump())

    async def chat(self, request: Request) -> Response:
        req = await self.parse(request, P.ChatCompletionRequest)
        model = self.check_model(req.model)
        try:
            prompt = self.tm.tokenizer.apply_chat_template(
                req.template_messages(),
                add_generation_prompt=req.add_generation_prompt,
                tokenize=False,
                **(req.chat_template_kwargs or {}),
            )
        except Exception as exc:  # no template, or the template refused the messages
            message = f"Cannot apply the chat template: {exc}"
            raise P.ProtocolError(message, param="messages") from exc
        ids = self.encode(prompt, add_special_tokens=False)
        params = P.to_sampling_params(req, len(ids), self.tm.context_len)
        rid = f"chatcmpl-{uuid.uuid4().hex}"
        streams = await self.start(ids, params, req.n, rid)
        top = req.top_logprobs or 0
        if req.stream:
            fmt = ChatEvents(rid, model, req.n, req.logprobs, top, self.token_strings)
            return SSEResponse(self.events(streams, fmt, req.n, req.include_usage, True))
        collected = await self.collect(request, streams, req.n)
        choices = [
            R.ChatChoice(
                index=i,
                message=R.ChatResponseMessage(content=c.text),
                logprobs=R.chat_logprobs(self.token_strings(c.token_ids), c.logprobs, top)
                if req.logprobs
                else None,
                finish_reason=P.finish_reason(c.last.finished),
                stop_reason=P.stop_reason(c.last.finished),
            )
            for i, c in enumerate(collected)
        ]
        usage = R.usage_of([c.last for c in collected])
        body = R.ChatCompletionResponse(id=rid, model=model, choices=choices, usage=usage)
        return JSONResponse(body.model_dump())

    async def generate(self, request: Request) -> Response:
        """Native /generate in SGLang's shape; an abort is reported in band."""
        req = await self.parse(request, P.GenerateRequest)
        ids = self.encode(req.text if req.text is not None else req.input_ids or [])
        params = P.native_sampling_params(req, len(ids), self.tm.context_len)
        rid = req.rid or uuid.uuid4().hex
        streams = await self.start(ids, params, 1, rid)
        if req.stream:
            fmt = GenerateEvents(rid, req.return_logprob)
            return SSEResponse(self.events(streams, fmt, 1, False, False))
        (c,) = await self.collect(request, streams, 1, abort_is_error=False)
        lps = c.logprobs if req.return_logprob else None
        return JSONResponse(R.generate_body(rid, c.text, c.token_ids, lps, c.last))

    def models(self) -> dict[str, Any]:
        card = R.ModelCard(
            id=self.tm.served_model_name,
            created=self.created,
            root=self.args.model,
            max_model_len=self.tm.context_len,
        )
        return R.ModelList(data=[card]).model_dump()

    def health(self) -> Response:
        if self.tm.is_ready and not self.tm.draining:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "draining" if self.tm.draining else "starting"}, 503)

    def live(self) -> Response:
        """Liveness: fails only for a hung scheduler (a restart helps), never while loading
        or draining (a restart would not)."""
        if self.tm.scheduler_stalled(self.args.scheduler_heartbeat_timeout):
            return JSONResponse({"status": "scheduler-stalled"}, 503)
        return JSONResponse({"status": "alive"})

    def server_info(self) -> dict[str, Any]:
        info = {k: v for k, v in dataclasses.asdict(self.args).items() if k != "api_key"}
        info.update(self.tm.server_info())
        stats = getattr(self.tm, "stats", None)  # the scheduler's latest SchedulerStats
        if dataclasses.is_dataclass(stats) and not isinstance(stats, type):
            info["scheduler_stats"] = dataclasses.asdict(stats)
        return info


class ApiKeyMiddleware:
    """Pure ASGI middleware: every route but /health and /metrics needs the bearer key."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app = app
        self.key = api_key.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or self._authorized(scope):
            await self.app(scope, receive, send)
            return
        body = P.error_body("Incorrect API key provided.", code="invalid_api_key")
        await JSONResponse(body, 401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)

    def _authorized(self, scope: Any) -> bool:
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.partition(b" ")
                valid = hmac.compare_digest(token.strip(), self.key)
                return valid and scheme.lower() == b"bearer"
        return False


def build_app(
    tm: Any,
    args: ServerArgs,
    metrics_handler: Callable[[], Awaitable[Response]] | None = None,
) -> FastAPI:
    """The FastAPI app over a TokenizerManager (or anything with its interface).

    `metrics_handler`: the coroutine serving GET /metrics (Prometheus text, no API key); a
    later issue supplies it. Without one there is no /metrics route.
    """
    server = _Server(tm, args)
    app = FastAPI(title="sluice", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = server
    app.add_api_route("/v1/models", server.models, methods=["GET"])
    app.add_api_route("/v1/completions", server.completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", server.chat, methods=["POST"])
    app.add_api_route("/generate", server.generate, methods=["POST"])
    app.add_api_route(C.HEALTH_PATH, server.health, methods=["GET"])
    app.add_api_route(C.LIVE_PATH, server.live, methods=["GET"])
    app.add_api_route(C.SERVER_INFO_PATH, server.server_info, methods=["GET"])
    if metrics_handler is not None:
        app.add_api_route(C.METRICS_PATH, metrics_handler, methods=["GET"])

    @app.exception_handler(P.ProtocolError)
    async def _refused(request: Request, exc: P.ProtocolError) -> Response:
        if exc.status < 500:
            logger.info(
                "request rejected path=%s status=%d why=%s", request.url.path, exc.status, exc
            )
        return JSONResponse(exc.body(), exc.status)

    @app.exception_handler(ClientGone)
    async def _gone(request: Request, exc: ClientGone) -> Response:
        logger.info("request aborted path=%s reason=client-gone", request.url.path)
        return Response(status_code=499)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        err = (exc.errors() or [{"loc": (), "msg": "invalid request"}])[0]
        loc = ".".join(str(part) for part in err["loc"])
        return JSONResponse(P.error_body(f"{loc}: {err['msg']}", code="invalid_value"), 400)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        body = P.error_body(str(exc.detail), type=kind)
        return JSONResponse(body, exc.status_code, headers=exc.headers)

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception) -> Response:
        logger.exception("unhandled error path=%s", request.url.path)
        body = P.error_body("Internal server error.", type="server_error", code="internal_error")
        return JSONResponse(body, 500)

    if args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=args.api_key)
    return app
