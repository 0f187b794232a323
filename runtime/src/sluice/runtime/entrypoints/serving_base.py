"""The steps every generation route takes, over the TokenizerManager (SGLang's
serving_base shape); each route is a subclass in a module of its own (`serving_chat`,
`serving_completions`, `serving_generate`) that strings these steps together:

parse and validate the body -> check the model -> tokenize (on the tokenizer thread) ->
build each choice's `SamplingParams` -> `start` one `tm.generate` per choice (prompts x n)
-> either `collect` the chunks into one response or stream them (`events`).

A client that goes away aborts its requests: a streaming response listens for the
disconnect and closes its generators; `collect` races the generation against
`http.disconnect`. Closing a `tm.generate` iterator sends the scheduler an abort.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from sluice.runtime.disconnect import unless_disconnected
from sluice.runtime.entrypoints.api_config import ApiConfig
from sluice.runtime.entrypoints.choice_output import ChoiceOutput
from sluice.runtime.entrypoints.constraints import ConstraintError, request_constraint
from sluice.runtime.entrypoints.disagg_headers import handoff_of
from sluice.runtime.entrypoints.errors import (
    ProtocolError,
    as_protocol_error,
    from_validation_error,
    model_not_found,
    not_supported_yet,
)
from sluice.runtime.entrypoints.harmony import HarmonyOutput
from sluice.runtime.entrypoints.jobs import Job, is_failure
from sluice.runtime.entrypoints.json_body import load_json_body
from sluice.runtime.entrypoints.logprobs import TokenBytes
from sluice.runtime.entrypoints.lora_api import LoraAdapters
from sluice.runtime.entrypoints.openai_protocol import ChatCompletionRequest, CompletionRequest
from sluice.runtime.entrypoints.openai_responses import usage_of
from sluice.runtime.entrypoints.reasoning import ReasoningSplitter, prompt_opens_thinking
from sluice.runtime.entrypoints.request_limits import EngineDown, Overloaded, TooManyChoices
from sluice.runtime.entrypoints.request_params import (
    Capabilities,
    capabilities_of,
    check_capabilities,
    check_token_ids,
    to_sampling_params,
    truncate_prompt,
)
from sluice.runtime.entrypoints.streaming import (
    SSE_DONE,
    ChoiceStreams,
    Chunk,
    Collected,
    EventFormat,
    sse_event,
)
from sluice.runtime.entrypoints.tokenizer_manager import GenerateChunk
from sluice.runtime.entrypoints.tool_parsers import ToolParser
from sluice.runtime.entrypoints.tools import (
    ToolError,
    answer_or_call,
    output_parser,
    template_message,
    template_tools,
    tool_constraint,
)
from sluice.runtime.ipc.messages import Constraint, DisaggHandoff, SamplingParams, SchedulerStats

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)
OpenAIRequest = CompletionRequest | ChatCompletionRequest


class TokenizerManagerLike(Protocol):
    """What the routes use of the `TokenizerManager` (the tests serve a scripted fake)."""

    tokenizer: Any  # a Hugging Face tokenizer
    served_model_name: str
    context_len: int
    vocab_size: int
    features: frozenset[str]  # SchedulerReady.features
    is_ready: bool
    draining: bool

    @property
    def down(self) -> str | None: ...  # why the engine is down; None while it serves

    @property
    def stats(self) -> SchedulerStats | None: ...  # the scheduler's latest

    def check_admission(self, n: int) -> None: ...
    async def prefill_only(self, input_ids: list[int]) -> None: ...
    def generate(
        self,
        input_ids: list[int],
        sampling: SamplingParams,
        rid: str | None = None,
        handoff: DisaggHandoff | None = None,
    ) -> AsyncIterator[GenerateChunk]: ...
    def abort(self, rid: str) -> list[str]: ...
    def abort_all(self) -> list[str]: ...
    def scheduler_stalled(self, timeout_s: float) -> bool: ...
    def server_info(self) -> dict[str, Any]: ...

    # what the LoRA routes use (`lora_api.SchedulerLink`)
    listeners: list[Any]

    def send_to_scheduler(self, msg: object) -> None: ...


@dataclasses.dataclass(frozen=True)
class PreparedChat:
    """A chat request ready to start: its prompt, one choice's params, and how its output
    is read for tool calls (None: it stays content)."""

    ids: list[int]
    params: SamplingParams
    parser: ToolParser | None
    thinking_opened: bool = False  # the prompt ends inside <think> (with --reasoning-parser)
    harmony: bool = False  # gpt-oss: the reply is read as Harmony, from its token ids
    harmony_tools: bool = False  # ... and its messages to functions.* are tool calls

    def output(self, reasoning: bool) -> ChoiceOutput:
        """How one choice's output is read; `reasoning`: its reasoning is split apart."""
        if self.harmony:
            return ChoiceOutput(tokens=HarmonyOutput(reasoning, self.harmony_tools))
        splitter = ReasoningSplitter.starting(self.thinking_opened) if reasoning else None
        return ChoiceOutput(splitter, self.parser.streaming() if self.parser else None)


