"""SGLang's native POST /generate: `text` or `input_ids`, one prompt or a batch, per-prompt
`sampling_params` and LoRA adapters, n outputs per prompt (prompt-major), logprobs in
`meta_info`; an abort is reported in band (`finish_reason.type` "abort"), not as an error."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any

from fastapi import Request, Response
from fastapi.responses import JSONResponse

from sluice.runtime.entrypoints.errors import ProtocolError, model_not_found
from sluice.runtime.entrypoints.jobs import fan_out
from sluice.runtime.entrypoints.logprobs import generate_logprobs
from sluice.runtime.entrypoints.openai_protocol import GenerateRequest
from sluice.runtime.entrypoints.openai_responses import Usage, generate_body
from sluice.runtime.entrypoints.request_params import (
    check_capabilities,
    kept_stop_text,
    native_sampling_params,
)
from sluice.runtime.entrypoints.serving_base import ServingBase
from sluice.runtime.entrypoints.streaming import Chunk, Collected, SSEResponse, sse_event


class ServingGenerate(ServingBase):
    async def handle(self, request: Request) -> Response:
        """One prompt or a list (then a list of outputs, prompt-major, n per prompt)."""
        req = await self.parse(request, GenerateRequest)
        prompts = req.prompts()
        sps = req.sampling_params * len(prompts) if len(req.sampling_params) == 1 else req.sampling_params
        ctx = self.tm.context_len
        param = "text" if req.text is not None else "input_ids"
        loras = self.loras(req, len(prompts))
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
        jobs = fan_out(ids_list, params, [sp.n for sp in sps], uuid.uuid4().hex, rids)
        batched = req.is_batch or len(jobs) > 1
        keep = [sp.no_stop_trim for sp in sps for _ in range(sp.n)]
        meta = self.meta(req)
        streams = await self.start(
            jobs, stop_param="sampling_params.stop_token_ids", handoff=self.handoff(request)
        )
        if req.stream:
            fmt = GenerateEvents([j.rid for j in jobs], meta, batched, keep)
            return SSEResponse(self.events(streams, fmt, len(jobs), False, False))
        collected = await self.collect(request, streams, len(jobs), abort_is_error=False)
        bodies = []
        for job, c, k in zip(jobs, collected, keep, strict=True):
            text = c.text + kept_stop_text(c.last.finished, k)
            bodies.append(generate_body(job.rid, text, c.token_ids, meta(c), c.last))
        return JSONResponse(bodies if batched else bodies[0])

    def loras(self, req: GenerateRequest, n: int) -> list[int]:
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

    def meta(self, req: GenerateRequest) -> Callable[[Collected], dict[str, Any] | None]:
        """An output's logprob entries of `meta_info` (None when not asked for)."""

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
