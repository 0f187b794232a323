"""The Responses API: POST /v1/responses (whole, streamed as typed events, or in the
background), and the stored responses' GET /v1/responses/{id}, GET
/v1/responses/{id}/input_items, POST /v1/responses/{id}/cancel (a background one) and DELETE
/v1/responses/{id}.

A response is the chat completion of its conversation (`responses_protocol.chat_request`),
run through the same steps as /v1/chat/completions (`ServingBase.prepare_chat`, `start`),
and told in the Responses API's items (`responses_output`). `store: true` (the default)
keeps it in this process's `ResponseStore`; `previous_response_id` continues the stored
conversation. A client that goes away aborts the generation, streamed or not; a background
response (`background: true`) runs on without the client, its stored entry `in_progress`
until it ends, and is stopped only by its cancel (or DELETE).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any, Literal

from fastapi import Query, Request, Response
from fastapi.responses import JSONResponse

from sluice.runtime.constants import RESPONSE_ID_HEADER
from sluice.runtime.disconnect import unless_disconnected
from sluice.runtime.entrypoints.errors import ProtocolError, as_protocol_error
from sluice.runtime.entrypoints.jobs import Job, is_failure
from sluice.runtime.entrypoints.responses_output import ResponseAssembler, new_id
from sluice.runtime.entrypoints.responses_protocol import (
    ResponsesRequest,
    chat_request,
    conversation_messages,
    input_item_records,
)
from sluice.runtime.entrypoints.responses_store import ResponseStore, StoredResponse
from sluice.runtime.entrypoints.serving_base import ServingBase, ServingContext
from sluice.runtime.entrypoints.streaming import ChoiceStreams, SSEResponse


def response_not_found(rid: str) -> ProtocolError:
    return ProtocolError(
        f"Response with id '{rid}' not found (never stored here, deleted, or expired: "
        "responses live in one server's memory, for a bounded time).",
        status=404, code="response_not_found",
    )  # fmt: skip


class ServingResponses(ServingBase):
    def __init__(self, ctx: ServingContext, store: ResponseStore) -> None:
        super().__init__(ctx)
        self.store = store
        self.running: dict[str, asyncio.Task[None]] = {}  # background responses in progress

    async def create(self, request: Request) -> Response:
        req = await self.parse(request, ResponsesRequest)
        model = self.check_model(req.model)
        history: list[dict[str, Any]] = []
        if req.previous_response_id is not None:
            previous = self.store.get(req.previous_response_id)
            if previous is None:  # OpenAI's answer: a 400 the client can act on
                raise ProtocolError(
                    f"Previous response with id '{req.previous_response_id}' not found (never "
                    "stored here, deleted, or expired).", param="previous_response_id",
                    code="previous_response_not_found",
                )  # fmt: skip
            if previous.messages is None:
                raise ProtocolError(
                    f"Previous response '{req.previous_response_id}' did not complete "
                    f"({previous.body.get('status')}); only a completed or incomplete response "
                    "can be continued.", param="previous_response_id",
                )  # fmt: skip
            history = previous.messages
        conversation = history + conversation_messages(req.items())
        chat = chat_request(req, conversation, model, self.args.reasoning_parser)
        prepared = await self.prepare_chat(chat, format_param="text.format")
        rid = req.request_id or new_id("resp")
        if rid in self.store:
            raise ProtocolError(f"request_id {rid!r} names a stored response already",
                                param="request_id")  # fmt: skip
        stored = req.store and self.store.enabled
        output = prepared.output(bool(self.args.reasoning_parser))
        assembler = ResponseAssembler(
            self._echo(req, rid, model, stored), output, req.parallel_tool_calls
        )
        streams = await self.start(
            [Job(prepared.ids, prepared.params, rid)], handoff=self.handoff(request)
        )
        headers = {RESPONSE_ID_HEADER: rid} if stored else None

        def keep(body: dict[str, Any]) -> None:
            if stored and not assembler.cancelled:
                messages = conversation + assembler.messages()
                self.store.put(rid, StoredResponse(body, messages, input_item_records(req)))

        if req.stream:
            return SSEResponse(self._events(streams, assembler, keep), headers=headers)
        if req.background:
            running = assembler.response("in_progress")
            self.store.put(rid, StoredResponse(running, None, input_item_records(req)))
            task = asyncio.ensure_future(self._in_background(rid, streams, assembler, keep))
            self.running[rid] = task
            return JSONResponse(running, headers=headers)
        body = await unless_disconnected(request, self._run(streams, assembler))
        keep(body)
        return JSONResponse(body, headers=headers)

    async def _run(self, streams: ChoiceStreams, assembler: ResponseAssembler) -> dict[str, Any]:
        """Every chunk into the assembler; the finished response (a failure raises)."""
        try:
            async for _, chunk in streams:
                if is_failure(chunk.finished, True):
                    raise self.failure(chunk)
                assembler.on_chunk(chunk)
        except Exception as exc:
            raise as_protocol_error(exc) from exc
        finally:
            await streams.aclose()
        last = assembler.last
        if last is None or last.finished is None:  # ended without a finish: lost
            raise self.failure(last)
        return assembler.final()

    async def _in_background(
        self,
        rid: str,
        streams: ChoiceStreams,
        assembler: ResponseAssembler,
        keep: Callable[[dict[str, Any]], None],
    ) -> None:
        """A background response's generation; its stored entry says how it ended."""
        ended: dict[str, Any] | None = None
        try:
            body = await self._run(streams, assembler)
            keep(body)
            if assembler.cancelled:  # aborted in band (POST /abort_request)
                ended = body
        except asyncio.CancelledError:  # POST /v1/responses/{id}/cancel
            ended = assembler.response("cancelled")
        except ProtocolError as exc:
            ended = assembler.failed_response(exc)
        finally:
            self.running.pop(rid, None)
            if ended is not None:
                stored = self.store.get(rid)
                items = stored.input_items if stored is not None else []
                self.store.put(rid, StoredResponse(ended, None, items))

    async def _events(
        self,
        streams: ChoiceStreams,
        assembler: ResponseAssembler,
        keep: Callable[[dict[str, Any]], None],
    ) -> AsyncIterator[str]:
        """The typed event stream; a failure ends it with response.failed."""
        try:
            for event in assembler.start():
                yield event
            finished = False
            async for _, chunk in streams:
                if is_failure(chunk.finished, True):
                    yield assembler.failed(self.failure(chunk))
                    return
                for event in assembler.on_chunk(chunk):
                    yield event
                finished = chunk.finished is not None
            if not finished:
                yield assembler.failed(self.failure(assembler.last))
                return
            end, body = assembler.end()
            keep(body)
            yield end
        except Exception as exc:
            yield assembler.failed(as_protocol_error(exc))
        finally:
            await streams.aclose()

    @staticmethod
    def _echo(req: ResponsesRequest, rid: str, model: str, stored: bool) -> dict[str, Any]:
        """The response object's fields that echo the request, as OpenAI's does."""
        fmt = req.text.format if req.text is not None and req.text.format is not None else None
        choice = req.tool_choice
        return {
            "id": rid,
            "model": model,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": dict(req.metadata or {}),
            "parallel_tool_calls": req.parallel_tool_calls,
            "previous_response_id": req.previous_response_id,
            "reasoning": {"effort": req.reasoning.effort if req.reasoning else None,
                          "summary": None},  # fmt: skip
            "store": stored,
            "temperature": 1.0 if req.temperature is None else req.temperature,
            "text": {"format": fmt.model_dump(by_alias=True, exclude_none=True)
                     if fmt is not None else {"type": "text"}},  # fmt: skip
            "tool_choice": choice.model_dump() if choice is not None and not isinstance(choice, str)
            else (choice or ("auto" if req.tools else "none")),
            "tools": [t.model_dump(exclude_none=True) for t in req.function_tools()],
            "top_p": 1.0 if req.top_p is None else req.top_p,
            "truncation": "disabled",
            "background": req.background,
            "service_tier": "default",
        }

    async def retrieve(self, response_id: str) -> Response:
        stored = self.store.get(response_id)
        if stored is None:
            raise response_not_found(response_id)
        return JSONResponse(stored.body)

    async def input_items(
        self,
        response_id: str,
        limit: int = Query(20, ge=1, le=100),
        order: Literal["asc", "desc"] = "desc",
        after: str | None = None,
    ) -> Response:
        """The stored response's own input items (not those of the responses before it),
        a page at a time as OpenAI pages them: `order` desc (newest first) by default,
        `after` an item id of the page before."""
        stored = self.store.get(response_id)
        if stored is None:
            raise response_not_found(response_id)
        items = stored.input_items if order == "asc" else stored.input_items[::-1]
        if after is not None:
            ids = [i["id"] for i in items]
            if after not in ids:
                raise ProtocolError(f"after: no input item {after!r} in this response", param="after")
            items = items[ids.index(after) + 1 :]
        page = items[:limit]
        return JSONResponse({
            "object": "list", "data": page, "has_more": len(items) > limit,
            "first_id": page[0]["id"] if page else None, "last_id": page[-1]["id"] if page else None,
        })  # fmt: skip

    async def cancel(self, response_id: str) -> Response:
        """Stop a background response still running (its KV pages go back at once); it is
        kept as `cancelled`. A finished or foreground one cannot be cancelled (400)."""
        task = self.running.get(response_id)
        if task is None:
            stored = self.store.get(response_id)
            if stored is None:
                raise response_not_found(response_id)
            raise ProtocolError(
                f"Only a background response still in progress can be cancelled; this one is "
                f"{stored.body.get('status')}.", param="response_id",
            )  # fmt: skip
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        stored = self.store.get(response_id)
        return JSONResponse(stored.body if stored is not None else {"id": response_id, "status": "cancelled"})

    async def delete(self, response_id: str) -> Response:
        task = self.running.get(response_id)
        if task is not None:  # a running background response is stopped first
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if not self.store.delete(response_id):
            raise response_not_found(response_id)
        return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})
