"""POST /v1/completions: one prompt or a list, n choices each (prompt-major), echo, logprobs
in the legacy completions shape, streamed as `text_completion` chunks or answered whole."""

from __future__ import annotations

import dataclasses
import functools
import time
import uuid
from collections.abc import Callable

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from sluice.runtime.entrypoints.errors import not_supported_yet
from sluice.runtime.entrypoints.jobs import fan_out
from sluice.runtime.entrypoints.logprobs import TokenBytes, completion_logprobs
from sluice.runtime.entrypoints.openai_protocol import CompletionRequest
from sluice.runtime.entrypoints.openai_responses import (
    CompletionChoice,
    CompletionResponse,
    Usage,
    usage_of,
)
from sluice.runtime.entrypoints.request_params import finish_reason, kept_stop_text, stop_reason
from sluice.runtime.entrypoints.serving_base import ServingBase
from sluice.runtime.entrypoints.streaming import Chunk, SSEResponse, positions_of, sse_event


class ServingCompletions(ServingBase):
    async def handle(self, request: Request) -> Response:
        req = await self.parse(request, CompletionRequest)
        model = self.check_model(req.model)
        constraint = self.constraint(req)
        if req.echo and req.logprobs is not None:
            raise not_supported_yet("echo", "echo with logprobs (prompt logprobs)")
        self.check_sampling(req, constraint, top_param="logprobs")
        encoded = await self.off_loop(
            lambda: [self.encode(p, req.add_special_tokens) for p in req.prompt]
        )
        prompts, params = self.sampling_params(req, encoded, constraint)
        rid = req.client_rid or f"cmpl-{uuid.uuid4().hex}"
        jobs = fan_out(prompts, params, [req.n] * len(prompts), rid)
        echoes = [""] * len(jobs)
        if req.echo:
            texts = [p if isinstance(p, str) else self.tm.tokenizer.decode(p) for p in req.prompt]
            echoes = [texts[k // req.n] for k in range(len(jobs))]
        streams = await self.start(jobs, handoff=self.handoff(request))
        tb = functools.partial(self.token_bytes, req.return_tokens_as_token_ids)
        if req.stream:
            fmt = CompletionEvents(rid, model, req.logprobs, echoes, tb, req.keep_stop_string,
                                   req.continuous_usage)  # fmt: skip
            return SSEResponse(self.events(streams, fmt, len(jobs), req.include_usage, True, req.n))
        collected = await self.collect(request, streams, len(jobs))
        choices = []
        for k, c in enumerate(collected):
            lp = None
            if req.logprobs is not None:
                lp = completion_logprobs(tb(), c.positions(), req.logprobs, len(echoes[k]))
            choices.append(
                CompletionChoice(
                    index=k,
                    text=echoes[k] + c.text + kept_stop_text(c.last.finished, req.keep_stop_string),
                    logprobs=lp,
                    finish_reason=finish_reason(c.last.finished),
                    stop_reason=stop_reason(c.last.finished),
                    token_ids=c.token_ids if req.return_token_ids else None,
                    prompt_token_ids=jobs[k].ids if req.return_token_ids else None,
                )
            )
        usage = usage_of([c.last for c in collected], req.n)
        body = CompletionResponse(id=rid, model=model, choices=choices, usage=usage)
        return JSONResponse(body.model_dump())


@dataclasses.dataclass
class CompletionEvents:
    """Completion chunks: an echoed prompt first, then each piece of text (with its
    logprobs, `text_offset` counted on from the echo), the finish in the last."""

    rid: str
    model: str
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
