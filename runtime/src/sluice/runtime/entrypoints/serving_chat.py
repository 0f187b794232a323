"""POST /v1/chat/completions: the chat template (or SGLang's `input_ids`), n choices, tools
(a forced tool_choice as a grammar; the output parsed into tool calls), reasoning apart with
--reasoning-parser, streamed as `chat.completion.chunk` events or answered whole."""

from __future__ import annotations

import dataclasses
import functools
import time
import uuid
from collections.abc import Callable

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from sluice.runtime.entrypoints.choice_output import ChoiceOutput
from sluice.runtime.entrypoints.jobs import fan_out
from sluice.runtime.entrypoints.logprobs import TokenBytes, chat_logprobs
from sluice.runtime.entrypoints.openai_protocol import ChatCompletionRequest
from sluice.runtime.entrypoints.openai_responses import (
    ChatChoice,
    ChatCompletionChunk,
    ChatCompletionResponse,
    ChatResponseMessage,
    ChatStreamChoice,
    DeltaFunction,
    DeltaMessage,
    DeltaToolCall,
    FunctionCall,
    ToolCall,
    Usage,
    usage_of,
)
from sluice.runtime.entrypoints.request_params import finish_reason, kept_stop_text, stop_reason
from sluice.runtime.entrypoints.serving_base import ServingBase
from sluice.runtime.entrypoints.streaming import Chunk, SSEResponse, positions_of, sse_event
from sluice.runtime.entrypoints.tool_parsers import StreamDelta, ToolCallDelta
from sluice.runtime.entrypoints.tool_parsers.base import assemble


class ServingChat(ServingBase):
    async def handle(self, request: Request) -> Response:
        req = await self.parse(request, ChatCompletionRequest)
        model = self.check_model(req.model)
        prepared = await self.prepare_chat(req)
        ids, params, parser = prepared.ids, prepared.params, prepared.parser
        rid = req.client_rid or f"chatcmpl-{uuid.uuid4().hex}"
        jobs = fan_out([ids], [params], [req.n], rid)
        last = req.messages[-1]
        echo = last.text if req.echo and last.role == "assistant" else ""
        streams = await self.start(jobs, handoff=self.handoff(request))
        top = req.top_logprobs if req.logprobs else None
        tb = functools.partial(self.token_bytes, req.return_tokens_as_token_ids)
        reasoning = bool(self.args.reasoning_parser) and req.separate_reasoning
        if req.stream:
            outputs = [prepared.output(reasoning) for _ in jobs]
            fmt = ChatEvents(rid, model, req.n, top, tb, outputs, echo, req.keep_stop_string,
                             req.continuous_usage, req.parallel_tool_calls)  # fmt: skip
            return SSEResponse(self.events(streams, fmt, req.n, req.include_usage, True, req.n))
        collected = await self.collect(request, streams, req.n)
        choices = []
        for i, c in enumerate(collected):
            text = c.text + kept_stop_text(c.last.finished, req.keep_stop_string)
            # the whole reply read as one streamed delta: the same split as a stream's
            pieces = prepared.output(reasoning).feed(text, True, c.token_ids)
            thought = pieces.reasoning if reasoning else None
            content, calls = pieces.content, []
            if parser is not None or pieces.tool_calls:
                parsed = assemble([StreamDelta(pieces.content, pieces.tool_calls)])
                content, calls = parsed.content, parsed.tool_calls
                if not req.parallel_tool_calls:
                    calls = calls[:1]
            message = ChatResponseMessage(
                content=(echo + content) if content is not None else (echo or None),
                reasoning_content=thought,
                tool_calls=[
                    ToolCall(id=t.id, function=FunctionCall(name=t.name, arguments=t.arguments))
                    for t in calls
                ] or None,
            )  # fmt: skip
            choices.append(
                ChatChoice(
                    index=i,
                    message=message,
                    logprobs=chat_logprobs(tb(), c.positions(), top) if top is not None else None,
                    finish_reason=finish_reason(c.last.finished, bool(calls)),
                    stop_reason=stop_reason(c.last.finished),
                    token_ids=c.token_ids if req.return_token_ids else None,
                )
            )
        usage = usage_of([c.last for c in collected], req.n)
        body = ChatCompletionResponse(
            id=rid, model=model, choices=choices, usage=usage,
            prompt_token_ids=ids if req.return_token_ids else None,
        )  # fmt: skip
        return JSONResponse(body.model_dump())


def delta_tool_calls(deltas: tuple[ToolCallDelta, ...], parallel: bool) -> list[DeltaToolCall]:
    return [
        DeltaToolCall(
            index=c.index,
            id=c.id,
            type="function" if c.id is not None else None,
            function=DeltaFunction(name=c.name, arguments=c.arguments),
        )
        for c in deltas
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
    outputs: list[ChoiceOutput]  # each choice's reasoning / content / tool-call split
    echo: str = ""
    keep_stop: bool = False
    continuous_usage: bool = False
    parallel_tool_calls: bool = True
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
        pieces = self.outputs[index].feed(text, chunk.finished is not None, chunk.token_ids)
        thought, content = pieces.reasoning, pieces.content
        calls = delta_tool_calls(pieces.tool_calls, self.parallel_tool_calls)
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

