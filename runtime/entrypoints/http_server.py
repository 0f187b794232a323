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
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

import anyio
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from sluice.runtime import constants as C
from sluice.runtime.entrypoints import openai_protocol as P
from sluice.runtime.ipc.messages import SamplingParams
from sluice.runtime.server_args import ServerArgs

logger = logging.getLogger("sluice.http")

OPEN_PATHS = frozenset({C.HEALTH_PATH, C.METRICS_PATH})  # reachable without the API key
SSE_DONE = "data: [DONE]\n\n"
T = TypeVar("T")
Chunk = Any  # tokenizer_manager.GenerateChunk, duck-typed so tests can script a fake


class ClientGone(Exception):
    """The HTTP client disconnected before its response was ready."""


class ChoiceStreams:
    """One `tm.generate` per choice, each pumped by a task; iterating yields
    (choice index, chunk) in arrival order and re-raises a generator's error.

    `aclose()` cancels the tasks, which closes the generators and so aborts whatever has
    not finished. The cancellation is requested before the first await, so it happens even
    when `aclose` itself is interrupted.
    """

    def __init__(self, gens: list[Any]) -> None:
        self.first_error: Exception | None = None
        self._queue: asyncio.Queue[tuple[int, Chunk, BaseException | None]] = asyncio.Queue()
        self._live = len(gens)
        self._tasks = [asyncio.ensure_future(self._pump(i, g)) for i, g in enumerate(gens)]

    async def _pump(self, index: int, gen: Any) -> None:
        try:
            async for chunk in gen:
                self._queue.put_nowait((index, chunk, None))
        except Exception as exc:
            self.first_error = self.first_error or exc
            self._queue.put_nowait((index, None, exc))
        finally:
            await gen.aclose()
            self._queue.put_nowait((index, None, StopAsyncIteration()))

    def __aiter__(self) -> ChoiceStreams:
        return self

    async def __anext__(self) -> tuple[int, Chunk]:
        while self._live:
            index, chunk, exc = await self._queue.get()
            if isinstance(exc, StopAsyncIteration):
                self._live -= 1
            elif exc is not None:
                raise exc
            else:
                return index, chunk
        raise StopAsyncIteration

    async def aclose(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@dataclasses.dataclass
class _Collected:
    """Everything one choice produced, for a non-streaming response."""

    text: str = ""
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    last: Chunk = None

    def add(self, chunk: Chunk) -> None:
        self.text += chunk.text
        self.token_ids += chunk.token_ids
        self.logprobs += chunk.logprobs
        self.last = chunk


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _unless_disconnected(request: Request, work: Coroutine[Any, Any, T]) -> T:
    """Run `work`; if the client disconnects first, cancel it and raise ClientGone."""
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            return task.result()
        raise ClientGone
    finally:
        task.cancel()
        watcher.cancel()
        await asyncio.gather(task, watcher, return_exceptions=True)


class _SSEResponse(StreamingResponse):
    """Streams events while listening for the client's disconnect (whatever the server's
    ASGI spec version), and always closes the event generator, aborting its requests."""

    media_type = "text/event-stream"

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def stream() -> None:
                    try:
                        await self.stream_response(send)
                    except OSError:  # the client went away mid-send
                        pass
                    tg.cancel_scope.cancel()

                tg.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tg.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()  # type: ignore[attr-defined]


def _sse(payload: BaseModel | dict[str, Any]) -> str:
    data = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {data}\n\n"


def _as_protocol_error(exc: BaseException) -> P.ProtocolError:
    if isinstance(exc, P.ProtocolError):
        return exc
    if isinstance(exc, ValueError):  # the TokenizerManager's up-front rejection
        return P.ProtocolError(str(exc))
    logger.error("request failed: %r", exc, exc_info=exc)
    return P.ProtocolError(
        "Internal server error.", status=500, type="server_error", code="internal_error"
    )


# --- streamed event formats -----------------------------------------------------------------
class _EventFormat(Protocol):
    """Turns one route's chunks into SSE events: `prelude()` before any token,
    `on_chunk()` per chunk of choice `index`, `usage()` once at the end when asked."""

    def prelude(self) -> list[str]: ...
    def on_chunk(self, index: int, chunk: Chunk) -> list[str]: ...
    def usage(self, usage: P.Usage) -> str: ...


@dataclasses.dataclass
class _ChatEvents:
    rid: str
    model: str
    n: int
    logprobs: bool
    top: int
    token_strings: Callable[[list[int]], list[str]]
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))

    def _event(self, choices: list[P.ChatStreamChoice], usage: P.Usage | None = None) -> str:
        chunk = P.ChatCompletionChunk(
            id=self.rid, created=self.created, model=self.model, choices=choices, usage=usage
        )
        return _sse(chunk)

    def prelude(self) -> list[str]:
        role = P.DeltaMessage(role="assistant", content="")
        return [self._event([P.ChatStreamChoice(index=i, delta=role)]) for i in range(self.n)]

    def on_chunk(self, index: int, chunk: Chunk) -> list[str]:
        events = []
        lp = None
        if self.logprobs:
            lp = P.chat_logprobs(self.token_strings(chunk.token_ids), chunk.logprobs, self.top)
        if chunk.text or (lp is not None and chunk.token_ids):
            delta = P.DeltaMessage(content=chunk.text)
            events.append(self._event([P.ChatStreamChoice(index=index, delta=delta, logprobs=lp)]))
        if chunk.finished is not None:
            end = P.ChatStreamChoice(
                index=index,
                delta=P.DeltaMessage(),
                finish_reason=P.finish_reason(chunk.finished),
                stop_reason=P.stop_reason(chunk.finished),
            )
            events.append(self._event([end]))
        return events

    def usage(self, usage: P.Usage) -> str:
        return self._event([], usage)


