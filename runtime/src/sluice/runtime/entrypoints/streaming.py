"""Streaming plumbing for the HTTP API: fan-in of per-choice generators, disconnect
watching, server-sent events, and the `EventFormat` each route's stream implements (in its
serving module).

One `tm.generate` runs per choice; `ChoiceStreams` merges them. A streaming response
listens for the client's disconnect and closes the generators (which aborts the requests
in the scheduler); a non-streaming handler races the work against `http.disconnect`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any, Protocol

import anyio
from fastapi.responses import StreamingResponse
from pydantic import BaseModel

from sluice.runtime.entrypoints.logprobs import (
    PositionLogprobs,
)
from sluice.runtime.entrypoints.openai_responses import (
    Usage,
)

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


# --- what each route streams -----------------------------------------------------------------
class EventFormat(Protocol):
    """Turns one route's chunks into SSE events: `prelude()` before any token,
    `on_chunk()` per chunk of choice `index`, `usage()` once at the end when asked."""

    def prelude(self) -> list[str]: ...
    def on_chunk(self, index: int, chunk: Chunk) -> list[str]: ...
    def usage(self, usage: Usage) -> str: ...
