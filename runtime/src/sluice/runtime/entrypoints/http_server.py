"""The HTTP API: OpenAI's /v1 routes, the native /generate, /health and /server_info.

Past 500 lines: every route's handler still lives here; one module per route over a shared
serving base (SGLang's serving_chat / serving_completions shape) is issue #35's next step.

`build_app(tm, args)` returns the FastAPI app. Handlers are thin: parse and validate the
body (`openai_protocol`), tokenize, start one `tm.generate` per choice (prompts x n), then either collect
the chunks into one response or stream them as server-sent events (`data: {...}` lines,
ending with `data: [DONE]`).

A client that goes away aborts its requests: a streaming response listens for the
disconnect and closes its generators; a non-streaming handler races the generation against
`http.disconnect`. Closing a `tm.generate` iterator sends the scheduler an abort.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from sluice.runtime.constants import HEALTH_PATH, LIVE_PATH, METRICS_PATH, SERVER_INFO_PATH
from sluice.runtime.disconnect import ClientGone, unless_disconnected
from sluice.runtime.entrypoints import openapi_doc
from sluice.runtime.entrypoints.constraints import ConstraintError, request_constraint
from sluice.runtime.entrypoints.errors import (
    ProtocolError,
    as_protocol_error,
    error_body,
    from_validation_error,
    model_not_found,
    not_supported_yet,
)
from sluice.runtime.entrypoints.http_guards import ApiKeyMiddleware, BodyLimitMiddleware
from sluice.runtime.entrypoints.json_body import load_json_body
from sluice.runtime.entrypoints.logprobs import (
    TokenBytes,
    chat_logprobs,
    completion_logprobs,
    generate_logprobs,
)
from sluice.runtime.entrypoints.lora_api import LoraAdapters
from sluice.runtime.entrypoints.openai_protocol import (
    AbortRequest,
    ChatCompletionRequest,
    CompletionRequest,
    GenerateRequest,
)
from sluice.runtime.entrypoints.openai_responses import (
    ChatChoice,
    ChatCompletionResponse,
    ChatResponseMessage,
    CompletionChoice,
    CompletionResponse,
    FunctionCall,
    ModelCard,
    ModelList,
    ToolCall,
    generate_body,
    usage_of,
)
from sluice.runtime.entrypoints.reasoning import ReasoningSplitter, split_reasoning
from sluice.runtime.entrypoints.request_limits import EngineDown, Overloaded, TooManyChoices
from sluice.runtime.entrypoints.request_params import (
    Capabilities,
    capabilities_of,
    check_capabilities,
    check_token_ids,
    finish_reason,
    kept_stop_text,
    native_sampling_params,
    per_choice_params,
    stop_reason,
    to_sampling_params,
    truncate_prompt,
)
from sluice.runtime.entrypoints.streaming import (
    SSE_DONE,
    ChatEvents,
    ChoiceStreams,
    Chunk,
    Collected,
    CompletionEvents,
    EventFormat,
    GenerateEvents,
    SSEResponse,
    sse_event,
)
from sluice.runtime.entrypoints.tokenizer_manager import ABORTED_BY_REQUEST
from sluice.runtime.entrypoints.tools import (
    ToolError,
    output_parser,
    template_message,
    template_tools,
    tool_constraint,
)
from sluice.runtime.ipc.messages import Constraint, FinishReason, SamplingParams
from sluice.runtime.server_args import ServerArgs

logger = logging.getLogger("sluice.http")

OPEN_PATHS = frozenset({HEALTH_PATH, LIVE_PATH, METRICS_PATH})  # no API key: probes, scrapes
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Job:
    """One generation: a prompt's ids, its params, its rid, and its choice index."""

    ids: list[int]
    params: SamplingParams
    rid: str


def _fan_out(prompts: list[list[int]], params: list[SamplingParams], ns: list[int],
             rid: str, rids: list[str] | None = None) -> list[Job]:
    """Prompt-major jobs (choice index = prompt * n + j, as OpenAI indexes them); n > 1
    choices get seeds `seed + j` and rids `<rid>-<j>`."""
    jobs = []
    total = sum(ns)
    for i, (ids, p, n) in enumerate(zip(prompts, params, ns, strict=True)):
        base = rids[i] if rids else (rid if len(prompts) == 1 else f"{rid}-p{i}")
        for j, q in enumerate(per_choice_params(p, n, random.getrandbits(63))):
            job_rid = base if n == 1 else f"{base}-{j}"
            if total == 1:
                job_rid = base
            jobs.append(Job(ids, q, job_rid))
    return jobs


