"""`TokenizerManager`: the API server's side of the ZeroMQ pipeline.

It sends tokenized requests to the scheduler, receives text deltas from the detokenizer,
and hands each request's updates to the HTTP handler that waits for them. Closing a
request's generator early (client gone) sends an abort, so the scheduler frees its slot
and KV pages.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import zmq
import zmq.asyncio

from sluice.runtime.ipc.messages import (
    AbortReq,
    BatchStrOut,
    FinishReason,
    SamplingParams,
    SchedulerReady,
    SchedulerStats,
    TokenizedGenerateReq,
)
from sluice.runtime.ipc.sockets import PortArgs, push_socket, recv_async, send

logger = logging.getLogger("sluice.tokenizer_manager")


@dataclass
class GenerateChunk:
    """One update for one request."""

    text: str
    token_ids: list[int]
    finished: FinishReason | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    logprobs: list[float]


@dataclass
class _ReqState:
    queue: asyncio.Queue[GenerateChunk] = field(default_factory=asyncio.Queue)
    created: float = field(default_factory=time.monotonic)
    first_token_at: float | None = None


class TokenizerManager:
    def __init__(
        self,
        tokenizer: Any,
        served_model_name: str,
        ready: SchedulerReady,
        port_args: PortArgs,
    ) -> None:
        self.tokenizer = tokenizer
        self.served_model_name = served_model_name
        self.ready_info = ready
        self.context_len = ready.context_len
        self.is_ready = False
        self.draining = False
        self.stats = SchedulerStats(max_total_tokens=ready.max_total_tokens)
        self._ctx = zmq.asyncio.Context()
        # sends never block (PUSH to a bound peer), so a plain socket keeps aborts
        # deliverable from `finally` blocks even while a task is being cancelled
        self._sync_ctx = zmq.Context()
        self._to_scheduler = push_socket(self._sync_ctx, port_args.scheduler_input)
        self._from_detokenizer = self._ctx.socket(zmq.PULL)
        self._from_detokenizer.setsockopt(zmq.LINGER, 0)
        self._from_detokenizer.bind(port_args.tokenizer_input)
        self._states: dict[str, _ReqState] = {}
        self._loop_task: asyncio.Task[None] | None = None
        # objects with on_chunk(rid, chunk, state), on_stats(stats) and optionally
        # on_abort(rid, state) (the request ended unfinished: its client went away)
        self.listeners: list[Any] = []

    @property
    def num_inflight(self) -> int:
        return len(self._states)

    def start(self) -> None:
        """Start receiving; call from inside the server's event loop."""
        if self._loop_task is None:
            self._loop_task = asyncio.get_running_loop().create_task(self._receive_loop())

    def server_info(self) -> dict[str, Any]:
        r = self.ready_info
        return {
            "served_model_name": self.served_model_name,
            "max_total_tokens": r.max_total_tokens,
            "max_running_requests": r.max_running_requests,
            "context_len": r.context_len,
            "page_size": r.page_size,
            "device": r.device,
            "dtype": r.dtype,
            "dtype_reason": r.dtype_reason,
            "kv_cache_dtype": r.kv_cache_dtype,
            "quantization": r.quantization,
            "torch_threads": r.torch_threads,
            "attention_backend": r.attention_backend,
            "is_ready": self.is_ready,
            "draining": self.draining,
            "inflight_requests": self.num_inflight,
        }

    async def generate(
        self, input_ids: list[int], sampling: SamplingParams, rid: str | None = None
    ) -> AsyncIterator[GenerateChunk]:
        rid = rid or uuid.uuid4().hex
        if rid in self._states:
            raise ValueError(f"request id {rid} is already in flight")
        if not input_ids:
            raise ValueError("the prompt is empty")
        if len(input_ids) >= self.context_len:
            raise ValueError(
                f"the prompt has {len(input_ids)} tokens; this model's context length is "
                f"{self.context_len}"
            )
        state = _ReqState()
        self._states[rid] = state
        finished = False
        try:
            send(
                self._to_scheduler,
                TokenizedGenerateReq(rid, list(input_ids), sampling, time.time()),
            )
            while True:
                chunk = await state.queue.get()
                finished = chunk.finished is not None
                yield chunk
                if finished:
                    return
        finally:
            self._states.pop(rid, None)
            if not finished:
                logger.info("request aborted rid=%s reason=client-gone", rid)
                send(self._to_scheduler, AbortReq(rid))
                for listener in self.listeners:
                    if hasattr(listener, "on_abort"):
                        listener.on_abort(rid, state)

    async def _receive_loop(self) -> None:
        while True:
            msg = await recv_async(self._from_detokenizer)
            if isinstance(msg, BatchStrOut):
                self._dispatch(msg)
            elif isinstance(msg, SchedulerStats):
                self.stats = msg
                for listener in self.listeners:
                    listener.on_stats(msg)

    def _dispatch(self, out: BatchStrOut) -> None:
        for i, rid in enumerate(out.rids):
            state = self._states.get(rid)
            if state is None:  # aborted: the client is gone
                continue
            chunk = GenerateChunk(
                text=out.text_deltas[i],
                token_ids=out.new_token_ids[i],
                finished=out.finished[i],
                prompt_tokens=out.prompt_tokens[i],
                completion_tokens=out.completion_tokens[i],
                cached_tokens=out.cached_tokens[i],
                logprobs=out.logprobs[i],
            )
            for listener in self.listeners:
                listener.on_chunk(rid, chunk, state)
            state.queue.put_nowait(chunk)

    def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
        self._ctx.destroy(linger=0)
        self._sync_ctx.destroy(linger=0)
