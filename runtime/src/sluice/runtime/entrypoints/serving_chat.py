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

from sluice.runtime.entrypoints.errors import ProtocolError
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
from sluice.runtime.entrypoints.reasoning import ReasoningSplitter, split_reasoning
from sluice.runtime.entrypoints.request_params import finish_reason, kept_stop_text, stop_reason
from sluice.runtime.entrypoints.serving_base import ServingBase, fan_out
from sluice.runtime.entrypoints.streaming import Chunk, SSEResponse, positions_of, sse_event
from sluice.runtime.entrypoints.tool_parsers import StreamDelta, StreamingToolParser
from sluice.runtime.entrypoints.tools import (
    ToolError,
    output_parser,
    template_message,
    template_tools,
    tool_constraint,
)


class ServingChat(ServingBase):
    async def handle(self, request: Request) -> Response:
        req = await self.parse(request, ChatCompletionRequest)
        model = self.check_model(req.model)
        choice = req.effective_tool_choice
        try:
            forced = tool_constraint(req.tools, choice, req.parallel_tool_calls)
            parser = output_parser(req.tools, choice, self.args.tool_call_parser)
        except ToolError as exc:
            raise ProtocolError(str(exc), param=exc.param) from exc
        constraint = self.constraint(req)
        if forced is not None:
            if constraint is not None:
                raise ProtocolError(
                    f"tool_choice {choice if isinstance(choice, str) else 'function'} cannot "
                    f"be combined with {constraint[0]}",
                    param="tool_choice",
                )
            constraint = ("tool_choice", forced)
        self.check_sampling(req, constraint, top_param="top_logprobs")
        encoded = await self.off_loop(self.chat_prompt, req)
        [ids], params = self.sampling_params(req, [encoded], constraint)
        rid = req.client_rid or f"chatcmpl-{uuid.uuid4().hex}"
        jobs = fan_out([ids], params, [req.n], rid)
        last = req.messages[-1]
        echo = last.text if req.echo and last.role == "assistant" else ""
        streams = await self.start(jobs)
        top = req.top_logprobs if req.logprobs else None
        tb = functools.partial(self.token_bytes, req.return_tokens_as_token_ids)
        reasoning = bool(self.args.reasoning_parser) and req.separate_reasoning
        if req.stream:
            parsers = [parser.streaming() if parser else None for _ in jobs]
            splitters = [ReasoningSplitter() if reasoning else None for _ in jobs]
            fmt = ChatEvents(rid, model, req.n, top, tb, parsers, echo, req.keep_stop_string,
                             req.continuous_usage, req.parallel_tool_calls, splitters)  # fmt: skip
            return SSEResponse(self.events(streams, fmt, req.n, req.include_usage, True, req.n))
        collected = await self.collect(request, streams, req.n)
        choices = []
        for i, c in enumerate(collected):
            text = c.text + kept_stop_text(c.last.finished, req.keep_stop_string)
            thought = None
            if reasoning:
                split = split_reasoning(text)
                thought, text = split.reasoning, split.content
            content, calls = text, []
            if parser is not None:
                parsed = parser.parse(text)
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

    def chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
        """The prompt's ids (on the tokenizer thread): the chat template applied to the
        messages and tools, or SGLang's `input_ids` as they are."""
        if req.input_ids is not None:  # SGLang: token ids instead of the template
            return self.encode(req.input_ids, param="input_ids")
        kwargs = dict(req.chat_template_kwargs or {})
        for name in ("documents", "chat_template"):
            if getattr(req, name) is not None:
                kwargs[name] = getattr(req, name)
        try:
            prompt = self.tm.tokenizer.apply_chat_template(
                [template_message(m) for m in req.messages],
                tools=template_tools(req.tools),
                add_generation_prompt=req.add_generation_prompt,
                continue_final_message=req.continue_final_message,
                tokenize=False,
                **kwargs,
            )
        except Exception as exc:  # no template, or the template refused the messages
            message = f"Cannot apply the chat template: {exc}"
            raise ProtocolError(message, param="messages") from exc
        return self.encode(prompt, add_special_tokens=req.add_special_tokens)


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