@dataclasses.dataclass
class _CompletionEvents:
    rid: str
    model: str
    n: int
    logprobs: int | None
    echo: str
    token_strings: Callable[[list[int]], list[str]]
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    offsets: list[int] = dataclasses.field(default_factory=list)

    def _event(self, choices: list[P.CompletionChoice], usage: P.Usage | None = None) -> str:
        response = P.CompletionResponse(
            id=self.rid, created=self.created, model=self.model, choices=choices, usage=usage
        )
        return _sse(response)

    def prelude(self) -> list[str]:
        self.offsets = [len(self.echo)] * self.n
        if not self.echo:
            return []
        return [self._event([P.CompletionChoice(index=i, text=self.echo)]) for i in range(self.n)]

    def on_chunk(self, index: int, chunk: Chunk) -> list[str]:
        lp = None
        if self.logprobs is not None:
            tokens = self.token_strings(chunk.token_ids)
            lp = P.completion_logprobs(tokens, chunk.logprobs, self.logprobs, self.offsets[index])
            self.offsets[index] += sum(len(t) for t in tokens)
        if not (chunk.text or chunk.finished is not None or (lp is not None and lp.tokens)):
            return []
        choice = P.CompletionChoice(
            index=index,
            text=chunk.text,
            logprobs=lp,
            finish_reason=P.finish_reason(chunk.finished),
            stop_reason=P.stop_reason(chunk.finished),
        )
        return [self._event([choice])]

    def usage(self, usage: P.Usage) -> str:
        return self._event([], usage)


@dataclasses.dataclass
class _GenerateEvents:
    """SGLang's /generate stream: each event carries the text and ids so far."""

    rid: str
    logprobs: bool
    so_far: _Collected = dataclasses.field(default_factory=_Collected)

    def prelude(self) -> list[str]:
        return []

    def on_chunk(self, index: int, chunk: Chunk) -> list[str]:
        c = self.so_far
        c.add(chunk)
        lps = c.logprobs if self.logprobs else None
        return [_sse(P.generate_body(self.rid, c.text, c.token_ids, lps, chunk))]

    def usage(self, usage: P.Usage) -> str:  # the counts are in every event already
        return ""