class _Server:
    def __init__(self, tm: Any, args: ServerArgs) -> None:
        self.tm = tm
        self.args = args
        self.created = int(time.time())
        # tokenization and chat templates run here, one at a time (a fast tokenizer is not
        # safe to call from several threads), so a long prompt never stalls the event loop
        self._tokenizing = ThreadPoolExecutor(1, thread_name_prefix="tokenize")
        self._token_bytes: TokenBytes | None = None
        self.lora = LoraAdapters(tm, args)

    async def off_loop(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`fn(*args, **kwargs)` on the tokenizer thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._tokenizing, functools.partial(fn, *args, **kwargs))

    @property
    def caps(self) -> Capabilities:
        return capabilities_of(self.tm, self.args)

    def token_bytes(self) -> TokenBytes:
        if self._token_bytes is None:
            self._token_bytes = TokenBytes.of(self.tm.tokenizer)
        return self._token_bytes

    # --- steps every generation route takes -------------------------------------------------
    async def parse(self, request: Request, model: type[T]) -> T:
        data = load_json_body(await request.body())
        if not isinstance(data, dict):
            raise ProtocolError("The request body must be a JSON object.", code="invalid_json")
        try:
            req = model.model_validate(data)  # type: ignore[attr-defined]
        except ValidationError as exc:
            raise from_validation_error(exc) from exc
        problem = req.unsupported()
        if problem is not None:
            raise problem
        req.check()
        if self.tm.draining:
            raise ProtocolError(
                "The server is shutting down.", status=503, type="server_error", code="draining"
            )
        return req

    def check_model(self, model: str | None) -> str:
        if model not in (None, self.tm.served_model_name, self.args.model) and self.lora.get(model) is None:
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

    async def start(self, jobs: list[Job], stop_param: str = "stop_token_ids") -> ChoiceStreams:
        """Start every job. The generators run to their first wait before this returns, so
        an up-front rejection (ValueError, raised before the TokenizerManager's first
        await) is a 400 even for a stream, and a full server a 503. A prompt shared by
        several jobs (n > 1) is prefilled once first, so the others reuse it from the
        prefix cache (SGLang's way)."""
        for j in jobs:
            check_token_ids(j.params.stop_token_ids, self.tm.vocab_size, stop_param)
        try:
            self.tm.check_admission(len(jobs))  # all the choices, or none
        except TooManyChoices as exc:
            raise ProtocolError(str(exc), param="n") from exc
        except (Overloaded, EngineDown) as exc:
            raise as_protocol_error(exc) from exc
        if not self.args.disable_radix_cache and not any(j.params.lora_id for j in jobs):
            shared = {tuple(j.ids) for j in jobs if sum(k.ids == j.ids for k in jobs) > 1}
            await asyncio.gather(*(self.tm.prefill_only(list(ids)) for ids in shared))
        streams = ChoiceStreams([self.tm.generate(j.ids, j.params, j.rid) for j in jobs])
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
            if _is_failure(c.last.finished, abort_is_error):
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
                if _is_failure(chunk.finished, abort_is_error):
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

    # --- routes ---------------------------------------------------------------------------
    async def completions(self, request: Request) -> Response:
        req = await self.parse(request, CompletionRequest)
        model = self.check_model(req.model)
        constraint = self.constraint(req)
        prompt_lp = "prompt_logprobs" if req.prompt_logprobs is not None else None
        if req.echo and req.logprobs is not None:
            raise not_supported_yet("echo", "echo with logprobs (prompt logprobs)")
        check_capabilities(
            self.caps, constraint=constraint, top_logprobs=req.top_logprobs_num(),
            top_param="logprobs", priority=req.priority, prompt_logprobs=prompt_lp,
            spaces_between_special_tokens=req.spaces_between_special_tokens,
        )  # fmt: skip
        if prompt_lp:
            raise not_supported_yet("prompt_logprobs", "vLLM's prompt_logprobs")
        ctx = self.tm.context_len
        encoded = await self.off_loop(lambda: [self.encode(p, req.add_special_tokens) for p in req.prompt])
        prompts = [
            truncate_prompt(ids, req.truncate_prompt_tokens, req.truncation_side, ctx)
            for ids in encoded
        ]
        c = constraint[1] if constraint else None
        params = [to_sampling_params(req, len(ids), ctx, c) for ids in prompts]
        for p in params:
            p.lora_id = self.lora_id(req.model)
        rid = req.client_rid or f"cmpl-{uuid.uuid4().hex}"
        jobs = _fan_out(prompts, params, [req.n] * len(prompts), rid)
        echoes = [""] * len(jobs)
        if req.echo:
            texts = [p if isinstance(p, str) else self.tm.tokenizer.decode(p) for p in req.prompt]
            echoes = [texts[k // req.n] for k in range(len(jobs))]
        streams = await self.start(jobs)
        tb = lambda: self.token_bytes().with_ids(req.return_tokens_as_token_ids)  # noqa: E731
        if req.stream:
            fmt = CompletionEvents(rid, model, len(jobs), req.logprobs, echoes, tb,
                                   req.keep_stop_string, req.continuous_usage)  # fmt: skip
            return SSEResponse(
                self.events(streams, fmt, len(jobs), req.include_usage, True, req.n)
            )
        collected = await self.collect(request, streams, len(jobs))
        choices = []
        for k, c_ in enumerate(collected):
            lp = None
            if req.logprobs is not None:
                lp = completion_logprobs(tb(), c_.positions(), req.logprobs, len(echoes[k]))
            keep = kept_stop_text(c_.last.finished, req.keep_stop_string)
            choices.append(
                CompletionChoice(
                    index=k,
                    text=echoes[k] + c_.text + keep,
                    logprobs=lp,
                    finish_reason=finish_reason(c_.last.finished),
                    stop_reason=stop_reason(c_.last.finished),
                    token_ids=c_.token_ids if req.return_token_ids else None,
                    prompt_token_ids=jobs[k].ids if req.return_token_ids else None,
                )
            )
        usage = usage_of([c_.last for c_ in collected], req.n)
        body = CompletionResponse(id=rid, model=model, choices=choices, usage=usage)
        return JSONResponse(body.model_dump())

    def chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
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

    async def chat(self, request: Request) -> Response:
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
        check_capabilities(
            self.caps, constraint=constraint, top_logprobs=req.top_logprobs_num(),
            top_param="top_logprobs", priority=req.priority,
            prompt_logprobs="prompt_logprobs" if req.prompt_logprobs is not None else None,
            spaces_between_special_tokens=req.spaces_between_special_tokens,
        )  # fmt: skip
        if req.prompt_logprobs is not None:
            raise not_supported_yet("prompt_logprobs", "vLLM's prompt_logprobs")
        ctx = self.tm.context_len
        ids = truncate_prompt(await self.off_loop(self.chat_prompt, req),
                                req.truncate_prompt_tokens, req.truncation_side, ctx)  # fmt: skip
        params = to_sampling_params(req, len(ids), ctx, constraint[1] if constraint else None)
        params.lora_id = self.lora_id(req.model)
        rid = req.client_rid or f"chatcmpl-{uuid.uuid4().hex}"
        jobs = _fan_out([ids], [params], [req.n], rid)
        last = req.messages[-1]
        echo = last.text if req.echo and last.role == "assistant" else ""
        streams = await self.start(jobs)
        top = req.top_logprobs if req.logprobs else None
        tb = lambda: self.token_bytes().with_ids(req.return_tokens_as_token_ids)  # noqa: E731
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
            )
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

    async def generate(self, request: Request) -> Response:
        """Native /generate in SGLang's shape: one prompt or a list (then a list of
        outputs, prompt-major, n per prompt); an abort is reported in band."""
        req = await self.parse(request, GenerateRequest)
        prompts = req.prompts()
        sps = req.sampling_params * len(prompts) if len(req.sampling_params) == 1 else req.sampling_params
        ctx = self.tm.context_len
        param = "text" if req.text is not None else "input_ids"
        loras = self.generate_loras(req, len(prompts))
        ids_list, params = [], []
        for prompt, sp, lora in zip(prompts, sps, loras, strict=True):
            constraint = self.constraint(sp, "sampling_params.")
            check_capabilities(
                self.caps, constraint=constraint,
                top_logprobs=req.top_logprobs_num if req.return_logprob else 0,
                top_param="top_logprobs_num", priority=req.priority,
                prompt_logprobs="logprob_start_len"
                if req.return_logprob and req.logprob_start_len >= 0 else None,
                spaces_between_special_tokens=sp.spaces_between_special_tokens,
            )  # fmt: skip
            ids = await self.off_loop(self.encode, prompt, param=param)
            ids_list.append(ids)
            params.append(native_sampling_params(
                req, sp, len(ids), ctx, constraint[1] if constraint else None))  # fmt: skip
            params[-1].lora_id = lora
        rids = None
        if req.rid is not None:
            rids = req.rid if isinstance(req.rid, list) else [req.rid]
        jobs = _fan_out(ids_list, params, [sp.n for sp in sps], uuid.uuid4().hex, rids)
        batched = req.is_batch or len(jobs) > 1
        keep = [sp.no_stop_trim for sp in sps for _ in range(sp.n)]
        meta = self.generate_meta(req)
        streams = await self.start(jobs, stop_param="sampling_params.stop_token_ids")
        if req.stream:
            fmt = GenerateEvents([j.rid for j in jobs], meta, batched, keep)
            return SSEResponse(self.events(streams, fmt, len(jobs), False, False))
        collected = await self.collect(request, streams, len(jobs), abort_is_error=False)
        bodies = []
        for job, c, k in zip(jobs, collected, keep, strict=True):
            text = c.text + kept_stop_text(c.last.finished, k)
            bodies.append(generate_body(job.rid, text, c.token_ids, meta(c), c.last))
        return JSONResponse(bodies if batched else bodies[0])

    def generate_loras(self, req: GenerateRequest, n: int) -> list[int]:
        """Per prompt, the adapter id SGLang's `lora_path` (one, or one per prompt; an
        adapter's name or folder) or `lora_name` names (0: the base model)."""
        wanted: list[str | None] = [req.lora_name] * n
        if req.lora_path is not None:
            paths = req.lora_path if isinstance(req.lora_path, list) else [req.lora_path] * n
            if len(paths) != n:
                raise ProtocolError(f"lora_path has {len(paths)} entries for {n} prompts",
                                      param="lora_path")  # fmt: skip
            wanted = list(paths)
        ids = []
        for value in wanted:
            if not value:
                ids.append(0)
                continue
            adapter = self.lora.by_name_or_path(value)
            if adapter is None:
                raise model_not_found(value)
            ids.append(adapter.lora_id)
        return ids

    def generate_meta(self, req: GenerateRequest) -> Callable[[Collected], dict[str, Any] | None]:
        def meta(c: Collected) -> dict[str, Any] | None:
            if not req.return_logprob:
                return None
            tb = self.token_bytes()
            k = req.top_logprobs_num
            chosen, tops = generate_logprobs(tb, c.positions(), k, req.return_text_in_logprobs)
            out: dict[str, Any] = {"output_token_logprobs": chosen}
            if tops is not None:
                out["output_top_logprobs"] = tops
            if req.logprob_start_len >= 0:
                out["input_token_logprobs"] = c.input_logprobs
            return out

        return meta

    async def abort_request(self, request: Request) -> Response:
        """SGLang's POST /abort_request: {"rid": ...} or {"abort_all": true}."""
        req = await self.parse(request, AbortRequest)
        rids = self.tm.abort_all() if req.abort_all else self.tm.abort(req.rid)
        return JSONResponse({"aborted": rids})

    def models(self) -> dict[str, Any]:
        card = ModelCard(
            id=self.tm.served_model_name,
            created=self.created,
            root=self.args.model,
            max_model_len=self.tm.context_len,
        )
        body = ModelList(data=[card]).model_dump()
        body["data"] += self.lora.cards(self.tm.served_model_name)
        return body

    def health(self) -> Response:
        if self.tm.is_ready and not self.tm.draining:
            return JSONResponse({"status": "ok"})
        if getattr(self.tm, "down", None):
            return JSONResponse({"status": "engine-down"}, 503)
        return JSONResponse({"status": "draining" if self.tm.draining else "starting"}, 503)

    def live(self) -> Response:
        """Liveness: fails for a hung scheduler or a dead engine (a restart helps), never
        while loading or draining (a restart would not). The watchdog reads the same
        heartbeat and takes the server down itself after --watchdog-timeout."""
        if getattr(self.tm, "down", None):
            return JSONResponse({"status": "engine-down"}, 503)
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


def _is_failure(reason: FinishReason | None, abort_is_error: bool) -> bool:
    """An end the client gets as an error: an engine fault or a timeout, everywhere; an
    abort it did not ask for, where `abort_is_error` (POST /abort_request aborts, and
    /generate's server-side aborts, are reported in band)."""
    if reason is None:
        return False
    if reason.kind in ("error", "timeout"):
        return True
    return abort_is_error and reason.kind == "abort" and reason.message != ABORTED_BY_REQUEST


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
    app = FastAPI(
        title="sluice", docs_url=None, redoc_url=None, openapi_url=openapi_doc.OPENAPI_PATH
    )
    openapi_doc.install(app, vocab_size=getattr(tm, "vocab_size", None))
    app.state.server = server
    app.add_api_route("/v1/models", server.models, methods=["GET"])
    for path, handler in (
        ("/v1/completions", server.completions),
        ("/v1/chat/completions", server.chat),
        ("/generate", server.generate),
        ("/abort_request", server.abort_request),
        ("/v1/load_lora_adapter", server.lora.load),
        ("/v1/unload_lora_adapter", server.lora.unload),
    ):
        app.add_api_route(
            path, handler, methods=["POST"], openapi_extra=openapi_doc.request_body(path)
        )
    app.add_api_route(HEALTH_PATH, server.health, methods=["GET"])
    app.add_api_route(LIVE_PATH, server.live, methods=["GET"])
    app.add_api_route(SERVER_INFO_PATH, server.server_info, methods=["GET"])
    if metrics_handler is not None:
        app.add_api_route(METRICS_PATH, metrics_handler, methods=["GET"])

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

    # the last added runs first: an unauthorized client never makes the server buffer a body
    app.add_middleware(BodyLimitMiddleware, limit=args.max_request_body_bytes)
    if args.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=args.api_key, open_paths=OPEN_PATHS)
    return app
