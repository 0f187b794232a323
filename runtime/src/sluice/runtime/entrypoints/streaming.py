"""Streaming plumbing for the HTTP API: fan-in of per-choice generators, disconnect
watching, server-sent events, and the event shape of each endpoint.

One `tm.generate` runs per choice; `ChoiceStreams` merges them. A streaming response
listens for the client's disconnect and closes the generators (which aborts the requests
in the scheduler); a non-streaming handler races the work against `http.disconnect`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any, Protocol

import anyio
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from sluice.runtime.entrypoints.logprobs import (
    PositionLogprobs,
    TokenBytes,
    chat_logprobs,
    completion_logprobs,
)
from sluice.runtime.entrypoints.openai_responses import (
    ChatCompletionChunk,
    ChatStreamChoice,
    CompletionChoice,
    CompletionResponse,
    DeltaFunction,
    DeltaMessage,
    DeltaToolCall,
    Usage,
    generate_body,
    usage_of,
)
from sluice.runtime.entrypoints.reasoning import ReasoningSplitter
from sluice.runtime.entrypoints.request_params import finish_reason, kept_stop_text, stop_reason
from sluice.runtime.entrypoints.tool_parsers import StreamDelta, StreamingToolParser

SSE_DONE = "data: [DONE]\n\n"
Chunk = Any  # tokenizer_manager.GenerateChunk, duck-typed so tests can script a fake


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
class Collected:
    """Everything one choice produced, for a non-streaming response."""

    text: str = ""
    token_ids: list[int] = dataclasses.field(default_factory=list)
    logprobs: list[float] = dataclasses.field(default_factory=list)
    top_logprobs: list[list[tuple[int, float]]] = dataclasses.field(default_factory=list)
    input_logprobs: list[float] = dataclasses.field(default_factory=list)
    last: Chunk = None

    def add(self, chunk: Chunk) -> None:
        self.text += chunk.text
        self.token_ids += chunk.token_ids
        self.logprobs += chunk.logprobs
        self.top_logprobs += getattr(chunk, "top_logprobs", None) or []
        self.input_logprobs += getattr(chunk, "input_logprobs", None) or []
        self.last = chunk

    def positions(self) -> list[PositionLogprobs]:
        return positions_of(self)


def positions_of(chunk: Any) -> list[PositionLogprobs]:
    """A chunk's (or a Collected's) tokens as logprob positions."""
    tops = getattr(chunk, "top_logprobs", None) or []
    return [
        PositionLogprobs(t, lp, tops[i] if i < len(tops) else ())
        for i, (t, lp) in enumerate(zip(chunk.token_ids, chunk.logprobs, strict=False))
    ]


class SSEResponse(StreamingResponse):
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


def sse_event(payload: BaseModel | dict[str, Any]) -> str:
    data = payload.model_dump_json() if isinstance(payload, BaseModel) else json.dumps(payload)
    return f"data: {data}\n\n"


# --- streamed event formats -----------------------------------------------------------------
class EventFormat(Protocol):
    """Turns one route's chunks into SSE events: `prelude()` before any token,
    `on_chunk()` per chunk of choice `index`, `usage()` once at the end when asked."""

    def prelude(self) -> list[str]: ...
    def on_chunk(self, index: int, chunk: Chunk) -> list[str]: ...
    def usage(self, usage: Usage) -> str: ...


def delta_tool_calls(d: StreamDelta, parallel: bool) -> list[DeltaToolCall]:
    return [
        DeltaToolCall(
            index=c.index,
            id=c.id,
            type="function" if c.id is not None else None,
            function=DeltaFunction(name=c.name, arguments=c.arguments),
        )
        for c in d.tool_calls
        if parallel or c.index == 0
    ]


@dataclasses.dataclass
class ChatEvents:
    """Chat chunks; with a tool parser per choice, content and tool-call deltas."""

    rid: str
    model: str
    n: int
    logprobs: int | None  # top-k per position; None: no logprobs
    token_bytes: Callable[[], TokenBytes]
    parsers: list[StreamingToolParser | None]
    echo: str = ""
    keep_stop: bool = False
    continuous_usage: bool = False
    parallel_tool_calls: bool = True
    splitters: list[ReasoningSplitter | None] | None = None  # --reasoning-parser, per choice
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    called: set[int] = dataclasses.field(default_factory=set)

    def _event(self, choices: list[ChatStreamChoice], usage: Usage | None = None) -> str:
        chunk = ChatCompletionChunk(
            id=self.rid, created=self.created, model=self.model, choices=choices, usage=usage
        )
        return sse_event(chunk)

    def prelude(self) -> list[str]:
        role = DeltaMessage(role="assistant", content=self.echo)
        return [self._event([ChatStreamChoice(index=i, delta=role)]) for i in range(self.n)]

    def on_chunk(self, index: int, chunk: Chunk) -> list[str]:
        events = []
        usage = usage_of([chunk]) if self.continuous_usage else None
        text = chunk.text + kept_stop_text(chunk.finished, self.keep_stop)
        lp = None
        if self.logprobs is not None:
            lp = chat_logprobs(self.token_bytes(), positions_of(chunk), self.logprobs)
        thought = ""
        splitter = self.splitters[index] if self.splitters else None
        if splitter is not None:
            split = splitter.feed(text)
            thought, text = split.reasoning, split.content
            if chunk.finished is not None:
                end = splitter.finish()
                thought, text = thought + end.reasoning, text + end.content
        content, calls = text, []
        parser = self.parsers[index]
        if parser is not None:
            d = parser.feed(text)
            if chunk.finished is not None:
                end = parser.finish()
                d = StreamDelta(d.content + end.content, d.tool_calls + end.tool_calls)
            content, calls = d.content, delta_tool_calls(d, self.parallel_tool_calls)
            if calls:
                self.called.add(index)
        if content or calls or thought or (lp is not None and chunk.token_ids):
            delta = DeltaMessage(
                content=content or None, reasoning_content=thought or None, tool_calls=calls or None
            )
            if not (content or calls or thought):
                delta = DeltaMessage(content="")
            choice = ChatStreamChoice(index=index, delta=delta, logprobs=lp)
            events.append(self._event([choice], usage))
        if chunk.finished is not None:
            end_choice = ChatStreamChoice(
                index=index,
                delta=DeltaMessage(),
                finish_reason=finish_reason(chunk.finished, index in self.called),
                stop_reason=stop_reason(chunk.finished),
            )
            events.append(self._event([end_choice], usage))
        return events

    def usage(self, usage: Usage) -> str:
        return self._event([], usage)


@dataclasses.dataclass
class CompletionEvents:
    rid: str
    model: str
    n: int  # choices in all (prompts x n)
    logprobs: int | None
    echoes: list[str]  # per choice
    token_bytes: Callable[[], TokenBytes]
    keep_stop: bool = False
    continuous_usage: bool = False
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    offsets: list[int] = dataclasses.field(default_factory=list)

    def _event(self, choices: list[CompletionChoice], usage: Usage | None = None) -> str:
        response = CompletionResponse(
            id=self.rid, created=self.created, model=self.model, choices=choices, usage=usage
        )
        return sse_event(response)

    def prelude(self) -> list[str]:
        self.offsets = [len(e) for e in self.echoes]
        return [
            self._event([CompletionChoice(index=i, text=e)])
            for i, e in enumerate(self.echoes)
            if e
        ]

    def on_chunk(self, index: int, chunk: Chunk) -> list[str]:
        lp = None
        if self.logprobs is not None:
            lp = completion_logprobs(
                self.token_bytes(), positions_of(chunk), self.logprobs, self.offsets[index]
            )
            self.offsets[index] += len(chunk.text)
        text = chunk.text + kept_stop_text(chunk.finished, self.keep_stop)
        if not (text or chunk.finished is not None or (lp is not None and lp.tokens)):
            return []
        choice = CompletionChoice(
            index=index,
            text=text,
            logprobs=lp,
            finish_reason=finish_reason(chunk.finished),
            stop_reason=stop_reason(chunk.finished),
        )
        usage = usage_of([chunk]) if self.continuous_usage else None
        return [self._event([choice], usage)]

    def usage(self, usage: Usage) -> str:
        return self._event([], usage)


@dataclasses.dataclass
class GenerateEvents:
    """SGLang's /generate stream: each event carries one output's text and ids so far;
    with several outputs (a batch, or n > 1) it also carries the output's `index`."""

    rids: list[str]
    meta: Callable[[Collected], dict[str, Any] | None]  # the logprob entries, or None
    batched: bool
    keep_stop: list[bool]  # per output: no_stop_trim
    so_far: list[Collected] = dataclasses.field(default_factory=list)

    def prelude(self) -> list[str]:
        self.so_far = [Collected() for _ in self.rids]
        return []

    def on_chunk(self, index: int, chunk: Chunk) -> list[str]:
        c = self.so_far[index]
        c.add(chunk)
        text = c.text + kept_stop_text(chunk.finished, self.keep_stop[index])
        body = generate_body(self.rids[index], text, c.token_ids, self.meta(c), chunk)
        if self.batched:
            body["index"] = index
        return [sse_event(body)]

    def usage(self, usage: Usage) -> str:  # the counts are in every event already
        return ""