# --- the server -----------------------------------------------------------------------------
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
            raise _as_protocol_error(streams.first_error)
        return streams

    async def collect(
        self, request: Request, streams: ChoiceStreams, n: int, abort_is_error: bool = True
    ) -> list[_Collected]:
        """Every choice's output; all are aborted if the client goes away first."""

        async def run() -> list[_Collected]:
            choices = [_Collected() for _ in range(n)]
            try:
                async for index, chunk in streams:
                    choices[index].add(chunk)
            except Exception as exc:
                raise _as_protocol_error(exc) from exc
            finally:
                await streams.aclose()
            return choices

        choices = await _unless_disconnected(request, run())
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
        fmt: _EventFormat,
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
                    yield _sse(self.aborted(chunk).body())
                    break
                for event in fmt.on_chunk(index, chunk):
                    yield event
                if chunk.finished is not None:
                    finals[index] = chunk
            else:
                if include_usage and len(finals) == n:
                    yield fmt.usage(P.usage_of([finals[i] for i in range(n)]))
        except Exception as exc:
            yield _sse(_as_protocol_error(exc).body())
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
            fmt = _CompletionEvents(rid, model, req.n, req.logprobs, echo, self.token_strings)
            return _SSEResponse(self.events(streams, fmt, req.n, req.include_usage, True))
        collected = await self.collect(request, streams, req.n)
        choices = []
        for i, c in enumerate(collected):
            lp = None
            if req.logprobs is not None:
                tokens = self.token_strings(c.token_ids)
                lp = P.completion_logprobs(tokens, c.logprobs, req.logprobs, len(echo))
            choices.append(
                P.CompletionChoice(
                    index=i,
                    text=echo + c.text,
                    logprobs=lp,
                    finish_reason=P.finish_reason(c.last.finished),
                    stop_reason=P.stop_reason(c.last.finished),
                )
            )
        usage = P.usage_of([c.last for c in collected])
        body = P.CompletionResponse(id=rid, model=model, choices=choices, usage=usage)
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
            fmt = _ChatEvents(rid, model, req.n, req.logprobs, top, self.token_strings)
            return _SSEResponse(self.events(streams, fmt, req.n, req.include_usage, True))
        collected = await self.collect(request, streams, req.n)
        choices = [
            P.ChatChoice(
                index=i,
                message=P.ChatResponseMessage(content=c.text),
                logprobs=P.chat_logprobs(self.token_strings(c.token_ids), c.logprobs, top)
                if req.logprobs
                else None,
                finish_reason=P.finish_reason(c.last.finished),
                stop_reason=P.stop_reason(c.last.finished),
            )
            for i, c in enumerate(collected)
        ]
        usage = P.usage_of([c.last for c in collected])
        body = P.ChatCompletionResponse(id=rid, model=model, choices=choices, usage=usage)
        return JSONResponse(body.model_dump())

    async def generate(self, request: Request) -> Response:
        """Native /generate in SGLang's shape; an abort is reported in band."""
        req = await self.parse(request, P.GenerateRequest)
        ids = self.encode(req.text if req.text is not None else req.input_ids or [])
        params = P.native_sampling_params(req, len(ids), self.tm.context_len)
        rid = req.rid or uuid.uuid4().hex
        streams = await self.start(ids, params, 1, rid)
        if req.stream:
            fmt = _GenerateEvents(rid, req.return_logprob)
            return _SSEResponse(self.events(streams, fmt, 1, False, False))
        (c,) = await self.collect(request, streams, 1, abort_is_error=False)
        lps = c.logprobs if req.return_logprob else None
        return JSONResponse(P.generate_body(rid, c.text, c.token_ids, lps, c.last))

    def models(self) -> dict[str, Any]:
        card = P.ModelCard(
            id=self.tm.served_model_name,
            created=self.created,
            root=self.args.model,
            max_model_len=self.tm.context_len,
        )
        return P.ModelList(data=[card]).model_dump()

    def health(self) -> Response:
        if self.tm.is_ready and not self.tm.draining:
            return JSONResponse({"status": "ok"})
        return JSONResponse({"status": "draining" if self.tm.draining else "starting"}, 503)

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