@dataclasses.dataclass
class ServingContext:
    """What every route shares, one per app: the TokenizerManager, the flags, the LoRA
    adapters, and the one thread that tokenizes."""

    tm: TokenizerManagerLike
    args: ApiConfig
    lora: LoraAdapters
    flags: dict[str, Any]  # every server flag but the API key, for /server_info
    created: int = dataclasses.field(default_factory=lambda: int(time.time()))
    # tokenization and chat templates run here, one at a time (a fast tokenizer is not
    # safe to call from several threads), so a long prompt never stalls the event loop
    tokenizing: ThreadPoolExecutor = dataclasses.field(
        default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="tokenize")
    )

    @functools.cached_property
    def token_bytes(self) -> TokenBytes:
        """Each token's bytes, for logprobs (built on first use: it reads the vocabulary)."""
        return TokenBytes.of(self.tm.tokenizer)


class ServingBase:
    """The shared steps; a route subclass adds `handle(request)`."""

    def __init__(self, ctx: ServingContext) -> None:
        self.ctx = ctx
        self.tm = ctx.tm
        self.args = ctx.args
        self.lora = ctx.lora

    async def off_loop(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on the tokenizer thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.ctx.tokenizing, functools.partial(fn, *args, **kwargs))

    @property
    def caps(self) -> Capabilities:
        return capabilities_of(self.tm.features, self.args)

    def token_bytes(self, as_ids: bool = False) -> TokenBytes:
        """`as_ids`: vLLM's return_tokens_as_token_ids."""
        return self.ctx.token_bytes.with_ids(as_ids)

    # --- the request ------------------------------------------------------------------------
    async def parse(self, request: Request, model: type[M]) -> M:
        data = load_json_body(await request.body())
        if not isinstance(data, dict):
            raise ProtocolError("The request body must be a JSON object.", code="invalid_json")
        try:
            req = model.model_validate(data)
        except ValidationError as exc:
            raise from_validation_error(exc) from exc
        problem = req.unsupported()  # type: ignore[attr-defined]
        if problem is not None:
            raise problem
        req.check()  # type: ignore[attr-defined]
        if self.tm.draining:
            raise ProtocolError(
                "The server is shutting down.", status=503, type="server_error", code="draining"
            )
        return req

    def check_model(self, model: str | None) -> str:
        served = (None, self.tm.served_model_name, self.args.model)
        if model not in served and self.lora.get(model) is None:
            raise model_not_found(model or "")
        return model or self.tm.served_model_name

    def lora_id(self, model: str | None) -> int:
        """The adapter a (checked) `model` names; 0 for the base model."""
        adapter = self.lora.get(model) if model not in (None, self.tm.served_model_name) else None
        return adapter.lora_id if adapter is not None else 0

    def encode(
        self, prompt: str | list[int], add_special_tokens: bool = True, param: str = "prompt"
    ) -> list[int]:
        if isinstance(prompt, str):
            return self.tm.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        check_token_ids(prompt, self.tm.vocab_size, param)
        return list(prompt)

    def constraint(self, req: Any, prefix: str = "") -> tuple[str, Constraint] | None:
        try:
            return request_constraint(req, prefix)
        except ConstraintError as exc:
            raise ProtocolError(str(exc), param=exc.param, code="invalid_constraint") from exc

    # --- the OpenAI routes' sampling ----------------------------------------------------------
    def check_sampling(
        self, req: OpenAIRequest, constraint: tuple[str, Constraint] | None, top_param: str
    ) -> None:
        """Refuse what the scheduler cannot do for this request (`top_param`: the field
        that asks for top logprobs)."""
        prompt_logprobs = "prompt_logprobs" if req.prompt_logprobs is not None else None
        check_capabilities(
            self.caps, constraint=constraint, top_logprobs=req.top_logprobs_num(),
            top_param=top_param, priority=req.priority, prompt_logprobs=prompt_logprobs,
            spaces_between_special_tokens=req.spaces_between_special_tokens,
        )  # fmt: skip
        if prompt_logprobs:
            raise not_supported_yet("prompt_logprobs", "vLLM's prompt_logprobs")

    def sampling_params(
        self,
        req: OpenAIRequest,
        encoded: list[list[int]],
        constraint: tuple[str, Constraint] | None,
    ) -> tuple[list[list[int]], list[SamplingParams]]:
        """The prompts (truncated as the request asks) and each one's `SamplingParams`."""
        ctx = self.tm.context_len
        prompts = [
            truncate_prompt(ids, req.truncate_prompt_tokens, req.truncation_side, ctx)
            for ids in encoded
        ]
        c = constraint[1] if constraint else None
        params = [to_sampling_params(req, len(ids), ctx, c) for ids in prompts]
        for p in params:
            p.lora_id = self.lora_id(req.model)
        return prompts, params

    # --- chat: /v1/chat/completions and /v1/responses ------------------------------------------
    async def prepare_chat(
        self, req: ChatCompletionRequest, format_param: str = "response_format"
    ) -> PreparedChat:
        """Tools (a forced tool_choice becomes the grammar), the constraint, the checks, the
        chat template on the tokenizer thread, and the sampling params. `format_param`: the
        field the route calls its output format (the Responses API's `text.format`)."""
        choice = req.effective_tool_choice
        if self.args.harmony:
            return await self._prepare_harmony(req, format_param)
        try:
            forced = tool_constraint(req.tools, choice, req.parallel_tool_calls)
            parser = output_parser(req.tools, choice, self.args.tool_call_parser)
        except ToolError as exc:
            raise ProtocolError(str(exc), param=exc.param) from exc
        constraint = self.constraint(req)
        if constraint is not None and constraint[0] == "response_format":
            constraint = (format_param, constraint[1])
        if forced is not None:
            if constraint is not None:
                raise ProtocolError(
                    f"tool_choice {choice if isinstance(choice, str) else 'function'} cannot "
                    f"be combined with {constraint[0]}",
                    param="tool_choice",
                )
            constraint = ("tool_choice", forced)
        elif constraint is not None and parser is not None and req.tools:
            try:  # auto: the answer in the format, or a call
                constraint = (constraint[0], answer_or_call(constraint[1], req.tools, parser))
            except ToolError as exc:
                raise ProtocolError(str(exc), param=exc.param) from exc
        ids, params = await self._chat_request(req, constraint)
        opened = bool(self.args.reasoning_parser) and await self.off_loop(
            lambda: prompt_opens_thinking(self.tm.tokenizer.decode(ids[-8:]))
        )
        return PreparedChat(ids, params, parser, opened)

    async def _prepare_harmony(self, req: ChatCompletionRequest, format_param: str) -> PreparedChat:
        """gpt-oss: the reply is Harmony messages, so nothing may force its text (a grammar
        would keep the model from writing the channels); tool_choice auto and none only."""
        choice = req.effective_tool_choice
        if choice not in ("auto", "none"):
            raise ProtocolError(
                "gpt-oss's Harmony replies (--reasoning-parser gpt-oss) cannot be forced to a "
                'tool call: send tool_choice "auto" or "none"', param="tool_choice",
            )  # fmt: skip
        if (constraint := self.constraint(req)) is not None:
            param = format_param if constraint[0] == "response_format" else constraint[0]
            raise ProtocolError(
                "gpt-oss's Harmony replies (--reasoning-parser gpt-oss) cannot be constrained "
                "to a format: the grammar would keep the model from writing its channels",
                param=param,
            )
        ids, params = await self._chat_request(req, None)
        tools = bool(req.tools) and choice == "auto"
        return PreparedChat(ids, params, None, harmony=True, harmony_tools=tools)

    async def _chat_request(
        self, req: ChatCompletionRequest, constraint: tuple[str, Constraint] | None
    ) -> tuple[list[int], SamplingParams]:
        """The sampling checks, the chat template on the tokenizer thread, and the prompt's
        sampling params under `constraint` (what both kinds of chat share)."""
        self.check_sampling(req, constraint, top_param="top_logprobs")
        encoded = await self.off_loop(self.chat_prompt, req)
        [ids], [params] = self.sampling_params(req, [encoded], constraint)
        return ids, params

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

    # --- the generation ---------------------------------------------------------------------
    def handoff(self, request: Request) -> DisaggHandoff | None:
        """A P/D server's transfer for `request`, from the headers the P/D router adds;
        None on a server that serves whole requests."""
        return handoff_of(request.headers, self.args.disaggregation_mode)

    async def start(
        self,
        jobs: list[Job],
        stop_param: str = "stop_token_ids",
        handoff: DisaggHandoff | None = None,
    ) -> ChoiceStreams:
        """Start every job. The generators run to their first wait before this returns, so
        an up-front rejection (ValueError, raised before the TokenizerManager's first
        await) is a 400 even for a stream, and a full server a 503. A prompt shared by
        several jobs (n > 1) is prefilled once first, so the others reuse it from the
        prefix cache (SGLang's way). With `handoff` (a P/D server), job j's transfer is
        room + j, on both servers alike."""
        for j in jobs:
            check_token_ids(j.params.stop_token_ids, self.tm.vocab_size, stop_param)
            if handoff is not None and j.params.max_new_tokens < 1:
                raise ProtocolError("A P/D pair generates at least one token (max_tokens >= 1).",
                                    param="max_tokens")  # fmt: skip
        try:
            self.tm.check_admission(len(jobs))  # all the choices, or none
        except TooManyChoices as exc:
            raise ProtocolError(str(exc), param="n") from exc
        except (Overloaded, EngineDown) as exc:
            raise as_protocol_error(exc) from exc
        shareable = not self.args.disable_radix_cache and handoff is None
        if shareable and not any(j.params.lora_id for j in jobs):
            shared = {tuple(j.ids) for j in jobs if sum(k.ids == j.ids for k in jobs) > 1}
            await asyncio.gather(*(self.tm.prefill_only(list(ids)) for ids in shared))
        handoffs = [None if handoff is None else dataclasses.replace(handoff, room=handoff.room + i)
                    for i in range(len(jobs))]  # fmt: skip
        streams = ChoiceStreams(
            [self.tm.generate(j.ids, j.params, j.rid, handoff=h) for j, h in zip(jobs, handoffs, strict=True)]
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
                raise self.failure(c.last)
            if is_failure(c.last.finished, abort_is_error):
                raise self.failure(c.last)
        return choices

    def failure(self, chunk: Chunk) -> ProtocolError:
        """The error a client gets for a request the server could not complete: 500 naming
        the cause for an engine fault, 408 past --request-timeout, 500 (503 while
        draining) for a server-side abort."""
        reason = chunk.finished if chunk is not None else None
        message = (reason.message if reason else "") or "The request was aborted by the server."
        kind = reason.kind if reason is not None else "abort"
        if kind == "timeout":
            return ProtocolError(message, status=408, type="server_error", code="request_timeout")
        if kind == "error":
            return ProtocolError(message, status=500, type="server_error", code="engine_error")
        status = 503 if self.tm.draining else 500
        return ProtocolError(message, status=status, type="server_error", code="request_aborted")

    async def events(
        self,
        streams: ChoiceStreams,
        fmt: EventFormat,
        n: int,
        include_usage: bool,
        abort_is_error: bool,
        n_per_prompt: int = 1,
    ) -> AsyncIterator[str]:
        """The SSE body: `fmt`'s events per chunk, then usage if asked, then [DONE]. A
        server-side abort or failure becomes an error event in OpenAI's shape."""
        finals: dict[int, Chunk] = {}
        try:
            for event in fmt.prelude():
                yield event
            async for index, chunk in streams:
                if is_failure(chunk.finished, abort_is_error):
                    yield sse_event(self.failure(chunk).body())
                    break
                for event in fmt.on_chunk(index, chunk):
                    yield event
                if chunk.finished is not None:
                    finals[index] = chunk
            else:
                if include_usage and len(finals) == n:
                    yield fmt.usage(usage_of([finals[i] for i in range(n)], n_per_prompt))
        except Exception as exc:
            yield sse_event(as_protocol_error(exc).body())
        finally:
            await streams.aclose()
        yield SSE_DONE
